"""One table of backend operations: the flow's tasks and the job's plain calls are made from it."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
from flow_helpers import parameters
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from prefect_ito.backend import operations
from prefect_ito.backend.operations import (
    OPERATIONS,
    STEP_RETRY_DELAYS_SECONDS,
    SUBMIT_TRAINING_RUN,
    Operation,
)
from prefect_ito.exceptions import BackendUnavailable, ItoProtocolError
from prefect_ito.flows import ito_training
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.reporting import event_relay
from prefect_ito.supervision import plain
from prefect_ito.supervision.plain import ClientSteps
from prefect_ito.supervision.tasks import TASKS


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.name)
def test_an_operation_has_one_name_from_the_backend_call_to_the_task(
    operation: Operation[Any, Any],
):
    assert operation.call.__name__ == operation.name
    if not operation.shown:
        assert operation.name not in TASKS
        return
    task = TASKS[operation.name]
    assert task.name == operation.name
    call = list(inspect.signature(operation.call).parameters)
    made = list(inspect.signature(task.fn).parameters)
    # The task takes the operation's own parameters, the credentials block in the client's place.
    assert call[0] == "client"
    assert made == ["credentials", *call[1:]]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.name)
def test_only_what_is_safe_to_send_again_is_retried_by_prefect(operation: Operation[Any, Any]):
    if not operation.shown:
        return
    task = TASKS[operation.name]
    expected = len(STEP_RETRY_DELAYS_SECONDS) if operation.resendable else 0
    assert task.retries == expected


def test_the_one_operation_that_creates_work_is_resent_only_under_its_own_key():
    # A busy backend answered 503 to a submission: sent again after the client's retries, as
    # any keyed write, under the same idempotency key, so it makes the run once (the lost
    # answers and storm trials count it). Before, one `train --confirm` in three gave up.
    assert SUBMIT_TRAINING_RUN.resendable
    assert TASKS["submit_training_run"].retries == len(STEP_RETRY_DELAYS_SECONDS)
    parameters = inspect.signature(SUBMIT_TRAINING_RUN.call).parameters
    assert "idempotency_key" in parameters  # the key comes with every attempt
    creating = [op.name for op in OPERATIONS if "submit" in op.name]
    assert creating == ["submit_training_run"]


def _counting(fault: Exception) -> tuple[list[int], Any]:
    calls: list[int] = []

    async def call(client: Any, value: int) -> int:
        calls.append(value)
        if len(calls) == 1:
            raise fault
        return value * 2

    return calls, call


@pytest.fixture
def no_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(operations.asyncio, "sleep", sleep)
    return slept


async def test_a_plain_call_retries_a_resendable_operation_after_a_transient_fault(no_waits):
    calls, call = _counting(BackendUnavailable("down for a moment"))
    read = Operation("read_something", "A read.", call, resendable=True)
    steps = ClientSteps(object(), SupervisionParameters(), logging.getLogger("test"))  # type: ignore[arg-type]

    assert await steps.perform(read, 21) == 42
    assert calls == [21, 21]
    assert no_waits == [STEP_RETRY_DELAYS_SECONDS[0]]


@pytest.mark.parametrize(
    ("fault", "resendable"),
    [
        (BackendUnavailable("down for a moment"), False),  # a write that is not resendable
        (ItoProtocolError("nonsense", endpoint="GET /x"), True),  # a fault that will not pass
    ],
    ids=["write-not-resendable", "fault-that-will-not-pass"],
)
async def test_a_plain_call_is_made_once_when_sending_it_again_is_no_use(
    no_waits, fault: Exception, resendable: bool
):
    calls, call = _counting(fault)
    operation = Operation("do_something", "Something.", call, resendable=resendable)
    steps = ClientSteps(object(), SupervisionParameters(), logging.getLogger("test"))  # type: ignore[arg-type]

    with pytest.raises(type(fault)):
        await steps.perform(operation, 21)
    assert calls == [21] and no_waits == []


async def test_a_job_s_report_is_made_again_after_a_transient_fault(no_waits, monkeypatch):
    # A storm at the end of a finished run failed the job on a report of its events.
    calls, report = _counting(BackendUnavailable("down for a moment"))
    monkeypatch.setattr(plain.reporting, "report", lambda client, run, seq: report(client, seq))
    steps = ClientSteps(object(), SupervisionParameters(), logging.getLogger("test"))  # type: ignore[arg-type]

    assert await steps.report(object(), 21) == 42  # type: ignore[arg-type]
    assert calls == [21, 21]
    assert no_waits == [STEP_RETRY_DELAYS_SECONDS[0]]


async def test_a_flow_run_relays_its_events_again_after_a_transient_fault(
    start_simulator, monkeypatch
):
    # A storm at the end of a finished run failed the flow run on relaying its events, once the
    # client's own retries were spent: the relaying tasks are reads, and are retried as reads are.
    failed: list[str] = []

    def failing_once(name: str) -> Any:
        real = getattr(event_relay, name)

        async def relay(*args: Any) -> Any:
            if name not in failed:
                failed.append(name)
                raise BackendUnavailable("down for a moment")
            return await real(*args)

        return relay

    for name in ("relay_held", "settle"):
        monkeypatch.setattr(event_relay, name, failing_once(name))
    simulator = start_simulator("default")

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    assert failed == ["relay_held", "settle"]


async def test_a_flow_run_shows_each_operation_under_its_one_name(start_simulator):
    simulator = start_simulator("default")
    state = await ito_training(**parameters(simulator), return_state=True)
    assert state.is_completed(), state.message

    async with get_client() as client:
        task_runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            )
        )
    names = {run.name.rsplit("-", 1)[0] for run in task_runs}
    for name in (
        "find_attachable_run",
        "verify_booking",
        "check_training_capability",
        "quote_training_run",
        "submit_training_run",
        "report_progress",
    ):
        assert name in names, sorted(names)
    # Gates are named after the stage they wait in.
    assert any(run.name.startswith("gate-") for run in task_runs), sorted(names)
    assert operations.POLL_TRAINING_QUOTE.name not in names
