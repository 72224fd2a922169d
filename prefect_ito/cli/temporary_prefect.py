"""Prefect's API for a command that runs a flow here: a real server, or a quiet temporary one.

Without ``PREFECT_API_URL`` Prefect starts a temporary ("ephemeral") server of its own in a
subprocess on the first API call. This module decides how that server is started: given time to
migrate a new database, with its noise kept out of the command's output, and in a process group
of its own (so the Ctrl-C that detaches does not stop it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import Any

from prefect import get_client
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    temporary_settings,
)

__all__ = ["EPHEMERAL_STARTUP_SECONDS", "has_real_server", "prefect_api"]

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
        super().__init__(*args, **kwargs)
