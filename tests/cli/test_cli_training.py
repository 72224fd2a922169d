"""``prefect-ito train | demo | decide | status | cancel`` as a person runs them: in this process,
but where a signal, a keyring or a Prefect home of the command's own needs a child process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_helpers import (
    FLOW_RUN_LINE,
    TRAIN,
    in_process,
    prefect_ito,
    read_flow_run_id,
    start_run,
    start_train,
    worker_env,
)
from prefect_homes import migrated_home
from simulator_fixture import FAST

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario

TASK_CHATTER = re.compile(r"Task run '[^']+' - Finished in state Completed")


def test_train_runs_the_flow_to_completion(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)
    result = in_process(*TRAIN, "--post-training", "sft", env=env)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.SUCCESS, output
    assert "Final state: Completed" in result.stdout
    assert "Stage post_training.sft: passed" in output
    assert f"Itô backend {simulator.url}: live API contacted: no. Notice: " in result.stdout
    assert len(simulator.runs()) == 1
    run_id = simulator.runs()[0].run.run_id
    # Before, train ended with the final state only; now with the demo's summary.
    for heading in (f"Backend run {run_id}: succeeded", "Gates", "Telemetry"):
        assert heading in result.stdout, result.stdout
    assert "Decisions: nothing was proposed to a person." in result.stdout
    # Before, about 25 "Task run … Finished in state Completed()" lines drowned the stages.
    assert not TASK_CHATTER.search(output), output

    flow_run_id = FLOW_RUN_LINE.search(result.stdout).group(1)
    env_without_token = {k: v for k, v in env.items() if k != "ITO_COMPUTE_TOKEN"}
    status = in_process("status", flow_run_id, env=env_without_token)
    assert status.returncode == ExitCode.SUCCESS, status.stdout + status.stderr
    assert "Completed" in status.stdout
    # Before, status printed only the state's name.
    assert f"Backend run: {run_id} (succeeded)" in status.stdout
    assert "Stage: post_training.sft" in status.stdout
    assert "Spend: $" in status.stdout and "of $250,000.00" in status.stdout
    assert "Pending decision: none" in status.stdout


def test_train_exits_with_the_unavailable_code_when_training_is_not_live(prefect_server):
    with SimulatorServer(builtin_scenario("unavailable")) as simulator:
        result = in_process(*TRAIN, env=worker_env(simulator, prefect_server))

        assert result.returncode == ExitCode.UNAVAILABLE, result.stdout + result.stderr
        assert "Unavailable" in result.stdout
        assert not [r for r in simulator.requests() if r.method == "POST"]


def test_train_exits_with_the_invalid_input_code_before_any_request(simulator, prefect_server):
    args = [*TRAIN[:-1], "-5"]
    result = in_process(*args, env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.INVALID_INPUT, result.stdout + result.stderr
    assert "budget_usd" in result.stderr
    assert simulator.requests() == []


@pytest.mark.parametrize("command", ["decide", "status", "cancel"])
def test_server_commands_say_plainly_they_need_a_prefect_server(command):
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    args = [command, "00000000-0000-0000-0000-000000000000"]
    if command == "decide":
        args += ["--approve", "--reason", "ok", "--name", "Ada"]
    result = in_process(*args, env=env)

    assert result.returncode == ExitCode.ERROR
    assert "needs a real Prefect server" in result.stderr


@pytest.mark.slow
def test_demo_runs_end_to_end_without_a_terminal_in_ephemeral_mode_whatever_the_shell_holds():
    with tempfile.TemporaryDirectory() as home:
        env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
        # A shell set up for a real backend: the demo must neither use nor send its token.
        env.update(
            # Not a new home: the first start on one has a test of its own (test_cli_edges.py).
            PREFECT_HOME=str(migrated_home(Path(home))),
            ITO_COMPUTE_API_URL="https://desk.example.com",
            ITO_COMPUTE_TOKEN="shell-canary-7d2c",
        )
        result = prefect_ito("demo", env=env, timeout=600)

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.SUCCESS, output
    assert "shell-canary-7d2c" not in output
    assert "leaves the Itô backend settings of your shell (ITO_COMPUTE_*) unused" in output
    said = " ".join(output.split())  # the console wraps at its width
    assert "scripted demo operator approves at the backend as the demo's person" in said
    assert "Real runs wait for a person's decision" in said
    assert "Final state: Completed" in output
    assert "post_training.rlvr" in output


async def test_attach_supervises_an_existing_backend_run(prefect_server, monkeypatch):
    scenario = builtin_scenario("default").with_options(time_scale=100_000)
    with SimulatorServer(scenario) as simulator:
        env = worker_env(simulator, prefect_server)
        monkeypatch.setenv("ITO_COMPUTE_API_URL", env["ITO_COMPUTE_API_URL"])
        monkeypatch.setenv("ITO_COMPUTE_TOKEN", env["ITO_COMPUTE_TOKEN"])
        run_id = await start_run(simulator)
        result = in_process("attach", run_id, "--verbose", env=env)

        output = result.stdout + result.stderr
        assert result.returncode == ExitCode.SUCCESS, output
        assert f"Attached to backend run {run_id}" in output
        assert [admin.run.run_id for admin in simulator.runs()] == [run_id]
        assert f"Backend run {run_id}: succeeded" in result.stdout  # the same summary
        assert TASK_CHATTER.search(output), output  # --verbose shows Prefect's task lines


def test_prefect_registers_the_blocks_from_the_collection(prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "block", "register", "-m", "prefect_ito"],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Successfully registered 4 blocks" in " ".join(result.stdout.split())


async def test_cancel_stops_a_paused_train_and_its_backend_workload(prefect_server):
    import asyncio

    from prefect import get_client

    from prefect_ito.contract import RunState

    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        env = worker_env(simulator, prefect_server)
        train = start_train(env)
        try:
            flow_run_id = await asyncio.to_thread(read_flow_run_id, train)
            async with asyncio.timeout(120), get_client() as client:
                while not (await client.read_flow_run(flow_run_id)).state.is_paused():
                    await asyncio.sleep(0.5)

            status = in_process("status", flow_run_id, env=env)
            assert "Pending decision: loss spike 17.28 at step 12,000 in pretrain" in status.stdout
            assert f"prefect-ito decide {flow_run_id} --approve|--reject" in status.stdout
            cancel = in_process("cancel", flow_run_id, env=env)
            assert cancel.returncode == ExitCode.SUCCESS, cancel.stdout + cancel.stderr
            output, _ = await asyncio.to_thread(train.communicate, timeout=180)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait(timeout=30)

        assert train.returncode == ExitCode.CANCELLED, output
        assert "Backend workload" in output
        assert simulator.runs()[0].run.state is RunState.CANCELLED
