"""The ids the simulator makes for what it keeps: a prefix naming the kind, then random hex."""

from __future__ import annotations

import re
from typing import Literal, get_args
from uuid import uuid4

Kind = Literal["run", "act", "quote", "qc", "sa", "req"]

MINTED = re.compile(rb"\b(?:%b)_[0-9a-f]{12,20}\b" % "|".join(get_args(Kind)).encode())
"""Matches an id :func:`mint` made, in the bytes of a path, a query or a body."""


def mint(kind: Kind, length: int = 16) -> str:
    """Return a new random id of ``kind``, ``length`` hex digits after its prefix."""
    return f"{kind}_{uuid4().hex[:length]}"
