"""Prefect tasks, each a thin wrapper over one step in :mod:`prefect_ito.backend.desk`.

Reads and idempotent writes may be retried by Prefect on transient failures (the client already
retried within a call).
:func:`delegate_training_run` is the one task that creates work on the backend; it submits only a
request whose spend was confirmed, and it has no Prefect retries: the client resolves a lost
answer by looking the run up by its idempotency key.
Every task opts out of caching, so a re-entered flow never reads a stale run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from prefect import State, Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.context import FlowRunContext

from prefect_ito.backend import desk
from prefect_ito.backend.desk import Watchdog
from prefect_ito.backend.provenance import Provenance, last_seen
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import (
    DecisionRequest,
    TrainingEligibility,
    TrainingQuote,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.exceptions import (
    InvalidParameters,
)
from prefect_ito.parameters import BookingClaim, SupervisionParameters
from prefect_ito.people import approval
from prefect_ito.reporting import event_relay
from prefect_ito.reporting import report as reporting
from prefect_ito.supervision.loop import STEP_RETRY_DELAYS_SECONDS, TRANSIENT_FAULTS, Steps
from prefect_ito.waiting import deferral, quote_wait
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.deferral import Deferral
from prefect_ito.waiting.flow_run import can_suspend, current_flow_run_id

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "TaskSteps",
    "await_stage_gate",
    "cancel_training_workload",
    "check_training_capability",
    "delegate_training_run",
    "quote_training_run",
    "read_training_run",
    "reattach_training_run",
    "relay_decision",
    "report_progress",
    "verify_booking",
]


def _transient(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only what may pass by itself (``supervision.TRANSIENT_FAULTS``)."""
    error = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    return isinstance(error, TRANSIENT_FAULTS)


def _retried_task(
    name: str, description: str, task_run_name: str | None = None
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Return the decorator for a task that reads, or writes idempotently: Prefect may retry it."""
    return task(
        name=name,
        description=description,
        task_run_name=task_run_name,
        retries=len(STEP_RETRY_DELAYS_SECONDS),
        retry_delay_seconds=list(STEP_RETRY_DELAYS_SECONDS),
        retry_condition_fn=_transient,
        cache_policy=NO_CACHE,
    )


@_retried_task("verify_booking", "Ask the backend whether the booking may train.")
async def verify_booking(credentials: ItoCredentials, claim: BookingClaim) -> TrainingEligibility:
    """Return the booking's eligibility; raise ``BookingNotEligible`` when it may not train."""
    async with credentials.get_client() as client:
        return await desk.verify_booking(client, claim)


@_retried_task("check_training_capability", "Stop unless the backend says training_run is live.")
async def check_training_capability(credentials: ItoCredentials, request: TrainingRequest) -> None:
    """Raise ``CapabilityNotAvailable`` when the backend cannot train."""
    async with credentials.get_client() as client:
        await desk.check_training_capability(client, request)


@_retried_task(
    "reattach_training_run",
    "Find this request's backend run, if any: made under its client reference or idempotency "
    "key, or unfinished on the booking.",
)
async def reattach_training_run(
    credentials: ItoCredentials,
    request: TrainingRequest,
    idempotency_key: str,
    client_reference: str | None = None,
) -> TrainingRun | None:
    """Return this request's run (``desk.find_attachable_run``); raise
    ``ClientReferenceInUse`` or ``IdempotencyKeyReused`` when the reference or the key made a
    run of another request, ``BookingBusy`` for another request's unfinished run."""
    async with credentials.get_client() as client:
        return await desk.find_attachable_run(
            client, request, idempotency_key, client_reference, get_run_logger()
        )


@task(
    name="delegate_training_run",
    description="Hand the training request to the Itô desk backend, exactly once.",
    cache_policy=NO_CACHE,
)
async def delegate_training_run(
    credentials: ItoCredentials,
    request: TrainingRequest,
    quote_id: str,
    authorization_id: str | None,
    idempotency_key: str,
    client_reference: str | None = None,
) -> TrainingRun:
    """Submit the request on ``quote_id`` under ``idempotency_key`` (and ``client_reference``,
    where the backend takes one): the one task that creates work, if the backend allows it."""
    async with credentials.get_client() as client:
        return await desk.submit(
            client, request, quote_id, authorization_id, idempotency_key, client_reference
        )


@_retried_task("read_training_quote", "Read the quote as the backend states it now.")
async def read_training_quote(
    credentials: ItoCredentials, request: TrainingRequest, quote_id: str
) -> TrainingQuote | None:
    """Return the quote, if it is one of ``request`` (``desk.read_quote``)."""
    async with credentials.get_client() as client:
        return await desk.read_quote(client, request, quote_id)


@_retried_task(
    "decline_training_quote", "Decline the quote at the backend: nothing is spent on it."
)
async def decline_training_quote(
    credentials: ItoCredentials, quote_id: str, note: str | None
) -> None:
    """Decline the quote at the backend (``desk.decline_quote``)."""
    async with credentials.get_client() as client:
        await desk.decline_quote(client, quote_id, note)


@_retried_task(
    "quote_training_run", "Ask the backend for the plan and the estimate; creates no work."
)
async def quote_training_run(
    credentials: ItoCredentials, request: TrainingRequest
) -> TrainingQuote:
    """Return the backend's quote for the request: plan preview, estimate, manifest digest."""
    async with credentials.get_client() as client:
        return await desk.quote(client, request)


@_retried_task("read_training_run", "Read a backend training run by its id.")
async def read_training_run(credentials: ItoCredentials, run_id: str) -> TrainingRun:
    """Return the backend run ``run_id``; raise ``RunNotFound`` when there is none."""
    async with credentials.get_client() as client:
        return await client.get_training_run(run_id)


@_retried_task(
    "await_stage_gate",
    "Long-poll the run until the current stage's gate has a result.",
    task_run_name="gate-{stage}",
)
async def await_stage_gate(
    credentials: ItoCredentials,
    run: TrainingRun,
    stage: str,
    *,
    watchdog: Watchdog,
    flow_run_id: UUID | None,
    patience: float | None = None,
) -> TrainingRun:
    """Return the run once ``stage``'s gate settles, a person must decide, or it finished.

    ``stage`` names the task run; between polls the flow run's own state is checked, so a
    cancellation requested in the UI or the API ends the wait. With ``patience`` the wait ends
    after that many seconds even if nothing settled (before a deferral).
    """
    del stage  # only names the task run
    async with credentials.get_client() as client:
        return await desk.follow_gate(
            client, run, watchdog, lambda: stop_requested(flow_run_id), patience
        )


@_retried_task("relay_decision", "Pass a person's restart decision to the backend.")
async def relay_decision(
    credentials: ItoCredentials, run: TrainingRun, action_id: str, decision: DecisionRequest
) -> TrainingRun:
    """Record the decision at the backend (idempotent per action) and return the run."""
    async with credentials.get_client() as client:
        return await desk.relay_decision(client, run, action_id, decision)


@task(
    name="cancel_training_workload",
    description="Cancel the backend workload (never the booking) and confirm it stopped.",
    cache_policy=NO_CACHE,
)
async def cancel_training_workload(
    credentials: ItoCredentials, run_id: str, reason: str, confirm_seconds: float
) -> TrainingRun:
    """Return the run after the cancel; a non-terminal state means the cancel is unconfirmed."""
    async with credentials.get_client() as client:
        return await desk.cancel_workload(
            client, run_id, reason=reason, confirm_seconds=confirm_seconds
        )


@task(
    name="report_progress",
    description="Relay the backend run's new events to Prefect.",
    cache_policy=NO_CACHE,
)
async def report_progress(credentials: ItoCredentials, run: TrainingRun, after_seq: int) -> int:
    """Emit the Prefect events after ``after_seq``; return the sequence number through which
    Prefect holds them all (:mod:`prefect_ito.reporting.event_relay`): the flow run stores that one.

    The artifact cards are published by the flow itself (:meth:`TaskSteps.report`), so that they
    belong to the flow run rather than to one of many task runs.
    """
    async with credentials.get_client() as client:
        return await event_relay.relay_held(client, run, after_seq)


@task(
    name="settle_events",
    description="Make sure Prefect holds every event of the finished backend run.",
    cache_policy=NO_CACHE,
)
async def settle_events(credentials: ItoCredentials, run: TrainingRun, after_seq: int) -> int:
    """Send the finished run's events Prefect does not hold again, for about half a minute;
    return the sequence number through which it holds them all."""
    async with credentials.get_client() as client:
        held_through, complete = await event_relay.settle(client, run, after_seq)
    if not complete:
        get_run_logger().warning(
            "Prefect does not hold the events of run %s after seq %d yet; they were sent again.",
            run.run_id,
            held_through,
        )
    return held_through


class TaskSteps(Steps):
    """Each step of supervision as a Prefect task, so every one shows in the flow run."""

    def __init__(
        self,
        credentials: ItoCredentials,
        supervision: SupervisionParameters,
        authorization: ItoSpendAuthorization | None = None,
    ) -> None:
        super().__init__(supervision, get_run_logger(), authorization)
        self.credentials = credentials
        self.flow_run_id = current_flow_run_id()
        self.deferred = _defers(supervision)

    async def find_attachable_run(
        self, request: TrainingRequest, idempotency_key: str, client_reference: str | None
    ) -> TrainingRun | None:
        return await reattach_training_run(
            self.credentials, request, idempotency_key, client_reference
        )

    async def verify_booking(self, claim: BookingClaim) -> TrainingEligibility:
        return await verify_booking(self.credentials, claim)

    async def check_training_capability(self, request: TrainingRequest) -> None:
        await check_training_capability(self.credentials, request)

    async def quote(self, request: TrainingRequest) -> TrainingQuote:
        return await quote_training_run(self.credentials, request)

    async def read_quote(self, request: TrainingRequest, quote_id: str) -> TrainingQuote | None:
        return await read_training_quote(self.credentials, request, quote_id)

    async def poll_quote(self, quote_id: str) -> TrainingQuote | None:
        # Read at every poll of a wait: as a task each, the flow run would fill with them.
        async with self.credentials.get_client() as client:
            return await client.get_quote(quote_id)

    async def decline_quote(self, quote_id: str, note: str | None) -> None:
        await decline_training_quote(self.credentials, quote_id, note)

    async def recorded_quote(self, request: TrainingRequest) -> TrainingQuote | None:
        if self.flow_run_id is None:
            return None
        record = await quote_wait.latest_quote_wait(self.flow_run_id)
        if record is None or record.manifest_digest != request.digest():
            return None
        return await self.read_quote(request, record.quote_id)

    async def record_quote(self, quote: TrainingQuote) -> None:
        if self.flow_run_id is None:
            return
        record = quote_wait.QuoteWait(
            api_url=self.credentials.api_url,
            keyring_entry=self.credentials.keyring_entry,
            quote_id=quote.quote_id,
            manifest_digest=quote.manifest_digest,
            expires_at=quote.expires_at,
        )
        await quote_wait.record_quote_wait(self.flow_run_id, record)

    async def submit(
        self,
        request: TrainingRequest,
        quote_id: str,
        authorization_id: str | None,
        idempotency_key: str,
        client_reference: str | None,
    ) -> TrainingRun:
        return await delegate_training_run(
            self.credentials,
            request,
            quote_id,
            authorization_id,
            idempotency_key,
            client_reference,
        )

    async def read_run(self, run_id: str) -> TrainingRun:
        return await read_training_run(self.credentials, run_id)

    async def report(self, run: TrainingRun, after_seq: int) -> int:
        seq = await report_progress(self.credentials, run, after_seq)
        await reporting.publish(run)  # here, in the flow: the cards belong to the flow run
        return seq

    async def settle(self, run: TrainingRun, events_seen: int) -> None:
        await settle_events(self.credentials, run, events_seen)

    async def await_gate(
        self, run: TrainingRun, watchdog: Watchdog, events_seen: int
    ) -> TrainingRun:
        if self.deferred and self.flow_run_id is not None:
            # A short wait costs less than a flow process's start: defer only if it lasts.
            stage = run.current_stage
            run = await self._gate(run, watchdog, patience=self.supervision.defer_after)
            if desk.gate_settled(run, stage):
                return run
            record = self._deferral(run, watchdog, events_seen)
            # Ends this process; returns only when resumed although this version did not move.
            await deferral.suspend_until_changed(self.flow_run_id, run, record)
        return await self._gate(run, watchdog)

    async def _gate(
        self, run: TrainingRun, watchdog: Watchdog, patience: float | None = None
    ) -> TrainingRun:
        return await await_stage_gate(
            self.credentials,
            run,
            run.current_stage or "start",
            watchdog=watchdog,
            flow_run_id=self.flow_run_id,
            patience=patience,
        )

    async def recorded_run_id(self) -> str | None:
        if self.flow_run_id is None:
            return None
        return await deferral.read_recorded_run_id(self.flow_run_id)

    async def record_run(self, run: TrainingRun) -> None:
        if self.flow_run_id is not None:
            await deferral.record_run_id(self.flow_run_id, run.run_id)

    async def resume_point(self, run: TrainingRun) -> tuple[int, Watchdog]:
        if not self.deferred or self.flow_run_id is None:
            return await super().resume_point(run)
        record = await deferral.latest_deferral(self.flow_run_id, run.run_id)
        limits = self.supervision
        watchdog = Watchdog(
            stall_timeout=limits.stall_timeout, deadline=limits.deadline, clock=deferral.wall_clock
        ).resume(
            started=_flow_run_started_at(),
            heartbeat=record.heartbeat_at if record else None,
            heartbeat_seen=record.heartbeat_seen_at if record else None,
        )
        return (record.events_seen if record else 0), watchdog

    def _deferral(self, run: TrainingRun, watchdog: Watchdog, events_seen: int) -> Deferral:
        return Deferral(
            api_url=self.credentials.api_url,
            keyring_entry=self.credentials.keyring_entry,
            run_id=run.run_id,
            version=run.version,
            stage=run.current_stage,
            events_seen=events_seen,
            heartbeat_at=run.heartbeat_at,
            heartbeat_seen_at=watchdog.heartbeat_seen,
            stall_timeout=self.supervision.stall_timeout,
            deadline_at=watchdog.deadline_at,
        )

    async def ask_person(self, run: TrainingRun) -> DecisionRequest | None:
        return await approval.ask_and_log(run, timeout=self.supervision.approval_timeout)

    async def relay_decision(
        self, run: TrainingRun, action_id: str, decision: DecisionRequest
    ) -> TrainingRun:
        return await relay_decision(self.credentials, run, action_id, decision)

    async def cancel_workload(self, run_id: str, reason: str) -> TrainingRun:
        return await cancel_training_workload(
            self.credentials, run_id, reason, desk.CANCEL_CONFIRM_SECONDS
        )

    def provenance(self) -> Provenance | None:
        # Each task has a client of its own; what they saw is kept per backend in the process.
        return last_seen(self.credentials.api_url)


def _defers(supervision: SupervisionParameters) -> bool:
    """Tell whether to defer; ``deferred`` where no suspension is possible is a broken rule."""
    possible = can_suspend()
    if supervision.mode == "deferred" and not possible:
        raise InvalidParameters(
            "mode: deferred supervision needs a flow run from a deployment (and no subflow); "
            "use in-process, or auto to defer exactly when possible"
        )
    return supervision.mode == "deferred" or (supervision.mode == "auto" and possible)


def _flow_run_started_at() -> float:
    """When this flow run first started, on the wall clock: the deadline counts from there."""
    context = FlowRunContext.get()
    started = context.flow_run.start_time if context and context.flow_run else None
    return started.timestamp() if started is not None else deferral.wall_clock()
