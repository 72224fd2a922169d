"""String enums that keep the values they do not know: forward compatibility inside v0.

The contract lets a backend add enum values within v0 (see "Extensions and deprecation" in
``docs/contract.md``). A response field typed with an :class:`OpenEnum` therefore never fails on a
value this prefect-ito does not know: the value becomes a member named ``UNKNOWN`` that keeps the
raw string as its value (``known`` is False), so one new event type cannot turn a whole events
page into a protocol error. Each unknown value is logged once per process.

What an unknown value *means* is up to the code that reads it, and each place decides safely: an
unknown run state is not terminal, an unknown stage status is not done, an unknown action is not
put to a person, an unknown event type is not relayed.

In the OpenAPI document an open enum is a plain string whose known values are listed in
``x-extensible-enum`` (:func:`open_enum_schema`), never a closed ``enum``: a client generated from
the document in any language then reads a value added later as the string it is, where a closed
``enum`` would make it reject the whole answer.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Self

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = [
    "EXTENSIBLE_ENUM",
    "UNKNOWN",
    "OpenEnum",
    "note_unknown",
    "open_enum_json_schema",
    "open_enum_schema",
]

logger = logging.getLogger("prefect_ito.contract")

UNKNOWN = "UNKNOWN"
"""The name of every member made for a value the enum does not know."""
_MAX_LOGGED = 256
"""Distinct unknown values logged per process; a backend cannot grow the set without bound."""
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()
_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")
EXTENSIBLE_ENUM = "x-extensible-enum"
"""The OpenAPI extension that lists an open enum's known values (Zalando's API guidelines, 112)."""
OPEN_NOTE = (
    "An open enum: the values known today are listed in `x-extensible-enum`, and a backend may "
    "add others within v0. A client keeps a value it does not know and treats it safely."
)


def open_enum_schema(values: Iterable[str], **schema: Any) -> dict[str, Any]:
    """Return the JSON schema of an open enum: a string, with its known values as an extension.

    Args:
        values: The values known today; a backend may send others.
        schema: Other members of the schema, such as ``title`` or ``description``.
    """
    described = schema.pop("description", None)
    description = f"{described}\n\n{OPEN_NOTE}" if described else OPEN_NOTE
    known = [str(value) for value in values]
    return {"type": "string", EXTENSIBLE_ENUM: known, **schema, "description": description}


def open_enum_json_schema(
    cls: type[StrEnum], core_schema: CoreSchema, handler: GetJsonSchemaHandler
) -> JsonSchemaValue:
    """Describe a string enum as open, for its ``__get_pydantic_json_schema__``."""
    schema = handler(core_schema)
    values = schema.pop("enum", [member.value for member in cls])
    schema.pop("type", None)
    return open_enum_schema(values, **schema)


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

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Describe the enum as open: a string whose known values are ``x-extensible-enum``."""
        return open_enum_json_schema(cls, core_schema, handler)

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
