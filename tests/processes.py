"""The processes the suite starts: waiting for a Prefect server to answer, and stopping them by
their own PID, SIGTERM first, SIGKILL if need be.

One definition for the session's servers, the end-to-end stacks (workers, watchers, their own
servers) and the trial stack, which the benchmarks use too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

STOP_WITHIN = 10.0
"""Seconds a process has to end after SIGTERM before it is killed. An idle Prefect server or
watcher ends within a second; a process still there is killed and named. (Workers are not
stopped this way: see ``stop_worker``.)"""


def wait_until_serving(process: subprocess.Popen[Any], api_url: str, timeout: float = 120) -> bool:
    """Return whether the Prefect server ``process`` answers ``api_url``/health within ``timeout``.

    Returns False as soon as the process has ended. One client for every look: each new one
    loads the CA bundle (about 60 ms of CPU), four times a second while a server starts.
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.get(f"{api_url}/health").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    return False


def stop_process(process: subprocess.Popen[Any] | None, timeout: float = STOP_WITHIN) -> None:
    """Stop a process this suite started: SIGTERM, then SIGKILL, always by its own PID.

    A process still running ``timeout`` seconds after SIGTERM is killed, with a warning that
    names it (pytest's summary lists them): a hang is seen, not waited out.
    """
    if process is None or process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        warnings.warn(
            f"{_command(process)} (pid {process.pid}) was still running {timeout:g} s after "
            "SIGTERM; killed",
            stacklevel=2,
        )


def stop_worker(process: subprocess.Popen[Any] | None) -> None:
    """Stop a Prefect worker at the end of a stack: SIGKILL its flow-run processes, then itself.

    Nothing a test reads is written by a worker's shutdown, and Prefect 3.9.1's process worker
    may not end on one SIGTERM even when idle, so a graceful stop would only wait out
    ``STOP_WITHIN`` (and leave its flow-run processes behind). Killing the whole tree by PID is
    what the lost-machine tests do mid-run too.
    """
    if process is None or process.poll() is not None:
        return
    for pid in [*descendants(process.pid), process.pid]:
        kill(pid)
    process.wait(timeout=30)


def descendants(pid: int) -> list[int]:
    """Return the PIDs of every process under ``pid`` (whatever its process group)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # The parent is the 4th field after the command, which may hold spaces: split after it.
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(pid: int) -> None:
    """SIGKILL a process this suite started (or one under it), if it is still there."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _command(process: subprocess.Popen[Any]) -> str:
    """Return what the process runs, without the interpreter's path: ``-m prefect server start``."""
    args = process.args if isinstance(process.args, list | tuple) else [process.args]
    return " ".join(str(arg) for arg in list(args)[1:5])
