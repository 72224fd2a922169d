"""Exactly once: a flow run killed right after its submission never makes a second run.

The flow run's id goes with its submission as the run's ``client_reference``, and a re-entered
flow run looks its run up by that reference before anything is quoted or confirmed: it holds
after the submission's idempotency key expired and the run finished.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import httpx
from flow_helpers import parameters
from prefect import get_client
from prefect.flow_engine import run_flow_async
from prefect.states import Crashed
from spend_helpers import covering_authorization

from prefect_ito.contract import RunState
from prefect_ito.flows import ito_training
from prefect_ito.reporting.report import TrainingSummary
from prefect_ito.simulator import builtin_scenario

KEY_RETENTION_SECONDS = 2.0

# The child runs the flow run and dies (SIGKILL) right after the backend answered its
# submission, before the flow run records the backend run in Prefect: the window of the finding.
_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from uuid import UUID

    from prefect import get_client
    from prefect.flow_engine import run_flow_async

    from prefect_ito.waiting import deferral
    from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
    from prefect_ito.flows import ito_training

    async def killed(flow_run_id, run_id):
        os.kill(os.getpid(), signal.SIGKILL)

    deferral.record_run_id = killed

    async def main():
        async with get_client() as client:
            flow_run = await client.read_flow_run(UUID(sys.argv[1]))
        params = {
            "training": json.loads(sys.argv[2]),
            "credentials": ItoCredentials(api_url=sys.argv[3]),
            "authorization": ItoSpendAuthorization.model_validate_json(sys.argv[4]),
        }
        await run_flow_async(ito_training, flow_run=flow_run, parameters=params)

    asyncio.run(main())
    """
)


def _key_forgotten(url: str, token: str, key: str) -> bool:
    answer = httpx.get(
        f"{url}/v0/training-runs",
        params={"idempotency_key": key},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    return answer.json()["data"]["runs"] == []


async def _finished_and_forgotten(simulator: Any, token: str, timeout: float = 120) -> Any:
    """Return the one backend run once it finished and its idempotency key expired."""
    async with asyncio.timeout(timeout):
        while True:
            runs = await asyncio.to_thread(simulator.runs)
            if runs and runs[0].run.state.terminal:
                key = runs[0].idempotency_key
                if await asyncio.to_thread(_key_forgotten, simulator.url, token, key):
                    return runs[0].run
            await asyncio.sleep(0.3)


async def test_a_flow_run_killed_after_submitting_re_enters_without_a_second_run(
    start_simulator, prefect_server
):
    scenario = builtin_scenario("default").model_copy(
        update={"idempotency_key_retention_seconds": KEY_RETENTION_SECONDS}
    )
    simulator = start_simulator(scenario)
    token = simulator.mint_token("flow-tests").get_secret_value()  # the fixture's account
    params = parameters(simulator)
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=params)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(flow_run.id), json.dumps(params["training"]),
         simulator.url, covering_authorization(simulator).model_dump_json()],
        env={**os.environ, "PREFECT_API_URL": prefect_server, "ITO_COMPUTE_API_URL": simulator.url,
             "ITO_COMPUTE_TOKEN": token},
    )  # fmt: skip
    try:
        returncode = await asyncio.to_thread(child.wait, 180)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert returncode == -9, "the child should have died right after its submission"
    first = await _finished_and_forgotten(simulator, token)
    assert first.state is RunState.SUCCEEDED

    # Re-entry: the flow run, crashed, runs again under its own id (as a retry would run it).
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Crashed(), force=True)
        flow_run = await client.read_flow_run(flow_run.id)
    state = await run_flow_async(
        ito_training, flow_run=flow_run, parameters=params, return_type="state"
    )

    assert state.is_completed(), state.message
    summary = await state.result()
    assert isinstance(summary, TrainingSummary) and summary.run_id == first.run_id
    assert [r.run.run_id for r in simulator.runs()] == [first.run_id]
    posts = [(r.path, r.status) for r in simulator.requests() if r.method == "POST"]
    assert posts.count(("/v0/training-quotes", 201)) == 1, posts
    assert [p for p in posts if p[0] == "/v0/training-runs"] == [("/v0/training-runs", 201)]
    assert first.client_reference == str(flow_run.id)
