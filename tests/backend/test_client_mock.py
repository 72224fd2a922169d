"""ItoClient against httpx.MockTransport: error mapping, retries, idempotency, parsing."""

from __future__ import annotations

import json

import httpx
import pytest
from ito_fakes import Script, Sleeps, fail, mock_client, ok, sample_request, sample_run
from pydantic import SecretStr

from prefect_ito import exceptions as exc
from prefect_ito.backend._retry import LONG_POLL_MARGIN_SECONDS, RETRY_BUDGET_CAPACITY, RetryBudget
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import (
    IDEMPOTENCY_HEADER,
    Capabilities,
    Capability,
    DecisionChoice,
    DecisionRequest,
    ErrorCode,
    EventPage,
    TrainingRequest,
    TrainingRunList,
)
from prefect_ito.outcomes import ERROR_STATUS

EXPECTED_CLASS = {
    ErrorCode.UNAUTHENTICATED: exc.Unauthenticated,
    ErrorCode.TOKEN_REVOKED: exc.TokenRevoked,
    ErrorCode.INSUFFICIENT_SCOPE: exc.InsufficientScope,
    ErrorCode.VALIDATION_ERROR: exc.ValidationFailed,
    ErrorCode.NOT_FOUND: exc.NotFound,
    ErrorCode.BOOKING_NOT_FOUND: exc.BookingNotFound,
    ErrorCode.BOOKING_NOT_ELIGIBLE: exc.BookingNotEligible,
    ErrorCode.CAPABILITY_NOT_AVAILABLE: exc.CapabilityNotAvailable,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: exc.IdempotencyKeyReused,
    ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT: exc.IdempotencyKeyInFlight,
    ErrorCode.BOOKING_BUSY: exc.BookingBusy,
    ErrorCode.RUN_NOT_FOUND: exc.RunNotFound,
    ErrorCode.ACTION_NOT_PENDING: exc.ActionNotPending,
    ErrorCode.DECISION_CONFLICT: exc.DecisionConflict,
    ErrorCode.RATE_LIMITED: exc.RateLimited,
    ErrorCode.BACKEND_UNAVAILABLE: exc.BackendUnavailable,
    ErrorCode.AUTHORIZATION_PENDING: exc.AuthorizationPending,
    ErrorCode.SLOW_DOWN: exc.SlowDown,
    ErrorCode.ACCESS_DENIED: exc.AccessDenied,
    ErrorCode.EXPIRED_TOKEN: exc.ExpiredToken,
    ErrorCode.INTERNAL_ERROR: exc.InternalError,
    ErrorCode.CONFIRMATION_REQUIRED: exc.ConfirmationRequired,
    ErrorCode.CONFIRMATION_MISMATCH: exc.ConfirmationMismatch,
    ErrorCode.CONFIRMATION_EXPIRED: exc.ConfirmationExpired,
    ErrorCode.CONFIRMATION_USED: exc.ConfirmationUsed,
    ErrorCode.PAYLOAD_TOO_LARGE: exc.PayloadTooLarge,
    ErrorCode.CLIENT_REFERENCE_IN_USE: exc.ClientReferenceInUse,
    ErrorCode.QUOTE_NOT_FOUND: exc.QuoteNotFound,
    ErrorCode.QUOTE_ALREADY_DECIDED: exc.QuoteAlreadyDecided,
    ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND: exc.SpendAuthorizationNotFound,
    ErrorCode.AUTHORIZATION_DOES_NOT_COVER: exc.AuthorizationDoesNotCover,
    ErrorCode.CONTRACT_VERSION_UNSUPPORTED: exc.ContractVersionUnsupported,
}


def test_every_contract_code_has_its_class() -> None:
    assert set(EXPECTED_CLASS) == set(ErrorCode)


@pytest.mark.parametrize("code", list(ErrorCode))
async def test_each_error_code_maps_to_its_class(code: ErrorCode) -> None:
    script = Script(
        fail(code, message="safe words", field="booking_id", headers={"X-Request-Id": "req-7"})
    )
    async with mock_client(script, max_retries=0) as client:
        with pytest.raises(exc.ItoAPIError) as caught:
            await client.get_training_eligibility("bk-1")

    error = caught.value
    assert type(error) is EXPECTED_CLASS[code]
    assert (error.code, error.status_code, error.request_id) == (
        code.value,
        ERROR_STATUS[code],
        "req-7",
    )
    assert (error.message, error.field) == ("safe words", "booking_id")
    assert str(error) == f"[{code.value} request req-7] safe words"


async def test_unknown_code_is_the_base_api_error_with_that_code() -> None:
    script = Script(fail("NEW_IN_V1", status=418))
    async with mock_client(script) as client:
        with pytest.raises(exc.ItoAPIError) as caught:
            await client.get_capabilities()
    assert type(caught.value) is exc.ItoAPIError
    assert (caught.value.code, caught.value.status_code) == ("NEW_IN_V1", 418)


def test_flow_raised_errors_are_constructible_from_a_message() -> None:
    error = exc.BookingNotEligible("booking b-1 is expired")
    assert (error.code, error.status_code, str(error)) == (
        "BOOKING_NOT_ELIGIBLE",
        None,
        "[BOOKING_NOT_ELIGIBLE] booking b-1 is expired",
    )


async def test_rate_limit_waits_out_retry_after_then_succeeds() -> None:
    capabilities = Capabilities(
        training_run=Capability(live=True), post_training_recipes=[], long_poll=True
    )
    script = Script(fail(ErrorCode.RATE_LIMITED, headers={"Retry-After": "2"}), ok(capabilities))
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps) as client:
        assert await client.get_capabilities() == capabilities
    assert sleeps.delays == [2.0]
    assert len(script.requests) == 2


async def test_rate_limit_reports_retry_after_when_retries_run_out() -> None:
    script = Script(fail(ErrorCode.RATE_LIMITED, headers={"Retry-After": "4"}))
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps, max_retries=2) as client:
        with pytest.raises(exc.RateLimited) as caught:
            await client.get_capabilities()
    assert caught.value.retry_after == 4.0
    assert sleeps.delays == [4.0, 4.0]
    assert len(script.requests) == 3


async def test_a_retry_after_too_long_to_wait_fails_at_once() -> None:
    script = Script(fail(ErrorCode.RATE_LIMITED, headers={"Retry-After": "3600"}))
    async with mock_client(script) as client:
        with pytest.raises(exc.RateLimited):
            await client.get_capabilities()
    assert len(script.requests) == 1


async def test_unavailable_backend_is_retried_with_growing_backoff() -> None:
    script = Script(fail(ErrorCode.BACKEND_UNAVAILABLE))
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps, max_retries=3) as client:
        with pytest.raises(exc.BackendUnavailable):
            await client.list_events("run-1")
    assert len(script.requests) == 4
    assert sleeps.delays == sorted(sleeps.delays)
    assert 0.375 <= sleeps.delays[0] <= 0.5
    assert 1.5 <= sleeps.delays[2] <= 2.0


async def test_retry_budget_caps_retries_across_calls() -> None:
    script = Script(fail(ErrorCode.BACKEND_UNAVAILABLE))
    budget = RetryBudget(capacity=3, refill_per_second=0.0)
    async with mock_client(script, budget=budget, max_retries=10) as client:
        for _ in range(2):
            with pytest.raises(exc.BackendUnavailable):
                await client.get_capabilities()
    # 2 first attempts + the 3 retries the budget allowed, shared between both calls.
    assert len(script.requests) == 5


async def test_clients_of_one_backend_share_its_retry_budget() -> None:
    requests = []
    for url in ("http://desk.test", "HTTP://Desk.test/", "http://other.test"):
        script = Script(fail(ErrorCode.BACKEND_UNAVAILABLE))
        transport = httpx.MockTransport(script)
        token = SecretStr("unit-test-token")
        async with ItoClient(url, token, transport=transport, max_retries=20, sleep=Sleeps()) as c:
            with pytest.raises(exc.BackendUnavailable):
                await c.get_capabilities()
        requests.append(len(script.requests))
    # The first client spends the backend's whole burst (the refill, one retry per two seconds,
    # gives nothing back within this test); a second client of that backend, spelled otherwise,
    # finds the budget empty; another backend has a budget of its own.
    burst = int(RETRY_BUDGET_CAPACITY)
    assert requests == [1 + burst, 1, 1 + burst]


@pytest.mark.parametrize("code", [ErrorCode.TOKEN_REVOKED, ErrorCode.UNAUTHENTICATED])
async def test_401_stops_at_once(code: ErrorCode) -> None:
    script = Script(fail(code))
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps) as client:
        with pytest.raises(EXPECTED_CLASS[code]):
            await client.get_training_run("run-1")
    assert script.calls == ["GET /v0/training-runs/run-1"]
    assert sleeps.delays == []


@pytest.mark.parametrize(
    "code",
    [ErrorCode.IDEMPOTENCY_KEY_REUSED, ErrorCode.BOOKING_BUSY, ErrorCode.BOOKING_NOT_ELIGIBLE],
)
async def test_409_is_never_retried(code: ErrorCode) -> None:
    script = Script(fail(code))
    async with mock_client(script) as client:
        with pytest.raises(EXPECTED_CLASS[code]):
            await client.submit_training_run(sample_request(), idempotency_key="k-1")
    assert len(script.requests) == 1


async def test_decision_conflict_is_never_retried() -> None:
    script = Script(fail(ErrorCode.DECISION_CONFLICT))
    decision = DecisionRequest(decision=DecisionChoice.REJECT, decided_by="ana", reason="no")
    async with mock_client(script) as client:
        with pytest.raises(exc.DecisionConflict):
            await client.decide("run-1", "act-1", decision, idempotency_key="k-d")
    assert len(script.requests) == 1


async def test_one_idempotency_key_is_reused_across_retries() -> None:
    run = sample_run()
    script = Script(
        fail(ErrorCode.BACKEND_UNAVAILABLE),
        httpx.ConnectError("refused"),
        fail(ErrorCode.RATE_LIMITED, headers={"Retry-After": "0"}),
        ok(run),
    )
    async with mock_client(script) as client:
        assert await client.cancel_training_run("run-1", idempotency_key="k-cancel") == run
    assert [r.headers[IDEMPOTENCY_HEADER] for r in script.requests] == ["k-cancel"] * 4
    assert len({r.content for r in script.requests}) == 1


async def test_a_keyless_post_is_not_retried() -> None:
    script = Script(fail(ErrorCode.BACKEND_UNAVAILABLE))
    async with mock_client(script) as client:
        with pytest.raises(exc.BackendUnavailable):
            await client.exchange_device_code("dev-1")
    assert len(script.requests) == 1
    assert IDEMPOTENCY_HEADER not in script.requests[0].headers


@pytest.mark.parametrize(
    "lost",
    [httpx.ReadTimeout("lost"), httpx.RemoteProtocolError("dropped"), httpx.ReadError("reset")],
)
async def test_ambiguous_submit_finds_the_run_by_key_instead_of_resending(
    lost: httpx.RequestError,
) -> None:
    run = sample_run("run-found")
    script = Script(lost, ok(TrainingRunList(runs=[run])))
    async with mock_client(script) as client:
        submission = await client.submit_training_run(sample_request(), idempotency_key="k-9")
    assert (submission.run, submission.replayed) == (run, True)
    assert script.calls == ["POST /v0/training-runs", "GET /v0/training-runs"]
    assert script.requests[1].url.params["idempotency_key"] == "k-9"


async def test_ambiguous_submit_resends_with_the_same_key_when_nothing_was_created() -> None:
    run = sample_run("run-new")
    script = Script(
        httpx.ReadTimeout("lost"),
        ok(TrainingRunList(runs=[])),
        ok({"run": run.model_dump(mode="json"), "replayed": False}, status=201),
    )
    async with mock_client(script) as client:
        submission = await client.submit_training_run(sample_request(), idempotency_key="k-10")
    assert (submission.run.run_id, submission.replayed) == ("run-new", False)
    assert script.calls == [
        "POST /v0/training-runs",
        "GET /v0/training-runs",
        "POST /v0/training-runs",
    ]
    assert script.requests[0].headers[IDEMPOTENCY_HEADER] == "k-10"
    assert script.requests[2].headers[IDEMPOTENCY_HEADER] == "k-10"


async def test_a_refused_connection_is_not_ambiguous_and_needs_no_lookup() -> None:
    run = sample_run()
    script = Script(
        httpx.ConnectError("refused"), ok({"run": run.model_dump(mode="json"), "replayed": False})
    )
    async with mock_client(script) as client:
        await client.submit_training_run(sample_request(), idempotency_key="k-11")
    assert script.calls == ["POST /v0/training-runs", "POST /v0/training-runs"]


@pytest.mark.parametrize(
    ("raised", "expected", "ambiguous"),
    [
        (httpx.ConnectError("x"), exc.ItoConnectionError, False),
        (httpx.ConnectTimeout("x"), exc.ItoTimeoutError, False),
        (httpx.ReadTimeout("x"), exc.ItoTimeoutError, True),
        (httpx.RemoteProtocolError("x"), exc.ItoConnectionError, True),
        (httpx.ReadError("x"), exc.ItoConnectionError, True),
    ],
)
async def test_transport_errors_are_mapped(
    raised: httpx.RequestError, expected: type[exc.ItoTransportError], ambiguous: bool
) -> None:
    script = Script(raised)
    async with mock_client(script, max_retries=0) as client:
        with pytest.raises(expected) as caught:
            await client.get_capabilities()
    assert caught.value.ambiguous is ambiguous
    assert "GET /v0/capabilities" in str(caught.value)
    assert isinstance(caught.value.__cause__, type(raised))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"<html>oops</html>", None),
        (b'{"ok": true, "live_api_contacted": false', None),  # truncated
        (b"[1, 2]", None),
        (b'{"ok": true, "live_api_contacted": false}', "data"),
        (b'{"ok": true, "live_api_contacted": false, "data": {"version": 1}}', "data.run_id"),
    ],
)
async def test_protocol_errors_name_endpoint_and_field(body: bytes, field: str | None) -> None:
    script = Script(httpx.Response(200, content=body))
    async with mock_client(script) as client:
        with pytest.raises(exc.ItoProtocolError) as caught:
            await client.get_training_run("run-1")
    assert caught.value.endpoint == "GET /v0/training-runs/{run_id}"
    assert caught.value.field == field
    assert "GET /v0/training-runs/{run_id}" in str(caught.value)


async def test_an_enum_value_that_is_no_string_is_a_protocol_error_naming_the_field() -> None:
    # A new *string* value is kept as UNKNOWN (test_forward_compat.py); anything else is wrong.
    data = sample_run().model_dump(mode="json") | {"state": 40417}
    script = Script(ok(data))
    async with mock_client(script) as client:
        with pytest.raises(exc.ItoProtocolError) as caught:
            await client.get_training_run("run-1")
    assert caught.value.field == "data.state"
    assert "40417" not in str(caught.value)


async def test_error_status_without_an_envelope_is_a_protocol_error() -> None:
    script = Script(httpx.Response(502, text="Bad Gateway"))
    async with mock_client(script) as client:
        with pytest.raises(exc.ItoProtocolError):
            await client.get_capabilities()


async def test_long_poll_stretches_the_read_timeout_and_caps_wait() -> None:
    run = sample_run(version=4)
    script = Script(ok(run))
    async with mock_client(script) as client:
        await client.get_training_run("run-1", after_version=3, wait=45)
        await client.get_training_run("run-1", after_version=3, wait=600)
    first, second = script.requests
    assert first.url.params["after_version"] == "3"
    assert float(first.url.params["wait"]) == 45
    assert first.extensions["timeout"]["read"] == 45 + LONG_POLL_MARGIN_SECONDS
    assert float(second.url.params["wait"]) == 60


async def test_ids_are_quoted_as_one_path_segment() -> None:
    # An id that would change the route is refused before sending (test_client_paths.py).
    script = Script(ok(EventPage(events=[], last_seq=0)))
    async with mock_client(script) as client:
        await client.list_events("run 1:ä%", after=5)
    path = script.requests[0].url.raw_path
    assert path == b"/v0/training-runs/run%201%3A%C3%A4%25/events?after=5"


async def test_bearer_header_is_attached_at_send_time_only() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return ok(sample_run())

    script = Script(answer)
    async with mock_client(script) as client:
        await client.get_training_run("run-1")
    assert seen == ["Bearer unit-test-token"]
    assert "authorization" not in script.requests[0].headers
    assert "unit-test-token" not in repr(client)


async def test_submission_sends_the_contract_body_and_key() -> None:
    run = sample_run()
    script = Script(ok({"run": run.model_dump(mode="json"), "replayed": False}, status=201))
    request = sample_request()
    async with mock_client(script) as client:
        submission = await client.submit_training_run(request, idempotency_key="k-12")
    sent = script.requests[0]
    # Without a reference the member is left out: a backend before v0.3 refuses unknown members.
    assert json.loads(sent.content) == request.model_dump(mode="json", exclude={"client_reference"})
    assert sent.headers[IDEMPOTENCY_HEADER] == "k-12"
    assert submission.run == run


async def test_a_submission_with_a_client_reference_sends_it() -> None:
    run = sample_run()
    script = Script(
        ok({"run": run.model_dump(mode="json"), "replayed": False}, status=201),
    )
    request = sample_request().referenced("flow-run-1")
    async with mock_client(script) as client:
        await client.submit_training_run(request, idempotency_key="k-12")
    assert json.loads(script.requests[0].content)["client_reference"] == "flow-run-1"


async def test_a_key_still_in_flight_is_resent_with_the_same_key_after_retry_after() -> None:
    run = sample_run("run-in-flight")
    script = Script(
        fail(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, headers={"Retry-After": "2"}),
        fail(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, headers={"Retry-After": "1"}),
        ok({"run": run.model_dump(mode="json"), "replayed": True}),
    )
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps) as client:
        submission = await client.submit_training_run(sample_request(), idempotency_key="k-fly")

    assert (submission.run.run_id, submission.replayed) == ("run-in-flight", True)
    assert sleeps.delays == [2.0, 1.0]
    assert script.calls == ["POST /v0/training-runs"] * 3  # never a lookup, never a new key
    assert [r.headers[IDEMPOTENCY_HEADER] for r in script.requests] == ["k-fly"] * 3
    assert len({r.content for r in script.requests}) == 1


async def test_a_key_in_flight_past_the_retries_is_raised_with_its_retry_after() -> None:
    script = Script(fail(ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT, headers={"Retry-After": "1"}))
    async with mock_client(script, max_retries=2) as client:
        with pytest.raises(exc.IdempotencyKeyInFlight) as caught:
            await client.cancel_training_run("run-1", idempotency_key="k-cancel")

    assert caught.value.retry_after == 1.0
    assert len(script.requests) == 3


async def test_a_quote_for_another_budget_is_a_protocol_error_naming_the_field() -> None:
    from prefect_ito.backend import desk
    from prefect_ito.simulator import builtin_scenario
    from prefect_ito.simulator.engine import Engine

    submission = sample_request("bk-h200-2x8-ib")
    request = TrainingRequest.model_validate(
        submission.model_dump(include=set(TrainingRequest.model_fields))
    )
    quoted = Engine(builtin_scenario("default")).quote("sim-user", submission)
    other = {**quoted.model_dump(mode="json"), "budget_usd": request.budget_usd + 1}
    script = Script(ok(other, status=201))

    async with mock_client(script) as client:
        with pytest.raises(exc.ItoProtocolError) as raised:
            await desk.quote_training_run(client, request)

    assert raised.value.field == "budget_usd"
    assert "budget_usd" in str(raised.value)
