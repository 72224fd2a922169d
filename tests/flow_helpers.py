"""Shared pieces of the flow tests: the request they make, and how they wait."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prefect import Flow, State, get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.context import FlowRunContext
from prefect.input import create_flow_run_input
from prefect.states import Running, Suspended
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.restart_answers import decide_here, stated_run
from prefect_ito.cli.terminal import RestartPause, run_training
from prefect_ito.contract import DecisionChoice, DecisionRequest, RunEvent, TrainingRequest
from prefect_ito.people import answers
from prefect_ito.reporting.report import EVENT_NAMES, event_id
from prefect_ito.simulator import SimulatorServer, builtin_scenario

BOOKING = "bk-h200-2x8-ib"
REQUEST: dict[str, Any] = {
    "model_size": "8B",
    "data": ["catalog://ito/web-2026-10"],
    "target": "code-assistant",
    "budget_usd": 250_000.0,
}


def parameters(simulator: SimulatorServer, **changes: Any) -> dict[str, Any]:
    """Return ``ito-training`` parameters for the simulator's completed booking.

    ``changes`` replace fields of the ``training`` parameter, except ``credentials`` and
    ``authorization`` (default: a standing authorization that covers every test request).
    """
    credentials = changes.pop("credentials", ItoCredentials(api_url=simulator.url))
    authorization = changes.pop("authorization", covering_authorization(simulator))
    training = {
        **REQUEST,
        "booking": BOOKING,
        # Bounded, so a test whose pause nobody answers fails instead of waiting a day.
        "approval_timeout": 300,
        **changes,
    }
    return {"training": training, "credentials": credentials, "authorization": authorization}


async def wait_for_pause(flow_run_id: Any, timeout: float = 60) -> Any:
    """Return the flow run's Paused state once it waits for input."""
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            state = (await client.read_flow_run(flow_run_id)).state
            if state is not None and state.is_paused() and state.state_details.run_input_keyset:
                return state
            await asyncio.sleep(0.3)


class Person:
    """Decides every restart at the backend with this process's token (a person's, ``user:``),
    as ``prefect-ito decide`` does, and remembers what it was shown."""

    def __init__(self, approve: bool) -> None:
        self.approve = approve
        self.asked: list[str] = []

    async def __call__(self, pause: RestartPause) -> None:
        self.asked.append(pause.description)
        assert pause.action is not None, "the flow recorded no action before it paused"
        run = await stated_run(pause.action)
        assert run is not None and run.pending_action is not None
        choice = DecisionChoice.APPROVE if self.approve else DecisionChoice.REJECT
        decision = DecisionRequest(decision=choice, decided_by="Ada", reason="looked at it")
        await decide_here(pause.action, run, decision, Console(quiet=True))


async def answer_pauses_with(
    flow: Flow[Any, Any], *, approve: bool, console: Console
) -> State[Any]:
    """Run ``flow`` here; a :class:`Person` answers its pauses through the resume API."""
    return await run_training(flow, {}, Person(approve), console, poll=0.3)


async def answered_suspension(key: str, answer: dict[str, Any]) -> None:
    """Record in this flow run what Prefect holds once its suspension under ``key`` was answered.

    A suspension needs a deployment and a worker; the flow tests run their flows in-process. So
    the records are written directly: the Suspended state, then the answer a person gave (stored
    after it), then the flow run running again, as after a resume.
    """
    flow_run_id = FlowRunContext.get().flow_run.id
    async with get_client() as client:
        suspended = Suspended(timeout_seconds=300, pause_key=key)
        await client.set_flow_run_state(flow_run_id, suspended, force=True)
        await create_flow_run_input(
            answers.response_key("suspended", key), answer, flow_run_id=flow_run_id
        )
        await client.set_flow_run_state(flow_run_id, Running(), force=True)


def spiked_run() -> Any:
    """Return a backend run that waits for a decision, as the simulator reports one."""
    from spend_helpers import confirmed_on

    from prefect_ito.simulator.engine import Engine

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    engine = Engine(builtin_scenario("loss-spike"), clock)
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://ito/web"],
        target="chat", budget_usd=1e5,
    ).to_submission()  # fmt: skip
    run_id = engine.submit("acct", "k", confirmed_on(engine, "acct", request)).run.run_id
    while engine.runs[run_id].pending_action is None:
        clock.now += 0.1
        engine.advance()
    return engine.runs[run_id].snapshot()


async def training_deployment(name: str) -> Any:
    """Deploy ``ito-training`` to a process pool of the same name that no worker serves.

    For flow runs a test puts into a state by hand (suspended, running, lost), as a deployment's
    runs would be. Deployed once per name and Prefect server: a deployment costs the server
    seconds under load, and no test changes or deletes one.
    """
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL
    from prefect.types.entrypoint import EntrypointType

    from prefect_ito.flows import ito_training

    key = (PREFECT_API_URL.value(), name)
    if key not in _DEPLOYED:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"), overwrite=True)
        _DEPLOYED[key] = await ito_training.adeploy(
            name=name,
            work_pool_name=name,
            entrypoint_type=EntrypointType.MODULE_PATH,
            print_next_steps=False,
        )
    return _DEPLOYED[key]


_DEPLOYED: dict[tuple[str | None, str], Any] = {}
"""The deployment id of each name, per Prefect server (pytest-xdist workers have one each)."""


async def sweep_watcher(caplog: Any, times: int = 3) -> Any:
    """Sweep a new watcher ``times`` times with its INFO lines captured; return it, closed."""
    from prefect_ito.waiting.watcher import Watcher

    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        with caplog.at_level(logging.INFO, logger="prefect_ito.waiting.watcher"):
            for _ in range(times):
                await watcher.sweep()
    finally:
        await watcher.close()
    return watcher


async def logs_until(flow_run_id: Any, text: str, timeout: float = 30) -> list[Any]:
    """Return the flow run's logs as Prefect stores them, once one contains ``text``."""
    flter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            logs = await client.read_logs(log_filter=flter)
            if any(text in log.message for log in logs):
                return logs
            await asyncio.sleep(1)


async def relayed_events(simulator: SimulatorServer, run_id: str) -> tuple[list[RunEvent], int]:
    """Return the backend run's events the flow relays to Prefect, and the last seq of all."""
    credentials = ItoCredentials(api_url=simulator.url)
    async with credentials.get_client() as client:
        page = await client.list_events(run_id, after=0)
    return [event for event in page.events if event.type in EVENT_NAMES], page.last_seq


async def backend_events(simulator: SimulatorServer, run_id: str) -> dict[str, str]:
    """Return {Prefect event id: event name} for the backend events the flow relays."""
    relayed, _ = await relayed_events(simulator, run_id)
    return {str(event_id(run_id, event.seq)): EVENT_NAMES[event.type] for event in relayed}


async def prefect_events(
    run_id: str, enough: Callable[[list[dict[str, Any]]], bool], timeout: float = 60
) -> list[dict[str, Any]]:
    """Return Prefect's events about the backend run (as its API answers them) once ``enough``
    says so of them, or when ``timeout`` passed: Prefect writes what it receives a little later."""
    body = {"filter": {"resource": {"id": [f"ito.training-run.{run_id}"]}}, "limit": 50}
    async with get_client() as client:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            response = await client._client.post("/events/filter", json=body)
            response.raise_for_status()
            events: list[dict[str, Any]] = response.json()["events"]
            if enough(events) or asyncio.get_running_loop().time() > deadline:
                return events
            await asyncio.sleep(1)


class DecidedAtTheBackend:
    """What :func:`prefect_ito.people.approval.wait_for_decision` needs of a supervisor, with a
    backend whose answer is scripted: the run still waits for ``pending_reads`` reads, then a
    person has decided there (the run comes back without its pending action)."""

    def __init__(self, run: Any, pending_reads: int = 0) -> None:
        self.run = run
        self.pending_reads = pending_reads
        self.reads = 0
        self.recorded: list[Any] = []
        self.logger = logging.getLogger("tests.decided_at_the_backend")

    async def perform(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        from prefect_ito.backend.operations import POLL_TRAINING_RUN, READ_TRAINING_RUN

        assert operation in (POLL_TRAINING_RUN, READ_TRAINING_RUN), operation.name
        self.reads += 1
        if self.reads <= self.pending_reads:
            return self.run
        return self.run.model_copy(update={"pending_action": None})

    async def record_action(self, run: Any, action: Any) -> None:
        self.recorded.append(action.action_id)


RECHECK = {"decision": "recheck", "reason": "decided at the backend"}
"""The only answer a restart's form takes (contract v0.5): read the backend again."""
