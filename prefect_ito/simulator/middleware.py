"""Request ids and the request log, around every request the simulator answers."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_ito.contract import IDEMPOTENCY_HEADER, REQUEST_ID_HEADER
from prefect_ito.simulator.faults import was_dropped
from prefect_ito.simulator.state import RequestLogEntry, SimState

ADMIN_PREFIX = "/_sim"


class RequestLogMiddleware:
    """Give every answer an ``X-Request-Id`` and log every non-admin request (never a header)."""

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
