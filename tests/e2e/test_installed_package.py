"""End to end: deploying prefect-ito as an installed package, with no source checkout.

``deployments/prefect-installed.yaml`` names its flows by module path
(``prefect_ito.flows.ito_training``) and has no pull step. ``prefect deploy`` runs from a
directory outside the checkout, and so does the process worker; Prefect imports the flow from the
worker's Python environment, where prefect-ito is installed. SQLite only: the database plays no
part in how a flow is found. The tests share one server, worker and simulator and run in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_stack import (
    AFTER_BOOKING,
    CANCEL_ON_CANCELLED,
    CHECKOUT,
    INSTALLED_YAML,
    NIGHTLY,
    PLAIN_BOOKING,
    POOL,
    STALLED_BOOKING,
    Stack,
    backend_runs,
    completed,
    flow_run_processes,
    named,
    shipped_parameters,
    start_training,
    train_until_stalled,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.client.schemas.responses import DeploymentResponse
from prefect.states import Cancelling
from prefect.types.entrypoint import EntrypointType

from prefect_ito.contract import RunState
from prefect_ito.flows import ito_training

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True),
]

FROM_PYTHON = "nightly-from-python"


def how_it_runs(deployment: DeploymentResponse) -> dict[str, Any]:
    """Return what a worker reads from a deployment to start and run a flow run."""
    return deployment.model_dump(
        include={
            "entrypoint", "pull_steps", "storage_document_id", "path", "work_pool_name",
            "work_queue_name", "job_variables", "parameters", "parameter_openapi_schema",
        }
    )  # fmt: skip


def outside_checkout(pid: int) -> bool:
    """Tell whether a process's working directory lies outside this checkout."""
    return not Path(f"/proc/{pid}/cwd").resolve().is_relative_to(CHECKOUT)


async def test_prefect_deploy_stores_module_entrypoints_and_no_pull_step(installed_stack: Stack):
    async with get_client() as client:
        deployments = [
            await client.read_deployment_by_name(name)
            for name in (NIGHTLY, AFTER_BOOKING, CANCEL_ON_CANCELLED)
        ]

    assert [d.entrypoint for d in deployments] == [
        "prefect_ito.flows.ito_training",
        "prefect_ito.flows.ito_training",
        "prefect_ito.flows.ito_cancel_training",
    ]
    # Nothing to fetch or change into: no pull step, no storage, no path on the worker's disk.
    assert [(d.pull_steps, d.storage_document_id, d.path) for d in deployments] == [
        ([], None, None)
    ] * 3
    assert outside_checkout(installed_stack.worker.pid)


async def test_a_module_entrypoint_deployment_runs_to_completion(installed_stack: Stack):
    flow_run = await start_training()
    await wait_for_flow_run(flow_run.id, completed)

    (run,) = backend_runs(installed_stack, PLAIN_BOOKING)
    assert run.state is RunState.SUCCEEDED


async def test_flow_deploy_with_a_module_entrypoint_matches_the_file(installed_stack: Stack):
    """``.deploy(entrypoint_type=MODULE_PATH)`` (docs/deployments.md) makes the same deployment as
    the file, field for field in what a worker reads to start a run, so it runs the same way."""
    deployment_id = await ito_training.adeploy(
        name=FROM_PYTHON,
        work_pool_name=POOL,
        entrypoint_type=EntrypointType.MODULE_PATH,
        parameters=shipped_parameters(INSTALLED_YAML, "nightly"),
        print_next_steps=False,
        ignore_warnings=True,
    )
    async with get_client() as client:
        from_python = await client.read_deployment(deployment_id)
        from_file = await client.read_deployment_by_name(NIGHTLY)
        await client.delete_deployment(deployment_id)

    assert how_it_runs(from_python) == how_it_runs(from_file)


async def test_cancelling_runs_the_hook_of_the_installed_flow(installed_stack: Stack):
    """The worker imports the flow again, by its module path, to run ``on_cancellation``."""
    flow_run = await train_until_stalled(installed_stack)
    processes = flow_run_processes(flow_run.id)
    assert processes and all(outside_checkout(pid) for pid in processes)

    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Cancelling())  # as the UI's Cancel does
    await wait_for_flow_run(flow_run.id, named("Cancelled"))

    await wait_for(
        lambda: backend_runs(installed_stack, STALLED_BOOKING)[0].state is RunState.CANCELLED
    )
