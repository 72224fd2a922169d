"""The ``prefect-ito`` command line.

Each submodule registers its commands on :data:`app`; none of them takes a token as an argument
or reads one from standard input. Every command but the two services (``watch``, ``simulator``)
takes ``--json`` (see :mod:`prefect_ito.cli.output`).
"""

from __future__ import annotations

import sys

from cyclopts import App, CycloptsError
from pydantic import ValidationError

from prefect_ito import __version__

app = App(
    name="prefect-ito",
    help="Run and supervise training on a completed Itô compute booking, from Prefect.",
    version=__version__,
)

# Submodules register their commands on `app` when imported.
from prefect_ito.cli import (  # noqa: E402
    auth,
    capabilities,
    output,
    quote,
    runs,
    simulator,
    spend,
    training,
    watch,
)
from prefect_ito.cli.errors import exit_with  # noqa: E402
from prefect_ito.exceptions import InvalidParameters  # noqa: E402
from prefect_ito.parameters import invalid_parameters  # noqa: E402

__all__ = [
    "app",
    "auth",
    "capabilities",
    "main",
    "quote",
    "runs",
    "simulator",
    "spend",
    "training",
    "watch",
]


def main() -> None:
    """Console-script entry point: bad options end with one line and exit code 2.

    ``--json`` is honoured before the options are parsed, so that bad options, too, end with
    the one JSON document.
    """
    output.use_json(output.JSON_FLAG in sys.argv[1:])
    try:
        app(exit_on_error=False, print_error=False)
    except CycloptsError as error:
        exit_with(_invalid_option(error))
    except Exception as error:
        # Unexpected: the traceback is for whoever reports the bug, the document for the caller.
        output.emit_unexpected(error)
        raise


def _invalid_option(error: CycloptsError) -> InvalidParameters:
    cause = error.__cause__
    if isinstance(cause, ValidationError):
        return invalid_parameters(cause)
    message = str(error).strip().replace("\n", " ")
    return InvalidParameters(message)
