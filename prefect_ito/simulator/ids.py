"""The ids the simulator makes for what it keeps (a prefix naming the kind, then random hex), and
the short codes a person checks on its pages."""

from __future__ import annotations

import re
import secrets
from typing import Literal, get_args
from uuid import uuid4

Kind = Literal["run", "act", "quote", "qc", "sa", "req"]

MINTED = re.compile(rb"\b(?:%b)_[0-9a-f]{12,20}\b" % "|".join(get_args(Kind)).encode())
"""Matches an id :func:`mint` made, in the bytes of a path, a query or a body."""


def mint(kind: Kind, length: int = 16) -> str:
    """Return a new random id of ``kind``, ``length`` hex digits after its prefix."""
    return f"{kind}_{uuid4().hex[:length]}"


USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
"""No vowels: no accidental words in a code a person reads out."""
CONFIRM_PAGE = "/confirm"
"""The simulator's confirm page (a quote), relative to its base URL."""
DECIDE_PAGE = "/decide"
"""The simulator's decide page (a run's pending action), relative to its base URL."""
DEVICE_PAGE = "/device"
"""The simulator's device-login page (a device grant's ``verification_uri``)."""
PERSON_PAGES = (CONFIRM_PAGE, DECIDE_PAGE, DEVICE_PAGE)
"""Every page a person opens from a link the contract names; none is in the OpenAPI document."""


def user_code() -> str:
    """Return a new code a person checks on, or types into, one of the simulator's pages:
    ``XXXX-XXXX``, as device login's."""
    return "-".join("".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(4)) for _ in range(2))
