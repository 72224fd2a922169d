"""``--json``: one envelope-shaped document on stdout for every command, everything else on stderr.

Each command runs with no terminal, as a script or a scheduler runs it, in this process
(:func:`cli_helpers.in_process`) unless it needs one of its own (a keyring, a signal). Commands
that need only the backend run with ``PREFECT_API_URL`` pointing where nothing
listens: had they asked Prefect anything, they would have failed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cli_helpers import FLOW_RUN_LINE, TRAIN, in_process, one_document, prefect_ito, worker_env
from device_login import approve_in_browser
from keyrings.alt.file import PlaintextKeyring
from simulator_fixture import FAST
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import SCHEMA_VERSION, Capabilities, Envelope, ErrorEnvelope
from prefect_ito.exceptions import ExitCode
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import SimulatorServer, builtin_scenario

NOWHERE = "http://127.0.0.1:9/api"  # nothing listens on the discard port
KEY = "nightly-2026-11-30"


def backend_env(simulator: SimulatorServer, token: str | None = None) -> dict[str, str]:
    """The environment of a command that needs only the backend; Prefect cannot be reached."""
    env = {key: value for key, value in os.environ.items() if key != "ITO_COMPUTE_TOKEN"}
    env.update(
        ITO_COMPUTE_API_URL=simulator.url,
        PREFECT_API_URL=NOWHERE,
        PREFECT_INTEGRATIONS_ITO_MAX_RETRIES="0",
    )
    if token is not None:
        env["ITO_COMPUTE_TOKEN"] = token
    return env


def revoke(simulator: SimulatorServer, token: str) -> None:
    answer = httpx.post(
        f"{simulator.url}/v0/auth/revoke", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.json()["data"] == {"revoked": True}


def methods(simulator: SimulatorServer, since: int = 0) -> set[str]:
    return {entry.method for entry in simulator.requests()[since:]}


def test_capabilities_and_whoami_answer_in_the_contract_s_envelope(simulator):
    token = simulator.mint_token("cli").get_secret_value()
    env = backend_env(simulator, token)

    capabilities = one_document(in_process("capabilities", "--json", env=env), token)
    whoami = one_document(in_process("whoami", "--json", env=env), token)
    human = in_process("capabilities", env=env)

    Envelope[Capabilities].model_validate(capabilities)  # the contract's own model reads it
    assert capabilities["data"]["schema_version"] == SCHEMA_VERSION
    assert capabilities["data"]["api_url"] == simulator.url
    assert capabilities["live_api_contacted"] is False
    assert "simulator" in capabilities["notice"].lower()
    assert whoami["data"]["account"] == "cli"
    assert whoami["data"]["api_url"] == simulator.url
    assert human.returncode == ExitCode.SUCCESS, human.stderr
    assert f"schema version: {SCHEMA_VERSION}" in human.stdout
    assert f"Itô backend {simulator.url}: live API contacted: no" in human.stdout
    assert methods(simulator) == {"GET"}


@pytest.mark.parametrize("token_state", ["missing", "revoked"])
def test_an_authentication_failure_exits_6_from_every_command(token_state, prefect_server):
    with SimulatorServer(builtin_scenario("default")) as simulator:
        env = worker_env(simulator, prefect_server)
        token = env.pop("ITO_COMPUTE_TOKEN")
        if token_state == "revoked":
            revoke(simulator, token)
            env["ITO_COMPUTE_TOKEN"] = token
        commands = {
            "train": TRAIN,
            "attach": ["attach", "run_1"],
            "runs show": ["runs", "show", "run_1"],
            "capabilities": ["capabilities"],
            "whoami": ["whoami"],
        }
        for name, args in commands.items():
            result = in_process(*args, "--json", env=env)
            document = one_document(result, token)

            assert result.returncode == ExitCode.AUTHENTICATION, (name, result.stderr)
            code = "NOT_LOGGED_IN" if token_state == "missing" else "TOKEN_REVOKED"
            assert document["error"]["code"] == code, (name, document)
            if token_state == "missing":  # no backend answered anything
                assert document["live_api_contacted"] is None, (name, document)
            else:
                # The backend's own code, passed through; train and attach add the flow run.
                ErrorEnvelope.model_validate({k: v for k, v in document.items() if k != "data"})
        for args in (["runs", "show", "run_1"], ["capabilities"]):  # and without --json
            assert in_process(*args, env=env).returncode == ExitCode.AUTHENTICATION

        submitted = [r for r in simulator.requests() if r.path.startswith("/v0/training-runs")]
        assert "POST" not in {r.method for r in submitted}


async def finished_runs(simulator: SimulatorServer, targets: list[str]) -> list[str]:
    """Submit one run per target on the same booking, one after the other; return their ids."""
    run_ids = []
    for target in targets:
        training = TrainingParameters(
            booking="bk-h200-2x8-ib", model_size="8B", data=["catalog://ito/web"],
            target=target, budget_usd=1e5, idempotency_key=f"key-{target}",
        )  # fmt: skip
        job = ItoTrainingJob(
            credentials=ItoCredentials(api_url=simulator.url),
            training=training,
            authorization=covering_authorization(simulator, "cli"),
        )
        run_ids.append((await job.trigger()).run_id)
        while not simulator.runs()[-1].run.state.terminal:
            await asyncio.sleep(0.2)
    return run_ids


async def test_runs_show_asks_the_backend_by_each_selector_and_only_reads(monkeypatch):
    with SimulatorServer(builtin_scenario("default"), time_scale=FAST) as simulator:
        token = simulator.mint_token("cli").get_secret_value()
        monkeypatch.setenv("ITO_COMPUTE_API_URL", simulator.url)
        monkeypatch.setenv("ITO_COMPUTE_TOKEN", token)
        first, second = await finished_runs(simulator, ["chat", "code"])
        env = backend_env(simulator, token)
        before = len(simulator.requests())

        def show(*args: str) -> subprocess.CompletedProcess:
            return in_process("runs", "show", *args, env=env)

        by_id = one_document(show(first, "--json"), token)
        by_key = one_document(show("--idempotency-key", "key-code", "--json"), token)
        by_booking = one_document(show("--booking", "bk-h200-2x8-ib", "--json"), token)
        unknown = one_document(show("run_nope", "--json"), token)
        unknown_key = one_document(show("--idempotency-key", "key-nope", "--json"), token)
        empty = one_document(show("--booking", "bk-without-runs", "--json"), token)
        one_human = show(first)
        all_human = show("--booking", "bk-h200-2x8-ib")

        assert [run["run_id"] for run in by_id["data"]["runs"]] == [first]
        assert by_id["data"]["runs"][0]["state"] == "succeeded"
        assert [run["run_id"] for run in by_key["data"]["runs"]] == [second]
        assert [run["run_id"] for run in by_booking["data"]["runs"]] == [first, second]
        assert empty["data"] == {"runs": []}
        for missing in (unknown, unknown_key):
            assert missing["error"]["exit_code"] == ExitCode.NOT_FOUND
        assert unknown["error"]["code"] == "RUN_NOT_FOUND"
        assert "run_nope" in unknown["error"]["message"]
        assert f"Backend run {first}: succeeded" in one_human.stdout, one_human.stderr
        assert first in all_human.stdout and second in all_human.stdout, all_human.stderr
        assert methods(simulator, since=before) == {"GET"}
        assert len(simulator.runs()) == 2


BAD_INPUT = {
    "no selector": (["runs", "show"], "RUN_ID, --idempotency-key and --booking", None),
    "two selectors": (
        ["runs", "show", "run_1", "--booking", "bk-1"],
        "RUN_ID, --idempotency-key and --booking",
        None,
    ),
    "malformed key": (["runs", "show", "--idempotency-key", "a key"], "idempotency_key", "="),
    "long booking": (["runs", "show", "--booking", "b" * 129], "booking", "="),
    "negative budget": ([*TRAIN[:-1], "-5"], "budget_usd", "="),
    "train key": ([*TRAIN, "--idempotency-key", "no/slash"], "idempotency_key", "="),
    "recipe": ([*TRAIN, "--post-training", "ppo"], "post_training", "="),
    "scenario": (["demo", "--scenario", "nope"], "scenario", "="),
    "unknown option": (["capabilities", "--bogus"], "--bogus", None),
    "not a flow run id": (["status", "run_1"], "run_1", None),
}


@pytest.mark.parametrize(("args", "named", "field"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_error_document_naming_the_field_and_nothing_is_sent(
    simulator, args, named, field
):
    token = simulator.mint_token("cli").get_secret_value()

    result = in_process(*args, "--json", env=backend_env(simulator, token))

    document = one_document(result, token)
    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert document["error"]["code"] == "INVALID_PARAMETERS"
    assert named in document["error"]["message"]
    assert document["error"].get("field") == (named if field == "=" else None)
    assert f"error: {document['error']['message']}" in result.stderr  # the line, as ever
    assert simulator.requests() == []


def test_an_unknown_simulator_scenario_is_one_line_naming_it():
    # Before, a traceback (FileNotFoundError).
    result = in_process("simulator", "--scenario", "nope", env=dict(os.environ))

    assert result.returncode == ExitCode.INVALID_INPUT
    assert result.stderr.startswith(
        "error: scenario: neither a built-in scenario nor a scenario file"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("port", ["-5", "70000"])
def test_a_simulator_port_out_of_range_is_one_line(port):
    # Before, a traceback (OverflowError from the socket's bind).
    result = in_process("simulator", "--port", port, env=dict(os.environ))

    assert result.returncode == ExitCode.INVALID_INPUT
    assert result.stderr.startswith("error: port: ")
    assert "Traceback" not in result.stderr


def test_train_with_the_same_idempotency_key_twice_makes_one_backend_run(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)
    token = env["ITO_COMPUTE_TOKEN"]
    args = [*TRAIN, "--idempotency-key", KEY, "--json"]

    first = in_process(*args, env=env)
    again = in_process(*args, env=env)
    changed = in_process(*TRAIN[:-1], "99999", "--idempotency-key", KEY, "--json", env=env)

    done = one_document(first, token)["data"]
    assert done["state_name"] == "Completed"
    assert done["summary"]["state"] == "succeeded"
    assert "pretrain" in [stage["name"] for stage in done["summary"]["stages"]]
    assert FLOW_RUN_LINE.search(first.stderr).group(1) == done["flow_run_id"]  # progress: stderr
    assert "Stage data_prep: passed" in first.stderr
    replayed = one_document(again, token)["data"]
    assert replayed["flow_run_id"] != done["flow_run_id"]
    assert replayed["summary"]["run_id"] == done["summary"]["run_id"]
    refused = one_document(changed, token)
    assert refused["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert refused["error"]["exit_code"] == ExitCode.INVALID_INPUT
    assert [(admin.run.run_id, admin.idempotency_key) for admin in simulator.runs()] == [
        (done["summary"]["run_id"], KEY)
    ]

    # The flow run, as Prefect has it (no token needed), and as the backend has it.
    without_token = {k: v for k, v in env.items() if k != "ITO_COMPUTE_TOKEN"}
    status = one_document(in_process("status", done["flow_run_id"], "--json", env=without_token))
    assert status["data"]["state_name"] == "Completed"
    assert status["data"]["backend_run"]["run_id"] == done["summary"]["run_id"]
    assert status["live_api_contacted"] is None  # Prefect only
    attach = one_document(in_process("attach", done["summary"]["run_id"], "--json", env=env))
    assert attach["data"]["summary"]["run_id"] == done["summary"]["run_id"]
    assert len(simulator.runs()) == 1


def test_train_that_fails_keeps_its_summary_beside_the_error(prefect_server):
    with SimulatorServer(builtin_scenario("unavailable")) as simulator:
        env = worker_env(simulator, prefect_server)
        result = in_process(*TRAIN, "--json", env=env)

        document = one_document(result, env["ITO_COMPUTE_TOKEN"])
        assert result.returncode == ExitCode.UNAVAILABLE
        assert document["error"]["code"] == "CAPABILITY_NOT_AVAILABLE"
        assert document["data"]["state_name"] == "Unavailable"
        assert document["data"]["summary"] is None  # it never got a backend run
        assert "POST" not in methods(simulator)


@pytest.mark.parametrize("command", ["status", "cancel", "decide"])
def test_an_unknown_flow_run_is_a_not_found_document(command, prefect_server):
    args = [command, "00000000-0000-4000-8000-000000000000", "--json"]
    if command == "decide":
        args += ["--approve", "--reason", "ok", "--name", "Ada"]
    result = in_process(*args, env={**os.environ, "PREFECT_API_URL": prefect_server})

    document = one_document(result)
    assert document["error"]["code"] == "FLOW_RUN_NOT_FOUND"
    assert document["error"]["exit_code"] == ExitCode.NOT_FOUND


def test_cancel_answers_in_json_and_the_cancelled_train_says_so(prefect_server):
    with SimulatorServer(builtin_scenario("stall")) as simulator:  # a run that never ends
        env = worker_env(simulator, prefect_server)
        train = subprocess.Popen(
            [sys.executable, "-m", "prefect_ito.cli", *TRAIN, "--json"],
            env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            flow_run_id = read_flow_run_id(train.stderr)
            while not simulator.runs():
                time.sleep(0.5)
            cancel = in_process("cancel", flow_run_id, "--json", env=env)
            stdout, stderr = train.communicate(timeout=180)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait(timeout=30)

        said = one_document(cancel)["data"]
        assert said["flow_run_id"] == flow_run_id and said["cancel_requested_in_prefect"] is True
        # A running flow process cancels its own backend run: cancel says so, and names it.
        assert said["backend_cancelled_here"] is False and said["left_to"] == "flow_process"
        assert said["backend_run"]["run_id"] == simulator.runs()[0].run.run_id
        finished = subprocess.CompletedProcess(train.args, train.returncode, stdout, stderr)
        document = one_document(finished, env["ITO_COMPUTE_TOKEN"])
        assert train.returncode == ExitCode.CANCELLED
        assert document["error"]["code"] == "RUN_CANCELLED"
        (cancelled,) = simulator.runs()
        assert document["data"]["summary"]["run_id"] == cancelled.run.run_id
        assert cancelled.run.state.value == "cancelled"


def read_flow_run_id(stream) -> str:
    for line in stream:
        found = FLOW_RUN_LINE.search(line)
        if found:
            return found.group(1)
    raise AssertionError("train ended without naming its flow run")


def test_train_without_a_terminal_prompts_nothing_in_json(prefect_server):
    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        env = worker_env(simulator, prefect_server)
        result = in_process(*TRAIN, "--approval-timeout", "7", "--json", env=env)

    document = one_document(result, env["ITO_COMPUTE_TOKEN"])
    assert result.returncode == ExitCode.AWAITING_DECISION
    assert document["error"]["code"] == "AWAITING_DECISION"
    assert document["data"]["summary"]["decisions"][0]["decision"] is None
    assert "Approve or reject" not in result.stdout + result.stderr


def test_demo_answers_in_json(prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    result = in_process("demo", "--scenario", "default", "--json", env=env)

    document = one_document(result)
    assert document["data"]["state_name"] == "Completed"
    assert document["data"]["summary"]["state"] == "succeeded"
    assert document["live_api_contacted"] is False


@pytest.mark.slow
def test_login_whoami_logout_answer_in_json(tmp_path: Path):
    env = {key: value for key, value in os.environ.items() if key != "ITO_COMPUTE_TOKEN"}
    env.update(XDG_DATA_HOME=str(tmp_path), PREFECT_API_URL=NOWHERE)
    with SimulatorServer() as simulator:
        login = subprocess.Popen(
            [sys.executable, "-m", "prefect_ito.cli", "login", "--api-url", simulator.url,
             "--json"],
            env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            prompt = read_user_code(login.stderr)
            approve_in_browser(f"{simulator.url}/device", prompt)
            stdout, stderr = login.communicate(timeout=60)
        finally:
            if login.poll() is None:
                login.kill()
                login.wait(timeout=30)
        stored = PlaintextKeyring()
        stored.file_path = str(tmp_path / "python_keyring" / "keyring_pass.cfg")
        token = stored.get_password("prefect-ito", simulator.url)
        assert token

        url = simulator.url
        logged_in = subprocess.CompletedProcess(login.args, login.returncode, stdout, stderr)
        whoami = prefect_ito("whoami", "--api-url", url, "--json", env=env)
        logout = prefect_ito("logout", "--api-url", url, "--json", env=env)
        again = prefect_ito("logout", "--api-url", url, "--json", env=env)

    assert one_document(logged_in, token)["data"]["api_url"] == url  # the code came on stderr
    assert one_document(whoami, token)["data"]["account"] == "ana"
    assert one_document(logout, token)["data"] == {"api_url": url, "revoked": True}
    assert one_document(again, token)["error"]["code"] == "NOT_LOGGED_IN"
    assert again.returncode == ExitCode.AUTHENTICATION


def read_user_code(stream) -> str:
    """Read login's standard error until it names the code to enter."""
    for line in stream:
        if "enter the code" in line:
            return line.rsplit(" ", 1)[-1].strip()
    raise AssertionError("login ended without showing a code")
