"""The ``prefect-ito`` command line.

The commands are registered by import path and imported only when run (cyclopts' lazy
loading), so ``prefect-ito --help`` imports none of them, and a command that reads the backend
only never imports Prefect (about two seconds). None of them takes a token as an argument or
reads one from standard input. Every command but the services (``watch``, ``worker``, ``simulator``)
takes ``--json`` (see :mod:`prefect_ito.cli.output`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from cyclopts import App, CycloptsError

from prefect_ito import __version__

if TYPE_CHECKING:
    from prefect_ito.exceptions import InvalidParameters

__all__ = ["COMMANDS", "app", "main"]

app = App(
    name="prefect-ito",
    help="Run and supervise training on a completed Itô compute booking, from Prefect.",
    version=__version__,
)

COMMANDS: dict[str, tuple[str, str]] = {
    "login": (
        "prefect_ito.cli.auth:login",
        "Log in to an Itô backend (device flow) and keep the token in the OS keyring.",
    ),
    "logout": (
        "prefect_ito.cli.auth:logout",
        "Revoke the stored token on the backend, then remove it from the keyring.",
    ),
    "whoami": (
        "prefect_ito.cli.auth:whoami",
        "Show which backend and account the credential is for (never the token itself).",
    ),
    "capabilities": (
        "prefect_ito.cli.capabilities:capabilities",
        "Show what the backend offers: its contract version, whether training runs are live, "
        "recipes.",
    ),
    "quote": (
        "prefect_ito.cli.quote:quote",
        "Show the plan, the estimate and the manifest digest `train` with these options would run.",
    ),
    "runs": (
        "prefect_ito.cli.runs:runs",
        "Read training runs from the backend (read-only; never Prefect).",
    ),
    "simulator": (
        "prefect_ito.cli.simulator:simulator",
        "Serve the reference desk simulator (no trainer, no model) until interrupted.",
    ),
    "authorizations": (
        "prefect_ito.cli.authorizations:authorizations",
        "Create, list and revoke standing spend authorizations at the backend (a person's "
        "token, scope spend:authorize).",
    ),
    "confirm": (
        "prefect_ito.cli.spend:confirm",
        "Confirm a training quote at the backend as yourself (or decline it with --decline).",
    ),
    "train": (
        "prefect_ito.cli.training:train",
        "Run the training flow on a completed booking: a line per stage change, then a summary.",
    ),
    "attach": (
        "prefect_ito.cli.training:attach",
        "Supervise an existing backend run to its end. Never submits anything.",
    ),
    "demo": (
        "prefect_ito.cli.training:demo",
        "Run the real training flow end to end on the built-in reference simulator.",
    ),
    "decide": (
        "prefect_ito.cli.decide:decide",
        "Approve or reject, as yourself, what a training flow run waits for: a proposed restart or "
        "deadline extension.",
    ),
    "status": (
        "prefect_ito.cli.flow_runs:status",
        "Show a training flow run: its state, backend run, stage, spend and any pending decision.",
    ),
    "inbox": (
        "prefect_ito.cli.inbox:inbox",
        "Show every flow run that waits for a person, oldest first, and how to answer each.",
    ),
    "cancel": (
        "prefect_ito.cli.flow_runs:cancel",
        "Cancel a training flow run and its backend workload (never the booking).",
    ),
    "watch": (
        "prefect_ito.cli.watch:watch",
        "Resume deferred ito-training flow runs when their backend run changes; re-enter lost "
        "ones.",
    ),
    "worker": (
        "prefect_ito.cli.worker:worker",
        "Run prefect-ito's flows from a work pool, refusing any other flow and ignoring what "
        "Prefect says to run.",
    ),
}
"""Each command: where it lives, and the line ``prefect-ito --help`` shows for it (the first line
of its docstring, which a test holds them to)."""


def _register(running: str | None) -> None:
    """Register every command by import path, none imported yet.

    The list shows each command's line from :data:`COMMANDS`. The command about to run gets
    none: cyclopts would put that line in place of its whole docstring on its own help page.
    """
    for name, (path, line) in COMMANDS.items():
        app.command(path, name=name, help=None if name == running else line)


def _command_in(arguments: list[str]) -> str | None:
    return next((argument for argument in arguments if argument in COMMANDS), None)


_register(_command_in(sys.argv[1:]))


def main() -> None:
    """Console-script entry point: bad options end with one line and exit code 2.

    ``--json`` is honoured before the options are parsed, so that bad options, too, end with
    the one JSON document.
    """
    arguments = sys.argv[1:]
    if _command_in(arguments) is None and set(arguments) <= _HELP:
        # Only the list of commands or the version: the output and error machinery (the
        # backend's contract models, httpx) would double what this takes.
        app(arguments)
        return
    from prefect_ito.cli import output
    from prefect_ito.cli.errors import exit_with

    output.use_json(output.JSON_FLAG in arguments)
    try:
        app(arguments, exit_on_error=False, print_error=False)
    except CycloptsError as error:
        exit_with(_invalid_option(error))
    except Exception as error:
        # Unexpected: the traceback is for whoever reports the bug, the document for the caller.
        output.emit_unexpected(error)
        raise


_HELP = {"--help", "-h", "--version"}


def _invalid_option(error: CycloptsError) -> InvalidParameters:
    from pydantic import ValidationError

    from prefect_ito.exceptions import InvalidParameters, invalid_parameters

    cause = error.__cause__
    if isinstance(cause, ValidationError):
        return invalid_parameters(cause)
    message = str(error).strip().replace("\n", " ")
    return InvalidParameters(message)
