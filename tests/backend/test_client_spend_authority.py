"""ItoClient's spend-authority calls (contract v0.4 draft) against the simulator on loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from ito_fakes import Sleeps, sample_request
from pydantic import SecretStr

from prefect_ito import exceptions as exc
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import (
    ALL_SCOPES,
    IDEMPOTENCY_HEADER,
    NewSpendLimits,
    QuoteAnswer,
    QuoteState,
    SpendAuthorizationRequest,
    SpendAuthorizationState,
)

WORKLOAD = "service:nightly-train"


def _client(sim: Any, token: SecretStr, **options: Any) -> ItoClient:
    return ItoClient(sim.url, token, sleep=Sleeps(), **options)


def _person(sim: Any) -> ItoClient:
    return _client(sim, sim.mint_token(scopes=[s.value for s in ALL_SCOPES]))


def _workload(sim: Any) -> ItoClient:
    return _client(sim, sim.mint_token(principal=WORKLOAD))


def _authorization(**limits: Any) -> SpendAuthorizationRequest:
    return SpendAuthorizationRequest(
        name="nightly 8B",
        limits=NewSpendLimits(**{"data_ref_patterns": ["*"], **limits}),
        expires_at=datetime.now(UTC) + timedelta(days=7),
    )


async def test_capabilities_say_spend_authority(sim: Any) -> None:
    async with _workload(sim) as client:
        assert (await client.get_capabilities()).spend_authority is True


async def test_a_person_confirms_a_quote_and_reads_it_back(sim: Any) -> None:
    async with _workload(sim) as workload, _person(sim) as person:
        quote = await workload.quote_training_run(sample_request())
        assert quote.state is QuoteState.PENDING
        assert quote.confirm_url and quote.user_code

        confirmed = await person.confirm_quote(quote.quote_id, note="Ada", idempotency_key="c1")
        again = await person.confirm_quote(quote.quote_id, note="Ada", idempotency_key="c1")
        stated = await workload.get_quote(quote.quote_id)

    assert confirmed == again
    assert (confirmed.state, confirmed.principal, confirmed.note) == (
        QuoteAnswer.CONFIRMED,
        "user:sim-user",
        "Ada",
    )
    assert stated.state is QuoteState.CONFIRMED
    assert stated.confirmation == confirmed


async def test_a_workload_cannot_confirm_but_may_decline(sim: Any) -> None:
    async with _workload(sim) as workload, _person(sim) as person:
        quote = await workload.quote_training_run(sample_request())
        with pytest.raises(exc.InsufficientScope) as refused:
            await workload.confirm_quote(quote.quote_id, idempotency_key="c1")
        declined = await workload.decline_quote(quote.quote_id, idempotency_key="d1")
        with pytest.raises(exc.QuoteAlreadyDecided):
            await person.confirm_quote(quote.quote_id, idempotency_key="c2")

    assert "spend:confirm" in refused.value.message
    assert (declined.state, declined.principal) == (QuoteAnswer.DECLINED, WORKLOAD)


async def test_an_unknown_quote_is_quote_not_found(sim: Any) -> None:
    async with _person(sim) as person:
        with pytest.raises(exc.QuoteNotFound):
            await person.get_quote("quote_nope")


async def test_a_person_creates_lists_and_revokes_an_authorization(sim: Any) -> None:
    async with _person(sim) as person, _workload(sim) as workload:
        created = await person.create_spend_authorization(
            _authorization(max_runs=3), idempotency_key="a1"
        )
        replayed = await person.create_spend_authorization(
            _authorization(max_runs=3).model_copy(update={"expires_at": created.expires_at}),
            idempotency_key="a1",
        )
        listed = await workload.list_spend_authorizations()
        with pytest.raises(exc.InsufficientScope):
            await workload.revoke_spend_authorization(created.authorization_id)
        revoked = await person.revoke_spend_authorization(created.authorization_id)
        read = await workload.get_spend_authorization(created.authorization_id)
        with pytest.raises(exc.SpendAuthorizationNotFound):
            await workload.get_spend_authorization("sa_nope")

    assert created.state is SpendAuthorizationState.ACTIVE
    assert replayed.authorization_id == created.authorization_id
    assert [a.authorization_id for a in listed] == [created.authorization_id]
    assert (revoked.state, revoked.revoked_by) == (SpendAuthorizationState.REVOKED, "user:sim-user")
    assert read == revoked


async def test_a_created_authorization_is_resent_with_the_same_key_after_a_503() -> None:
    seen: list[str | None] = []
    body = _authorization().model_dump(mode="json")
    answer = {
        "authorization_id": "sa_1",
        "name": body["name"],
        "account": "sim-user",
        "principal": "user:sim-user",
        "limits": body["limits"],
        "created_at": body["expires_at"],
        "expires_at": body["expires_at"],
        "state": "active",
        "used": {"runs": 0, "spend_usd": 0},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(IDEMPOTENCY_HEADER))
        if len(seen) == 1:
            error = {"code": "BACKEND_UNAVAILABLE", "message": "down"}
            return httpx.Response(
                503, json={"ok": False, "live_api_contacted": False, "error": error}
            )
        return httpx.Response(201, json={"ok": True, "live_api_contacted": False, "data": answer})

    client = ItoClient(
        "http://127.0.0.1:9", SecretStr("t"), transport=httpx.MockTransport(handler), sleep=Sleeps()
    )
    async with client:
        created = await client.create_spend_authorization(_authorization(), idempotency_key="a1")

    assert created.authorization_id == "sa_1"
    assert seen == ["a1", "a1"]
