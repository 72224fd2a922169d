"""The table of backend operations supervision performs, each defined once.

An :class:`Operation` holds one name (the same in :mod:`prefect_ito.backend.desk` or
:mod:`prefect_ito.backend.gates`, as the Prefect task and in the docs), the coroutine that does
it over an :class:`~prefect_ito.backend.client.ItoClient`, whether it may be sent again after a
transient fault, and whether a flow shows it as a task of its own. The flow's tasks
(:mod:`prefect_ito.supervision.tasks`) and the job's plain calls
(:mod:`prefect_ito.supervision.plain`) are both made from this table.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from prefect_ito.backend import desk, gates, ownership
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import (
    BackendUnavailable,
    IdempotencyKeyInFlight,
    ItoTransportError,
    RateLimited,
)

P = ParamSpec("P")
R = TypeVar("R")

TRANSIENT_FAULTS = (ItoTransportError, BackendUnavailable, RateLimited, IdempotencyKeyInFlight)
"""What may pass by itself: a lost connection, 503, 429, a keyed write still in flight."""

STEP_RETRY_DELAYS_SECONDS = (2.0, 10.0)
"""A resendable operation's waits before each of its retries after a transient fault, once the
client's own retries are spent: the flow's tasks (as Prefect task retries) and
``ItoTrainingRun``'s calls alike, so a storm ends a job no sooner than a flow."""


async def resend(
    call: Callable[[], Awaitable[R]], logger: logging.Logger | logging.LoggerAdapter[Any]
) -> R:
    """Make ``call``, again after each transient fault once the client's own retries are spent,
    waiting :data:`STEP_RETRY_DELAYS_SECONDS`: as the flow's tasks are retried, for callers
    outside a flow (``ItoTrainingRun``, a command's checks before its flow)."""
    for delay in STEP_RETRY_DELAYS_SECONDS:
        try:
            return await call()
        except TRANSIENT_FAULTS as fault:
            logger.warning("%s; trying again in %g s", fault, delay)
            await asyncio.sleep(delay)
    return await call()


@dataclass(frozen=True)
class Operation(Generic[P, R]):
    """One backend operation of supervision; see the module docstring."""

    name: str
    """The one name of the operation: the desk coroutine's, the Prefect task's, the docs'."""
    description: str
    """What it does, in a line: the Prefect task's description."""
    call: Callable[Concatenate[ItoClient, P], Awaitable[R]]
    """The coroutine that does it over a client."""
    resendable: bool
    """A read or a keyed write: safe to send again after a transient fault."""
    shown: bool = True
    """Shown as a Prefect task in the flow run (not for reads made at every poll of a wait)."""
    task_run_name: Callable[..., str] | None = None
    """How its task runs are named, from their parameters; by default after the operation."""


def _gate_task_run_name(parameters: dict[str, Any]) -> str:
    """Name a gate's task run after the stage it waits in, as the UI lists them."""
    run = parameters.get("run")
    stage = run.current_stage if isinstance(run, TrainingRun) else None
    return f"gate-{stage or 'start'}"


def _poll(
    name: str, description: str, call: Callable[Concatenate[ItoClient, P], Awaitable[R]]
) -> Operation[P, R]:
    """Return the operation of a read made at every poll of a wait: never sent again (it is
    read again at the next poll anyway) and never shown (as tasks, the flow run would fill
    with them)."""
    return Operation(name, description, call, resendable=False, shown=False)


FIND_ATTACHABLE_RUN = Operation(
    "find_attachable_run",
    "Find the backend run this request made, if any: under its client reference or its "
    "idempotency key; a booking busy with a run it did not make stops here.",
    ownership.find_attachable_run,
    resendable=True,
)
VERIFY_BOOKING = Operation(
    "verify_booking",
    "Ask the backend whether the booking may train.",
    desk.verify_booking,
    resendable=True,
)
CHECK_TRAINING_CAPABILITY = Operation(
    "check_training_capability",
    "Stop unless the backend says training_run is live.",
    desk.check_training_capability,
    resendable=True,
)
QUOTE_TRAINING_RUN = Operation(
    "quote_training_run",
    "Ask the backend for the plan and the estimate; creates no work.",
    desk.quote_training_run,
    resendable=True,
)
READ_TRAINING_QUOTE = Operation(
    "read_training_quote",
    "Read the quote as the backend states it now, if it is this request's.",
    desk.read_training_quote,
    resendable=True,
)
POLL_TRAINING_QUOTE = _poll(
    "poll_training_quote", "Read the quote while a person is asked.", desk.poll_training_quote
)
DECLINE_TRAINING_QUOTE = Operation(
    "decline_training_quote",
    "Decline the quote at the backend: nothing is spent on it.",
    desk.decline_training_quote,
    resendable=True,
)
SUBMIT_TRAINING_RUN = Operation(
    "submit_training_run",
    "Hand the training request to the Itô desk backend, exactly once.",
    desk.submit_training_run,
    # Keyed: sent again, the same key makes the run once (and a lost answer is found by it).
    resendable=True,
)
READ_TRAINING_RUN = Operation(
    "read_training_run",
    "Read a backend training run by its id.",
    desk.read_training_run,
    resendable=True,
)
POLL_TRAINING_RUN = _poll(
    "poll_training_run",
    "Read the run while a person is asked to decide on it.",
    desk.poll_training_run,
)
AWAIT_STAGE_GATE = Operation(
    "await_stage_gate",
    "Long-poll the run until the current stage's gate has a result.",
    gates.await_stage_gate,
    resendable=True,
    task_run_name=_gate_task_run_name,
)
CANCEL_TRAINING_WORKLOAD = Operation(
    "cancel_training_workload",
    "Cancel the backend workload (never the booking) and confirm it stopped.",
    desk.cancel_training_workload,
    resendable=False,  # waits minutes for the backend to confirm: once is enough
)

OPERATIONS: tuple[Operation[Any, Any], ...] = (
    FIND_ATTACHABLE_RUN,
    VERIFY_BOOKING,
    CHECK_TRAINING_CAPABILITY,
    QUOTE_TRAINING_RUN,
    READ_TRAINING_QUOTE,
    POLL_TRAINING_QUOTE,
    DECLINE_TRAINING_QUOTE,
    SUBMIT_TRAINING_RUN,
    READ_TRAINING_RUN,
    POLL_TRAINING_RUN,
    AWAIT_STAGE_GATE,
    CANCEL_TRAINING_WORKLOAD,
)
"""Every backend operation of supervision; only :data:`SUBMIT_TRAINING_RUN` creates work, and
none decides: a person decides at the backend (contract v0.5), never a flow run."""
