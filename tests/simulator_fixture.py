"""Fixtures for the flow tests: a fresh simulator per test, with a stored token, on the session's
Prefect server.

Each test directory that runs flows takes them in its `conftest.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from prefect_ito.backend.auth import store_token
from prefect_ito.backend.origins import ENV_API_URL, ENV_TOKEN
from prefect_ito.simulator import Faults, Scenario, SimulatorServer, builtin_scenario

FAST = 4_000_000.0
"""Simulated seconds per real second where a test's pace does not matter: the default run takes
about half a second (at the simulator's own default, 400,000, the pretraining stage alone waits
three). A test that needs time to act while a run is under way names its own pace."""


def with_faults(**faults: Any) -> Scenario:
    """Return the default scenario with these :class:`~prefect_ito.simulator.Faults`."""
    return builtin_scenario("default").model_copy(update={"faults": Faults(**faults)})


@pytest.fixture
def start_simulator(prefect_server: str) -> Iterator[Callable[..., SimulatorServer]]:
    """Start a simulator with a scenario and a stored token; stop it after the test.

    A scenario named by its name runs at :data:`FAST` unless ``time_scale`` is given; a
    :class:`Scenario` keeps its own pace.
    """
    started: list[SimulatorServer] = []

    def start(scenario: Scenario | str = "default", **options: Any) -> SimulatorServer:
        if isinstance(scenario, str):
            scenario = builtin_scenario(scenario)
            options.setdefault("time_scale", FAST)
        simulator = SimulatorServer(scenario, **options)
        simulator.start()
        started.append(simulator)
        store_token(simulator.url, simulator.mint_token("flow-tests"))
        return simulator

    yield start
    # Its token goes with the test's keyring (tests/conftest.py leaves it as the test found it),
    # so a later test's server on the same port finds none under its origin.
    for simulator in started:
        simulator.stop()


@pytest.fixture
def worker_environment(
    start_simulator: Callable[..., SimulatorServer], monkeypatch: pytest.MonkeyPatch
) -> SimulatorServer:
    """A simulator, and this process configured as its worker: the token in the environment."""
    simulator = start_simulator()
    monkeypatch.setenv(ENV_API_URL, simulator.url)
    monkeypatch.setenv(ENV_TOKEN, simulator.mint_token("flow-tests").get_secret_value())
    return simulator
