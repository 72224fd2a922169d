"""The edges a new user hit: attach never spends, no traceback, Ctrl-C detaches, a new home."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from cli_helpers import (
    AUTHORIZATION,
    FLOW_RUN_LINE,
    TRAIN,
    UNCONFIRMED,
    confirming_env,
    in_process,
    person_env,
    prefect_ito,
    quote_for_train,
    read_flow_run_id,
    start_run,
    stored_login,
    worker_env,
)
from prefect_homes import migrated_home
from simulator_fixture import FAST

from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import RunState
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario

SUBMIT = ("POST", "/v0/training-runs")


def submissions(simulator: SimulatorServer) -> list[object]:
    return [r for r in simulator.requests() if (r.method, r.path) == SUBMIT]


def no_traceback(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    return output


@pytest.mark.parametrize(
    ("scenario", "cancel_first", "state", "code"),
    [
        ("default", True, RunState.CANCELLED, ExitCode.CANCELLED),
        ("gate-failure", False, RunState.GATE_FAILED, ExitCode.RUN_OUTCOME),
        ("default", False, RunState.SUCCEEDED, ExitCode.SUCCESS),
    ],
)
async def test_attach_to_a_finished_run_reports_it_and_submits_nothing(
    prefect_server, monkeypatch, scenario, cancel_first, state, code
):
    # Before, attach rebuilt the request, found nothing unfinished and submitted a new run.
    # A run to cancel first must still be going when the cancel comes: a slower pace for it.
    pace = 200_000 if cancel_first else FAST
    with SimulatorServer(builtin_scenario(scenario), time_scale=pace) as simulator:
        env = worker_env(simulator, prefect_server)
        monkeypatch.setenv("ITO_COMPUTE_API_URL", env["ITO_COMPUTE_API_URL"])
        monkeypatch.setenv("ITO_COMPUTE_TOKEN", env["ITO_COMPUTE_TOKEN"])
        run_id = await start_run(simulator)
        if cancel_first:
            async with ItoCredentials(api_url=simulator.url).get_client() as client:
                await client.cancel_training_run(run_id, reason="a person", idempotency_key="c-1")
        while not simulator.runs()[0].run.state.terminal:
            await asyncio.sleep(0.2)
        assert simulator.runs()[0].run.state is state

        result = in_process("attach", run_id, env=env)

        assert result.returncode == code, no_traceback(result)
        assert len(submissions(simulator)) == 1
        assert [admin.run.run_id for admin in simulator.runs()] == [run_id]


def test_attach_to_an_unknown_run_is_not_found(simulator, prefect_server):
    result = in_process("attach", "run_nope", env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.NOT_FOUND, no_traceback(result)
    assert "run_nope" in result.stdout + result.stderr
    assert submissions(simulator) == []


@pytest.mark.parametrize("command", ["status", "cancel", "decide"])
def test_an_unknown_flow_run_is_one_line_and_not_found(command, prefect_server):
    unknown = str(uuid4())
    args = [command, unknown]
    if command == "decide":
        args += ["--approve", "--reason", "ok", "--name", "Ada"]
    result = in_process(*args, env={**os.environ, "PREFECT_API_URL": prefect_server})

    assert result.returncode == ExitCode.NOT_FOUND, no_traceback(result)
    assert f"error: Prefect knows no flow run {unknown}" in result.stderr


def test_decide_on_a_run_that_is_not_paused_says_so(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)
    done = in_process(*TRAIN, env=env)
    flow_run_id = FLOW_RUN_LINE.search(done.stdout).group(1)

    result = in_process(
        "decide", flow_run_id, "--approve", "--reason", "ok", "--name", "Ada", env=env
    )

    assert result.returncode == ExitCode.INVALID_INPUT, no_traceback(result)
    assert "waits for no decision" in result.stderr


def test_an_unreachable_backend_is_named_in_one_line(prefect_server):
    with SimulatorServer(builtin_scenario("default")) as simulator:
        env = worker_env(simulator, prefect_server)
    # On the client's default retries: a backend that drops every connection is asked once.
    with dropping_listener() as (url, attempts):
        env["ITO_COMPUTE_API_URL"] = url
        result = in_process(*TRAIN, env=env)

    assert result.returncode == ExitCode.ERROR, no_traceback(result)
    # Before, the flow ran first and ended BackendUnreachable, after eight lines of output.
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert url in result.stderr
    # Before, four attempts (three retries, seconds of back-off) came before that one line.
    assert attempts == [url], attempts


@contextlib.contextmanager
def dropping_listener() -> Iterator[tuple[str, list[str]]]:
    """Listen on a loopback port and close every connection at once; yield its URL and a list
    that gains an entry per connection accepted."""
    attempts: list[str] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)  # so that the loop sees the test end
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            attempts.append(url)
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield url, attempts
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


def test_train_takes_the_backend_and_data_from_options(simulator, prefect_server, tmp_path):
    # The backend comes from --api-url alone, its token from the keyring (kept for its origin).
    token = simulator.mint_token("cli").get_secret_value()
    stored_login(tmp_path, simulator.url, token)
    worker_env(simulator, prefect_server)  # saves the authorization block
    env = person_env(tmp_path, prefect_server)
    refs = tmp_path / "refs.txt"
    refs.write_text("# the corpus\ncatalog://ito/web-2026-10\n\n" + "\n".join(
        f"s3://acme/shard-{i:05d}/" for i in range(3_000)
    ))  # fmt: skip
    args = [
        "train", "--booking", "bk-h200-2x8-ib", "--model-size", "8B", "--target", "t",
        "--budget-usd", "9e4", "--data-file", str(refs), "--api-url", simulator.url,
        "--authorization", AUTHORIZATION,
    ]  # fmt: skip

    result = prefect_ito(*args, env=env)

    assert result.returncode == ExitCode.SUCCESS, no_traceback(result)
    (run,) = simulator.runs()
    assert len(run.run.request.data_refs) == 3_001
    assert run.run.request.data_refs[0] == "catalog://ito/web-2026-10"


def test_bad_options_name_the_option_and_send_nothing(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)
    cases = {
        ("--budget-usd", "-1"): "budget_usd",
        ("--post-training", "ppo"): "post_training",
        ("--data-file", "/no/such/file"): "data_file",
        ("--api-url", "ftp://desk"): "api_url",
    }
    for (option, value), fragment in cases.items():
        args = [*TRAIN[:-2], option, value] if option == "--budget-usd" else [*TRAIN, option, value]
        result = in_process(*args, env=env)  # refused before any flow runs
        assert result.returncode == ExitCode.INVALID_INPUT, no_traceback(result)
        assert fragment in result.stderr, result.stderr
    assert simulator.requests() == []


@pytest.mark.slow
def test_the_first_train_on_a_brand_new_prefect_home_works(simulator):
    # A new PREFECT_HOME migrates its database first; on a small busy machine that took longer
    # than the 20 s Prefect allows its temporary server.
    with tempfile.TemporaryDirectory() as home:
        env = worker_env(simulator, prefect_server="")
        del env["PREFECT_API_URL"]
        env["PREFECT_HOME"] = str(Path(home) / "new")
        Path(env["PREFECT_HOME"]).mkdir()
        # A real quote, confirmed: every check before the flow passes, so the server starts.
        confirmed = [*UNCONFIRMED, "--confirm", quote_for_train(simulator)]
        env["ITO_COMPUTE_TOKEN"] = confirming_env(simulator, "")["ITO_COMPUTE_TOKEN"]
        result = prefect_ito(*confirmed, env=env, timeout=600)

    output = no_traceback(result)
    assert result.returncode == ExitCode.SUCCESS, output
    # Prefect's telemetry complaints, not the run summary's heading of that name.
    complaints = [line for line in output.lower().splitlines() if "telemetry" in line]
    assert all(line.strip() == "telemetry" for line in complaints), complaints
    assert "database is locked" not in output


@pytest.mark.slow
def test_ctrl_c_at_a_terminal_detaches_in_ephemeral_mode(tmp_path):
    # A terminal sends Ctrl-C to its whole foreground process group: once that stopped Prefect's
    # temporary server too, and the detaching command then waited for it forever.
    with SimulatorServer(builtin_scenario("stall")) as simulator:
        env = confirming_env(simulator, prefect_server="")
        del env["PREFECT_API_URL"]
        env["PREFECT_HOME"] = str(migrated_home(tmp_path))  # not a new home: tested above
        confirmed = [*UNCONFIRMED, "--confirm", quote_for_train(simulator)]
        train = subprocess.Popen(
            [sys.executable, "-m", "prefect_ito.cli", *confirmed],
            env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own group, as a terminal's foreground job
        )  # fmt: skip
        try:
            read_flow_run_id(train)
            deadline = time.monotonic() + 120
            while not simulator.runs() and time.monotonic() < deadline:
                time.sleep(0.3)
            os.killpg(train.pid, signal.SIGINT)
            output, _ = train.communicate(timeout=120)
        finally:
            stop_group(train)

    assert train.returncode == ExitCode.DETACHED, output
    assert "Detached: backend run " in output and "ERROR" not in output, output
    assert "Traceback" not in output and "Crash detected" not in output


def stop_group(process: subprocess.Popen[str]) -> None:
    """Stop what a test started in its own process group, and the temporary server it began."""
    if process.poll() is None:
        children = subprocess.run(
            ["pgrep", "-P", str(process.pid)], capture_output=True, text=True
        ).stdout.split()
        os.killpg(process.pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        process.wait(timeout=30)
