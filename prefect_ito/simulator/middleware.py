"""Request ids, the request log, the 500 envelope and the body limit, around every answer."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_ito.contract import IDEMPOTENCY_HEADER, REQUEST_ID_HEADER, ErrorCode
from prefect_ito.simulator.envelopes import CACHE_CONTROL_HEADER, NO_STORE, error_response
from prefect_ito.simulator.faults import was_dropped
from prefect_ito.simulator.ids import mint
from prefect_ito.simulator.person_session import PAGE_HEADERS
from prefect_ito.simulator.request_scope import state_of
from prefect_ito.simulator.state import RequestLogEntry

ADMIN_PREFIX = "/_sim"
logger = logging.getLogger("prefect_ito.simulator")


class RequestLogMiddleware:
    """Give every answer an ``X-Request-Id``, ``Cache-Control: no-store`` and the pages' frame
    and referrer headers, and log every non-admin request (never a header, a query or a body).

    It is the outermost of the simulator's own middleware, so it also turns an unexpected
    exception into the contract's 500 ``INTERNAL_ERROR`` envelope, with its request id; Starlette's
    own 500 is plain text and would carry neither.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = mint("req", 20)
        received = datetime.now(UTC)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers.append(REQUEST_ID_HEADER, request_id)
                # Answers carry tokens, quotes and run state, which no cache may keep.
                headers[CACHE_CONTROL_HEADER] = NO_STORE
                # Here, not in each page: no page (nor its error answer) can go without them.
                headers.update(PAGE_HEADERS)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if status:  # the answer had begun: nothing sound can be sent any more
                raise
            logger.exception("request %s failed", request_id)
            response = error_response(ErrorCode.INTERNAL_ERROR, "the simulator failed unexpectedly")
            await response(scope, receive, send_with_id)
        finally:
            if not scope["path"].startswith(ADMIN_PREFIX):
                self._log(scope, request_id, status, received)

    def _log(self, scope: Scope, request_id: str, status: int, received: datetime) -> None:
        state_of(scope).requests.append(
            RequestLogEntry(
                time=datetime.now(UTC),
                received=received,
                method=scope["method"],
                path=scope["path"],
                status=status,
                idempotency_key=Headers(scope=scope).get(IDEMPOTENCY_HEADER),
                request_id=request_id,
                dropped=was_dropped(scope),
            )
        )


class BodyLimitMiddleware:
    """Refuse a request body over the scenario's ``max_body_bytes`` while it arrives (413).

    A ``Content-Length`` over the limit is answered before any of the body is read; a chunked
    body is counted as it is received, and refused once the count passes the limit. Either way
    the answer is the contract's ``PAYLOAD_TOO_LARGE`` envelope, and the body is never held
    whole.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = state_of(scope).engine.scenario.max_body_bytes
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await too_large_response(BodyTooLarge(limit))(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def send_started(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, send_started)
        except BodyTooLarge as error:  # only if no handler inside answered it
            if started:
                raise
            await too_large_response(error)(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once the body passes the limit; answered 413 PAYLOAD_TOO_LARGE.

    An ``HTTPException``, so that FastAPI — which turns any other failure while it reads a body
    into a 400 — lets it through to the app's handler (or to :class:`BodyLimitMiddleware`).
    """

    def __init__(self, limit: int) -> None:
        message = f"the request body is larger than {limit:,} bytes; nothing was done with it"
        super().__init__(status_code=413, detail=message)


def too_large_response(error: BodyTooLarge) -> JSONResponse:
    """Return the contract's 413 envelope for ``error``."""
    return error_response(ErrorCode.PAYLOAD_TOO_LARGE, error.detail, field="body")
