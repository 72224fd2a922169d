"""String enums that keep the values they do not know: forward compatibility inside v0.

The contract lets a backend add enum values within v0 (see "Extensions and deprecation" in
``docs/contract.md``). A response field typed with an :class:`OpenEnum` therefore never fails on a
value this prefect-ito does not know: the value becomes a member named ``UNKNOWN`` that keeps the
raw string as its value (``known`` is False), so one new event type cannot turn a whole events
page into a protocol error. Each unknown value is logged once per process.

What an unknown value *means* is up to the code that reads it, and each place decides safely: an
unknown run state is not terminal, an unknown stage status is not done, an unknown action is not
put to a person, an unknown event type is not relayed.
"""

from __future__ import annotations

import logging
import re
import threading
from enum import StrEnum
from typing import Self

__all__ = ["UNKNOWN", "OpenEnum", "note_unknown"]

logger = logging.getLogger("prefect_ito.contract")

UNKNOWN = "UNKNOWN"
"""The name of every member made for a value the enum does not know."""
_MAX_LOGGED = 256
"""Distinct unknown values logged per process; a backend cannot grow the set without bound."""
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()
_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")


class OpenEnum(StrEnum):
    """A string enum of a response field that the backend may extend within v0.

    Example:
        ```python
        state = RunState("paused_by_operator")  # a state a newer backend added
        state.known, state.name, state.value  # (False, "UNKNOWN", "paused_by_operator")
        ```
    """

    @classmethod
    def _missing_(cls, value: object) -> Self | None:
        if not isinstance(value, str) or not value:
            return None  # still an error: only a non-empty string can be a future value
        member = str.__new__(cls, value)
        member._name_ = UNKNOWN
        member._value_ = value
        note_unknown(cls.__name__, value)
        return member

    @property
    def known(self) -> bool:
        """Tell whether this prefect-ito knows the value (False for an ``UNKNOWN`` member)."""
        return self._name_ != UNKNOWN


def note_unknown(enum: str, value: str) -> None:
    """Log, once per process, that the backend sent a value of ``enum`` unknown here."""
    with _lock:
        if (enum, value) in _logged or len(_logged) >= _MAX_LOGGED:
            return
        _logged.add((enum, value))
    shown = _UNPRINTABLE.sub("?", value[:64]) + ("…" if len(value) > 64 else "")
    logger.warning(
        "The Itô backend sent %s %r, which this prefect-ito does not know; it is kept as "
        "UNKNOWN and treated safely (a newer prefect-ito may know it).",
        enum,
        shown,
    )
