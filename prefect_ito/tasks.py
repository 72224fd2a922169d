"""Prefect tasks, each a thin wrapper over one step in :mod:`prefect_ito.operations`.

Reads and idempotent writes may be retried by Prefect on transient failures (the client already
retried within a call).
:func:`delegate_training_run` is the one task that creates work on the backend, and it has no
Prefect retries: the client resolves a lost answer by looking the run up by its idempotency key.
Every task opts out of caching, so a re-entered flow never reads a stale run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from prefect import State, Task, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun

from prefect_ito import operations, reporting
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import DecisionRequest, TrainingEligibility, TrainingRequest, TrainingRun
from prefect_ito.exceptions import BackendUnavailable, ItoTransportError, RateLimited
from prefect_ito.operations import Watchdog
from prefect_ito.request import BookingClaim
from prefect_ito.runtime import cancellation_requested

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "await_stage_gate",
    "cancel_training_workload",
    "check_training_capability",
    "delegate_training_run",
    "reattach_training_run",
    "relay_decision",
    "report_progress",
    "verify_booking",
]


def _transient(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only what may pass by itself: lost connections, 503 and 429."""
    error = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    return isinstance(error, ItoTransportError | BackendUnavailable | RateLimited)


def _retried_task(
    name: str, description: str, task_run_name: str | None = None
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Return the decorator for a task that reads, or writes idempotently: Prefect may retry it."""
    return task(
        name=name,
        description=description,
        task_run_name=task_run_name,
        retries=2,
        retry_delay_seconds=[2, 10],
        retry_condition_fn=_transient,
        cache_policy=NO_CACHE,
    )


@_retried_task("verify_booking", "Ask the backend whether the booking may train.")
async def verify_booking(credentials: ItoCredentials, claim: BookingClaim) -> TrainingEligibility:
    """Return the booking's eligibility; raise ``BookingNotEligible`` when it may not train."""
    async with credentials.get_client() as client:
        return await operations.verify_booking(client, claim)


@_retried_task("check_training_capability", "Stop unless the backend says training_run is live.")
async def check_training_capability(credentials: ItoCredentials, request: TrainingRequest) -> None:
    """Raise ``CapabilityNotAvailable`` when the backend cannot train."""
    async with credentials.get_client() as client:
        await operations.check_training_capability(client, request)


@_retried_task("reattach_training_run", "Find this request's unfinished backend run, if any.")
async def reattach_training_run(
    credentials: ItoCredentials, request: TrainingRequest
) -> TrainingRun | None:
    """Return the unfinished run with this manifest; raise ``BookingBusy`` for another one."""
    async with credentials.get_client() as client:
        return await operations.find_attachable_run(client, request)


@task(
    name="delegate_training_run",
    description="Hand the training request to the Itô desk backend, exactly once.",
    cache_policy=NO_CACHE,
)
async def delegate_training_run(
    credentials: ItoCredentials, request: TrainingRequest, idempotency_key: str
) -> TrainingRun:
    """Attach to this request's unfinished run, or submit it under ``idempotency_key``."""
    async with credentials.get_client() as client:
        return await operations.delegate(client, request, idempotency_key)


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
    wait: float,
    flow_run_id: UUID | None,
    state_poll_seconds: float,
) -> TrainingRun:
    """Return the run once ``stage``'s gate settles, a person must decide, or it finished.

    ``stage`` names the task run; between polls the flow run's own state is checked, so a
    cancellation requested in the UI or the API ends the wait.
    """
    del stage  # only names the task run

    async def cancelled() -> bool:
        return await cancellation_requested(flow_run_id)

    async with credentials.get_client() as client:
        return await operations.await_gate(
            client,
            run,
            wait=min(wait, state_poll_seconds),
            watchdog=watchdog,
            interrupted=cancelled,
        )


@_retried_task("relay_decision", "Pass a person's restart decision to the backend.")
async def relay_decision(
    credentials: ItoCredentials, run: TrainingRun, action_id: str, decision: DecisionRequest
) -> TrainingRun:
    """Record the decision at the backend (idempotent per action) and return the run."""
    async with credentials.get_client() as client:
        return await operations.relay_decision(client, run, action_id, decision)


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
        return await operations.cancel_workload(
            client, run_id, reason=reason, confirm_seconds=confirm_seconds
        )


@task(
    name="report_progress",
    description="Relay backend events to Prefect and update the run's artifacts.",
    cache_policy=NO_CACHE,
)
async def report_progress(credentials: ItoCredentials, run: TrainingRun, after_seq: int) -> int:
    """Emit events after ``after_seq``, refresh the artifacts; return the last sequence seen."""
    async with credentials.get_client() as client:
        page = await client.list_events(run.run_id, after=after_seq)
    reporting.relay_events(run, page.events)
    await reporting.publish_artifacts(run)
    return max(after_seq, page.last_seq)
