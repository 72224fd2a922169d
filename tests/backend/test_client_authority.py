"""Authority at the client: 403 is final, and a booking must be the authenticated account's."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from ito_fakes import BASE_URL, NOW, Script, Sleeps, fail, mock_client, ok, sample_run

from prefect_ito import exceptions as exc
from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN
from prefect_ito.backend.desk import decide_action, verify_booking
from prefect_ito.cli import auth as cli_auth
from prefect_ito.contract import (
    ALL_SCOPES,
    BookingStatus,
    DecisionChoice,
    DecisionRequest,
    ErrorCode,
    TrainingEligibility,
    WhoAmI,
)
from prefect_ito.exceptions import ExitCode
from prefect_ito.parameters import BookingClaim, SupervisionParameters
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.plain import ClientSteps

FORBIDDEN = fail(ErrorCode.INSUFFICIENT_SCOPE, message="this token lacks the scope training:read")
DECISION = DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="Ada", reason="fine")


def whoami(account: str = "acme") -> WhoAmI:
    return WhoAmI(
        account=account,
        backend="test",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        scopes=[scope.value for scope in ALL_SCOPES],
        principal=f"user:{account}",
    )


def eligibility(**changes: Any) -> TrainingEligibility:
    fields: dict[str, Any] = {
        "booking_id": "bk-1",
        "status": BookingStatus.COMPLETED,
        "gpu_sku": "H200",
        "node_count": 2,
        "gpus_per_node": 8,
        "fabric": "InfiniBand",
        "region": "eu-north-1",
        "term_end": NOW,
        "eligible": True,
        "account": "acme",
    }
    return TrainingEligibility(**{**fields, **changes})


def test_insufficient_scope_is_its_own_outcome_with_its_own_exit_code() -> None:
    assert (exc.InsufficientScope.state_name, exc.InsufficientScope.exit_code) == (
        "InsufficientScope",
        ExitCode.FORBIDDEN,
    )
    assert int(ExitCode.FORBIDDEN) not in {int(ExitCode.AUTHENTICATION), 10, 11}


async def test_a_403_on_a_read_is_never_retried() -> None:
    script = Script(FORBIDDEN, ok(sample_run()))
    sleeps = Sleeps()
    async with mock_client(script, sleeps=sleeps, max_retries=3) as client:
        with pytest.raises(exc.InsufficientScope) as caught:
            await client.get_training_run("run-1")

    assert len(script.requests) == 1 and sleeps.delays == []
    assert "training:read" in str(caught.value)


async def test_a_decision_the_token_may_not_make_says_so_and_is_sent_once() -> None:
    script = Script(
        fail(ErrorCode.INSUFFICIENT_SCOPE, message="this token lacks the scope training:decide")
    )
    async with mock_client(script, max_retries=3) as client:
        with pytest.raises(exc.InsufficientScope) as caught:
            await decide_action(client, sample_run(), "act-1", DECISION)

    assert script.calls == ["POST /v0/training-runs/run-1/actions/act-1/decision"]
    message = caught.value.message
    assert "nothing was decided on action act-1" in message and "Only a person decides" in message
    assert "run-1 still waits" in message and "training:decide" in message
    assert "prefect-ito login" in message


async def test_a_booking_the_backend_places_in_another_account_is_refused() -> None:
    script = Script(ok(eligibility(account="globex")), ok(whoami("acme")))
    async with mock_client(script) as client:
        with pytest.raises(exc.BookingNotEligible) as caught:
            await verify_booking(client, BookingClaim(booking_id="bk-1"))

    assert "held by account 'globex', not by the authenticated account 'acme'" in str(caught.value)


async def test_a_booking_the_backend_does_not_know_is_named_with_the_backend_s_words() -> None:
    # Before: "[BOOKING_NOT_FOUND] no such booking" named neither the booking nor what to give.
    script = Script(fail(ErrorCode.BOOKING_NOT_FOUND, message="no such booking"))
    async with mock_client(script) as client:
        with pytest.raises(exc.BookingNotFound) as caught:
            await verify_booking(client, BookingClaim(booking_id="bk-123"))

    assert str(caught.value) == (
        f"[BOOKING_NOT_FOUND] booking 'bk-123' was not found at {BASE_URL}: give the id of one "
        "of this account's bookings, as its booking flow handed it over. The backend said: no "
        "such booking"
    )
    assert caught.value.status_code == 404
    assert caught.value.exit_code == ExitCode.BOOKING


async def test_a_booking_whose_answer_names_no_account_is_refused() -> None:
    script = Script(ok(eligibility(account=None)), ok(whoami("acme")))
    async with mock_client(script) as client:
        with pytest.raises(exc.BookingNotEligible, match="did not say which account holds it"):
            await verify_booking(client, BookingClaim(booking_id="bk-1"))


@pytest.mark.parametrize(
    ("field", "claimed", "actual"),
    [
        ("gpu_sku", "H100", "'H200'"),
        ("node_count", 4, "2"),
        ("gpus_per_node", 4, "8"),
        ("fabric", "RoCE", "'InfiniBand'"),
        ("region", "us-east-1", "'eu-north-1'"),
        ("account", "Acme", "'acme'"),  # account names are compared exactly
    ],
)
async def test_each_field_handed_over_is_compared(field: str, claimed: Any, actual: str) -> None:
    claim = BookingClaim(booking_id="bk-1", **{field: claimed})
    script = Script(ok(eligibility()), ok(whoami("acme")))
    async with mock_client(script) as client:
        with pytest.raises(exc.BookingNotEligible) as caught:
            await verify_booking(client, claim)

    assert f"{field} is {actual} at the backend, not {claimed!r}" in str(caught.value)


async def test_a_matching_claim_passes_and_whoami_is_asked_once_per_client() -> None:
    claim = BookingClaim(
        booking_id="bk-1",
        gpu_sku="h-200",
        node_count=2,
        gpus_per_node=8,
        fabric="infiniband",
        region="EU-North-1",
        account="acme",
    )
    script = Script(
        lambda request: ok(whoami()) if request.url.path.endswith("whoami") else ok(eligibility())
    )
    async with mock_client(script) as client:
        await verify_booking(client, claim)
        await verify_booking(client, claim)

    assert script.calls.count("GET /v0/auth/whoami") == 1


async def test_whoami_prints_the_principal_and_the_scopes(
    sim: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = sim.mint_token("acme", scopes=["training:read"], principal="service:nightly-train")
    monkeypatch.setenv(ENV_API_URL, sim.url)
    monkeypatch.setenv(ENV_TOKEN, token.get_secret_value())

    cli_auth._show_whoami(await cli_auth._whoami(sim.url, None))

    out = capsys.readouterr().out
    assert "account:   acme\n" in out
    assert "principal: service:nightly-train\n" in out
    assert "scopes:    training:read\n" in out
    assert token.get_secret_value() not in out


async def test_a_cancel_the_token_may_not_make_says_the_workload_goes_on() -> None:
    script = Script(
        fail(ErrorCode.INSUFFICIENT_SCOPE, message="this token lacks the scope training:cancel")
    )
    async with mock_client(script) as client:
        steps = ClientSteps(client, SupervisionParameters(), logging.getLogger("test"))
        run, message = await supervision.stop_for_cancel(steps, sample_run())

    assert run.run_id == "run-1"
    assert "run-1 was NOT cancelled and goes on" in message and "training:cancel" in message
    assert script.calls == ["POST /v0/training-runs/run-1/cancel"]
