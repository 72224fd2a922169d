"""Asking a person whether a proposed loss-spike restart may go ahead.

The backend holds the run and proposes a restart; only a person decides. The main flow (never a
subflow: Prefect cannot suspend subflows) waits for a typed :class:`RestartDecision`, which the
Prefect UI renders as a form under the spike's context. A flow run from a deployment suspends,
holding no infrastructure while it waits; any other flow run pauses in its process.
"""

from __future__ import annotations

import asyncio
import re

from prefect import get_run_logger
from prefect.flow_runs import apause_flow_run, asuspend_flow_run
from prefect.input import RunInput
from pydantic import Field

from prefect_ito.cancellation import stop_requested
from prefect_ito.contract import (
    CheckpointRef,
    DecisionChoice,
    DecisionRequest,
    PendingAction,
    TrainingRun,
)
from prefect_ito.exceptions import AwaitingDecision
from prefect_ito.flow_run import can_suspend
from prefect_ito.settings import ItoSettings

PAUSE_MARGIN_SECONDS = 5.0
"""How long before Prefect's own pause deadline an in-process wait gives up by itself."""


class RestartDecision(RunInput):
    """A person's answer to a proposed loss-spike restart."""

    approve: bool = Field(
        default=False,
        description="Tick to restart from the proposed checkpoint; leave unticked to reject.",
    )
    decided_by: str = Field(
        min_length=1, description="Your name, as the backend should record who decided."
    )
    reason: str = Field(min_length=1, description="Why: recorded with the decision.")

    def to_request(self) -> DecisionRequest:
        """Return the decision as the backend's contract states it."""
        choice = DecisionChoice.APPROVE if self.approve else DecisionChoice.REJECT
        return DecisionRequest(decision=choice, decided_by=self.decided_by, reason=self.reason)


def pause_key(action: PendingAction) -> str:
    """Return the pause key for an action: stable across re-entries, letters digits and dashes."""
    return "restart-" + re.sub(r"[^a-zA-Z0-9-]+", "-", action.action_id).strip("-").lower()


def _spike(action: PendingAction) -> tuple[float, float, CheckpointRef]:
    """Return a loss-spike restart's loss, baseline loss and proposed checkpoint.

    The contract requires them of a ``loss_spike_restart``, the only kind put to a person.
    """
    loss, baseline, checkpoint = action.loss, action.baseline_loss, action.proposed_checkpoint
    if loss is None or baseline is None or checkpoint is None:
        raise ValueError(f"action {action.action_id} ({action.kind}) is not a loss-spike restart")
    return loss, baseline, checkpoint


def describe(run: TrainingRun, action: PendingAction) -> str:
    """Return the markdown a person reads above the decision form."""
    loss, baseline, checkpoint = _spike(action)
    rise = loss - baseline
    return "\n".join(
        [
            f"### Loss spike in `{action.stage}` — restart proposed",
            "",
            f"The Itô desk backend holds run `{run.run_id}` (booking `{run.booking_id}`) and "
            "proposes to restart from an earlier checkpoint. Nothing restarts until a person "
            "decides; prefect-ito never decides by itself.",
            "",
            "| | |",
            "|---|---|",
            f"| step | {action.step} |",
            f"| loss | {loss:.4f} (baseline {baseline:.4f}, +{rise:.4f}) |",
            f"| proposed checkpoint | `{checkpoint.checkpoint_id}` (step {checkpoint.step}) |",
            f"| proposed at | {action.proposed_at.isoformat()} |",
            "",
            "**Approve** restarts from that checkpoint; **reject** lets the run go on as it is.",
        ]
    )


async def ask_person(
    run: TrainingRun, *, timeout: float, poll_interval: float
) -> RestartDecision | None:
    """Wait for a person's decision on the run's pending action; None if the flow run was cancelled.

    A flow run from a deployment (and no subflow) suspends: that ends this process, and Prefect
    re-runs the flow from the top once resumed, where the stable pause key returns the same answer
    without asking again. Any other flow run pauses in-process, watching for a cancellation, and
    gives up :data:`PAUSE_MARGIN_SECONDS` before Prefect's own deadline, after which the server
    would turn any final state into "never resumed".

    Raises:
        AwaitingDecision: nobody decided in time; the action stays pending at the backend.
    """
    action = run.pending_action
    if action is None:
        raise ValueError(f"run {run.run_id} waits for no decision")
    get_run_logger().warning(
        "Loss spike in %s at step %d: the backend proposes a restart from %s and holds the run. "
        "Waiting for a person to approve or reject it (in the Prefect UI: Resume).",
        action.stage,
        action.step,
        _spike(action)[2].checkpoint_id,
    )
    form = RestartDecision.with_initial_data(description=describe(run, action))
    if can_suspend():
        return await asuspend_flow_run(
            wait_for_input=form, timeout=int(timeout), key=pause_key(action)
        )
    pause = asyncio.ensure_future(
        apause_flow_run(
            wait_for_input=form,
            timeout=int(timeout),
            poll_interval=max(1, int(poll_interval)),
            key=pause_key(action),
        )
    )
    try:
        return await _first_of(pause, poll_interval, max(0.0, timeout - PAUSE_MARGIN_SECONDS))
    except TimeoutError:
        raise AwaitingDecision(
            f"nobody decided on the restart proposed for run {run.run_id} "
            f"({action.action_id}) within {timeout:g} s; it stays pending at the backend, and "
            "running the flow again re-attaches and asks again",
            run_id=run.run_id,
        ) from None
    finally:
        pause.cancel()


async def _first_of(
    pause: asyncio.Future[RestartDecision], poll_interval: float, give_up_after: float
) -> RestartDecision | None:
    async with asyncio.timeout(give_up_after):
        while True:
            done, _ = await asyncio.wait({pause}, timeout=poll_interval)
            if done:
                return pause.result()
            if await stop_requested(None):
                return None


async def ask_and_log(run: TrainingRun, *, timeout: float) -> DecisionRequest | None:
    """Ask a person (see :func:`ask_person`), log what they decided, and return it for the backend.

    Returns None when the flow run was cancelled while waiting.
    """
    decision = await ask_person(
        run, timeout=timeout, poll_interval=ItoSettings().state_poll_seconds
    )
    if decision is None:
        return None
    get_run_logger().info(
        "%s %s the restart: %s",
        decision.decided_by,
        "approved" if decision.approve else "rejected",
        decision.reason,
    )
    return decision.to_request()
