"""How supervision stops on request: a person cancels, or the person at the terminal detaches.

A **cancel** stops the backend workload (never the booking). Prefect delivers it differently by
where the flow runs — to nothing in a plain process (supervision asks for it between polls, see
:func:`cancellation_requested`), to the ``on_cancellation`` hook under a worker
(:func:`cancel_for_flow_run`), and to no code at all for a suspended run (an Automation runs the
``ito-cancel-training`` flow, which calls the same function).

A **detach** (Ctrl-C at ``prefect-ito train``) stops only the supervising: the backend run goes
on, and ``prefect-ito attach RUN_ID`` or running the same request again re-attaches. A **closed
terminal** (a hangup or termination signal at ``prefect-ito train``) stops it the same way, and
the flow run's end says the terminal went away: a question it asked is left open, never declined.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.objects import FlowRun

from prefect_ito.backend import desk, ownership
from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import resolve_credentials
from prefect_ito.contract import TrainingRun, id_problem
from prefect_ito.exceptions import Detached, RunNotFound, TerminalClosed
from prefect_ito.parameters import TrainingParameters, resolve_booking, submission_key
from prefect_ito.waiting.flow_run import current_flow_run_id

__all__ = [
    "DETACHED_AT_TERMINAL",
    "TERMINAL_WENT_AWAY",
    "CancelOutcome",
    "attached_run_id",
    "cancel_asked",
    "cancel_for_flow_run",
    "cancel_supervised_run",
    "cancel_workload_of",
    "cancellation_requested",
    "closed_terminal_message",
    "followed_run",
    "raise_if_detached",
    "request_detach",
    "request_stop_for_closed_terminal",
    "stop_requested",
    "supervised_run",
]

DETACHED_AT_TERMINAL = "detached at the terminal"
"""How every message of a detach begins; the terminal shows such lines calmly, not as errors."""

TERMINAL_WENT_AWAY = "the terminal went away"
"""How every message of a stop for a closed terminal begins."""

_detach = threading.Event()
_closed_by: list[str] = []
"""The signal that closed the terminal of this process, once one did."""


def request_detach() -> None:
    """Ask supervision in this process to stop at its next check, leaving the backend run be."""
    _detach.set()


def request_stop_for_closed_terminal(signal_name: str) -> None:
    """Ask supervision in this process to stop at its next check: ``signal_name`` (SIGHUP,
    SIGTERM) says the terminal went away. The backend run, and any open question, are left be."""
    if not _closed_by:
        _closed_by.append(signal_name)
    _detach.set()


def closed_terminal_message(run_id: str | None = None) -> str:
    """Say that the terminal went away, by which signal, and what that left as it was."""
    signal_name = _closed_by[0] if _closed_by else "a signal"
    goes_on = (
        f"backend run {run_id} goes on unsupervised; re-attach with `prefect-ito attach {run_id}`"
        if run_id is not None
        else "a backend run already submitted goes on unsupervised"
    )
    return (
        f"{TERMINAL_WENT_AWAY} ({signal_name}): nothing was declined or spent, a question it "
        f"asked is left to others, and {goes_on}"
    )


def raise_if_detached() -> None:
    """Raise :class:`Detached` once :func:`request_detach` was called in this process, or
    :class:`TerminalClosed` once :func:`request_stop_for_closed_terminal` was."""
    if _closed_by:
        raise TerminalClosed(closed_terminal_message())
    if _detach.is_set():
        raise Detached(
            f"{DETACHED_AT_TERMINAL}: the backend run goes on; re-attach with "
            "`prefect-ito attach RUN_ID`"
        )


async def cancellation_requested(flow_run_id: UUID | None = None) -> bool:
    """Tell whether someone asked Prefect to cancel the flow run (default: the current one).

    A flow run that no runner or worker executes never hears of its cancellation, so
    supervision asks for it between polls and while paused.
    """
    flow_run_id = flow_run_id or current_flow_run_id()
    if flow_run_id is None:
        return False
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
    return cancel_asked(flow_run)


def cancel_asked(flow_run: FlowRun) -> bool:
    """Tell whether Prefect's server holds ``flow_run`` as cancelling or cancelled."""
    state = flow_run.state
    return state is not None and (state.is_cancelling() or state.is_cancelled())


async def stop_requested(flow_run_id: UUID | None) -> bool:
    """Tell whether the flow run was cancelled; raise :class:`Detached` on a detach."""
    raise_if_detached()
    return await cancellation_requested(flow_run_id)


class CancelOutcome(NamedTuple):
    """What a cancel found at the backend: the run as it stands after, and whether this cancel
    is what stopped it (False: it had already ended, or no backend run was found)."""

    run: TrainingRun | None
    cancelled_now: bool


async def cancel_for_flow_run(flow: Any, flow_run: FlowRun, state: Any) -> None:
    """Cancel the backend workload that a cancelled ``ito-training`` flow run supervised.

    The flow's ``on_cancellation`` hook, which Prefect runs in the worker after it killed the
    flow's process; see :func:`cancel_workload_of`. A crashed or evicted flow run is never
    cancelled this way: it is re-attached instead.
    """
    await cancel_workload_of(flow_run)


async def cancel_workload_of(flow_run: FlowRun) -> CancelOutcome:
    """Cancel the backend workload of a training flow run, with its own credentials parameter.

    Used by the ``on_cancellation`` hook and by the ``ito-cancel-training`` flow. It finds the
    workload from the flow run's own records (see :func:`supervised_run`), so it needs no state
    of its own.

    Returns:
        The backend run as it stands after the cancel, and whether this call cancelled it.
    """
    parameters = dict(flow_run.parameters or {})
    if "training" not in parameters:  # an attach flow run: it made no run, so it stops none
        return CancelOutcome(None, cancelled_now=False)
    creds = await resolve_credentials(parameters.get("credentials"))
    async with creds.get_client() as client:
        return await cancel_supervised_run(client, flow_run)


async def cancel_supervised_run(client: ItoClient, flow_run: FlowRun) -> CancelOutcome:
    """Cancel the backend run ``flow_run`` supervised, over ``client``; idempotent."""
    run = await supervised_run(client, flow_run)
    if run is None or run.finished:
        return CancelOutcome(run, cancelled_now=False)
    reason = f"Prefect flow run {flow_run.id} was cancelled"
    run = await desk.cancel_training_workload(client, run.run_id, reason=reason)
    return CancelOutcome(run, cancelled_now=True)


async def supervised_run(client: ItoClient, flow_run: FlowRun) -> TrainingRun | None:
    """Return the backend run a training flow run submitted, as the backend states it now.

    Only the backend says which run that is: the run whose client reference is the flow run's
    id (or, from a backend without references, the run the flow run's own idempotency key
    made). Nothing the flow run's parameters or records in Prefect name counts — anyone with
    Prefect API access writes those — so an ``ito-attach-training`` flow run, which follows a
    run it did not make, cancels nothing: cancelling it detaches. None when there is none: a
    flow run cancelled before it submitted stops nothing, not even another flow run's run of
    the same request on the booking.
    """
    parameters = dict(flow_run.parameters or {})
    if "training" not in parameters:
        return None
    training = TrainingParameters.parse(parameters["training"])
    request = training.to_request(await resolve_booking(training))
    key = submission_key(training, request, flow_run.id)
    return await ownership.find_submitted_run(client, request, key, str(flow_run.id))


def attached_run_id(flow_run: FlowRun) -> str | None:
    """Return the run id an ``ito-attach-training`` flow run was started on, to show it (it
    made no run, so nothing acts on it); None for a training flow run or a malformed id."""
    parameters = flow_run.parameters or {}
    run_id = parameters.get("run_id")
    if "training" in parameters or not isinstance(run_id, str) or id_problem(run_id):
        return None
    return run_id


async def followed_run(client: ItoClient, flow_run: FlowRun) -> TrainingRun | None:
    """Return the backend run a flow run follows, to show it: the run it submitted, or, for an
    ``ito-attach-training`` flow run, the run it was started on (shown, never acted on)."""
    run_id = attached_run_id(flow_run)
    if run_id is None:
        return await supervised_run(client, flow_run)
    try:
        return await client.get_training_run(run_id)
    except RunNotFound:
        return None
