"""Cancelling reaches the backend; a crash cancels nothing and the next run re-attaches."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

from flow_helpers import BOOKING, REQUEST, parameters, wait_for_pause
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.flow_engine import run_flow_async
from prefect.states import Cancelling
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.cli.views import print_outcome
from prefect_ito.contract import RunState
from prefect_ito.flows import ito_cancel_training, ito_training
from prefect_ito.reporting.report import artifact_key
from prefect_ito.simulator import builtin_scenario


async def start_flow(params: dict[str, Any]) -> tuple[Any, asyncio.Future[Any]]:
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=params)
    future = asyncio.ensure_future(
        run_flow_async(ito_training, flow_run=flow_run, parameters=params, return_type="state")
    )
    return flow_run, future


async def wait_for_backend_run(simulator: Any, timeout: float = 60) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            runs = await asyncio.to_thread(simulator.runs)
            if runs and runs[0].run.state is RunState.RUNNING:
                return runs[0].run
            await asyncio.sleep(0.2)


async def request_cancel(flow_run_id: Any) -> None:
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelling(), force=True)


async def test_cancelling_a_supervising_flow_cancels_the_backend_workload(start_simulator):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=20_000))
    flow_run, flow = await start_flow(parameters(simulator))
    await wait_for_backend_run(simulator)

    await request_cancel(flow_run.id)
    state = await asyncio.wait_for(flow, timeout=120)

    assert state.is_cancelled(), state
    assert "cancelled" in state.message
    assert simulator.runs()[0].run.state is RunState.CANCELLED
    cancels = [r for r in simulator.requests() if r.method == "POST" and r.path.endswith("/cancel")]
    assert cancels and {r.idempotency_key for r in cancels} == {cancels[0].idempotency_key}


async def test_after_a_cancel_the_summary_and_the_cards_say_the_run_was_cancelled(
    start_simulator,
):
    # Before: the terminal said "Backend workload … cancelled", then "Backend run …: running",
    # and the progress card still read "Now <stage>".
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=20_000))
    flow_run, flow = await start_flow(parameters(simulator))
    run = await wait_for_backend_run(simulator)

    await request_cancel(flow_run.id)
    state = await asyncio.wait_for(flow, timeout=120)

    console = Console(record=True, width=200)
    print_outcome(console, state)
    printed = console.export_text()
    assert f"Backend workload {run.run_id} cancelled (cancelled)" in printed
    assert f"Backend run {run.run_id}: cancelled" in printed, printed
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key(run.run_id, "progress")]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]),
            )
        )
    (progress,) = artifacts
    assert (progress.description or "").startswith("Cancelled:"), progress.description


async def test_cancelling_a_paused_flow_cancels_the_backend_workload(start_simulator):
    simulator = start_simulator("loss-spike")
    flow_run, flow = await start_flow(parameters(simulator))
    await wait_for_pause(flow_run.id)

    await request_cancel(flow_run.id)
    state = await asyncio.wait_for(flow, timeout=120)

    assert state.is_cancelled(), state
    run = simulator.runs()[0].run
    assert run.state is RunState.CANCELLED
    assert run.decisions == []


async def test_the_cancel_flow_says_which_backend_run_it_cancelled_and_its_state(
    start_simulator, caplog
):
    """Before, ito-cancel-training logged nothing and returned no backend run id."""
    simulator = start_simulator("loss-spike")
    flow_run, flow = await start_flow(parameters(simulator))
    await wait_for_pause(flow_run.id)
    run_id = simulator.runs()[0].run.run_id

    await request_cancel(flow_run.id)  # the cancel flow acts only on what Prefect's server says
    said = await ito_cancel_training(str(flow_run.id))
    await asyncio.wait_for(flow, timeout=120)
    again = await ito_cancel_training(str(flow_run.id))  # idempotent, and says so

    assert simulator.runs()[0].run.state is RunState.CANCELLED
    # The paused flow run may hear of its cancel first and cancel the workload itself.
    assert said in (
        f"Cancelled backend run {run_id} of flow run {flow_run.id}: it is now cancelled.",
        again,
    )
    assert again == (
        f"Backend run {run_id} of flow run {flow_run.id} had already ended (cancelled): "
        "nothing to cancel."
    )
    logged = [r.getMessage() for r in caplog.records if r.name == "prefect.flow_runs"]
    assert said in logged and again in logged, logged


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
    from prefect_ito.flows import ito_cancel_training, ito_training

    asyncio.run(ito_training(
        {**REQUEST, "booking": sys.argv[2], "idempotency_key": "killed-once"},
        credentials=ItoCredentials(api_url=sys.argv[1]),
        authorization=ItoSpendAuthorization.model_validate_json(sys.argv[3])))
    """
)


async def test_a_killed_flow_run_is_reattached_by_the_next_run(start_simulator, prefect_server):
    # About ten seconds of run: still running when the child is killed, done soon after.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=200_000))
    token = simulator.mint_token("flow-tests")  # the same account as the fixture's token
    child = subprocess.Popen(
        [sys.executable, "-c", f"REQUEST = {REQUEST!r}\n{_CHILD}", simulator.url, BOOKING,
         covering_authorization(simulator).model_dump_json()],
        env={**os.environ, "PREFECT_API_URL": prefect_server, "ITO_COMPUTE_API_URL": simulator.url,
             "ITO_COMPUTE_TOKEN": token.get_secret_value()},
    )  # fmt: skip
    try:
        first = await wait_for_backend_run(simulator, timeout=120)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)

    assert simulator.runs()[0].run.state is RunState.RUNNING  # a crash cancels nothing
    # The same request under the same key: the same submission, so it follows that run.
    state = await ito_training(
        **parameters(simulator, idempotency_key="killed-once"), return_state=True
    )

    assert state.is_completed(), state.message
    runs = simulator.runs()
    assert len(runs) == 1 and runs[0].run.run_id == first.run_id
    submissions = [
        r for r in simulator.requests() if r.method == "POST" and r.path == "/v0/training-runs"
    ]
    assert len({r.idempotency_key for r in submissions}) == 1
