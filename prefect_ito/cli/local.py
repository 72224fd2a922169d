"""What a command checks about its own input and terminal, needing neither Prefect nor a backend.

:mod:`prefect_ito.parameters` holds the same id rules for flows, but its models accept an
``ItoBooking`` block and so import Prefect (about two seconds): the commands that only read or
answer the backend take these from here instead (a test holds the two to the same rules).
"""

from __future__ import annotations

import sys

from prefect_ito.contract import id_problem
from prefect_ito.exceptions import InvalidParameters

__all__ = ["IDEMPOTENCY_KEY_PATTERN", "check_id", "interactive"]

IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"
"""An idempotency key: 1 to 255 letters, digits or ``._:-``, starting with a letter or digit."""


def check_id(value: str, field: str) -> str:
    """Return ``value``, an id to send; refuse it, naming ``field``, before any request.

    Raises:
        InvalidParameters: naming ``field`` and the rule ``value`` breaks.
    """
    problem = id_problem(value) if isinstance(value, str) else "must be a string"
    if problem is not None:
        raise InvalidParameters(f"{field}: {problem}", field=field)
    return value


def interactive() -> bool:
    """Tell whether a person is at this terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()
