"""How a ``prefect-ito`` command ends on an expected failure: one line, and its exit code.

No Python traceback reaches a user for anything prefect-ito expects to go wrong: an outcome of
the error tree prints its safe message and exits with the code its class states, and an
unanswered Prefect API is named as such. With ``--json`` the same failure is the command's one
JSON document (see :mod:`prefect_ito.cli.output`), and the line still goes to standard error.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import httpx
from prefect.settings import PREFECT_API_URL

from prefect_ito.cli import output
from prefect_ito.exceptions import Detached, ItoError, PrefectUnreachable

__all__ = ["exit_with", "run_command"]

T = TypeVar("T")


def run_command(command: Coroutine[Any, Any, T]) -> T:
    """Run ``command``; end the process with the outcome's exit code if it fails as expected."""
    try:
        return asyncio.run(command)
    except ItoError as error:
        exit_with(error)
    except httpx.TransportError as error:
        # Only Prefect's own client lets httpx errors through: the Itô client maps its own.
        target = PREFECT_API_URL.value() or "Prefect's temporary server"
        exit_with(PrefectUnreachable(f"the Prefect API at {target} did not answer ({error})"))
    except KeyboardInterrupt:
        exit_with(Detached("interrupted"))


def exit_with(error: ItoError) -> NoReturn:
    """Print ``error``'s safe message (and its JSON document) and exit with its exit code."""
    print(f"error: {error}", file=sys.stderr)
    output.fail(error)
    sys.exit(int(error.exit_code))
