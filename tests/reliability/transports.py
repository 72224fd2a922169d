"""httpx transports the reliability tests put between a client and a real simulator.

Each passes every request on to a real loopback connection and notes what came back, so faults
are counted where they happen; some also lose an answer after the backend committed it, or
rewrite an answer the way a broken backend would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

_TLS = httpx.create_ssl_context()
"""One TLS context for every tap: building one per connection pool costs tens of milliseconds."""

Answer = dict[str, Any] | bytes | httpx.Response | None
Rewrite = Callable[[httpx.Request, dict[str, Any]], Answer]
"""Given a request and its answer's JSON body: a new body (JSON or raw bytes), a whole new
answer, or None to leave the answer alone."""


class Tap(httpx.AsyncBaseTransport):
    """Pass requests to a real connection and count each outcome (a status or an error's name).

    Args:
        lose_first: A pattern of POST paths whose first answer for each idempotency key is read
            in full (the backend committed) and then lost, as if the connection dropped.
        time_out_first: A pattern of POST paths whose first request for each idempotency key is
            sent, and given up on after ``give_up_after`` seconds with a read timeout while the
            backend still works on it (the request goes on, as it does at a backend whose
            client went away).
        give_up_after: See ``time_out_first``.
        rewrite: Changes answers (see :data:`Rewrite`).
        never_answer: A pattern of GET paths that are never answered: the request waits out
            its read timeout and fails with a read timeout, as a stuck long-poll does.
    """

    def __init__(
        self,
        *,
        lose_first: str | None = None,
        time_out_first: str | None = None,
        give_up_after: float = 0.25,
        rewrite: Rewrite | None = None,
        never_answer: str | None = None,
    ) -> None:
        self._inner = httpx.AsyncHTTPTransport(verify=_TLS)
        self._lose_first = re.compile(lose_first) if lose_first else None
        self._time_out_first = re.compile(time_out_first) if time_out_first else None
        self._give_up_after = give_up_after
        self._abandoned: list[asyncio.Task[httpx.Response]] = []
        self._rewrite = rewrite
        self._never_answer = re.compile(never_answer) if never_answer else None
        self._first_keys: set[str] = set()
        self.outcomes: Counter[str] = Counter()
        self.timeline: list[tuple[float, str, int | None]] = []
        """(monotonic time, request, status): a send has no status, an answer its status."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        name = _identity(request)
        self.timeline.append((time.monotonic(), name, None))
        response = await self._handle(request)
        self.timeline.append((time.monotonic(), name, response.status_code))
        return response

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        if self._stuck(request):
            await asyncio.sleep(_read_timeout(request))
            self.outcomes["never answered"] += 1
            raise httpx.ReadTimeout("no answer", request=request)
        if self._first(self._time_out_first, request):
            return await self._give_up_on(request)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TransportError as error:
            self.outcomes[type(error).__name__] += 1
            raise
        if self._first(self._lose_first, request):
            await response.aread()
            await response.aclose()
            self.outcomes["answer lost after commit"] += 1
            raise httpx.RemoteProtocolError("connection dropped mid-answer", request=request)
        self.outcomes[str(response.status_code)] += 1
        if self._rewrite is not None:
            return await self._rewritten(request, response)
        return response

    async def aclose(self) -> None:
        for sent in self._abandoned:
            response = await sent
            await response.aclose()
        await self._inner.aclose()

    async def _give_up_on(self, request: httpx.Request) -> httpx.Response:
        sent = asyncio.ensure_future(self._inner.handle_async_request(request))
        self._abandoned.append(sent)
        await asyncio.wait({sent}, timeout=self._give_up_after)
        self.outcomes["timed out after sending"] += 1
        raise httpx.ReadTimeout("gave up waiting", request=request)

    def _stuck(self, request: httpx.Request) -> bool:
        pattern = self._never_answer
        return bool(pattern and request.method == "GET" and pattern.search(request.url.path))

    def _first(self, pattern: re.Pattern[str] | None, request: httpx.Request) -> bool:
        """Tell whether ``request`` is the first POST with its key to a path ``pattern`` finds."""
        key = request.headers.get("Idempotency-Key")
        if not (pattern and key and request.method == "POST" and pattern.search(request.url.path)):
            return False
        if key in self._first_keys:
            return False
        self._first_keys.add(key)
        return True

    async def _rewritten(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        assert self._rewrite is not None
        raw = await response.aread()
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        changed = self._rewrite(request, json.loads(raw))
        if changed is None:
            return httpx.Response(response.status_code, headers=headers, content=raw)
        self.outcomes["rewritten"] += 1
        if isinstance(changed, httpx.Response):
            return changed
        if isinstance(changed, bytes):
            return httpx.Response(response.status_code, headers=headers, content=changed)
        return httpx.Response(response.status_code, headers=headers, json=changed)


def _identity(request: httpx.Request) -> str:
    """Name a request by all it sends but its auth: a resend has the same name."""
    key = request.headers.get("Idempotency-Key")
    body = hashlib.sha256(request.content).hexdigest()[:12]
    return f"{request.method} {request.url.raw_path.decode()} {key} {body}"


def _read_timeout(request: httpx.Request) -> float:
    timeout = request.extensions.get("timeout", {})
    read = timeout.get("read")
    return float(read) if read is not None else 5.0
