"""Deferred supervision end to end: a real server, a process worker and `prefect-ito watch`.

A deployment run waits on the backend with no process of its own, is resumed by the watcher when
its run moves, survives the watcher's restart and the loss of its flow process, and ends with
exactly one backend run.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from e2e_stack import (
    DEFER_BOOKING,
    LOST_BOOKING,
    LOST_MACHINE_BOOKING,
    NIGHTLY,
    Stack,
    backend_runs,
    completed,
    flow_run_processes,
    on_booking,
    start_watcher,
    start_worker,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.deployments import run_deployment

from prefect_ito.contract import RunState

SUBMIT = ("POST", "/v0/training-runs")


def deferred(flow_run) -> bool:
    state = flow_run.state
    key = state.state_details.pause_key if state else None
    return bool(state and state.is_paused() and key and key.startswith("defer-"))


async def test_a_deferred_run_holds_no_process_and_ends_with_one_backend_run(stack: Stack):
    flow_run = await run_deployment(
        NIGHTLY, parameters=on_booking(DEFER_BOOKING, defer_after=1), timeout=0
    )

    waiting = await wait_for_flow_run(flow_run.id, deferred)
    await wait_for(lambda: not flow_run_processes(flow_run.id))  # nobody holds a process

    # The watcher may go away and come back at any time: it keeps no state of its own.
    stop(stack.watcher)
    assert stack.watcher_env is not None and stack.watcher_log is not None
    stack.watcher = start_watcher(stack.watcher_env, stack.watcher_log)

    done = await wait_for_flow_run(flow_run.id, completed, timeout=300)

    (run,) = backend_runs(stack, DEFER_BOOKING)
    assert run.state is RunState.SUCCEEDED
    async with get_client() as client:
        history = [state.name for state in await client.read_flow_run_states(done.id)]
    assert waiting.state_name == "Suspended"
    assert "Running" in history[history.index("Suspended") :]  # resumed, by the new watcher
    assert f"Resumed flow run {done.id}" in stack.watcher_log.read_text()
    assert submitted_once(stack, DEFER_BOOKING)


async def test_a_lost_flow_process_is_reentered_and_never_submits_again(stack: Stack):
    flow_run = await run_deployment(
        NIGHTLY, parameters=on_booking(LOST_BOOKING, mode="in-process"), timeout=0
    )
    await wait_for(lambda: backend_runs(stack, LOST_BOOKING))
    pids = await wait_for(lambda: flow_run_processes(flow_run.id))

    for pid in pids:  # the machine's flow process is lost
        os.kill(pid, signal.SIGKILL)

    done = await wait_for_flow_run(flow_run.id, completed, timeout=300, crashes_recover=True)

    (run,) = backend_runs(stack, LOST_BOOKING)
    assert run.state is RunState.SUCCEEDED
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            done.id, key_prefix="ito-recovery-", limit=10, exclude_keys=set()
        )
    assert len(inputs) >= 1  # the watcher re-entered it


async def test_a_lost_machine_is_noticed_by_its_silence_and_its_run_ends_as_the_backend_says(
    stack: Stack,
):
    if stack.database != "sqlite":
        pytest.skip("one database is enough for a wait of two heartbeat windows")
    flow_run = await run_deployment(
        NIGHTLY, parameters=on_booking(LOST_MACHINE_BOOKING, mode="in-process"), timeout=0
    )
    await wait_for(lambda: backend_runs(stack, LOST_MACHINE_BOOKING))
    pids = await wait_for(lambda: flow_run_processes(flow_run.id))

    # The machine is lost: its worker and every flow process under it, at once. Nobody is
    # left to report a crash, so Prefect goes on showing the flow run as Running.
    os.kill(stack.worker.pid, signal.SIGKILL)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    stack.worker.wait(timeout=30)
    await asyncio.sleep(5)
    async with get_client() as client:
        assert (await client.read_flow_run(flow_run.id)).state_name == "Running"

    # Another machine's worker; the watcher notices the silence (no heartbeat for 65 s).
    assert stack.watcher_env is not None and stack.watcher_log is not None
    stack.worker = start_worker(stack.watcher_env, stack.watcher_log.with_name("worker-2.log"))
    done = await wait_for_flow_run(flow_run.id, completed, timeout=420, crashes_recover=True)

    # The backend run finished while nobody watched; the re-entered flow reports its outcome.
    (run,) = backend_runs(stack, LOST_MACHINE_BOOKING)
    assert run.state is RunState.SUCCEEDED
    assert submitted_once(stack, LOST_MACHINE_BOOKING)
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            done.id, key_prefix="ito-recovery-", limit=10, exclude_keys=set()
        )
    assert len(inputs) >= 1


def submitted_once(stack: Stack, booking_id: str) -> bool:
    """Tell whether the booking's one backend run was submitted by one request.

    The simulator serves the whole module, so submissions are told apart by the run's key.
    """
    (admin,) = [a for a in stack.simulator.runs() if a.run.booking_id == booking_id]
    keys = [
        r.idempotency_key
        for r in stack.simulator.requests()
        if (r.method, r.path) == SUBMIT and r.status < 300
    ]
    return keys.count(admin.idempotency_key) == 1


def stop(process) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        process.wait(timeout=30)
