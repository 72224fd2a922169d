"""The ``prefect-ito`` command line.

Each submodule registers its commands on :data:`app`; none of them takes a token as an argument
or reads one from standard input.
"""

from __future__ import annotations

from cyclopts import App, CycloptsError
from pydantic import ValidationError

from prefect_ito import __version__

app = App(
    name="prefect-ito",
    help="Run and supervise training on a completed Itô compute booking, from Prefect.",
    version=__version__,
)

# Submodules register their commands on `app` when imported.
from prefect_ito.cli import auth, quote, simulator, training, watch  # noqa: E402
from prefect_ito.cli.errors import exit_with  # noqa: E402
from prefect_ito.exceptions import InvalidParameters  # noqa: E402
from prefect_ito.parameters import invalid_parameters  # noqa: E402

__all__ = ["app", "auth", "main", "quote", "simulator", "training", "watch"]


def main() -> None:
    """Console-script entry point: bad options end with one line and exit code 2."""
    try:
        app(exit_on_error=False, print_error=False)
    except CycloptsError as error:
        exit_with(_invalid_option(error))


def _invalid_option(error: CycloptsError) -> InvalidParameters:
    cause = error.__cause__
    if isinstance(cause, ValidationError):
        return invalid_parameters(cause)
    message = str(error).strip().replace("\n", " ")
    return InvalidParameters(message)
