"""The client's boundary with httpx: bearer auth, transport-error mapping, response parsing.

Each foreign failure is translated at exactly one place here: httpx exceptions in
:func:`map_transport_errors`, error envelopes through
:func:`~prefect_ito.exceptions.error_from_envelope`, and contract mismatches into
:class:`~prefect_ito.exceptions.ItoProtocolError` in :func:`parse_response`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, SecretStr, ValidationError

from prefect_ito.backend._retry import parse_retry_after
from prefect_ito.backend.origins import origin_of
from prefect_ito.contract import REQUEST_ID_HEADER, Envelope
from prefect_ito.exceptions import (
    ItoAPIError,
    ItoConnectionError,
    ItoProtocolError,
    ItoTimeoutError,
    ItoTransportError,
    error_from_envelope,
)

M = TypeVar("M", bound=BaseModel)

# Failures before any byte of the request could reach the backend; everything else is ambiguous.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class BearerAuth(httpx.Auth):
    """Attach ``Authorization: Bearer …`` at send time, to requests for the token's origin only.

    The token lives only in this object, as a ``SecretStr``; no request prefect-ito builds or
    keeps carries it outside the moment of sending. A request for any other origin goes without
    it: a token is sent only to the backend it belongs to (:mod:`prefect_ito.backend.origins`).
    """

    def __init__(self, token: SecretStr, origin: str) -> None:
        self._token = token
        self._origin = origin

    def __repr__(self) -> str:
        return f"BearerAuth(token=SecretStr('**********'), origin={self._origin!r})"

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if origin_of(request.url) != self._origin:
            yield request
            return
        request.headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        try:
            yield request
        finally:
            # Runs on success and, through the generator's close, on failure too.
            del request.headers["Authorization"]


@contextmanager
def map_transport_errors(endpoint: str) -> Iterator[None]:
    """Translate httpx transport errors into the ``ItoTransportError`` family.

    Args:
        endpoint: The endpoint being called, for the message.

    Raises:
        ItoTimeoutError: A timeout ran out.
        ItoConnectionError: The connection failed or was dropped.
        ItoTransportError: Any other transport failure.
    """
    try:
        yield
    except httpx.TransportError as exc:
        ambiguous = not isinstance(exc, _UNSENT)
        message = f"{endpoint}: {_describe(exc)}"
        if isinstance(exc, httpx.TimeoutException):
            raise ItoTimeoutError(message, ambiguous=ambiguous) from exc
        if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
            raise ItoConnectionError(message, ambiguous=ambiguous) from exc
        raise ItoTransportError(message, ambiguous=ambiguous) from exc


def _describe(exc: httpx.TransportError) -> str:
    # The class name and where are enough to act on; httpx's own text is kept out of our message,
    # and of the URL only the origin (never a path, query or user info).
    try:
        url = exc.request.url
    except RuntimeError:  # an error raised without a request
        return f"{type(exc).__name__} talking to the Itô backend"
    port = f":{url.port}" if url.port else ""
    return f"{type(exc).__name__} talking to the Itô backend at {url.scheme}://{url.host}{port}"


def parse_response(
    response: httpx.Response,
    model: type[M],
    endpoint: str,
    *,
    observe: Callable[[dict[str, Any]], None] | None = None,
) -> M:
    """Parse an answer into ``model``, or raise the error it carries.

    Args:
        response: The backend's answer.
        model: The contract model of the envelope's ``data``.
        endpoint: The endpoint that answered, named in protocol errors.
        observe: Called with every JSON object answer, success or error, before it is parsed
            (the client reads ``live_api_contacted`` and ``notice`` there).

    Returns:
        The validated ``data``.

    Raises:
        ItoAPIError: The answer is an error envelope (the mapped subclass).
        ItoProtocolError: The answer does not match contract v0.
    """
    body = _json_object(response, endpoint)
    if observe is not None:
        observe(body)
    if response.is_error or body.get("ok") is not True:
        raise _api_error(response, body, endpoint)
    try:
        envelope = Envelope[model].model_validate(body)  # type: ignore[valid-type]
    except ValidationError as exc:
        raise _protocol_error(exc, endpoint) from None
    if envelope.data is None:
        raise ItoProtocolError(
            f"{endpoint} answered ok without data", endpoint=endpoint, field="data"
        )
    data: M = envelope.data
    return data


def peek_error_code(response: httpx.Response) -> str | None:
    """Return the ``error.code`` of a 409 answer without parsing it further; else None.

    Only a 409 needs its code to decide on a retry (``IDEMPOTENCY_KEY_IN_FLIGHT`` is the one to
    retry), so no other answer is read twice.
    """
    if response.status_code != 409:
        return None
    try:
        error = json.loads(response.content).get("error")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _json_object(response: httpx.Response, endpoint: str) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        raise ItoProtocolError(
            f"{endpoint} answered HTTP {response.status_code} with a body that is not JSON",
            endpoint=endpoint,
        ) from None
    if not isinstance(body, dict):
        raise ItoProtocolError(
            f"{endpoint} answered with JSON that is not an envelope object", endpoint=endpoint
        )
    return body


def _api_error(
    response: httpx.Response, body: dict[str, Any], endpoint: str
) -> ItoAPIError | ItoProtocolError:
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    field = error.get("field") if isinstance(error, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if not (isinstance(code, str) and code and isinstance(message, str)):
        return ItoProtocolError(
            f"{endpoint} answered HTTP {response.status_code} without a valid error envelope",
            endpoint=endpoint,
            field="error",
        )
    return error_from_envelope(
        code,
        message,
        status_code=response.status_code,
        request_id=response.headers.get(REQUEST_ID_HEADER),
        field=field if isinstance(field, str) else None,
        retry_after=parse_retry_after(response.headers.get("Retry-After")),
        details=details if isinstance(details, dict) else None,
    )


def _protocol_error(exc: ValidationError, endpoint: str) -> ItoProtocolError:
    first = exc.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    # The message names the field and the rule, never the offending value.
    return ItoProtocolError(
        f"{endpoint} answered with a body that does not match contract v0: "
        f"field {field or '<body>'}: {first['msg']}",
        endpoint=endpoint,
        field=field,
    )
