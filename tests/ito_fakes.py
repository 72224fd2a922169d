"""Test doubles for the client tests: scripted MockTransport handlers and sample contract data."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel, SecretStr

from prefect_ito.backend._retry import RetryBudget
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import (
    ErrorCode,
    RunState,
    Telemetry,
    TrainingRequest,
    TrainingRun,
    TrainingRunRequest,
)
from prefect_ito.outcomes import ERROR_STATUS

BASE_URL = "http://desk.test"
NOW = datetime(2026, 3, 2, tzinfo=UTC)


def envelope(data: Any = None, *, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return a response body in the contract's envelope."""
    body: dict[str, Any] = {"ok": error is None, "live_api_contacted": False}
    if error is None:
        body["data"] = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    else:
        body["error"] = error
    return body


def ok(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    """Return a successful answer carrying ``data``."""
    return httpx.Response(status, json=envelope(data), headers=headers)


def fail(
    code: ErrorCode | str,
    *,
    message: str = "something went wrong",
    status: int | None = None,
    headers: dict[str, str] | None = None,
    field: str | None = None,
) -> httpx.Response:
    """Return an error envelope answer for ``code`` with its contract status."""
    if status is None:
        status = ERROR_STATUS[ErrorCode(code)]
    error = {"code": str(code), "message": message, "field": field}
    return httpx.Response(status, json=envelope(error=error), headers=headers)


def sample_request(
    booking_id: str = "bk-h200-2x8-ib", *, budget_usd: float = 1000.0
) -> TrainingRunRequest:
    """Return a valid submission body."""
    return TrainingRequest(
        booking_id=booking_id,
        model_size="150M",
        data_refs=["s3://corpus/web"],
        target="code-assist",
        budget_usd=budget_usd,
    ).to_submission()


def sample_run(run_id: str = "run-1", *, version: int = 1) -> TrainingRun:
    """Return a valid, freshly accepted run."""
    request = sample_request()
    return TrainingRun(
        run_id=run_id,
        version=version,
        state=RunState.ACCEPTED,
        booking_id=request.booking_id,
        manifest_digest=request.manifest_digest,
        request=request,
        created_at=NOW,
        updated_at=NOW,
        heartbeat_at=NOW,
        stages=[],
        telemetry=Telemetry(
            goodput=1.0,
            interruption_rate_per_day=0.0,
            checkpoint_bandwidth_gbps=40.0,
            spend_usd=0.0,
            budget_usd=1000.0,
            tokens_processed=0,
            step=0,
        ),
    )


Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Script:
    """A MockTransport handler that answers each request with the next scripted reply.

    A reply is a response, an exception to raise (bound to the request), or a function of the
    request. Once the script runs out, the last reply repeats. Every request is recorded.
    """

    def __init__(self, *replies: Reply) -> None:
        self._replies = list(replies)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
        if isinstance(reply, httpx.RequestError):
            reply.request = request
            raise reply
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        return reply(request)

    @property
    def calls(self) -> list[str]:
        """Return ``METHOD path`` of every request, in order."""
        return [f"{r.method} {r.url.path}" for r in self.requests]


class Sleeps:
    """A fake ``sleep`` that records the delays it was asked for and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def mock_client(
    script: Script,
    *,
    sleeps: Sleeps | None = None,
    token: SecretStr | None = None,
    max_retries: int = 3,
    budget: RetryBudget | None = None,
) -> ItoClient:
    """Return a client whose requests go to ``script`` and whose sleeps return at once."""
    return ItoClient(
        BASE_URL,
        token if token is not None else SecretStr("unit-test-token"),
        transport=httpx.MockTransport(script),
        max_retries=max_retries,
        retry_budget=budget,
        sleep=sleeps or Sleeps(),
    )


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now
