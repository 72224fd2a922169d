"""What a command checks about its own terminal, needing neither Prefect nor a backend.

The id and idempotency-key rules the commands check before any request are the flows' own:
:func:`prefect_ito.exceptions.check_id` and :data:`prefect_ito.contract.IDEMPOTENCY_KEY_PATTERN`,
both free of Prefect, re-exported here for the commands that only read or answer the backend.
"""

from __future__ import annotations

import sys

from prefect_ito.contract import IDEMPOTENCY_KEY_PATTERN
from prefect_ito.exceptions import check_id

__all__ = ["IDEMPOTENCY_KEY_PATTERN", "check_id", "interactive"]


def interactive() -> bool:
    """Tell whether a person is at this terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()
