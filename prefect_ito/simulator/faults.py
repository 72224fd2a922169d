"""Transport faults: 503s, 429s with ``Retry-After``, 500s, latency, and dropping an answer.

Every fault a scenario's :class:`~prefect_ito.simulator.scenario.Faults` configures is injected
from here. Faults apply to ``/v0`` routes only, never to the ``/_sim`` admin surface, and their dice
are seeded by the scenario, so a fault sequence repeats from run to run.

Dropping a committed answer takes two steps, because only the route knows when a submission made a
new run: the route calls :meth:`FaultInjector.drop_after_commit`, which flags the request while the
scenario has drops left, and :class:`FaultMiddleware` cuts a flagged answer half-way through its
body.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefect_ito.contract import API_PREFIX, IDEMPOTENCY_HEADER, ErrorCode
from prefect_ito.simulator.envelopes import error_response
from prefect_ito.simulator.ids import MINTED
from prefect_ito.simulator.request_scope import state_of
from prefect_ito.simulator.scenario import Faults

_DROP_KEY = "prefect_ito.drop_response"
"""Key in the ASGI scope state that flags an answer to be cut off after the headers."""


_HEADER = IDEMPOTENCY_HEADER.lower().encode()


class FaultInjector:
    """The running side of a scenario's faults: how many times each request came, and the drops
    still due.

    Made afresh on every scenario load, so every request's fault sequence and the drop count start
    over with it.

    Args:
        config: The scenario's faults.
    """

    def __init__(self, config: Faults) -> None:
        self.config = config
        self._seen: Counter[bytes] = Counter()
        self._drops_left = config.drop_response_after_commit

    def roll(self, scope: Scope, body: bytes) -> float:
        """Return a number in [0, 1) for this request, this time: the same in every run.

        Args:
            scope: The ASGI scope of the request.
            body: The request's body.
        """
        request = _identity(scope, body)
        attempt = self._seen[request]
        self._seen[request] += 1
        dice = hashlib.blake2b(request, digest_size=8, key=str(self.config.seed).encode())
        dice.update(attempt.to_bytes(8, "big"))
        return int.from_bytes(dice.digest(), "big") / 2**64

    def drop_after_commit(self, scope: Scope) -> None:
        """Flag the answer to a new, committed submission to be cut, while drops are left.

        Args:
            scope: The ASGI scope of the submission's request.
        """
        if self._drops_left > 0:
            self._drops_left -= 1
            scope["state"][_DROP_KEY] = True


def _identity(scope: Scope, body: bytes) -> bytes:
    """Return what makes a request itself, the same in every run of a test.

    That is its method, path, query, and its idempotency key or, without one, its body. The ids
    the backend made (a run's, a quote's) are left out, since they differ from run to run; so is
    the body of a keyed request, since the key names it and its body may hold such an id.
    """
    key = next((value for name, value in scope["headers"] if name == _HEADER), None)
    payload = b"key:" + key if key is not None else b"body:" + body
    parts = (scope["method"].encode(), scope["path"].encode(), scope["query_string"], payload)
    return hashlib.blake2b(MINTED.sub(b"{id}", b"\0".join(parts)), digest_size=16).digest()


class InjectedFault(RuntimeError):
    """The exception ``faults.internal_error_rate`` raises inside a request."""


def was_dropped(scope: Scope) -> bool:
    """Return whether the answer to this request was flagged to be cut."""
    return bool(scope.get("state", {}).get(_DROP_KEY))


class FaultMiddleware:
    """Inject the scenario's latency, 503s and 429s, and cut flagged answers, on ``/v0`` routes.

    The simulator's state is read on every request: a scenario load replaces its fault injector.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        injector = state_of(scope).faults
        faults = injector.config
        if faults.latency_seconds:
            await asyncio.sleep(faults.latency_seconds)
        # Without dice to cast, the body streams on to the app unread.
        if faults.unavailable_rate or faults.rate_limited_rate or faults.internal_error_rate:
            body, receive = await _read_body(receive)
            fault = _fault_for(injector.roll(scope, body), faults)
            if fault is not None:
                await fault(scope, receive, send)
                return
        await self.app(scope, receive, _dropping(scope, send))


def _fault_for(roll: float, faults: Faults) -> Response | None:
    """Return the answer a request's roll of the dice gives it, or None to let it through.

    Raises:
        InjectedFault: the roll fell in ``internal_error_rate``.
    """
    if roll < faults.unavailable_rate:
        return error_response(ErrorCode.BACKEND_UNAVAILABLE, "the backend is briefly unavailable")
    if roll < faults.unavailable_rate + faults.rate_limited_rate:
        return error_response(
            ErrorCode.RATE_LIMITED,
            "too many requests",
            headers={"Retry-After": str(faults.retry_after_seconds)},
        )
    if roll < faults.unavailable_rate + faults.rate_limited_rate + faults.internal_error_rate:
        # A real exception, so the path every unexpected failure takes is the one exercised.
        raise InjectedFault("injected internal error")
    return None


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """Read a request's whole body, and return it with a ``receive`` that hands it on again.

    The body is part of what makes a keyless request itself (two quotes differ only in theirs),
    so it is read before the fault is decided; the app behind reads it from the returned
    ``receive``. The body limit, an outer middleware, has already bounded it.
    """
    chunks: list[bytes] = []
    message: Message = {"type": "http.request", "more_body": True}
    while message["type"] == "http.request" and message.get("more_body", False):
        message = await receive()
        chunks.append(message.get("body", b""))
    body = b"".join(chunks)
    # A client that went away is told to the app as it happened; otherwise the app gets the body.
    first: Message = (
        {"type": "http.request", "body": body, "more_body": False}
        if message["type"] == "http.request"
        else message
    )
    handed = False

    async def replay() -> Message:
        nonlocal handed
        if handed:
            return await receive()
        handed = True
        return first

    return body, replay


def _dropping(scope: Scope, send: Send) -> Send:
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
        if message["type"] == "http.response.body" and was_dropped(scope):
            body: bytes = message.get("body", b"")
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            cut = True
            return
        await send(message)

    return send_partially
