"""A lost machine on the shipped defaults: the deployment files as shipped, a process worker and
``prefect-ito watch`` without ``--lost-after``, and no heartbeat setting anywhere.

Found by a trial: three runs of ``after-booking``, the machine lost (worker and every flow process
SIGKILLed) a few seconds after submission, a new worker started: nine minutes later one flow run
still read ``Submitting``, as the watcher's default waited three of Prefect's 180 s heartbeat
intervals for a run that never beats while it starts. The machine is lost here while the worker
starts the run (it froze first, so that what Prefect holds is what the loss left), and a worker
comes back under the same name, as a systemd unit does: the run is re-entered and ends with one
backend run. A run the loss catches running is found by its flow process's alive beats, which
stopped with it, whatever Prefect's heartbeat setting (its default 180 s here).

Its own Prefect server (the shared one's worker would take the run) and simulator, shared by both
tests: each trains on a booking of its own, and the worker that came back after one test's loss
serves the next. Every process is stopped by its own PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import (
    AFTER_BOOKING,
    LOST_MACHINE_BOOKING,
    PLAIN_BOOKING,
    SHIPPED_YAML,
    completed,
    deploy,
    deployment_file,
    e2e_scenario,
    environment,
    on_booking,
    start_training,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL, temporary_settings
from processes import descendants
from trial_stack import TrialStack, free_port, save_blocks_and_pool

from prefect_ito.simulator import SimulatorServer

pytestmark = pytest.mark.e2e

ACCOUNT = "lost-machine"
PERSON = "user:ada"
WORKLOAD = "service:lost-machine-worker"
HEARTBEAT = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
RECOVERED_WITHIN = 300.0
"""Generous for a busy machine; the watcher's old default waited 540 s before a first look."""
STARTED_WITHIN = 120.0


@pytest.fixture(scope="module")
def defaults_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialStack]:
    """A stack on the shipped files as they are, but for the checkout's path; see the docstring."""
    scratch = Path(tmp_path_factory.mktemp("lost-machine"))
    with SimulatorServer(e2e_scenario()) as simulator:
        stack = TrialStack(scratch, simulator, free_port())
        try:
            stack.start_server()
            with temporary_settings({PREFECT_API_URL: stack.api_url}):
                _prepare(stack)
                yield stack
        finally:
            stack.close()


def _prepare(stack: TrialStack) -> None:
    """Save the blocks the files name, create the pool from the shipped template, deploy the
    shipped file, and start the watcher as docs/deployments.md shows (no options)."""
    save_blocks_and_pool(stack, ACCOUNT, "lost machine")
    deployer = _without_heartbeat(environment(stack.api_url, stack.scratch / "deployer"))
    deploy(deployment_file(stack.scratch, SHIPPED_YAML), deployer, stack.scratch / "deploy.log")
    token = stack.simulator.mint_token(ACCOUNT, principal=WORKLOAD)
    stack.env = _without_heartbeat(
        environment(
            stack.api_url,
            stack.scratch / "worker",
            ITO_COMPUTE_API_URL=stack.simulator.url,
            ITO_COMPUTE_TOKEN=token.get_secret_value(),
            XDG_DATA_HOME=str(stack.scratch / "worker-keyring"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )
    )
    stack.watchers[0] = _start_watcher(stack.env, stack.scratch / "watcher.log")


def _without_heartbeat(env: dict[str, str]) -> dict[str, str]:
    """Return ``env`` without a heartbeat setting, whatever this shell holds: Prefect's default."""
    return {key: value for key, value in env.items() if key != HEARTBEAT}


def _start_watcher(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``prefect-ito watch`` with its defaults, but a short long-poll (the sweep's pace)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect_ito.cli", "watch", "--wait", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _a_worker(stack: TrialStack) -> None:
    """Start the stack's worker once its flow run waits, unless one runs (after another test's
    loss, the worker that came back)."""
    if stack.worker is None or stack.worker.poll() is not None:
        stack.start_worker()


def _freeze_machine(stack: TrialStack) -> list[int]:
    """SIGSTOP the worker and every process under it: nothing more reaches Prefect from there."""
    assert stack.worker is not None
    frozen = [stack.worker.pid, *descendants(stack.worker.pid)]
    for pid in frozen:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return frozen


async def _states(flow_run_id: Any) -> list[Any]:
    async with get_client() as client:
        return sorted(await client.read_flow_run_states(flow_run_id), key=lambda s: s.timestamp)


async def test_a_machine_lost_while_starting_a_run_is_recovered_on_the_shipped_defaults(
    defaults_stack: TrialStack,
):
    stack = defaults_stack
    assert not [e for e in (stack.env, os.environ) if HEARTBEAT in e]  # Prefect's 180 s
    flow_run = await start_training(on_booking(PLAIN_BOOKING), deployment=AFTER_BOOKING)
    _a_worker(stack)
    await wait_for_flow_run(
        flow_run.id, lambda r: r.state is not None and r.state.type == StateType.PENDING,
        STARTED_WITHIN,
    )  # fmt: skip

    # Still starting (Pending, or the worker's Submitting after it): no flow process beats.
    lost_at = await _lose_machine(stack, flow_run.id, StateType.PENDING)

    await _recovered_with_one_backend_run(stack, flow_run.id, PLAIN_BOOKING, lost_at)


async def test_a_machine_lost_while_a_run_runs_is_recovered_on_the_shipped_defaults(
    defaults_stack: TrialStack,
):
    stack = defaults_stack
    flow_run = await start_training(on_booking(LOST_MACHINE_BOOKING), deployment=AFTER_BOOKING)
    _a_worker(stack)
    await wait_for_flow_run(
        flow_run.id, lambda r: r.state is not None and r.state.type == StateType.RUNNING,
        STARTED_WITHIN,
    )  # fmt: skip
    async with asyncio.timeout(STARTED_WITHIN):  # supervising its backend run: it submitted
        while not [r for r in stack.simulator.runs() if r.run.booking_id == LOST_MACHINE_BOOKING]:
            await asyncio.sleep(0.5)

    lost_at = await _lose_machine(stack, flow_run.id, StateType.RUNNING)

    await _recovered_with_one_backend_run(stack, flow_run.id, LOST_MACHINE_BOOKING, lost_at)


async def _lose_machine(stack: TrialStack, flow_run_id: Any, state: StateType) -> float:
    """Freeze the machine, check the run is still in ``state``, lose the machine; return when."""
    _freeze_machine(stack)
    # A request already on its way lands; then Prefect holds what the loss left.
    await asyncio.sleep(1)
    async with get_client() as client:
        left = await client.read_flow_run(flow_run_id)
    assert left.state is not None and left.state.type == state, left.state
    lost_at = time.time()
    stack.lose_machine()  # SIGKILL the worker and every process under it; a worker comes back
    return lost_at


async def _recovered_with_one_backend_run(
    stack: TrialStack, flow_run_id: Any, booking: str, lost_at: float
) -> None:
    done = await wait_for_flow_run(flow_run_id, completed, RECOVERED_WITHIN, crashes_recover=True)

    states = await _states(flow_run_id)
    assert [s for s in states if s.name == "Recovering"], [s.name for s in states]
    runs = [r.run for r in stack.simulator.runs() if r.run.booking_id == booking]
    assert len(runs) == 1, runs
    assert done.state is not None and done.state.is_completed()
    _print_figures(lost_at, states)


def _print_figures(lost_at: float, states: list[Any]) -> None:
    """Print the seconds from the loss to the re-entry, to running again, and to the end."""
    after = [s for s in states if s.timestamp.timestamp() > lost_at]

    def first(name: str) -> str:
        found = [s for s in after if s.name == name]
        return f"{found[0].timestamp.timestamp() - lost_at:.1f}" if found else "-"

    print(
        f"figures: lost → re-entered {first('Recovering')} s, running again {first('Running')} s,"
        f" completed {first('Completed')} s"
    )
