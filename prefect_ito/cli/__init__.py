"""The ``prefect-ito`` command line.

Each submodule registers its commands on :data:`app`; none of them takes a token as an argument
or reads one from standard input.
"""

from __future__ import annotations

from cyclopts import App

from prefect_ito import __version__

app = App(
    name="prefect-ito",
    help="Run and supervise training on a completed Itô compute booking, from Prefect.",
    version=__version__,
)

# Submodules register their commands on `app` when imported.
from prefect_ito.cli import auth, simulator, training  # noqa: E402

__all__ = ["app", "auth", "main", "simulator", "training"]


def main() -> None:
    """Console-script entry point."""
    app()
