"""A loss-spike restart: the backend holds a run whose loss spiked, and proposes to restart it
from an earlier checkpoint. Approved, it restarts; rejected, it goes on as it is."""

from __future__ import annotations

from typing import ClassVar

from prefect_ito.contract import (
    ActionKind,
    CheckpointRef,
    DecisionChoice,
    PendingAction,
    TrainingRun,
)
from prefect_ito.questions.registry import ActionQuestion, Kind, register
from prefect_ito.reporting import charts, moments
from prefect_ito.reporting import markdown as md

__all__ = ["RESTART", "Restart"]


def _spike(action: PendingAction) -> tuple[float, float, CheckpointRef]:
    """Return the spike's loss, its baseline and the proposed checkpoint (the contract requires
    them of a ``loss_spike_restart``)."""
    loss, baseline, checkpoint = action.loss, action.baseline_loss, action.proposed_checkpoint
    if loss is None or baseline is None or checkpoint is None:
        raise ValueError(f"action {action.action_id} ({action.kind}) is not a loss-spike restart")
    return loss, baseline, checkpoint


class Restart(ActionQuestion):
    """A proposed restart after a loss spike."""

    kind: ClassVar[ActionKind] = ActionKind.LOSS_SPIKE_RESTART
    name: ClassVar[Kind] = "restart"
    noun: ClassVar[str] = "a restart to decide"
    subject: ClassVar[str] = "the restart"
    label: ClassVar[str] = "restart"

    def heading(self, action: PendingAction) -> str:
        return f"Loss spike in {md.code(action.stage)} — a restart is proposed"

    def situation(self, run: TrainingRun, action: PendingAction) -> str:
        return (
            f"The Itô desk backend holds run {md.code(run.run_id)} (booking "
            f"{md.code(run.booking_id)}) at step {action.step:,} and proposes to restart from an "
            "earlier checkpoint."
        )

    def rows(self, run: TrainingRun, action: PendingAction) -> list[tuple[str, str]]:
        loss, baseline, checkpoint = _spike(action)
        times = f" ({loss / baseline:.1f}×)" if baseline > 0 else ""
        return [
            ("spike", f"loss {loss:.2f} at step {action.step:,}"),
            ("baseline", f"loss {baseline:.2f}{times}"),
            ("restart from", md.code(checkpoint.checkpoint_id, cell=True)),
            ("its step", f"{checkpoint.step:,} ({action.step - checkpoint.step:,} steps back)"),
        ]

    def chart(self, run: TrainingRun, action: PendingAction) -> str | None:
        svg = charts.draw(charts.loss_chart(run), width=charts.FORM_WIDTH, height=280)
        return charts.markdown_image(svg, "Training loss by step, up to the spike")

    def choices(self, action: PendingAction) -> dict[DecisionChoice, str]:
        _, _, checkpoint = _spike(action)
        back = action.step - checkpoint.step
        return {
            DecisionChoice.APPROVE: f"the backend restarts from {md.code(checkpoint.checkpoint_id)}"
            f" at step {checkpoint.step:,} and trains the {back:,} steps since again; spend "
            "goes on meanwhile.",
            DecisionChoice.REJECT: f"the run goes on from step {action.step:,} as it is, "
            "without restarting.",
        }

    def asked(self, run: TrainingRun, action: PendingAction) -> str:
        return (
            f"Approve or reject a loss-spike restart of run {run.run_id} (booking {run.booking_id})"
        )

    def evidence(self, action: PendingAction) -> str:
        loss, baseline, checkpoint = _spike(action)
        return (
            f"loss {loss:.2f} at step {action.step:,} in {action.stage} (baseline "
            f"{baseline:.2f}); proposed restart from {checkpoint.checkpoint_id} "
            f"(step {checkpoint.step:,})"
        )

    def numbers(self, action: PendingAction) -> dict[str, float]:
        loss, baseline, checkpoint = _spike(action)
        return {
            "loss": loss,
            "baseline_loss": baseline,
            "step": float(action.step),
            "checkpoint_step": float(checkpoint.step),
        }

    def facts(self, action: PendingAction) -> list[tuple[str, str]]:
        loss, _, checkpoint = _spike(action)
        return [
            ("loss spike", f"{loss:.2f} at step {action.step:,} in {action.stage}"),
            ("restart checkpoint", f"{checkpoint.checkpoint_id} (step {checkpoint.step:,})"),
        ]

    def status(self, action: PendingAction) -> str:
        loss, _, checkpoint = _spike(action)
        return (
            f"loss spike {loss:.2f} at step {action.step:,} in {action.stage}: restart from "
            f"{checkpoint.checkpoint_id} (step {checkpoint.step:,}) proposed, "
            f"{moments.said_asked(action)}"
        )

    def outcome(self, decision: DecisionChoice, action: PendingAction | None) -> str:
        if decision is DecisionChoice.REJECT:
            return "rejected: the run went on without restarting"
        checkpoint = action.proposed_checkpoint if action is not None else None
        where = f" from step {checkpoint.step:,}" if checkpoint is not None else ""
        return f"approved: the run restarted{where}"

    def waiting(self, action: PendingAction) -> str:
        _, _, checkpoint = _spike(action)
        return (
            f"Loss spike in {action.stage} at step {action.step}: the backend proposes a restart "
            f"from {checkpoint.checkpoint_id} and holds the run. Waiting for a person to approve "
            "or reject it at the backend"
        )

    def asks(self, action: PendingAction) -> str:
        return f"approve or reject a restart from {_spike(action)[2].checkpoint_id} at the backend"


RESTART = register(Restart())
