"""Asking a person whether a proposed loss-spike restart may go ahead.

The backend holds the run and proposes a restart; only a person decides. The main flow (never a
subflow: Prefect cannot suspend subflows) waits for a typed :class:`RestartDecision`, which the
Prefect UI renders as a form under the spike's context, asked through
:mod:`prefect_ito.people.asking`: a
flow run from a deployment suspends, holding no infrastructure while it waits; any other flow run
pauses in its process.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import get_run_logger
from prefect.input import RunInput
from pydantic import Field, model_validator

from prefect_ito.contract import (
    CheckpointRef,
    DecisionChoice,
    DecisionRequest,
    PendingAction,
    TrainingRun,
)
from prefect_ito.exceptions import AwaitingDecision
from prefect_ito.people import asking, notices
from prefect_ito.reporting import charts
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.cards import when
from prefect_ito.reporting.holding import held_for
from prefect_ito.settings import current_settings
from prefect_ito.waiting.keys import restart_pause_key

Choice = Literal["approve", "reject"]

WHAT_EACH_ANSWER_DOES = (
    "approve: the backend restarts from the proposed checkpoint and trains the steps since "
    "again. reject: the run goes on from where it is, without restarting. There is no default: "
    "nothing happens until you choose."
)


class RestartDecision(RunInput):
    """A person's answer to a proposed loss-spike restart: an explicit choice, a name, a reason.

    ``decision`` is required and has no default, so a form submitted untouched is refused (by the
    Prefect UI, and by Prefect's server, which checks every answer against this schema) instead
    of rejecting the restart by accident.
    """

    decision: Choice = Field(title="Decision", description=WHAT_EACH_ANSWER_DOES)
    decided_by: str = Field(
        min_length=1, description="Your name, as the backend should record who decided."
    )
    reason: str = Field(min_length=1, description="Why: recorded with the decision.")

    @model_validator(mode="before")
    @classmethod
    def _from_the_earlier_form(cls, data: Any) -> Any:
        """Read an answer to a pause saved with the earlier form, a tick box ``approve``."""
        if isinstance(data, dict) and "decision" not in data and "approve" in data:
            data = dict(data)
            data["decision"] = "approve" if data.pop("approve") is True else "reject"
        return data

    @property
    def approves(self) -> bool:
        """Tell whether the person approved the restart."""
        return self.decision == "approve"

    def to_request(self) -> DecisionRequest:
        """Return the decision as the backend's contract states it."""
        return DecisionRequest(
            decision=DecisionChoice(self.decision), decided_by=self.decided_by, reason=self.reason
        )


def pause_key(action: PendingAction) -> str:
    """Return the pause key for an action: stable across re-entries, letters digits and dashes."""
    return restart_pause_key(action.action_id)


def _spike(action: PendingAction) -> tuple[float, float, CheckpointRef]:
    """Return a loss-spike restart's loss, baseline loss and proposed checkpoint.

    The contract requires them of a ``loss_spike_restart``, the only kind put to a person.
    """
    loss, baseline, checkpoint = action.loss, action.baseline_loss, action.proposed_checkpoint
    if loss is None or baseline is None or checkpoint is None:
        raise ValueError(f"action {action.action_id} ({action.kind}) is not a loss-spike restart")
    return loss, baseline, checkpoint


def describe(run: TrainingRun, action: PendingAction) -> str:
    """Return the markdown a person reads above the decision form: evidence, chart, choices.

    The Resume dialog is narrow and does not wrap table cells: values stay short, and the chart
    is drawn at the dialog's width.
    """
    loss, baseline, checkpoint = _spike(action)
    back = action.step - checkpoint.step
    t = run.telemetry
    times = f" ({loss / baseline:.1f}×)" if baseline > 0 else ""
    svg = charts.draw(charts.loss_chart(run), width=charts.FORM_WIDTH, height=280)
    return "\n".join(
        [
            f"### Loss spike in {md.code(action.stage)} — a restart is proposed",
            "",
            f"The Itô desk backend holds run {md.code(run.run_id)} "
            f"(booking {md.code(run.booking_id)}) at step "
            f"{action.step:,} and proposes to restart from an earlier checkpoint. Nothing "
            "restarts until a person decides; prefect-ito never decides by itself.",
            "",
            "| evidence | value |",
            "|---|---|",
            f"| spike | loss {loss:.2f} at step {action.step:,} |",
            f"| baseline | loss {baseline:.2f}{times} |",
            f"| restart from | {md.code(checkpoint.checkpoint_id, cell=True)} |",
            f"| its step | {checkpoint.step:,} ({back:,} steps back) |",
            *_held_rows(action),
            f"| spent so far | ${t.spend_usd:,.0f} of ${t.budget_usd:,.0f} "
            f"({t.spend_usd / t.budget_usd:.0%}) |",
            "",
            charts.markdown_image(svg, "Training loss by step, up to the spike"),
            "",
            "**Choose one** — the form has no default:",
            "",
            f"- **approve**: the backend restarts from {md.code(checkpoint.checkpoint_id)} at step "
            f"{checkpoint.step:,} and trains the {back:,} steps since again; spend goes on "
            "meanwhile.",
            f"- **reject**: the run goes on from step {action.step:,} as it is, without "
            "restarting.",
        ]
    )


def _held_rows(action: PendingAction) -> list[str]:
    """Return the rows that say since when the backend holds the run, and what that costs.

    The hold is dated by the wall clock; ``proposed_at`` is on the run's own timeline, which a
    simulated run compresses (its weeks pass in minutes), so it is shown only when the backend
    says nothing of the hold.
    """
    if action.held_since is None:
        return [f"| proposed at | {when(action.proposed_at)} |"]
    rows = [f"| held since | {when(action.held_since)} |"]
    if (cost := held_for(action)) is not None and action.hold_usd_per_hour is not None:
        # Two short cells: the form's narrow column does not wrap them.
        rows.append(f"| holding costs | ${action.hold_usd_per_hour:,.0f} an hour |")
        rows.append(f"| held so far | {cost.duration()}: {cost.cost()} |")
    return rows


async def ask_person(
    run: TrainingRun, *, timeout: float, poll_interval: float
) -> RestartDecision | None:
    """Wait for a person's decision on the run's pending action; None if the flow run was cancelled.

    Asked through :func:`prefect_ito.people.asking.ask`: a flow run from a deployment suspends, any
    other
    pauses in-process; the stable pause key returns the same answer after a resumed suspension.

    Raises:
        AwaitingDecision: nobody decided in time; the action stays pending at the backend.
    """
    action = run.pending_action
    if action is None:
        raise ValueError(f"run {run.run_id} waits for no decision")

    def waiting() -> None:
        get_run_logger().warning(
            "Loss spike in %s at step %d: the backend proposes a restart from %s and holds the "
            "run. Waiting for a person to approve or reject it (the form under Resume on this flow "
            "run, or prefect-ito decide).",
            action.stage,
            action.step,
            _spike(action)[2].checkpoint_id,
        )
        notices.restart_needed(run, action, timeout=timeout)

    def timed_out() -> AwaitingDecision:
        return AwaitingDecision(
            f"nobody decided on the restart proposed for run {run.run_id} "
            f"({action.action_id}) within {timeout:g} s; it stays pending at the backend, and "
            "running the flow again re-attaches and asks again",
            run_id=run.run_id,
        )

    decision = await asking.ask(
        RestartDecision,
        key=pause_key(action),
        description=describe(run, action),
        asks=f"approve or reject a restart from {_spike(action)[2].checkpoint_id}",
        timeout=timeout,
        poll_interval=poll_interval,
        waiting=waiting,
        timed_out=timed_out,
    )
    if decision is not None:
        notices.restart_answered(
            action,
            decision=decision.decision,
            decided_by=decision.decided_by,
            reason=decision.reason,
        )
    return decision


async def ask_and_log(run: TrainingRun, *, timeout: float) -> DecisionRequest | None:
    """Ask a person (see :func:`ask_person`), log what they decided, and return it for the backend.

    Returns None when the flow run was cancelled while waiting.
    """
    decision = await ask_person(
        run, timeout=timeout, poll_interval=current_settings().state_poll_seconds
    )
    if decision is None:
        return None
    get_run_logger().info(
        "%s %s the restart: %s",
        decision.decided_by,
        "approved" if decision.approves else "rejected",
        decision.reason,
    )
    return decision.to_request()
