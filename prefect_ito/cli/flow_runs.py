"""``prefect-ito status | cancel``: what became of a training flow run, and stopping it.

Both name a flow run by its id and say where each fact comes from: the backend, read just now
with this machine's token, or else the flow run's last progress card in Prefect, with its time,
as possibly stale. Both are one view (:class:`prefect_ito.reporting.run_view.RunView`): a card's
numbers are read from its metadata's JSON document (or an older card's numeric strings), never
parsed out of its text; a card older than its numbers shows its text, its numbers null.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterType,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import ArtifactSort
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Cancelling
from rich.console import Console

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import resolve_credentials
from prefect_ito.cli import terminal, views
from prefect_ito.cli.errors import respond
from prefect_ito.cli.output import JsonOption
from prefect_ito.contract import RunState, TrainingRun
from prefect_ito.exceptions import FlowRunNotFound, ItoError, PrefectServerRequired
from prefect_ito.reporting.run_view import RunView
from prefect_ito.waiting.cancellation import (
    attached_run_id,
    cancel_supervised_run,
    followed_run,
)
from prefect_ito.waiting.recovery import may_hold_a_process

__all__ = ["cancel", "read_flow_run", "require_server", "status"]

_console = Console()


def status(flow_run_id: UUID, *, json_output: JsonOption = False) -> None:
    """Show a training flow run: its state, backend run, stage, spend and any pending decision.

    Also the forecast of spend at completion and time to finish while the run goes on, and what
    holding it has cost while a decision holds it (counted to now). The backend run is read from
    the backend when this machine can (a token for the flow run's backend, whose origin this
    process allows); otherwise it is the flow run's last progress card in Prefect, shown with
    its time, as possibly stale, and why the backend was not asked.

    Args:
        flow_run_id: The ito-training (or ito-attach-training) flow run.
    """
    respond(
        json_output, _read_status(flow_run_id), lambda shown: views.print_status(_console, shown)
    )


async def _read_status(flow_run_id: UUID) -> dict[str, Any]:
    require_server("status")
    flow_run = await read_flow_run(flow_run_id)
    state = flow_run.state
    try:
        async with await backend_client(flow_run) as client:
            backend_run = _run_facts(await followed_run(client, flow_run))
    except ItoError as error:  # not logged in, origin not allowed, backend down, …
        backend_run = await _card_facts(flow_run_id, stale_because=str(error))
    return {
        "flow_run_id": str(flow_run_id),
        "flow_run_name": flow_run.name,
        "state_name": state.name if state else None,
        "state_message": state.message if state else None,
        "ended": bool(state and state.is_final()),
        "backend_run": backend_run,
    }


async def backend_client(flow_run: FlowRun) -> ItoClient:
    """Return a client for the flow run's backend, if this process may send it a token.

    Raises:
        ItoError: No token here, an origin this process does not allow, no backend named.
    """
    credentials = dict(flow_run.parameters or {}).get("credentials")
    return (await resolve_credentials(credentials)).get_client()


def _run_facts(run: TrainingRun | None) -> RunView | None:
    """Return what status shows of a backend run read from the backend just now."""
    return RunView.of(run) if run is not None else None


async def _card_facts(flow_run_id: UUID, *, stale_because: str) -> RunView | None:
    """Return what the flow run's last progress card said, with its time and why only it."""
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                type=ArtifactFilterType(any_=["progress"]),
            ),
            sort=ArtifactSort.UPDATED_DESC,
        )
    cards = [a for a in found if (a.key or "").startswith("ito-progress-") and a.metadata_]
    if not cards:
        return None
    return RunView.from_card(
        dict(cards[0].metadata_ or {}), written_at=cards[0].updated, stale_because=stale_because
    )


def cancel(flow_run_id: UUID, *, json_output: JsonOption = False) -> None:
    """Cancel a training flow run and its backend workload (never the booking).

    Says what it did and what it left to others: the backend run is cancelled from here when
    no process runs the flow (suspended, already ended, or its process gone: three of its
    heartbeats missed) and this machine holds a token for its backend; otherwise the flow's
    worker (its on_cancellation hook) or the cancel-on-cancelled Automation does it. A flow run
    no process holds is then marked Cancelled from here too, since nobody else would. Then it
    names the backend run and its state.

    Args:
        flow_run_id: The ito-training flow run.
    """
    respond(
        json_output, _request_cancel(flow_run_id), lambda sent: views.print_cancel(_console, sent)
    )


async def _request_cancel(flow_run_id: UUID) -> dict[str, Any]:
    require_server("cancel")
    flow_run = await read_flow_run(flow_run_id)
    state = flow_run.state
    ended = state is not None and state.is_final()
    try:
        client = await backend_client(flow_run)  # checked before anything is touched
    except ItoError as error:
        if ended:  # nothing would be done at all: say why, and change nothing
            raise
        await _set_cancelling(flow_run_id)
        backend_run = await _card_facts(flow_run_id, stale_because=str(error))
        return _cancelled(flow_run, requested=True, here=False, backend_run=backend_run)
    async with client:
        stranded = not ended and not await may_hold_a_process(flow_run)
        if not ended:  # first: a process that does hold it stops, and cancels nothing twice
            await _set_cancelling(flow_run_id)
        sent = await _cancel_at_backend(client, flow_run, requested=not ended, stranded=stranded)
    if stranded and sent["backend_settled"]:
        # Nobody else would end it: no process holds it, and Prefect ends a Cancelling run only
        # through one. Only once its own backend run was cancelled (or it had none).
        await _set_cancelled(flow_run_id, sent)
        sent["flow_run_cancelled_here"] = True
    return sent


async def _cancel_at_backend(
    client: ItoClient, flow_run: FlowRun, *, requested: bool, stranded: bool = False
) -> dict[str, Any]:
    state = flow_run.state
    no_process = state is None or state.is_final() or stranded
    try:
        if not no_process:  # the flow's own process cancels it as it stops
            run = await followed_run(client, flow_run)
            return _cancelled(
                flow_run, requested=requested, here=False, backend_run=_run_facts(run)
            )
        outcome = await cancel_supervised_run(client, flow_run)
    except ItoError as error:
        backend_run = await _card_facts(flow_run.id, stale_because=str(error))
        return _cancelled(flow_run, requested=requested, here=False, backend_run=backend_run)
    return _cancelled(
        flow_run,
        requested=requested,
        here=outcome.cancelled_now,
        backend_run=_run_facts(outcome.run),
        settled=True,
    )


def _cancelled(
    flow_run: FlowRun,
    *,
    requested: bool,
    here: bool,
    backend_run: RunView | None,
    settled: bool = False,
) -> dict[str, Any]:
    """Return what cancel did, what it left to others (and to whom), and the backend run;
    ``settled``: the backend said the run this flow run made is cancelled or ended, or that it
    made none."""
    state = flow_run.state
    suspended = state is not None and bool(state.state_details.pause_reschedule)
    finished = (
        backend_run is not None
        and backend_run.source == "backend"
        and (backend_run.state in _FINISHED)
    )
    follows = attached_run_id(flow_run)
    left_to = None
    if not here and not finished and requested and follows is None:
        left_to = "automation" if suspended else "flow_process"
    return {
        "flow_run_id": str(flow_run.id),
        "flow_run_state_before": state.name if state else None,
        # An attach flow run follows a run it did not make: its cancel only detaches.
        "follows_run_id": follows,
        "cancel_requested_in_prefect": requested,
        "flow_run_cancelled_here": False,
        "backend_cancelled_here": here,
        "backend_settled": settled and (backend_run is None or finished or here),
        "left_to": left_to,
        "backend_run": backend_run,
    }


_FINISHED = frozenset(s.value for s in RunState if s.terminal)


async def _set_cancelling(flow_run_id: UUID) -> None:
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelling(), force=True)


async def _set_cancelled(flow_run_id: UUID, sent: dict[str, Any]) -> None:
    """Mark a flow run no process holds Cancelled, saying so and what became of its run."""
    facts: RunView | None = sent["backend_run"]
    run = f"backend run {facts.run_id} is {facts.state}" if facts else "no backend run"
    message = f"Cancelled by prefect-ito cancel: no flow process held the run; {run}."
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)


async def read_flow_run(flow_run_id: UUID) -> FlowRun:
    """Return the flow run as Prefect has it.

    Raises:
        FlowRunNotFound: Prefect knows no such flow run.
    """
    async with get_client() as client:
        try:
            return await client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            raise FlowRunNotFound(f"Prefect knows no flow run {flow_run_id}") from None


def require_server(command: str) -> None:
    """End ``prefect-ito <command>`` unless a real Prefect server is configured.

    Raises:
        PrefectServerRequired: Only an ephemeral API, which only the terminal that started
            the flow can reach.
    """
    if not terminal.has_real_server():
        raise PrefectServerRequired(
            f"`prefect-ito {command}` needs a real Prefect server: set PREFECT_API_URL. "
            "In ephemeral mode only the terminal that started the flow can reach it."
        )
