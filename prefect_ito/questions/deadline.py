"""A deadline extension (contract v0.5): the run will not finish by its wall-clock deadline, and
the backend proposes a later one. Approved, it goes on until then; rejected, it stops at the
deadline it has."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from prefect_ito.contract import ActionKind, DecisionChoice, PendingAction, TrainingRun
from prefect_ito.questions.registry import ActionQuestion, Kind, register
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting import moments
from prefect_ito.reporting.moments import when

__all__ = ["DEADLINE", "DeadlineExtension"]


def _deadlines(action: PendingAction) -> tuple[datetime, datetime]:
    """Return the deadline now and the one proposed (the contract requires both)."""
    now, proposed = action.deadline_at, action.proposed_deadline_at
    if now is None or proposed is None:
        raise ValueError(f"action {action.action_id} ({action.kind}) is not a deadline extension")
    return now, proposed


def _longer(action: PendingAction) -> str:
    now, proposed = _deadlines(action)
    hours = (proposed - now).total_seconds() / 3600
    return f"{hours:,.0f} h" if hours >= 1 else f"{hours * 60:,.0f} min"


class DeadlineExtension(ActionQuestion):
    """A proposed later wall-clock deadline for a run."""

    kind: ClassVar[ActionKind] = ActionKind.DEADLINE_EXTENSION
    name: ClassVar[Kind] = "deadline"
    noun: ClassVar[str] = "a deadline extension to decide"
    subject: ClassVar[str] = "the deadline extension"
    label: ClassVar[str] = "deadline extension"

    def heading(self, action: PendingAction) -> str:
        return f"Deadline in {md.code(action.stage)} — an extension is proposed"

    def situation(self, run: TrainingRun, action: PendingAction) -> str:
        return (
            f"The Itô desk backend holds run {md.code(run.run_id)} (booking "
            f"{md.code(run.booking_id)}) at step {action.step:,}: it will not finish by its "
            "wall-clock deadline, and the backend proposes a later one."
        )

    def rows(self, run: TrainingRun, action: PendingAction) -> list[tuple[str, str]]:
        now, proposed = _deadlines(action)
        progress = run.telemetry.progress
        return [
            ("deadline now", when(now)),
            ("proposed", f"{when(proposed)} ({_longer(action)} later)"),
            *([("progress", f"{progress:.0%}")] if progress is not None else []),
        ]

    def choices(self, action: PendingAction) -> dict[DecisionChoice, str]:
        now, proposed = _deadlines(action)
        return {
            DecisionChoice.APPROVE: f"the run may go on until {when(proposed)} "
            f"({_longer(action)} more); spend goes on meanwhile.",
            DecisionChoice.REJECT: f"the run stops at its deadline, {when(now)}, unfinished; "
            "its checkpoints stay.",
        }

    def asked(self, run: TrainingRun, action: PendingAction) -> str:
        return (
            f"Approve or reject a deadline extension of run {run.run_id} (booking {run.booking_id})"
        )

    def evidence(self, action: PendingAction) -> str:
        now, proposed = _deadlines(action)
        return (
            f"deadline {when(now)}, proposed {when(proposed)} ({_longer(action)} later), at step "
            f"{action.step:,} in {action.stage}"
        )

    def numbers(self, action: PendingAction) -> dict[str, float]:
        now, proposed = _deadlines(action)
        return {
            "step": float(action.step),
            "deadline_at": now.timestamp(),
            "proposed_deadline_at": proposed.timestamp(),
        }

    def facts(self, action: PendingAction) -> list[tuple[str, str]]:
        now, proposed = _deadlines(action)
        return [
            ("deadline", f"{when(now)} (at step {action.step:,} in {action.stage})"),
            ("proposed deadline", f"{when(proposed)} ({_longer(action)} later)"),
        ]

    def status(self, action: PendingAction) -> str:
        now, proposed = _deadlines(action)
        return (
            f"deadline {when(now)} at step {action.step:,} in {action.stage}: extension to "
            f"{when(proposed)} proposed, {moments.said_asked(action)}"
        )

    def outcome(self, decision: DecisionChoice, action: PendingAction | None) -> str:
        if decision is DecisionChoice.REJECT:
            return "rejected: the run stopped at its deadline"
        proposed = action.proposed_deadline_at if action is not None else None
        until = f" until {when(proposed)}" if proposed is not None else ""
        return f"approved: the run went on{until}"

    def waiting(self, action: PendingAction) -> str:
        _, proposed = _deadlines(action)
        return (
            f"Run will miss its deadline in {action.stage} at step {action.step}: the backend "
            f"proposes to extend it to {when(proposed)} and holds the run. Waiting for a person "
            "to approve or reject it at the backend"
        )

    def asks(self, action: PendingAction) -> str:
        proposed = when(action.proposed_deadline_at)
        return f"approve or reject a deadline extension to {proposed} at the backend"


DEADLINE = register(DeadlineExtension())
