"""A temporary Prefect server never outlives the ``prefect-ito train`` that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import UNCONFIRMED, confirming_env, quote_for_train, read_flow_run_id
from prefect.settings import PREFECT_HOME, temporary_settings
from prefect_homes import migrated_home

from prefect_ito.cli.temporary_prefect import (
    TEMPORARY_SERVER_LOG,
    _children_in_their_own_process_group,
)

GONE_WITHIN = 60.0
"""A bound on the wait, not a speed target: the server stops in a second or two."""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads processes from /proc")
def test_a_train_killed_outright_leaves_no_temporary_prefect_server(simulator, tmp_path):
    home = str(migrated_home(tmp_path))  # the first start on a new home has tests of its own
    env = {**confirming_env(simulator, ""), "PREFECT_HOME": home, "PYTHONUNBUFFERED": "1"}
    command = [*UNCONFIRMED, "--confirm", quote_for_train(simulator)]
    train = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", *command],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    servers: list[int] = []
    watchdogs: list[int] = []
    try:
        read_flow_run_id(train)  # the flow run was made through the temporary server: it is up
        servers = children(train.pid, "uvicorn", "prefect.server")
        assert servers, "train started no temporary Prefect server"
        watchdogs = children(train.pid, "os.killpg")
        train.send_signal(signal.SIGKILL)  # as the OOM killer or `kill -9` does: no cleanup
        train.wait()
        left = wait_until_gone(servers)
        assert not left, f"temporary Prefect server(s) {left} outlived the killed train"
        assert not wait_until_gone(watchdogs), "the watchdog outlived the server it stopped"
    finally:
        train.kill()
        train.wait()
        for pid in [*servers, *watchdogs]:
            stop(pid)


def children(parent: int, *words: str) -> list[int]:
    """Return the pids of ``parent``'s children whose command line holds all ``words``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent_of(int(entry.name)) == parent:
            cmdline = _read(entry / "cmdline").replace("\0", " ")
            if all(word in cmdline for word in words):
                found.append(int(entry.name))
    return found


def wait_until_gone(pids: list[int]) -> list[int]:
    """Wait up to :data:`GONE_WITHIN` seconds for ``pids`` to end; return those still running."""
    deadline = time.monotonic() + GONE_WITHIN
    left = [pid for pid in pids if _running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if _running(pid)]
    return left


def stop(pid: int) -> None:
    if _running(pid):
        os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Tell whether ``pid`` runs: an ended process left unreaped (a zombie) does not."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parent_of(pid: int) -> int | None:
    stat = _read(Path(f"/proc/{pid}/stat"))
    return int(stat.rsplit(")", 1)[1].split()[1]) if stat else None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the process ended meanwhile
        return ""


@pytest.mark.slow
def test_a_temporary_server_s_output_goes_to_a_file_not_the_command_s_terminal(tmp_path, capfd):
    # What a stopped server printed once: its pool's ERROR and traceback after the detach line.
    noise = "ERROR | sqlalchemy.pool.impl.AsyncAdaptedQueuePool - Exception during reset"
    with temporary_settings({PREFECT_HOME: tmp_path}), _children_in_their_own_process_group():
        child = subprocess.Popen(
            [sys.executable, "-c", f"import sys; print({noise!r}, file=sys.stderr)"],
            process_group=os.getpgrp(),  # ours: no watchdog for a child that ends at once
        )
    assert child.wait(timeout=60) == 0

    assert noise not in capfd.readouterr().err
    assert noise in (tmp_path / TEMPORARY_SERVER_LOG).read_text()


@pytest.mark.slow
def test_a_child_whose_caller_chose_its_output_keeps_it(tmp_path, capfd):
    # Only a child started with no say over its output (Prefect's server) writes to the file.
    script = "import sys; print('out'); print('err', file=sys.stderr)"
    with temporary_settings({PREFECT_HOME: tmp_path}), _children_in_their_own_process_group():
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, process_group=os.getpgrp()
        )
    out, _ = child.communicate(timeout=60)

    assert out == b"out\n"
    assert "err" in capfd.readouterr().err
    assert not (tmp_path / TEMPORARY_SERVER_LOG).exists()
