"""The flow's steps as Prefect tasks: one task per backend operation, made from one table.

Each :class:`~prefect_ito.backend.operations.Operation` the flow shows becomes a task of the same
name whose parameters are the operation's, with the ``ItoCredentials`` block in place of the
client: the task opens a client of its own. Resendable operations (reads and keyed writes) get
Prefect's retries on transient faults, after the client's own; ``submit_training_run`` — the one
task that creates work — has none: the client resolves a lost answer by the idempotency key.
Every task opts out of caching, so a re-entered flow never reads a stale run.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

from prefect import State, Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.context import FlowRunContext
from prefect.tasks import TaskRunNameCallbackWithParameters

from prefect_ito.backend import gates
from prefect_ito.backend.gates import Watchdog
from prefect_ito.backend.operations import (
    AWAIT_STAGE_GATE,
    OPERATIONS,
    READ_TRAINING_QUOTE,
    STEP_RETRY_DELAYS_SECONDS,
    TRANSIENT_FAULTS,
    Operation,
    P,
    R,
)
from prefect_ito.backend.provenance import Provenance, last_seen
from prefect_ito.backend.refusals import Uncovered
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import TrainingQuote, TrainingRequest, TrainingRun
from prefect_ito.exceptions import InvalidParameters
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.people import approval
from prefect_ito.reporting import event_relay
from prefect_ito.reporting import report as reporting
from prefect_ito.supervision.steps import Steps
from prefect_ito.waiting import deferral, waits
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.deferral import Deferral
from prefect_ito.waiting.flow_run import can_suspend, current_flow_run_id

__all__ = ["TASKS", "TaskSteps", "report_progress", "settle_events"]


def _transient(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only what may pass by itself (``TRANSIENT_FAULTS``)."""
    error = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    return isinstance(error, TRANSIENT_FAULTS)


RESENDING: dict[str, Any] = {
    "retries": len(STEP_RETRY_DELAYS_SECONDS),
    "retry_delay_seconds": list(STEP_RETRY_DELAYS_SECONDS),
    "retry_condition_fn": _transient,
}
"""Prefect's retries for a task that is safe to run again, after the client's own."""


def _as_task(operation: Operation[Any, Any]) -> Task[..., Any]:
    """Return the Prefect task that does ``operation`` with a client of its own."""

    async def step(credentials: ItoCredentials, *args: Any, **kwargs: Any) -> Any:
        async with credentials.get_client() as client:
            return await operation.call(client, *args, **kwargs)

    # Prefect names and binds the task's parameters by this signature: the operation's own,
    # with the credentials block in place of the client, as the UI and the docs show them.
    signature = inspect.signature(operation.call)
    client, *rest = signature.parameters.values()
    credentials = client.replace(name="credentials", annotation=ItoCredentials)
    step.__signature__ = signature.replace(parameters=[credentials, *rest])  # type: ignore[attr-defined]
    step.__name__ = step.__qualname__ = operation.name
    step.__doc__ = operation.call.__doc__
    # Prefect calls a name callback with the parameters when it takes them (checked by name).
    name = cast("TaskRunNameCallbackWithParameters | None", operation.task_run_name)
    made: Task[..., Any] = Task(
        step,
        name=operation.name,
        description=operation.description,
        cache_policy=NO_CACHE,
        task_run_name=name,
        **(RESENDING if operation.resendable else {}),
    )
    return made


TASKS: dict[str, Task[..., Any]] = {op.name: _as_task(op) for op in OPERATIONS if op.shown}
"""The flow's task for each operation it shows, by the operation's name."""


# Reads and re-sent events (Prefect keeps one of each id): safe to run again.
@task(
    **RESENDING,
    name="report_progress",
    description="Relay the backend run's new events to Prefect.",
    cache_policy=NO_CACHE,
)
async def report_progress(credentials: ItoCredentials, run: TrainingRun, after_seq: int) -> int:
    """Emit the Prefect events after ``after_seq``; return the sequence number through which
    Prefect holds them all (:mod:`prefect_ito.reporting.event_relay`): the flow run stores that.

    The artifact cards are published by the flow itself (:meth:`TaskSteps.report`), so that they
    belong to the flow run rather than to one of many task runs.
    """
    async with credentials.get_client() as client:
        return await event_relay.relay_held(client, run, after_seq)


# Reads and re-sent events (Prefect keeps one of each id): safe to run again.
@task(
    **RESENDING,
    name="settle_events",
    description="Make sure Prefect holds every event of the finished backend run.",
    cache_policy=NO_CACHE,
)
async def settle_events(credentials: ItoCredentials, run: TrainingRun, after_seq: int) -> int:
    """Send the finished run's events Prefect does not hold again, for about a minute;
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

    credentials: ItoCredentials

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

    async def perform(self, operation: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if operation.shown:
            result: R = await TASKS[operation.name](self.credentials, *args, **kwargs)
            return result
        async with self.credentials.get_client() as client:
            return await operation.call(client, *args, **kwargs)

    async def recorded_quote(self, request: TrainingRequest) -> TrainingQuote | None:
        if self.flow_run_id is None:
            return None
        record = await waits.latest_wait(self.flow_run_id, waits.QuoteWait)
        if record is None or record.manifest_digest != request.digest():
            return None
        return await self.perform(READ_TRAINING_QUOTE, request, record.quote_id)

    async def record_quote(self, quote: TrainingQuote, refused: Uncovered | None = None) -> None:
        if self.flow_run_id is None:
            return
        record = waits.QuoteWait(
            api_url=self.credentials.api_url,
            keyring_entry=self.credentials.keyring_entry,
            quote_id=quote.quote_id,
            manifest_digest=quote.manifest_digest,
            expires_at=quote.expires_at,
            named_authorization=refused is not None,
            refused=refused,
        )
        await waits.record_wait(self.flow_run_id, record)

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
            if gates.gate_settled(run, stage):
                return run
            record = self._deferral(run, watchdog, events_seen)
            # The cards were published before the flow knew it would park: say it now.
            await reporting.publish(run, parked=True)
            # Ends this process; returns only when Prefect refused the suspension.
            await deferral.suspend_until_changed(self.flow_run_id, run, record)
            await reporting.publish(run)  # it waits here after all: not parked
        return await self._gate(run, watchdog)

    async def _gate(
        self, run: TrainingRun, watchdog: Watchdog, patience: float | None = None
    ) -> TrainingRun:
        flow_run_id = self.flow_run_id
        return await self.perform(
            AWAIT_STAGE_GATE, run, watchdog, lambda: stop_requested(flow_run_id), patience
        )

    async def recorded_run_id(self) -> str | None:
        if self.flow_run_id is None:
            return None
        return await deferral.read_recorded_run_id(self.flow_run_id)

    async def record_run(self, run: TrainingRun) -> None:
        if self.flow_run_id is not None:
            await deferral.record_run_id(self.flow_run_id, run.run_id)

    async def resume_point(self, run: TrainingRun) -> tuple[int, Watchdog]:
        await self._recall_actions(run)
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

    async def _recall_actions(self, run: TrainingRun) -> None:
        """Recall what the actions this flow run asked about proposed, for its cards: a decided
        action leaves the backend run, and a resumed flow runs again in a new process. Shown
        only beside a decision the backend itself recorded on this run."""
        if self.flow_run_id is None:
            return
        decided = {decision.action_id for decision in run.decisions}
        for record in await waits.all_waits(self.flow_run_id, waits.ActionWait):
            action = record.action
            ours = record.run_id == run.run_id and record.action_id in decided
            if ours and action is not None and action.action_id == record.action_id:
                if action.action_id not in reporting.SEEN.actions(run.run_id):
                    approval.announce_decision(self, run, action)
                reporting.SEEN.note_action(run.run_id, action)

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
