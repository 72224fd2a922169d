"""Envelope helpers: every simulator answer, success or error, is a contract ``Envelope``."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from prefect_ito.contract import ERROR_STATUS, ApiError, Envelope, ErrorCode

NOTICE = "Reference desk simulator: no live backend was contacted and nothing is trained."
ErrorEnvelope = Envelope[None]
"""The schema of an error answer in the OpenAPI document."""


def ok(data: Any) -> Envelope[Any]:
    """Wrap a successful answer."""
    return Envelope[Any](ok=True, live_api_contacted=False, notice=NOTICE, data=data)


def error_response(
    code: ErrorCode,
    message: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Return the error envelope for a code, with the status the contract pins to it."""
    body = Envelope[None](
        ok=False,
        live_api_contacted=False,
        notice=NOTICE,
        error=ApiError(code=code, message=message, field=field),
    )
    return JSONResponse(body.model_dump(mode="json"), ERROR_STATUS[code], headers=headers)


def documented_errors(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """Return OpenAPI ``responses`` entries for the statuses of the given error codes."""
    responses: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        status = ERROR_STATUS[code]
        entry = responses.setdefault(
            status, {"model": ErrorEnvelope, "description": "Error envelope: "}
        )
        entry["description"] += ("" if entry["description"].endswith(": ") else ", ") + code.value
        if code is ErrorCode.RATE_LIMITED:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                }
            }
    return responses


COMMON_ERRORS = (
    ErrorCode.VALIDATION_ERROR,
    ErrorCode.RATE_LIMITED,
    ErrorCode.BACKEND_UNAVAILABLE,
)
"""Errors any ``/v0`` route may answer with."""
AUTHENTICATED_ERRORS = (*COMMON_ERRORS, ErrorCode.UNAUTHENTICATED, ErrorCode.TOKEN_REVOKED)
"""Errors any route behind a bearer token may answer with."""
