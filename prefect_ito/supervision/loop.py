"""The one supervision loop: start or re-attach, then follow the backend run to its end.

:func:`start` and :func:`supervise` say *what* happens, in which order; a
:class:`~prefect_ito.supervision.steps.Steps` says *how* each step is done. The ``ito-training``
flow performs every operation as a Prefect task (so each shows in the UI, with retries where they
are safe); :class:`~prefect_ito.jobs.ItoTrainingRun` performs the same operations plainly over one
client. Both therefore verify, quote, wait for a person, submit, report, ask people and stop on
request in exactly the same way, and only ``submit_training_run`` creates work — reached from
:func:`start` only after nothing could be re-attached, and only on a quote the backend says a
person confirmed or an authorization covers (see :mod:`prefect_ito.people.spend`); the backend
decides, and refuses anything else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prefect_ito.backend import gates
from prefect_ito.backend.desk import BookingClaim
from prefect_ito.backend.operations import (
    CANCEL_TRAINING_WORKLOAD,
    CHECK_TRAINING_CAPABILITY,
    FIND_ATTACHABLE_RUN,
    TRANSIENT_FAULTS,
    VERIFY_BOOKING,
)
from prefect_ito.contract import ConfirmationRecord, ConfirmationVia, TrainingRequest, TrainingRun
from prefect_ito.exceptions import Detached, InsufficientScope, TerminalClosed
from prefect_ito.people import spend
from prefect_ito.reporting import report as reporting
from prefect_ito.supervision.steps import Steps
from prefect_ito.waiting.cancellation import closed_terminal_message

__all__ = ["CancelRequested", "OtherAsker", "start", "stop_for_cancel", "supervise"]


class CancelRequested(Exception):
    """A person asked Prefect to cancel the flow run while it supervised ``run``."""

    def __init__(self, run: TrainingRun) -> None:
        super().__init__(run.run_id)
        self.run = run


async def start(
    steps: Steps,
    claim: BookingClaim,
    request: TrainingRequest,
    idempotency_key: Callable[[], str],
    client_reference: str | None = None,
) -> TrainingRun:
    """Re-attach to the run the backend says this request made (under its client reference
    or its key); otherwise verify, check, quote, have the spend confirmed, and submit it once.

    Re-attaching comes first, so a re-entered supervisor never verifies again a booking the
    backend already accepted work for, nor asks anyone again. ``client_reference`` (the flow
    run's id) finds the run this supervisor submitted however long ago, after its idempotency
    key expired too, and goes with the submission. The run this supervisor recorded in Prefect
    is only a hint (see :mod:`prefect_ito.backend.ownership`): whoever can write in Prefect
    cannot make a flow run follow another run.
    """
    attachable = await steps.perform(
        FIND_ATTACHABLE_RUN,
        request,
        idempotency_key(),
        client_reference,
        steps.logger,
        await steps.recorded_run_id(),
    )
    if attachable is not None:
        steps.logger.info(
            "Re-attached to backend run %s (%s), %s: nothing is quoted, confirmed or submitted "
            "again.",
            attachable.run_id,
            attachable.state.value,
            f"which this flow run submitted (client reference {client_reference})"
            if client_reference is not None and attachable.client_reference == client_reference
            else "which the backend says this request made",
        )
        await steps.record_run(attachable)
        return attachable
    eligibility = await steps.perform(VERIFY_BOOKING, claim)
    steps.logger.info(
        "Booking %s verified: %s × %d nodes × %d GPUs on %s.",
        eligibility.booking_id,
        eligibility.gpu_sku,
        eligibility.node_count,
        eligibility.gpus_per_node,
        eligibility.fabric,
    )
    await steps.perform(CHECK_TRAINING_CAPABILITY, request)
    run = await spend.submit_with_consent(steps, request, idempotency_key(), client_reference)
    on_record = run.confirmation
    steps.logger.info(
        "Delegated to the Itô desk backend as run %s%s.",
        run.run_id,
        _allowed_by(on_record) if on_record is not None else "",
    )
    await steps.record_run(run)
    return run


def _allowed_by(record: ConfirmationRecord) -> str:
    """Say who allowed the spend, as the backend recorded it."""
    if record.via == ConfirmationVia.STANDING_AUTHORIZATION:
        return f", under the standing authorization {record.authorization} of {record.confirmed_by}"
    return f", confirmed at the backend by {record.confirmed_by}"


OtherAsker = Callable[[], Awaitable[str | None]]
"""Returns who else asks the run's questions (the flow run that made it) while it is there to
ask them, else None: then this supervisor asks."""


async def supervise(
    steps: Steps, run: TrainingRun, other_asker: OtherAsker | None = None
) -> TrainingRun:
    """Follow the backend's own stage plan until the run ends; ask people to decide restarts.

    ``other_asker`` says, at each question, whether the flow run that made the run asks it
    (:func:`~prefect_ito.backend.ownership.asks_its_questions`): then the decision is waited
    for without asking anyone, so that each question is put to people once.

    Raises:
        CancelRequested: a person cancelled the flow run; the caller cancels the workload.
        Detached: the person at the terminal detached; the backend run goes on.
        TerminalClosed: the terminal went away; the backend run goes on.
        RunStalled, DeadlineExceeded: a watchdog limit passed; the backend run goes on.
    """
    seen, watchdog = await steps.resume_point(run)
    before, noted = None, set[str]()
    _log_provenance(steps)
    try:
        while True:
            seen = await _report(steps, run, seen)
            for line in reporting.stage_changes(before, run):
                steps.logger.info("%s", line)
            before = run
            if run.finished:
                await steps.settle(run, seen)
                return run
            if await steps.interrupted():
                raise CancelRequested(run)
            _note_unknown(steps, run, noted)
            if run.pending_action is not None and gates.decidable(run.pending_action):
                # A person decides at the backend; the flow only waits to be told (v0.5).
                owner = await other_asker() if other_asker is not None else None
                if owner is not None and other_asker is not None:
                    decided = await steps.await_owner(run, owner, other_asker)
                else:
                    decided = await steps.await_decision(run)
                if decided is None:
                    raise CancelRequested(run)
                run = decided
                continue
            run = await steps.await_gate(run, watchdog, seen)
    except Detached:
        raise Detached(
            f"detached at the terminal: backend run {run.run_id} goes on; re-attach with "
            f"`prefect-ito attach {run.run_id}`"
        ) from None
    except TerminalClosed:
        raise TerminalClosed(closed_terminal_message(run.run_id)) from None


async def stop_for_cancel(steps: Steps, run: TrainingRun) -> tuple[TrainingRun, str]:
    """Cancel the workload of a cancelled flow run; return the last run seen and what happened."""
    steps.logger.info("Cancellation requested: cancelling backend workload %s.", run.run_id)
    try:
        final = await steps.perform(
            CANCEL_TRAINING_WORKLOAD,
            run.run_id,
            reason="the Prefect flow run was cancelled",
            confirm_seconds=steps.cancel_confirm_seconds,
        )
    except InsufficientScope as error:
        # The flow run is cancelled either way; say plainly that the workload was not.
        return run, (
            f"Backend workload {run.run_id} was NOT cancelled and goes on: {error.message}; "
            "cancel it with a token that carries training:cancel"
        )
    if final.finished:
        return final, f"Backend workload {run.run_id} cancelled ({final.state.value})."
    return final, (
        f"Cancel of backend workload {run.run_id} is unconfirmed: it was still "
        f"{final.state.value} after {steps.cancel_confirm_seconds:g} s."
    )


def _log_provenance(steps: Steps) -> None:
    """Say in the flow's log where the backend's answers come from (a warning if surprising)."""
    provenance = steps.provenance()
    if provenance is None:
        return
    if provenance.surprising:
        steps.logger.warning("%s", provenance.warning())
    steps.logger.info("%s", provenance.describe())


def _note_unknown(steps: Steps, run: TrainingRun, noted: set[str]) -> None:
    """Say once what of the run this prefect-ito does not know, and that supervision goes on."""
    if not run.state.known and f"state:{run.state.value}" not in noted:
        noted.add(f"state:{run.state.value}")
        steps.logger.warning(
            "Backend run %s is in state %r, which this prefect-ito does not know: it is treated "
            "as unfinished, and supervision goes on until the backend reports an end.",
            run.run_id,
            run.state.value,
        )
    action = run.pending_action
    if action is not None and not gates.decidable(action) and action.action_id not in noted:
        noted.add(action.action_id)
        steps.logger.warning(
            "Backend run %s waits for a decision on action %s of kind %r, which prefect-ito "
            "cannot put to a person: decide it with a tool that knows it. Supervision goes on.",
            run.run_id,
            action.action_id,
            action.kind.value,
        )


async def _report(steps: Steps, run: TrainingRun, seen: int) -> int:
    # A report that fails for a passing reason must never be what stops supervision: the events
    # are read again from the same sequence next time round, so nothing is lost.
    try:
        return await steps.report(run, seen)
    except TRANSIENT_FAULTS as error:  # only delays a report: it is made next time round
        steps.logger.warning("Could not report on run %s this time: %s", run.run_id, error)
        return seen
