"""A ``train`` whose terminal goes away at the spend prompt leaves nothing waiting for nobody.

Subprocesses at a pseudo-terminal, against the simulator and the session's real Prefect server.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import sys
from typing import Any

import pytest
from cli_helpers import (
    _ANSI,
    FLOW_RUN_LINE,
    UNCONFIRMED,
    _read_until,
    confirming_env,
    in_process,
    one_document,
)
from prefect import get_client

from prefect_ito.exceptions import ExitCode, TerminalClosed
from prefect_ito.simulator import SimulatorServer

PROMPT = "Confirm or decline the spend?"


def signalled_at_prompt(env: dict[str, str], signum: signal.Signals) -> tuple[int, str, str]:
    """Run ``train`` at a pseudo-terminal until it asks for the spend, then end its terminal:
    SIGHUP after closing the terminal (as a closed window does), SIGTERM with it open.

    Returns the exit code, the flow run's id and what the terminal and standard error showed.
    """
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", *UNCONFIRMED],
        env=env, stdin=follower, stdout=follower, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(follower)
    try:
        seen, _ = _read_until(leader, process, b"", 0, PROMPT.encode())
        if signum is signal.SIGHUP:
            os.close(leader)
        os.kill(process.pid, signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    if signum is not signal.SIGHUP:  # what it said after the signal, to a terminal still there
        while select.select([leader], [], [], 0.2)[0]:
            try:
                seen += os.read(leader, 65536)
            except OSError:
                break
        os.close(leader)
    shown = _ANSI.sub(b"", seen).decode(errors="replace") + stderr.decode()
    found = FLOW_RUN_LINE.search(shown)
    assert found, shown
    return process.returncode, found.group(1), shown


def flow_run_state(flow_run_id: str) -> Any:
    async def read() -> Any:
        async with get_client() as client:
            return (await client.read_flow_run(flow_run_id)).state  # type: ignore[arg-type]

    return asyncio.run(read())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_train_ended_at_the_spend_prompt_leaves_no_paused_flow_run(
    simulator: SimulatorServer, prefect_server: str, signum: signal.Signals
):
    # Before: the process died with its flow run Paused, which `inbox` listed for a day with a
    # `confirm` command for a quote that had expired, and whose cancel hung in Cancelling.
    env = confirming_env(simulator, prefect_server)

    code, flow_run_id, shown = signalled_at_prompt(env, signum)

    assert "Traceback" not in shown, shown
    state = flow_run_state(flow_run_id)
    assert not state.is_paused(), state
    assert state.name == TerminalClosed.state_name, state
    # A closed terminal both fails the prompt's next read (EIO) and sends SIGHUP; which the
    # process meets first is a race in a real window as here, and either names why it stopped.
    causes = [signum.name] + (["its output was lost"] if signum is signal.SIGHUP else [])
    assert any(f"the terminal went away ({cause})" in state.message for cause in causes), (
        state.message
    )
    assert "nothing was declined or spent" in state.message
    assert code == ExitCode.DETACHED, shown
    if signum is signal.SIGTERM:  # one calm line where someone may still read it
        assert f"Stopped: the terminal went away ({signum.name})" in shown, shown
        assert "ERROR" not in shown.split(PROMPT, 1)[1], shown
    # Nothing declined, nothing submitted: the quote is left for whoever runs it again.
    sent = [r.path for r in simulator.requests() if r.method == "POST"]
    assert not [path for path in sent if path.endswith(("/declines", "/confirmations"))], sent
    assert simulator.runs() == []
    entries = one_document(in_process("inbox", "--json", env=env))["data"]
    assert flow_run_id not in [entry["flow_run_id"] for entry in entries]
