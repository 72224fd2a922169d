"""Contract v0: constants, shared field types, error codes and the response envelope."""

from __future__ import annotations

import unicodedata
from enum import StrEnum
from typing import Annotated, Any, Final, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StringConstraints,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from prefect_ito.contract.open_enum import open_enum_json_schema

SCHEMA_VERSION: Final = "ito.training.v0.5"
"""The contract version this prefect-ito speaks: major 0 (the ``/v0`` paths), minor 5."""
SCHEMA_VERSION_PATTERN = r"^ito\.training\.v0(\.[0-9]+)?$"
"""Any minor version of v0: additive, so each reads as the other (see docs/contract.md)."""
API_PREFIX = "/v0"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
REQUEST_ID_HEADER = "X-Request-Id"
RETRY_AFTER_HEADER = "Retry-After"
DEPRECATION_HEADER = "Deprecation"
SUNSET_HEADER = "Sunset"
ID_MAX_LENGTH = 128
"""The longest booking, run or action id, wherever it appears: body, path or query."""
TEXT_MAX_LENGTH = 512
"""The longest data reference, target, decider's name or reason."""
IDEMPOTENCY_KEY_MAX_LENGTH = 255
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"
"""An idempotency key: 1 to 255 letters, digits or ``._:-``, starting with a letter or digit."""
IDEMPOTENCY_KEY_RETENTION_SECONDS = 86_400
"""A backend keeps an idempotency key at least this long (24 h) after its first use."""
MAX_WAIT_SECONDS = 60
"""The longest ``wait`` a long-poll read may ask for; longer values are capped."""
DEFAULT_PAGE_LIMIT = 100
"""Items in a page of runs or events when the request gives no ``limit``."""
MAX_PAGE_LIMIT = 500
"""The largest ``limit`` a page of runs or events may ask for."""
CURSOR_MAX_LENGTH = 255
CLIENT_REFERENCE_PATTERN = r"^[!-~]{1,128}$"
"""A client reference: 1–128 visible ASCII characters (letters, digits, punctuation; no space)."""
DETECT_TARGET_SECONDS = 600
"""The backend's target for detecting an interruption (10 minutes)."""
RESUME_TARGET_SECONDS = 900
"""The backend's target for resuming after an interruption (15 minutes)."""

T = TypeVar("T")

MODEL_SIZE_PATTERN = r"^[1-9][0-9]{0,3}(\.[0-9]{1,2})?[MBT]$"
"""A parameter count such as ``150M``, ``8B``, ``70B`` or ``1.5T``."""
ModelSize = Annotated[
    str,
    StringConstraints(pattern=MODEL_SIZE_PATTERN),
    Field(description="Parameter count such as `150M`, `8B` or `70B`.", examples=["8B"]),
]
ManifestDigest = Annotated[
    str,
    StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$"),
    Field(description="`sha256:<hex>` of the request's canonical manifest in RFC 8785 (JCS) form."),
]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1, max_length=TEXT_MAX_LENGTH)]
QuoteId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ID_MAX_LENGTH),
    Field(description="A training quote's id at the Itô desk."),
]
AuthorizationId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ID_MAX_LENGTH),
    Field(description="A standing spend authorization's id at the Itô desk (v0.4)."),
]
ClientReference = Annotated[
    str,
    StringConstraints(pattern=CLIENT_REFERENCE_PATTERN),
    Field(
        description="The caller's own stable reference for a submission (contract v0.3): 1–128 "
        "visible ASCII characters, no space. prefect-ito sends the Prefect flow run id.",
        examples=["0b1d6d2e-6f5c-4a8e-9a7e-3c2b1a0f9e8d"],
    ),
]
BookingId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=ID_MAX_LENGTH),
    Field(description="A booking's id at the Itô desk."),
]


PATH_SEPARATORS = ("/", "\\", "?", "#")
"""Characters that would end an id's path segment (or the path) wherever a server decodes it."""


def segment_problem(value: str) -> str | None:
    """Return why ``value`` cannot be one path segment of a request, or None when it can.

    An empty id, ``.`` or ``..``, or one holding a separator would change which route a request
    reaches: an empty one the collection, dot segments the parent, and ``%2F`` is decoded back to
    ``/`` by servers that route on the decoded path.
    """
    if not value:
        return "must not be empty"
    if value in (".", ".."):
        return f"{value!r} is not an id: it would change the request's path"
    if any(separator in value for separator in PATH_SEPARATORS):
        return "must not contain '/', '\\', '?' or '#': it would change the request's path"
    return None


def id_problem(value: str) -> str | None:
    """Return why ``value`` is not a booking, run or action id to send, or None when it is.

    An id is 1 to :data:`ID_MAX_LENGTH` characters, without surrounding spaces or control
    characters, and usable as one path segment (:func:`segment_problem`).
    """
    if not value.strip():
        return "must not be empty"
    if len(value) > ID_MAX_LENGTH:
        return f"must be at most {ID_MAX_LENGTH} characters (got {len(value)})"
    if value != value.strip():
        return "must not start or end with a space"
    if (hidden := hidden_character(value)) is not None:
        return f"must not contain a control or invisible character (U+{ord(hidden):04X})"
    return segment_problem(value)


_SHOWN_LENGTH = 40
"""The most characters of a rejected value a message repeats: a huge value stays out of it."""


def shown(value: object) -> str:
    """Return ``repr(value)``, cut short: a message names a bad value without repeating it all."""
    text = repr(value)
    if len(text) <= _SHOWN_LENGTH:
        return text
    return f"{text[:_SHOWN_LENGTH]}… ({len(text):,} characters)"


_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})
"""Format characters (bidi overrides, zero-width spaces and joiners, a byte order mark) and line
or paragraph separators: none is ever meant in an id, a target or a data reference, and each can
make one read as another in a log, a terminal or a form."""


def invisible_character(text: str) -> str | None:
    """Return the first invisible character in ``text`` (see above), or None."""
    return next((c for c in text if unicodedata.category(c) in _INVISIBLE_CATEGORIES), None)


def hidden_character(text: str) -> str | None:
    """Return the first control (``Cc``) or invisible character in ``text``, or None."""
    control = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    return control if control is not None else invisible_character(text)


class _Model(BaseModel):
    """Base for wire models: unknown fields are tolerated so the backend may add to v0."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class ErrorCode(StrEnum):
    """Stable error codes carried in ``error.code``.

    Open in the OpenAPI document: a backend may add codes within v0, and a client treats a code
    it does not know by the HTTP status of the answer. prefect-ito reads ``error.code`` from an
    answer as a string (``prefect_ito.backend._http``), so an unknown code becomes a plain
    :class:`~prefect_ito.exceptions.ItoAPIError`; this enum names the codes it knows.
    """

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return open_enum_json_schema(cls, core_schema, handler)

    UNAUTHENTICATED = "UNAUTHENTICATED"
    TOKEN_REVOKED = "TOKEN_REVOKED"
    INSUFFICIENT_SCOPE = "INSUFFICIENT_SCOPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    NOT_FOUND = "NOT_FOUND"
    BOOKING_NOT_FOUND = "BOOKING_NOT_FOUND"
    BOOKING_NOT_ELIGIBLE = "BOOKING_NOT_ELIGIBLE"
    CAPABILITY_NOT_AVAILABLE = "CAPABILITY_NOT_AVAILABLE"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    IDEMPOTENCY_KEY_IN_FLIGHT = "IDEMPOTENCY_KEY_IN_FLIGHT"
    BOOKING_BUSY = "BOOKING_BUSY"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    ACTION_NOT_PENDING = "ACTION_NOT_PENDING"
    DECISION_CONFLICT = "DECISION_CONFLICT"
    RATE_LIMITED = "RATE_LIMITED"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    AUTHORIZATION_PENDING = "AUTHORIZATION_PENDING"
    SLOW_DOWN = "SLOW_DOWN"
    ACCESS_DENIED = "ACCESS_DENIED"
    EXPIRED_TOKEN = "EXPIRED_TOKEN"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    CONFIRMATION_REQUIRED = "CONFIRMATION_REQUIRED"
    CONFIRMATION_MISMATCH = "CONFIRMATION_MISMATCH"
    CONFIRMATION_EXPIRED = "CONFIRMATION_EXPIRED"
    CONFIRMATION_USED = "CONFIRMATION_USED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    CLIENT_REFERENCE_IN_USE = "CLIENT_REFERENCE_IN_USE"
    QUOTE_NOT_FOUND = "QUOTE_NOT_FOUND"
    QUOTE_ALREADY_DECIDED = "QUOTE_ALREADY_DECIDED"
    SPEND_AUTHORIZATION_NOT_FOUND = "SPEND_AUTHORIZATION_NOT_FOUND"
    AUTHORIZATION_DOES_NOT_COVER = "AUTHORIZATION_DOES_NOT_COVER"
    CONTRACT_VERSION_UNSUPPORTED = "CONTRACT_VERSION_UNSUPPORTED"


class ApiError(_Model):
    """The ``error`` member of a failed response. ``message`` is safe to show and log."""

    code: ErrorCode
    message: str
    field: str | None = Field(default=None, description="The offending request field, if any.")
    details: dict[str, Any] | None = Field(
        default=None,
        description="v0.3: machine-readable facts about the error, by code: `fields` (the "
        "request fields that differ) for `CONFIRMATION_MISMATCH`, `interval` (the seconds to "
        "poll at from now on) for `SLOW_DOWN`, `run_id` (the run that holds the reference) for "
        "`CLIENT_REFERENCE_IN_USE`; v0.4: `quote_id`, `confirm_url`, `user_code` and `reasons` "
        "for `CONFIRMATION_REQUIRED`, `reason` for `AUTHORIZATION_DOES_NOT_COVER`. Absent when "
        "there are none; a client ignores members it does not know.",
    )


_LIVE = Field(description="True only when a live production backend produced this answer.")
_NOTICE = Field(default=None, description="A human note, e.g. a simulator banner.")


class Envelope(_Model, Generic[T]):
    """A successful answer: ``ok`` is true and ``data`` holds it (see :class:`ErrorEnvelope`)."""

    ok: Literal[True]
    live_api_contacted: bool = _LIVE
    notice: str | None = _NOTICE
    data: T
    error: None = None


class ErrorEnvelope(_Model):
    """A failed answer: ``ok`` is false and ``error`` says why."""

    ok: Literal[False]
    live_api_contacted: bool = _LIVE
    notice: str | None = _NOTICE
    data: None = None
    error: ApiError
