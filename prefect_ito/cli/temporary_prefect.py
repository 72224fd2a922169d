"""Prefect's API for a command that runs a flow here: a real server, or a quiet temporary one.

Without ``PREFECT_API_URL`` Prefect starts a temporary ("ephemeral") server of its own in a
subprocess on the first API call. This module decides how that server is started: given time to
migrate a new database, with its noise kept out of the command's output, and in a process group
of its own (so the Ctrl-C that detaches does not stop it).

Prefect stops that server at the command's exit (``atexit``), which a command killed outright
(SIGKILL: the OOM killer, a CI timeout, ``kill -9``) never reaches, and the signal that ends the
command's process group does not reach a server in a group of its own. So each server gets a
watchdog: a tiny process in a third group, blocked reading a pipe whose only write end this
command holds. However the command ends, the kernel closes that end; the watchdog reads EOF and
stops the server's group (SIGTERM, then SIGKILL). A pipe was chosen over
``prctl(PR_SET_PDEATHSIG)``, which is Linux-only, fires when the *thread* that forked ends and
needs ``preexec_fn`` (unsafe with threads), and over polling the parent pid, which can be reused.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from prefect import get_client
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_HOME,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    temporary_settings,
)

__all__ = ["EPHEMERAL_STARTUP_SECONDS", "TEMPORARY_SERVER_LOG", "has_real_server", "prefect_api"]

EPHEMERAL_STARTUP_SECONDS = 180
"""How long Prefect's temporary server may take to start: a brand-new ``PREFECT_HOME`` migrates
its database first, which takes tens of seconds on a small, busy machine (Prefect allows 20)."""

_QUIET_EPHEMERAL_SERVER = {
    # The temporary server has no network to send telemetry to, and logs every failure to.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Its SQLite "database is locked" retries are Prefect's own business, not the user's.
    "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
}


def has_real_server() -> bool:
    """Tell whether a Prefect server (not the ephemeral one) is configured."""
    return bool(PREFECT_API_URL.value())


@contextlib.contextmanager
def prefect_api() -> Iterator[None]:
    """Make Prefect's API ready for a command: a real server, or a quiet temporary one.

    The temporary server is given time to migrate a new database, and its noise is kept out of
    the command's output. The first API call comes from the main thread, so exactly one
    temporary server starts.
    """
    if has_real_server():
        yield
        return
    for name, value in _QUIET_EPHEMERAL_SERVER.items():
        os.environ.setdefault(name, value)
    startup = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: EPHEMERAL_STARTUP_SECONDS}
    with temporary_settings(startup):
        with _children_in_their_own_process_group(), get_client(sync_client=True) as client:
            client.hello()
        yield


@contextlib.contextmanager
def _children_in_their_own_process_group() -> Iterator[None]:
    """Start the processes begun meanwhile (Prefect's temporary server) in a group of their own.

    A terminal sends Ctrl-C to its whole foreground process group. Prefect starts its temporary
    server in ours, so the Ctrl-C that detaches would also stop the server the flow still has to
    report its final state to, and the command would wait for it forever.
    """
    original = subprocess.Popen
    subprocess.Popen = _OwnGroupPopen  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess.Popen = original  # type: ignore[misc]


class _OwnGroupPopen(subprocess.Popen[Any]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("process_group", 0)
        if "stdout" in kwargs or "stderr" in kwargs:  # the caller chose where output goes
            super().__init__(*args, **kwargs)
        else:
            # Prefect lets its temporary server write to the command's terminal, and not all of
            # it goes through the levels set above: stopped mid-query at the command's end, its
            # database pool logs an ERROR with a traceback. It goes to a file in PREFECT_HOME.
            with _server_log() as log:
                kwargs.update(stdout=log, stderr=subprocess.STDOUT)
                super().__init__(*args, **kwargs)
        if kwargs["process_group"] == 0:
            _watch_over(self.pid)


TEMPORARY_SERVER_LOG = "temporary-server.log"
"""Where, in ``PREFECT_HOME``, the output of the commands' temporary Prefect servers goes."""


def _server_log() -> IO[bytes]:
    home = Path(PREFECT_HOME.value()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return (home / TEMPORARY_SERVER_LOG).open("ab")


_WATCHDOG = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()
group = int(sys.argv[1])
try:
    os.killpg(group, signal.SIGTERM)
    for _ in range(100):
        time.sleep(0.1)
        os.killpg(group, 0)
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""
"""Waits for EOF on standard input, then stops process group ``argv[1]``: politely for 10 s."""

_held_open: list[int] = []
"""Write ends of the watchdogs' pipes: never written to, never closed by hand; only this
process's end (however it comes) closes them."""


def _watch_over(group: int) -> None:
    """Start a watchdog that stops process group ``group`` once this process has ended.

    The pipe's ends are not inheritable (PEP 446), so no other child holds the write end open;
    the watchdog is spawned without a ``Popen`` object, which would warn at exit that it still
    runs. Its own process group keeps it out of reach of a Ctrl-C and of a signal to ours.
    """
    read_end, write_end = os.pipe()
    try:
        os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(group)],
            os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)],
            setpgroup=0,
        )
    finally:
        os.close(read_end)
    _held_open.append(write_end)
