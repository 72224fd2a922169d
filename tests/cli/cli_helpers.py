"""Shared pieces of the CLI tests: the command they run and how they run it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from cli_in_process import in_process as in_process  # the CLI tests import it from here
from keyrings.alt.file import PlaintextKeyring
from prefect.utilities.asyncutils import run_coro_as_sync
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import ALL_SCOPES, TrainingRequest
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import SimulatorServer

AUTHORIZATION = "cli-tests"
"""The standing spend authorization the CLI tests' ``train`` names (saved by :func:`worker_env`)."""
TRAIN = [
    "train", "--authorization", AUTHORIZATION, "--booking", "bk-h200-2x8-ib", "--model-size", "8B",
    "--data", "catalog://ito/web-2026-10", "--data", "s3://acme/custom/",
    "--target", "code-assistant", "--budget-usd", "250000",
]  # fmt: skip
REQUEST = TrainingRequest(
    booking_id="bk-h200-2x8-ib", model_size="8B",
    data_refs=["catalog://ito/web-2026-10", "s3://acme/custom/"],
    target="code-assistant", budget_usd=250_000,
)  # fmt: skip
""":data:`TRAIN`'s request."""
CONFIRMED = REQUEST.digest()
"""The manifest digest of :data:`TRAIN`'s request."""
UNCONFIRMED = [TRAIN[0], *TRAIN[3:]]
""":data:`TRAIN` without the authorization: nothing here allows its spend."""
TRAIN_CONFIRMED = [*UNCONFIRMED, "--confirm", "quote_never_made"]
""":data:`TRAIN` with ``--confirm`` of a quote no backend made (needs no block)."""
ALLOW_PLAINTEXT = "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING"
FLOW_RUN_LINE = re.compile(r"Flow run \S+ \(([0-9a-f-]{36})\)")  # what train prints first


def prefect_ito(
    *args: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the CLI with no terminal attached, as CI and schedulers do."""
    return subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", *args],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def worker_env(simulator: SimulatorServer, prefect_server: str) -> dict[str, str]:
    """Return the environment of a CLI run against the simulator and the session's Prefect.

    The standing authorization ``train`` names is saved to that Prefect server here, if any.
    """
    if prefect_server:
        save = covering_authorization(simulator, "cli").asave(AUTHORIZATION, overwrite=True)
        run_coro_as_sync(save)  # also from an async test
    token = simulator.mint_token("cli").get_secret_value()
    return {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "ITO_COMPUTE_API_URL": simulator.url,
        "ITO_COMPUTE_TOKEN": token,
    }


def confirming_env(simulator: SimulatorServer, prefect_server: str) -> dict[str, str]:
    """Return :func:`worker_env` with a person's own token (who may confirm a spend) instead."""
    token = simulator.mint_token(
        "cli", scopes=[scope.value for scope in ALL_SCOPES], principal="user:ada"
    ).get_secret_value()
    return {**worker_env(simulator, prefect_server), "ITO_COMPUTE_TOKEN": token}


def quote_for_train(simulator: SimulatorServer) -> str:
    """Return the id of a fresh quote at ``simulator`` for :data:`TRAIN`'s request."""
    token = simulator.mint_token("cli").get_secret_value()
    response = httpx.post(
        f"{simulator.url}/v0/training-quotes",
        json=REQUEST.to_submission().model_dump(mode="json"),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["data"]["quote_id"])


async def start_run(simulator: SimulatorServer) -> str:
    """Submit one backend run, as an earlier supervisor did; return its id."""
    training = TrainingParameters(
        booking="bk-h200-2x8-ib", model_size="8B", data=["catalog://ito/web"],
        target="chat", budget_usd=1e5,
    )  # fmt: skip
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator, "cli"),
    )
    return (await job.trigger()).run_id


def person_quote(simulator: SimulatorServer) -> tuple[str, dict[str, Any]]:
    """Return a person's own token (every scope) and a fresh quote she asked for with it."""
    token = simulator.mint_token(
        scopes=[scope.value for scope in ALL_SCOPES], principal="user:grace"
    ).get_secret_value()
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://x"],
        target="chat", budget_usd=250_000,
    )  # fmt: skip
    quote = httpx.post(
        f"{simulator.url}/v0/training-quotes",
        json=request.to_submission().model_dump(mode="json"),
        headers={"Authorization": f"Bearer {token}"},
    ).json()["data"]
    return token, quote


def read_flow_run_id(process: subprocess.Popen[str]) -> str:
    """Read the train command's output until it names its flow run."""
    assert process.stdout is not None
    for line in process.stdout:
        found = FLOW_RUN_LINE.search(line)
        if found:
            return found.group(1)
    raise AssertionError("train ended without naming its flow run")


def start_train(env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``prefect-ito train`` in the background, its output unbuffered on one pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", *TRAIN],
        env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


ENVELOPE_HEAD = ["ok", "live_api_contacted", "notice"]


def one_document(result: subprocess.CompletedProcess, *secrets: str) -> dict[str, Any]:
    """Return the one JSON document a ``--json`` command printed, checking its shape.

    Standard output holds exactly that document on one line; the document's exit code is the
    process's; no traceback and none of ``secrets`` appears anywhere in the output.
    """
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    for secret in secrets:
        assert secret not in output
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1, output
    document = json.loads(result.stdout)  # two documents would be "extra data"
    assert list(document)[:3] == ENVELOPE_HEAD, document
    assert isinstance(document["ok"], bool)
    if document["ok"]:
        assert list(document) == [*ENVELOPE_HEAD, "data"], document
        assert result.returncode == 0, output
    else:
        assert document["error"]["exit_code"] == result.returncode != 0, output
        assert {"code", "message", "exit_code"} <= set(document["error"]), document
    return document


def person_env(home: Path, prefect_server: str, **settings: str) -> dict[str, str]:
    """A person's shell: a file keyring in ``home`` (allowed here), the session's Prefect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")}
    env.update(
        PREFECT_API_URL=prefect_server,
        PYTHON_KEYRING_BACKEND="keyrings.alt.file.PlaintextKeyring",
        XDG_DATA_HOME=str(home),
        PREFECT_INTEGRATIONS_ITO_MAX_RETRIES="0",
        **{ALLOW_PLAINTEXT: "true"},
    )
    env.update(settings)
    return env


def stored_login(home: Path, api_url: str, token: str) -> None:
    """Keep ``token`` for ``api_url`` where the command's file keyring will read it."""
    backend = PlaintextKeyring()
    backend.file_path = str(home / "python_keyring" / "keyring_pass.cfg")
    backend.set_password("prefect-ito", api_url, token)


_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def converse(
    command: list[str], env: dict[str, str], steps: list[tuple[str, str]], wait: float = 60
) -> tuple[int, str]:
    """Run ``command`` at a pseudo-terminal; at each prompt of ``steps``, type its reply.

    Each prompt is waited for after the previous one (``wait`` seconds at most: a bound on a
    hang), so a prompt asked twice is two steps. Returns the exit code and what the terminal and
    standard error showed (no colour codes).
    """
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        command, env=env, stdin=follower, stdout=follower, stderr=subprocess.PIPE
    )
    os.close(follower)
    seen, cursor = b"", 0
    try:
        for prompt, reply in steps:
            seen, cursor = _read_until(leader, process, seen, cursor, prompt.encode(), wait)
            os.write(leader, reply.encode())
        _, stderr = process.communicate(timeout=wait)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    while select.select([leader], [], [], 0.2)[0]:
        try:
            seen += os.read(leader, 65536)
        except OSError:
            break
    os.close(leader)
    output = _ANSI.sub(b"", seen).decode(errors="replace") + stderr.decode()
    assert "Traceback" not in output, output
    return process.returncode, output


def _read_until(
    leader: int,
    process: subprocess.Popen[bytes],
    seen: bytes,
    cursor: int,
    prompt: bytes,
    wait: float = 60,
) -> tuple[bytes, int]:
    """Read the terminal until ``prompt`` shows after ``cursor``; return what was seen and
    where the prompt ended."""
    deadline = time.monotonic() + wait  # a bound on a hang, not an assertion about speed
    while time.monotonic() < deadline and process.poll() is None:
        found = _ANSI.sub(b"", seen[cursor:]).find(prompt)
        if found >= 0:
            return seen, len(seen)
        if select.select([leader], [], [], 1)[0]:
            seen += os.read(leader, 65536)
    raise AssertionError(f"never asked {prompt!r}: {_ANSI.sub(b'', seen).decode()!r}")
