"""The prefect-ito CLI run in the test's own process, with what a child would have returned.

Shared by the CLI tests and the end-to-end tests that read the CLI's output where the child
process is not what they test.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


def in_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the CLI in this process, as ``cli_helpers.prefect_ito`` runs it in a child, and
    return what a child would have: its exit code, standard output and standard error.

    For the fast tier: a command that neither runs a flow nor imports Prefect behaves the same in
    either. Prefect reads its settings once per process: this process's are the session's (its
    home, its server), and ``env`` is made from this process's environment, so the one Prefect
    setting a test's ``env`` changes, ``PREFECT_API_URL``, is applied for the call. A command
    that reads Prefect (``status``, ``cancel``, ``inbox``, …) then asks the same server a child
    would, and one that runs a flow (``train``, ``attach``) writes Prefect's console lines to its
    own standard error, as a child does. A signal, a terminal, a keyring or a Prefect home of
    the command's own still needs a child (``cli_helpers.prefect_ito``).
    The environment is ``env`` alone, standard input reads nothing, and both descriptors 1 and 2
    are files for the time of the call, since JSON mode points descriptor 1 at descriptor 2.
    """
    if _in_event_loop():
        # An async test's loop is running here, and the command runs its own (asyncio.run): as a
        # child would, it runs apart, on a thread of its own, while the test waits for it.
        with ThreadPoolExecutor(1) as apart:
            return apart.submit(contextvars.copy_context().run, in_process, *args, env=env).result()
    with _prefect_api_of(env), _fresh_process_state():
        return _in_process(args, env)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@contextmanager
def _prefect_api_of(env: dict[str, str]) -> Iterator[None]:
    """Point this process's Prefect at ``env``'s ``PREFECT_API_URL`` (none: no server) for a
    call, as a child started with ``env`` would be."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    wanted = env.get("PREFECT_API_URL") or None
    if PREFECT_API_URL.value() == wanted:
        yield
        return
    with temporary_settings({PREFECT_API_URL: wanted}):
        yield


@contextmanager
def _fresh_process_state() -> Iterator[None]:
    """Give the call what a new process starts with, and give this process its own back: what
    each backend last said of itself (``live_api_contacted`` is null until one answers), the
    retry budgets, the unknown values already logged once, and the keyring (``demo`` puts one in
    memory in place of the session's file keyring)."""
    import keyring

    from prefect_ito.backend import _retry, provenance
    from prefect_ito.contract import open_enum

    fresh = {(provenance, "_last"): {}, (_retry, "_budgets"): {}, (open_enum, "_logged"): set()}
    saved = {(module, name): getattr(module, name) for module, name in fresh}
    saved_keyring = keyring.get_keyring()
    for (module, name), value in fresh.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
        keyring.set_keyring(saved_keyring)


def _in_process(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess:
    from prefect_ito.cli import main, output

    saved_environ, saved_argv = dict(os.environ), sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_fds = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdin = io.StringIO("")
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["prefect-ito", *args]
        try:
            with _console_logs_to(sys.stderr):
                code = _exit_code(main)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            os.environ.clear()
            os.environ.update(saved_environ)
            sys.argv = saved_argv
            output.forget()
        stdout, stderr = (_read(file) for file in (out, err))
    return subprocess.CompletedProcess(["prefect-ito", *args], code, stdout, stderr)


@contextmanager
def _console_logs_to(stream: Any) -> Iterator[None]:
    """Send Prefect's console log lines to ``stream`` for a call: its handlers were made, with
    the stream they write to, when this process configured Prefect's logging; a child's write to
    its own standard error."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, PrefectConsoleHandler)
    }
    saved = [(handler, handler.stream, handler.console.file) for handler in handlers]
    for handler in handlers:
        handler.stream = handler.console.file = stream
    try:
        yield
    finally:
        for handler, before, file in saved:
            handler.stream, handler.console.file = before, file


def _exit_code(main: Any) -> int:
    """Call the CLI's entry point; return the exit code a process would have ended with."""
    try:
        main()
    except SystemExit as ended:
        return ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    except Exception:
        traceback.print_exc()  # as the interpreter would, so that a test sees "Traceback"
        return 1
    return 0


def _read(file: Any) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")
