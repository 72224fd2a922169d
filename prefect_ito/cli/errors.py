"""How a ``prefect-ito`` command ends on an expected failure: one line, and its exit code.

No Python traceback reaches a user for anything prefect-ito expects to go wrong: an outcome of
the error tree prints its safe message and exits with the code its class states, and an
unanswered Prefect API is named as such. With ``--json`` the same failure is the command's one
JSON document (see :mod:`prefect_ito.cli.output`), and the line still goes to standard error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import httpx

from prefect_ito.cli import output
from prefect_ito.exceptions import Detached, InvalidParameters, ItoError, PrefectUnreachable

__all__ = ["exit_with", "require_positive", "respond", "run_command"]

T = TypeVar("T")


def respond(
    json_output: bool,
    command: Coroutine[Any, Any, T],
    show: Callable[[T], None],
) -> None:
    """Run ``command`` and print its result: ``show`` it, or emit it as the document's data.

    Every expected failure ends the process through :func:`exit_with`,
    as text or as an error document.

    Args:
        json_output: The command's ``--json`` option.
        command: What the command does; its result is the document's ``data``.
        show: Prints the result for a person.
    """
    output.use_json(json_output)
    result = run_command(command)
    if output.json_mode():
        output.emit(output.document(data=result))
    else:
        show(result)


def run_command(command: Coroutine[Any, Any, T]) -> T:
    """Run ``command``; end the process with the outcome's exit code if it fails as expected."""
    try:
        return asyncio.run(command)
    except ItoError as error:
        _quiet_prefect_exit_warning()
        exit_with(error)
    except httpx.TransportError as error:
        # Only Prefect's own client lets httpx errors through: the Itô client maps its own.
        # Prefect is loaded by then; a command that never used it does not import it here.
        from prefect.settings import PREFECT_API_URL

        target = PREFECT_API_URL.value() or "Prefect's temporary server"
        exit_with(PrefectUnreachable(f"the Prefect API at {target} did not answer ({error})"))
    except KeyboardInterrupt:
        exit_with(Detached("interrupted"))
    except Exception as error:
        refusal = _prefect_refusal(error)
        if refusal is None:
            raise
        exit_with(refusal)


def _prefect_refusal(error: Exception) -> ItoError | None:
    """Return the one line for a Prefect API that refused this client's credentials, if it did.

    A server behind Prefect's own authentication (``PREFECT_SERVER_API_AUTH_STRING``) answers
    401 to a client without ``PREFECT_API_AUTH_STRING``; that is a setting to fix, not a bug.
    """
    exceptions = sys.modules.get("prefect.exceptions")  # loaded if Prefect answered at all
    if exceptions is None or not isinstance(error, exceptions.PrefectHTTPStatusError):
        return None
    status = error.response.status_code
    if status not in (401, 403):
        return None
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    # Set but refused is a different fix from unset: say which, never the value itself.
    fix = (
        "PREFECT_API_AUTH_STRING is set but is not"
        if PREFECT_API_AUTH_STRING.value()
        else "set PREFECT_API_AUTH_STRING to"
    )
    return PrefectUnreachable(
        f"the Prefect API at {PREFECT_API_URL.value()} refused this client ({status}): {fix} "
        "the server's PREFECT_SERVER_API_AUTH_STRING (or PREFECT_API_KEY for Prefect Cloud)"
    )


def _quiet_prefect_exit_warning() -> None:
    # Loading a block emits a Prefect event. A command that fails right after sends it on its
    # way out, and Prefect's events worker then warns "Still processing items" about it: a
    # second line under the one that says what went wrong, about nothing the person can act on.
    logging.getLogger("EventsWorker").setLevel(logging.ERROR)


def exit_with(error: ItoError) -> NoReturn:
    """Print ``error``'s safe message (and its JSON document) and exit with its exit code."""
    print(f"error: {error}", file=sys.stderr)
    output.fail(error)
    sys.exit(int(error.exit_code))


def require_positive(field: str, value: float, *, at_least: float | None = None) -> None:
    """End the command naming ``field`` unless ``value`` is a finite number above 0.

    ``nan`` and ``inf`` parse as floats, and compare false with every bound: each is refused
    here by name, not met later as a loop that never waits or never ends.

    Args:
        field: The option's name, as the message names it.
        value: What the option was given.
        at_least: The smallest value allowed instead of "above 0" (a count's 1).
    """
    low_enough = value >= at_least if at_least is not None else value > 0
    if math.isfinite(value) and low_enough:
        return
    rule = f"at least {at_least:g}" if at_least is not None else "above 0"
    exit_with(
        InvalidParameters(f"{field}: must be a finite number {rule} (got {value:g})", field=field)
    )
