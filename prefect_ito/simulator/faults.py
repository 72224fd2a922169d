"""Transport faults: 503s, 429s with ``Retry-After``, latency, and dropping a committed answer.

Faults apply to ``/v0`` routes only, never to the ``/_sim`` admin surface, and their dice are seeded
by the scenario, so a fault sequence repeats from run to run.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_ito.contract import API_PREFIX, ErrorCode
from prefect_ito.simulator.envelopes import error_response
from prefect_ito.simulator.state import SimState

DROP_RESPONSE = "prefect_ito.drop_response"
"""Key a route sets in the ASGI scope state to have its answer cut off after the headers."""


class FaultMiddleware:
    """Inject the scenario's latency, 503s and 429s before a ``/v0`` request reaches a route."""

    def __init__(self, app: ASGIApp, state: SimState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(API_PREFIX + "/"):
            faults = self.state.engine.scenario.faults
            if faults.latency_seconds:
                await asyncio.sleep(faults.latency_seconds)
            roll = self.state.rng.random()
            if roll < faults.unavailable_rate:
                response = error_response(
                    ErrorCode.BACKEND_UNAVAILABLE, "the backend is briefly unavailable"
                )
                await response(scope, receive, send)
                return
            if roll < faults.unavailable_rate + faults.rate_limited_rate:
                response = error_response(
                    ErrorCode.RATE_LIMITED,
                    "too many requests",
                    headers={"Retry-After": str(faults.retry_after_seconds)},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def dropping(scope: Scope, send: Send) -> Send:
    """Wrap ``send`` so that a flagged answer stops half-way through its body.

    uvicorn closes the connection when an app returns without completing its response, so the
    client sees the status line and headers, then a connection cut before the body ends: the
    ambiguous failure ``drop_response_after_commit`` is about.
    """
    cut = False

    async def send_partially(message: Message) -> None:
        nonlocal cut
        if cut:
            return
        if message["type"] == "http.response.body" and scope["state"].get(DROP_RESPONSE):
            body: bytes = message.get("body", b"")
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            cut = True
            return
        await send(message)

    return send_partially
