"""Stopping the processes the suite starts: by their own PID, SIGTERM first, SIGKILL if need be.

One definition for the session's servers, the end-to-end stacks (workers, watchers, their own
servers) and the trial stack, which the benchmarks use too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import warnings
from typing import Any

STOP_WITHIN = 10.0
"""Seconds a process has to end after SIGTERM before it is killed. An idle Prefect server or
watcher ends within a second, a Prefect worker not always (one SIGTERM left even an idle one
running); in one run three end-to-end teardowns waited out the
whole grace they then had (20–30 s each), so a process still there is killed and named."""


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


def _command(process: subprocess.Popen[Any]) -> str:
    """Return what the process runs, without the interpreter's path: ``-m prefect server start``."""
    args = process.args if isinstance(process.args, list | tuple) else [process.args]
    return " ".join(str(arg) for arg in list(args)[1:5])
