"""The reliability suite's plumbing: the sweep's hooks, the simulators, and the one way to submit or
run (the parts themselves are in ``reliability_kit.py``).

- Tests record their figures in the ``ledger`` (the suite's root ``conftest.py``, ``ledger.py``).
- Every submission goes through the ``submit`` fixture and every flow run through the
  ``run_training`` fixture, so how work is authorized is decided in one place.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from reliability_kit import (
    DEBUG_LOGGERS,
    SWEEP,
    Backend,
    Person,
    RunTraining,
    Submit,
    Sweep,
    Training,
    scenario_with,
    training_fields,
)
from rich.console import Console
from spend_helpers import covering_authorization
from sweeping import Verdict, check_conduct, publish, published, search_for_tokens, this_worker

from prefect_ito.cli import terminal
from prefect_ito.flows import ito_training
from prefect_ito.simulator import Scenario, SimulatorServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The sweep checks what every other test left behind, so it runs last.
    items.sort(key=lambda item: item.path.name == "test_sweep.py")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # pytest's own capture of each phase: stdout, stderr and log records, searched by the sweep.
    for name, text in report.sections:
        SWEEP.text(f"{report.nodeid} {name}", text)
    if report.longrepr is not None:
        SWEEP.text(f"{report.nodeid} failure", str(report.longrepr))


def pytest_ito_server_closing(api_url: str) -> None:
    # This session's tests are done and its Prefect server still answers: sweep it for the run.
    _leave_verdict(prefect=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _leave_verdict(prefect=False)  # a worker that never needed a Prefect server


def _leave_verdict(*, prefect: bool) -> None:
    """Under pytest-xdist, sweep this worker's session and leave the verdict for the run's sweep.

    Not where the run's sweep ran: it swept this session itself, and waited for the others.
    """
    worker = this_worker()
    if worker and not SWEEP.of_the_run and not published(worker):
        publish(Verdict(worker, search_for_tokens(SWEEP, prefect=prefect), check_conduct(SWEEP)))


@pytest.fixture
def sweep() -> Sweep:
    """The session's sweep material (see :class:`Sweep`)."""
    return SWEEP


@pytest.fixture(autouse=True)
def _debug_logging() -> Iterator[None]:
    """Log the client and its HTTP stack at DEBUG, so the sweep searches everything they say."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in DEBUG_LOGGERS]
    for logger, _ in saved:
        logger.setLevel(logging.DEBUG)
    yield
    for logger, level in saved:
        logger.setLevel(level)


@pytest.fixture
def backend(sweep: Sweep) -> Iterator[Callable[..., Backend]]:
    """Start simulators (``backend("loss-spike", faults=…)``); their logs go to the sweep."""
    started: list[Backend] = []

    def start(name: str | Scenario = "default", **options: Any) -> Backend:
        scenario = name if isinstance(name, Scenario) else scenario_with(name, **options)
        sim = SimulatorServer(scenario)
        sim.start()
        started.append(Backend(sim, sweep))
        return started[-1]

    yield start
    for each in started:
        sweep.requests += each.requests()
        sweep.runs += [admin.run for admin in each.sim.runs()]
        each.sim.stop()


@pytest.fixture
def submit() -> Submit:
    """The suite's one way to submit (see :class:`Submit`)."""
    return Submit()


@pytest.fixture
def run_training(prefect_server: str, sweep: Sweep) -> RunTraining:
    """Run ``ito-training`` for a backend here, a :class:`Person` answering its pauses.

    ``run_training(backend, approve=True, booking=…, model_size=…)``: the keywords replace
    fields of the ``training`` parameter. Every flow run of this suite goes through here.
    """

    async def run(
        target: Backend, *, approve: bool = True, credentials: Any = None, **training: Any
    ) -> Training:
        fields = training_fields(approval_timeout=300, **training)
        parameters = {
            "training": fields,
            "credentials": credentials or target.credentials(),
            "authorization": covering_authorization(target.sim, "reliability"),
        }
        out = io.StringIO()
        person = Person(approve, sweep)
        console = Console(file=out, width=120)
        state = await terminal.run_training(ito_training, parameters, person, console, poll=0.3)
        sweep.text("flow console", out.getvalue())
        sweep.text("flow state", f"{state.name}: {state.message}")
        return Training(state=state, console=out.getvalue(), person=person)

    return run
