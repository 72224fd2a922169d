"""The canary: a unique token driven through every client path must never show up anywhere.

Scanned: captured stdout/stderr, every log record (httpx, httpcore and prefect-ito at DEBUG),
exception strings, reprs and formatted tracebacks (with their chained causes), the requests the
transport saw after sending, and the results' reprs.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from ito_fakes import (
    Script,
    Sleeps,
    fail,
    mock_client,
    ok,
    sample_request,
    sample_run,
)
from pydantic import SecretStr
from simulator_fixture import with_faults

from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN, resolve_token
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import (
    Capabilities,
    Capability,
    DecisionChoice,
    DecisionRequest,
    ErrorCode,
    EventPage,
    TrainingRunList,
)
from prefect_ito.exceptions import ItoError
from prefect_ito.simulator import builtin_scenario

CANARY = f"canary-{uuid.uuid4().hex}"
DEBUG_LOGGERS = ("httpx", "httpcore", "prefect_ito")

Call = Callable[[ItoClient], Awaitable[Any]]
SUBMISSION = {"run": sample_run().model_dump(mode="json"), "replayed": False}
CALLS: list[Call] = [
    lambda c: c.get_capabilities(),
    lambda c: c.get_training_eligibility("bk-1"),
    lambda c: c.submit_training_run(sample_request(), idempotency_key="k-1"),
    lambda c: c.find_run_by_idempotency_key("k-1"),
    lambda c: c.list_active_runs("bk-1"),
    lambda c: c.get_training_run("run-1", after_version=1, wait=5),
    lambda c: c.list_events("run-1", after=2),
    lambda c: c.decide(
        "run-1",
        "act-1",
        DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="ana", reason="fine"),
        idempotency_key="k-2",
    ),
    lambda c: c.cancel_training_run("run-1", reason="stop", idempotency_key="k-3"),
    lambda c: c.whoami(),
    lambda c: c.revoke_token(),
]
CAPABILITIES = Capabilities(
    training_run=Capability(live=True), post_training_recipes=[], long_poll=True
)


def _replies() -> list[tuple[Any, ...]]:
    """One reply sequence per path: failures of every kind, retries, and plain successes."""
    replies: list[tuple[Any, ...]] = [(fail(code),) for code in ErrorCode]
    replies += [
        (fail(ErrorCode.BACKEND_UNAVAILABLE), ok(CAPABILITIES)),
        (fail(ErrorCode.RATE_LIMITED, headers={"Retry-After": "0"}), ok(CAPABILITIES)),
        (httpx.ReadTimeout("lost"), ok(TrainingRunList(runs=[])), ok(SUBMISSION)),
        (httpx.ConnectError("refused"),),
        (httpx.RemoteProtocolError("dropped"),),
        (httpx.Response(200, content=b"{not json"),),
        (ok({"state": "exploded"}),),
        (httpx.Response(502, text="Bad Gateway"),),
        (ok(EventPage(events=[], last_seq=0)),),
    ]
    return replies


def _leaks(texts: list[str]) -> list[str]:
    return [text for text in texts if CANARY in text]


def _describe_error(error: BaseException) -> list[str]:
    texts = [str(error), repr(error), "".join(traceback.format_exception(error))]
    cause = error.__cause__
    if isinstance(cause, httpx.RequestError):
        texts += [repr(cause), repr(cause.request), repr(cause.request.headers)]
        texts += [str(value) for value in cause.request.headers.values()]
    return texts


async def test_canary_appears_nowhere_on_any_client_path(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    for name in DEBUG_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    texts: list[str] = []
    sent_with_canary = 0
    for replies in _replies():
        for call in CALLS:
            fresh = Script(*replies)
            async with mock_client(fresh, token=SecretStr(CANARY)) as client:
                texts.append(repr(client))
                try:
                    texts.append(repr(await call(client)))
                except ItoError as error:
                    texts += _describe_error(error)
            for request in fresh.requests:
                texts += [repr(request), repr(request.headers), str(dict(request.headers))]
            sent_with_canary += len(fresh.requests)

    assert sent_with_canary > len(CALLS) * len(ErrorCode)
    out, err = capfd.readouterr()
    records = [
        text
        for record in caplog.records
        for text in (record.getMessage(), repr(record.args), record.exc_text or "")
    ]
    assert records, "DEBUG logging captured nothing: the scan would prove nothing"
    assert _leaks([*texts, out, err, *records]) == []


async def test_the_canary_really_is_sent_at_send_time() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return ok(CAPABILITIES)

    async with mock_client(Script(answer), token=SecretStr(CANARY)) as client:
        await client.get_capabilities()
    assert seen == [f"Bearer {CANARY}"]


def test_canary_from_the_environment_stays_out_of_blocks_and_clients(
    monkeypatch: pytest.MonkeyPatch,
    memory_keyring: MemoryKeyring,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_API_URL, "http://127.0.0.1:9")
    monkeypatch.setenv(ENV_TOKEN, CANARY)
    block = ItoCredentials(api_url="http://127.0.0.1:9")
    client = block.get_client()
    token = resolve_token(block.api_url)
    texts = [
        repr(block),
        str(block),
        block.model_dump_json(),
        str(block.model_dump()),
        repr(client),
        repr(token),
        str(token),
        repr(client._http.auth),
    ]
    out, err = capfd.readouterr()
    assert _leaks([*texts, out, err]) == []
    assert token.get_secret_value() == CANARY


async def test_canary_minted_by_the_simulator_appears_nowhere_over_loopback(
    sim: Any, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    for name in DEBUG_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    token = sim.mint_token()
    canary = token.get_secret_value()
    texts: list[str] = []
    scenarios = [
        builtin_scenario("default"),
        with_faults(unavailable_rate=0.5, rate_limited_rate=0.2, retry_after_seconds=0, seed=3),
        with_faults(drop_response_after_commit=3),
        with_faults(revoke_tokens_after_seconds=0),
    ]
    for scenario in scenarios:
        sim.load_scenario(scenario)
        async with ItoClient(sim.url, token, sleep=Sleeps()) as client:
            for call in CALLS[:-1]:  # revocation last, below
                try:
                    texts.append(repr(await call(client)))
                except ItoError as error:
                    texts += _describe_error(error)
        texts += [entry.model_dump_json() for entry in sim.requests()]
    sim.load_scenario(builtin_scenario("default"))
    async with ItoClient(sim.url, token) as client:
        await client.revoke_token()

    out, err = capfd.readouterr()
    records = [
        text
        for record in caplog.records
        for text in (record.getMessage(), repr(record.args), record.exc_text or "")
    ]
    assert any(record.name.startswith("httpcore") for record in caplog.records)
    assert [text for text in [*texts, out, err, *records] if canary in text] == []
