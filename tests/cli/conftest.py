"""Fixtures for the CLI tests: a simulator per test, and for those that run a flow in process (the
terminal runner) simulators with a stored token."""

from collections.abc import Iterator

import pytest
from simulator_fixture import FAST, start_simulator

from prefect_ito.simulator import SimulatorServer, builtin_scenario

__all__ = ["simulator", "start_simulator"]


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    """The default scenario at the tests' pace (:data:`FAST`), on a loopback port."""
    with SimulatorServer(builtin_scenario("default"), time_scale=FAST) as server:
        yield server
