"""The ids the simulator makes for what it keeps: a prefix naming the kind, then random hex."""

from __future__ import annotations

from typing import Literal
from uuid import uuid4

Kind = Literal["run", "act", "quote", "qc", "sa", "req"]


def mint(kind: Kind, length: int = 16) -> str:
    """Return a new random id of ``kind``, ``length`` hex digits after its prefix."""
    return f"{kind}_{uuid4().hex[:length]}"
