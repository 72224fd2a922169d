"""``train`` checks what needs no Prefect server before one starts, and a down backend is a line.

Each command here runs in this process, in Prefect's ephemeral mode: a temporary server is a
process Prefect starts, and no process may start while the command runs (each attempt is refused
and counted).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from cli_helpers import REQUEST, TRAIN, UNCONFIRMED, confirming_env, in_process, worker_env

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario


def ephemeral(env: dict[str, str]) -> dict[str, str]:
    """Return ``env`` without a Prefect server: Prefect would start a temporary one."""
    return {**env, "PREFECT_API_URL": ""}


@contextmanager
def processes_refused() -> Iterator[list[Any]]:
    """Refuse, and list, every process started meanwhile (a temporary Prefect server is one)."""
    started: list[Any] = []

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        started.append(args)
        raise RuntimeError(f"a process was started: {args!r}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        yield started


def train(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``train`` in this process; assert that it started no process (and so no server)."""
    with processes_refused() as started:
        result = in_process(*args, env=env)
    assert started == [], result.stdout + result.stderr
    return result


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("confirm", ["../quotes", " q1 ", ""])
def test_a_malformed_quote_id_is_refused_before_a_server_starts(simulator, confirm):
    env = ephemeral(confirming_env(simulator, ""))
    result = train(*UNCONFIRMED, "--confirm", confirm, env=env)

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert one_line(result.stderr).startswith("error: confirm:")


def test_the_request_s_own_digest_is_no_quote_id_and_is_told_so(simulator):
    env = ephemeral(confirming_env(simulator, ""))
    result = train(*UNCONFIRMED, "--confirm", REQUEST.digest(), env=env)

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert "takes a quote's id, not a manifest digest" in one_line(result.stderr)


def test_another_request_s_digest_is_a_mismatch_before_a_server_starts(simulator):
    other = REQUEST.model_copy(update={"budget_usd": 1_000}).digest()
    env = ephemeral(confirming_env(simulator, ""))
    result = train(*UNCONFIRMED, "--confirm", other, env=env)

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stderr
    assert "manifest digest of another request" in one_line(result.stderr)


def test_a_quote_of_another_request_is_refused_before_a_server_starts(simulator):
    other = REQUEST.model_copy(update={"budget_usd": 1_000})
    quote_id = make_quote(simulator, other.to_submission().model_dump(mode="json"))
    env = ephemeral(confirming_env(simulator, ""))
    result = train(*UNCONFIRMED, "--confirm", quote_id, env=env)

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stderr
    assert "is a quote of another request" in one_line(result.stderr)
    assert simulator.runs() == []


def test_a_backend_that_is_down_is_one_line_and_no_server_starts():
    with SimulatorServer(builtin_scenario("default")) as simulator:
        env = ephemeral(worker_env(simulator, ""))
    url = env["ITO_COMPUTE_API_URL"]  # nothing listens there any more
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) != 0
    result = train(*TRAIN, env=env)

    assert result.returncode == ExitCode.ERROR, result.stdout + result.stderr
    line = one_line(result.stderr)
    assert line.startswith("error: ") and url in line, line
    assert result.stdout == ""


def make_quote(simulator: SimulatorServer, submission: dict[str, object]) -> str:
    token = simulator.mint_token("cli").get_secret_value()
    response = httpx.post(
        f"{simulator.url}/v0/training-quotes",
        json=submission,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["data"]["quote_id"])
