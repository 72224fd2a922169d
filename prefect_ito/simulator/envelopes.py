"""Envelope helpers: every simulator answer is a contract envelope, and its OpenAPI entry.

The ``responses`` built here are the whole of what an operation may answer in the committed
OpenAPI document: its success, every error status its codes map to (always 500 too), and the
headers each answer carries.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from prefect_ito.contract import (
    DEPRECATION_HEADER,
    REPLAYED_HEADER,
    REQUEST_ID_HEADER,
    RETRY_AFTER_HEADER,
    SUNSET_HEADER,
    ApiError,
    Envelope,
    ErrorCode,
    ErrorEnvelope,
)
from prefect_ito.outcomes import ERROR_STATUS

NOTICE = "Reference desk simulator: no live backend was contacted and nothing is trained."

Header = dict[str, Any]
CACHE_CONTROL_HEADER = "Cache-Control"
NO_STORE = "no-store"
"""Every answer's ``Cache-Control``: answers carry tokens, quotes and run state."""

ANSWER_HEADERS: dict[str, Header] = {
    REQUEST_ID_HEADER: {
        "description": "The answer's id: quote it when you report a problem.",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    },
    CACHE_CONTROL_HEADER: {
        "description": "`no-store`: answers carry tokens, quotes and run state, which no cache "
        "may keep (RFC 9111).",
        "required": True,
        "schema": {"type": "string", "const": NO_STORE},
    },
    DEPRECATION_HEADER: {
        "description": "RFC 9745: the endpoint is deprecated (or will be) as of this time, "
        "`@` and Unix seconds. Clients log it.",
        "schema": {"type": "string", "pattern": "^@-?[0-9]+$"},
    },
    SUNSET_HEADER: {
        "description": "RFC 8594: the HTTP-date after which a deprecated endpoint may stop "
        "answering.",
        "schema": {"type": "string"},
    },
}
"""Headers of every answer, success or error."""
RETRY_AFTER: Header = {
    "description": "Seconds to wait before sending the same request again.",
    "schema": {"type": "integer", "minimum": 0},
}
REPLAYED: Header = {
    "description": "`true`: the answer replays an earlier submission with this key.",
    "required": True,
    "schema": {"type": "string", "const": "true"},
}
_RETRY_STATUSES = {429: True, 503: False}
"""Statuses that may carry ``Retry-After``, and whether they always do."""


def ok(data: Any) -> Envelope[Any]:
    """Wrap a successful answer."""
    return Envelope[Any](ok=True, live_api_contacted=False, notice=NOTICE, data=data)


def error_response(
    code: ErrorCode,
    message: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    details: dict[str, Any] | None = None,
) -> JSONResponse:
    """Return the error envelope for a code, with the status the contract pins to it."""
    body = ErrorEnvelope(
        ok=False,
        live_api_contacted=False,
        notice=NOTICE,
        error=ApiError(code=code, message=message, field=field, details=details),
    )
    # ``details`` appears only when an error has some, as older backends never sent it.
    content = body.model_dump(
        mode="json", exclude={"error": {"details"}} if details is None else None
    )
    return JSONResponse(content, ERROR_STATUS[code], headers=headers)


def documented(
    *codes: ErrorCode, status: int = 200, replay: type | None = None
) -> dict[int | str, dict[str, Any]]:
    """Return an operation's OpenAPI ``responses``: success, the codes' statuses, and 500.

    Args:
        codes: The error codes the operation may answer with.
        status: The success status.
        replay: The envelope model of a 200 that replays an earlier submission (with
            ``Idempotent-Replayed``), for an operation that creates with another status.
    """
    responses: dict[int | str, dict[str, Any]] = {status: {"headers": dict(ANSWER_HEADERS)}}
    if replay is not None:
        responses[200] = {
            "model": replay,
            "description": "A replay of an earlier submission with this key.",
            "headers": {**ANSWER_HEADERS, REPLAYED_HEADER: REPLAYED},
        }
    for code in dict.fromkeys((*codes, ErrorCode.INTERNAL_ERROR)):
        error_status = ERROR_STATUS[code]
        entry = responses.setdefault(
            error_status,
            {
                "model": ErrorEnvelope,
                "description": "Error envelope: ",
                "headers": dict(ANSWER_HEADERS),
            },
        )
        entry["description"] += ("" if entry["description"].endswith(": ") else ", ") + code.value
        if error_status in _RETRY_STATUSES or code is ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT:
            # A 409 carries it only with IDEMPOTENCY_KEY_IN_FLIGHT, so it is optional there.
            required = _RETRY_STATUSES.get(error_status, False)
            entry["headers"][RETRY_AFTER_HEADER] = {**RETRY_AFTER, "required": required}
    return responses


COMMON_ERRORS = (
    ErrorCode.VALIDATION_ERROR,
    ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.RATE_LIMITED,
    ErrorCode.BACKEND_UNAVAILABLE,
    ErrorCode.INTERNAL_ERROR,
)
"""Errors any ``/v0`` route may answer with."""
AUTHENTICATED_ERRORS = (*COMMON_ERRORS, ErrorCode.UNAUTHENTICATED, ErrorCode.TOKEN_REVOKED)
"""Errors any route behind a bearer token may answer with."""
