"""Request ids, the request log and the 500 envelope, around every answer of the simulator."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from uuid import uuid4

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_ito.contract import IDEMPOTENCY_HEADER, REQUEST_ID_HEADER, ErrorCode
from prefect_ito.simulator.envelopes import error_response
from prefect_ito.simulator.faults import was_dropped
from prefect_ito.simulator.state import RequestLogEntry, SimState

ADMIN_PREFIX = "/_sim"
logger = logging.getLogger("prefect_ito.simulator")


class RequestLogMiddleware:
    """Give every answer an ``X-Request-Id`` and log every non-admin request (never a header).

    It is the outermost of the simulator's own middleware, so it also turns an unexpected
    exception into the contract's 500 ``INTERNAL_ERROR`` envelope, with its request id; Starlette's
    own 500 is plain text and would carry neither.
    """

    def __init__(self, app: ASGIApp, state: SimState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + uuid4().hex[:20]
        scope.setdefault("state", {})
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, request_id)
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
                self._log(scope, request_id, status)

    def _log(self, scope: Scope, request_id: str, status: int) -> None:
        self.state.requests.append(
            RequestLogEntry(
                time=datetime.now(UTC),
                method=scope["method"],
                path=scope["path"],
                status=status,
                idempotency_key=Headers(scope=scope).get(IDEMPOTENCY_HEADER),
                request_id=request_id,
                dropped=was_dropped(scope),
            )
        )
