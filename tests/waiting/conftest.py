"""Fixtures for the waiting tests that run flows: a simulator per test, and the flow runs a
test suspends by hand."""

import pytest
from prefect import get_client
from simulator_fixture import start_simulator, worker_environment

__all__ = ["start_simulator", "worker_environment"]


@pytest.fixture
async def flow_runs():
    """Flow runs a test suspends by hand; deleted after it, so no later watcher meets them."""
    made: list = []
    yield made
    async with get_client() as client:
        for flow_run in made:
            await client.delete_flow_run(flow_run.id)
