"""The end-to-end stack's parts: the deployment file, the worker, and what tests wait on."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prefect import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment
from pydantic import SecretStr

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import DecisionRequest
from prefect_ito.simulator import Scenario, SimulatorServer, builtin_scenario

CHECKOUT = Path(__file__).resolve().parents[2]
SHIPPED_YAML = CHECKOUT / "deployments" / "prefect.yaml"
INSTALLED_YAML = CHECKOUT / "deployments" / "prefect-installed.yaml"
"""The installed-package route: module entrypoints, no pull step, deployable from anywhere."""
PROCESS_TEMPLATE = CHECKOUT / "deployments" / "process-base-job-template.json"
"""The process work pool's template: no job variable sets the command, environment or directory."""
POOL = "ito-process"
ACCOUNT = "e2e"
"""The backend account of the worker's token, and of the person who allows its spend."""
PASSPHRASE = "e2e-person-passphrase"
"""The passphrase the account's person signs in with on the backend's pages (the scenario's)."""
WORKLOAD = "service:e2e-worker"
"""The principal of the worker's token: a workload's, which no spend scope is granted to."""
PLAIN_BOOKING = "bk-h200-2x8-ib"
CREDENTIALS_BLOCK = "ito-desk"  # the block names deployments/prefect.yaml ships with
BOOKING_BLOCK = "ito-booking"
AUTHORIZATION_BLOCK = "ito-spend"
APPROVE_BOOKING = "bk-e2e-spike-approve"
CANCEL_BOOKING = "bk-e2e-spike-cancel"
BROWSER_BOOKING = "bk-e2e-spike-browser"
NIGHTS_BOOKING = "bk-e2e-spike-nights"
STALLED_BOOKING = "bk-e2e-stalled"
DEFER_BOOKING = "bk-e2e-deferred"
LOST_BOOKING = "bk-e2e-lost"
LOST_MACHINE_BOOKING = "bk-e2e-lost-machine"
CONFIRM_BOOKING = "bk-e2e-confirm"
"""A booking whose run nobody's standing authorization covers: a person confirms it."""
BROWSER_CONFIRM_BOOKING = "bk-e2e-confirm-browser"
"""The same, confirmed in a browser on the backend's confirm page."""
BROWSER_DECLINE_BOOKING = "bk-e2e-decline-browser"
"""The same, declined in the Prefect UI's Resume form."""
NIGHTLY = "ito-training/nightly"
AFTER_BOOKING = "ito-training/after-booking"
CANCEL_ON_CANCELLED = "ito-cancel-training/cancel-on-cancelled"
TIMEOUT = 180.0
POLL = 0.5


def e2e_scenario() -> Scenario:
    """Return the default scenario plus bookings whose runs hit a loss spike, or stall."""
    base = builtin_scenario("default")
    spiky = [APPROVE_BOOKING, CANCEL_BOOKING, BROWSER_BOOKING, NIGHTS_BOOKING]
    slow = [LOST_BOOKING, LOST_MACHINE_BOOKING]
    bookings = [b.model_dump() for b in base.bookings]
    bookings += [
        {"booking_id": b, "status": "completed", "gpu_sku": "H100"}
        for b in [
            *spiky,
            STALLED_BOOKING,
            *slow,
            CONFIRM_BOOKING,
            BROWSER_CONFIRM_BOOKING,
            BROWSER_DECLINE_BOOKING,
            DEFER_BOOKING,
        ]
    ]
    spike = {"loss_spikes": [{"stage": "pretrain", "at_fraction": 0.6}]}
    stall = {"stall": {"stage": "pretrain", "at_fraction": 0.5}}
    # Two curriculum stages of about 10 s each at the default time scale: long enough to defer.
    stages = base.run.curriculum[:2]
    long_stages = {
        "curriculum": [{**stage.model_dump(), "hours": 1_000} for stage in stages],
        "post_training": [],
    }
    return Scenario.model_validate(
        {
            **base.model_dump(),
            "bookings": bookings,
            "people": [*base.people, {"account": ACCOUNT, "secret": PASSPHRASE}],
            "booking_overrides": {
                **{b: spike for b in spiky},
                STALLED_BOOKING: stall,
                **{b: long_stages for b in slow},
                # Deferred first, then a person decides: a spike half-way through mid_train.
                DEFER_BOOKING: {
                    **long_stages,
                    "loss_spikes": [{"stage": "mid_train", "at_fraction": 0.5}],
                },
            },
        }
    )


CHECKOUT_STEP = f"prefect.deployments.steps.set_working_directory={CHECKOUT}"
"""The pull step a prefect-ito worker allows on the checkout route: :func:`deployment_file`'s."""


def deployment_file(directory: Path, shipped: Path = SHIPPED_YAML) -> Path:
    """Copy a shipped deployment file with what a user would edit for this machine.

    A pull step (the checkout route's) points at this checkout; the installed-package route has
    none. Schedules are inactive so that the nightly cron never fires in a test. The training
    deployments name the standing authorization the stack saves (docs/deployments.md §2's edit).
    Everything else — the other block names included — stays as shipped.
    """
    config = _with_standing_authorization(yaml.safe_load(shipped.read_text()))
    if config["pull"]:
        config["pull"] = [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(CHECKOUT)}}
        ]
    for deployment in config["deployments"]:
        for schedule in deployment.get("schedules") or []:
            schedule["active"] = False
    path = directory / shipped.name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _with_standing_authorization(config: dict[str, Any]) -> dict[str, Any]:
    """Name :data:`AUTHORIZATION_BLOCK` where a shipped file leaves the authorization unset."""
    for deployment in config["deployments"]:
        if "authorization" in (deployment.get("parameters") or {}):
            deployment["parameters"]["authorization"] = AUTHORIZATION_BLOCK
    return config


def shipped_parameters(shipped: Path, deployment_name: str) -> dict[str, Any]:
    """Return a deployment's parameters as deployed here (anchors resolved; see
    :func:`deployment_file`)."""
    config = _with_standing_authorization(yaml.safe_load(shipped.read_text()))
    (deployment,) = [d for d in config["deployments"] if d["name"] == deployment_name]
    return dict(deployment.get("parameters") or {})


def deploy(prefect_file: Path, env: dict[str, str], log: Path, cwd: Path = CHECKOUT) -> None:
    """Deploy every deployment of ``prefect_file`` from ``cwd``, as a user does."""
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"]
    with log.open("wb") as out:
        result = subprocess.run(
            [*command, "--prefect-file", str(prefect_file)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert result.returncode == 0, log.read_text()


STOCK_WORKER = "process"
"""Prefect's own process worker."""
ITO_WORKER = "prefect-ito"
"""The prefect-ito worker: what runs is its own configuration, never Prefect's."""


def start_worker(
    env: dict[str, str], log: Path, cwd: Path = CHECKOUT, worker_type: str = STOCK_WORKER
) -> subprocess.Popen[bytes]:
    """Start ``prefect worker start`` of a worker type on the process pool in ``cwd``; the
    caller stops it by PID."""
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*command, "--name", "e2e", "--type", worker_type],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_watcher(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``prefect-ito watch`` with short long-polls; the caller stops it by PID."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect_ito.cli", "watch", "--wait", "2", "--lost-after", "65"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def flow_run_processes(flow_run_id: Any) -> list[int]:
    """Return the PIDs of processes running the flow run (the worker sets this variable)."""
    return flow_processes().get(str(flow_run_id), [])


def flow_processes() -> dict[str, list[int]]:
    """Return the PIDs of every flow run's processes on this machine, by flow run id."""
    marker = b"PREFECT__FLOW_RUN_ID="
    found: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        for variable in environ.split(b"\0"):
            if variable.startswith(marker):
                found.setdefault(variable[len(marker) :].decode(), []).append(int(proc.name))
    return found


@dataclass
class Stack:
    """One Prefect server with a worker, the deployments and a simulator, for one database."""

    database: str
    api_url: str
    simulator: SimulatorServer
    token: SecretStr
    worker: subprocess.Popen[bytes]
    rows: Callable[[], list[str]]
    """Every deployment, flow-run and work-pool row of the server's database, as text."""
    watcher: subprocess.Popen[bytes] | None = None
    watcher_env: dict[str, str] | None = None
    watcher_log: Path | None = None
    worker_type: str = STOCK_WORKER
    worker_log: Path | None = None


async def wait_for_flow_run(
    flow_run_id: Any,
    done: Callable[[FlowRun], bool],
    timeout: float = TIMEOUT,
    *,
    crashes_recover: bool = False,
) -> FlowRun:
    """Poll a flow run until ``done`` says so; fail if it ends in another final state.

    With ``crashes_recover``, a Crashed state is not an end: the watcher re-enters such runs.
    """
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            flow_run = await client.read_flow_run(flow_run_id)
            if done(flow_run):
                return flow_run
            state = flow_run.state
            final = state is not None and state.is_final()
            assert not final or (crashes_recover and state.is_crashed()), (
                f"{flow_run.name}: {state}"
            )
            await asyncio.sleep(POLL)


async def wait_for_deployment_run(
    deployment_name: str, match: Callable[[FlowRun], bool], timeout: float = TIMEOUT
) -> FlowRun:
    """Poll until a flow run of the deployment matches ``match``; return it."""
    async with asyncio.timeout(timeout), get_client() as client:
        deployment = await client.read_deployment_by_name(deployment_name)
        only_this = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        while True:
            runs = await client.read_flow_runs(deployment_filter=only_this)
            found = [run for run in runs if match(run)]
            if found:
                return found[0]
            await asyncio.sleep(POLL)


async def wait_for(check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Poll a blocking ``check`` (run in a thread) until it returns something truthy."""
    async with asyncio.timeout(timeout):
        while not (result := await asyncio.to_thread(check)):
            await asyncio.sleep(POLL)
        return result


async def flow_run_log_messages(
    flow_run_id: Any, until: str = "", timeout: float = 30
) -> list[str]:
    """Return the flow run's log messages, oldest first, once one contains ``until``.

    Flow processes send logs in batches, so the last ones may arrive a moment after the run ends.
    """
    only_this = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            logs = await client.read_logs(log_filter=only_this, sort=LogSort.TIMESTAMP_ASC)
            messages = [log.message for log in logs]
            if any(until in message for message in messages):
                return messages
            await asyncio.sleep(POLL)


def completed(flow_run: FlowRun) -> bool:
    """Tell whether a flow run is Completed."""
    return flow_run.state is not None and flow_run.state.is_completed()


def named(name: str) -> Callable[[FlowRun], bool]:
    """Return a check that a flow run's state has this name (e.g. "Suspended")."""
    return lambda flow_run: flow_run.state is not None and flow_run.state.name == name


def on_booking(booking_id: str, **changes: Any) -> dict[str, Any]:
    """Return deployment-run parameters that train the shipped defaults on ``booking_id``.

    A run's parameters replace the deployment's ``training`` parameter as a whole.
    """
    defaults = yaml.safe_load(SHIPPED_YAML.read_text())["definitions"]["training"]
    return {"training": {**defaults, "booking": booking_id, **changes}}


def backend_runs(stack: Stack, booking_id: str) -> list[Any]:
    """Return the simulator's training runs on a booking."""
    return [r.run for r in stack.simulator.runs() if r.run.booking_id == booking_id]


async def decide_as_the_person(
    stack: Stack, booking_id: str, decision: DecisionRequest, key: str
) -> None:
    """Decide the pending action of the booking's backend run at the backend, as the account's
    person with a token of their own (contract v0.5)."""
    (run,) = backend_runs(stack, booking_id)
    assert run.pending_action is not None, "the run waits for no decision"
    person = stack.simulator.mint_token(ACCOUNT, principal=f"user:{ACCOUNT}")
    async with ItoClient(stack.simulator.url, person) as client:
        await client.decide(run.run_id, run.pending_action.action_id, decision, idempotency_key=key)


async def start_training(
    parameters: dict[str, Any] | None = None,
    deployment: str = NIGHTLY,
    idempotency_key: str | None = None,
) -> FlowRun:
    """Create a flow run of a training deployment, as a person or a schedule does; return it.

    Every end-to-end training flow run starts here, so what each one must carry (beyond its
    deployment's parameters) is added in one place. Without ``parameters`` the deployment's own
    are used; with ``idempotency_key``, Prefect creates one flow run however often it is asked.
    """
    return await run_deployment(
        deployment, parameters=parameters, timeout=0, idempotency_key=idempotency_key
    )


async def suspend_on_spike(booking_id: str) -> FlowRun:
    """Run the nightly deployment on a booking whose run hits a loss spike; wait for Suspended."""
    flow_run = await start_training(on_booking(booking_id))
    suspended = await wait_for_flow_run(flow_run.id, named("Suspended"))
    # Suspended holds no infrastructure: the worker's flow process for it ends.
    await wait_for(lambda: not flow_run_processes(flow_run.id))
    return suspended


async def train_until_stalled(stack: Stack, booking_id: str = STALLED_BOOKING) -> FlowRun:
    """Run the nightly deployment on a booking whose backend run stalls; return once it trains."""
    # In-process, so that a worker's process runs it while the test cancels (nothing defers).
    params = on_booking(booking_id, mode="in-process")
    flow_run = await start_training(params)
    await wait_for(lambda: [r for r in backend_runs(stack, booking_id) if not r.state.terminal])
    return flow_run


def sqlite_rows(database: Path) -> Callable[[], list[str]]:
    """Return a reader of the rows that hold deployments, flow runs and work pools."""

    def read() -> list[str]:
        with sqlite3.connect(database) as connection:
            return [
                repr(row)
                for table in ("deployment", "flow_run", "work_pool", "flow_run_input")
                for row in connection.execute(f"SELECT * FROM {table}")
            ]

    return read


def postgres_rows(url: str) -> Callable[[], list[str]]:
    """The same reader for PostgreSQL, through asyncpg (what Prefect's server uses)."""
    import asyncpg

    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)

    async def fetch() -> list[str]:
        connection = await asyncpg.connect(dsn)
        try:
            return [
                str(row[0])
                for table in ("deployment", "flow_run", "work_pool", "flow_run_input")
                for row in await connection.fetch(f"SELECT row_to_json(t)::text FROM {table} t")
            ]
        finally:
            await connection.close()

    return lambda: asyncio.run(fetch())


def environment(api_url: str, home: Path, **extra: str) -> dict[str, str]:
    """Return a child process's environment: this one's, pointed at ``api_url``."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(home),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        **extra,
    }
