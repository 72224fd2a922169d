"""Contract v0.4: spend authority at the backend, over real HTTP against the simulator.

A person's token confirms a quote and the backend records its principal; a workload's token may
decline but never confirm; standing authorizations are backend objects.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from device_login import approve_in_browser

from prefect_ito.contract import (
    IDEMPOTENCY_HEADER,
    PERSON_SCOPES,
    SPEND_SCOPES,
    TRAINING_SCOPES,
    WORKLOAD_SCOPES,
)

WORKLOAD = "service:nightly-train"


def _http(desk: Any, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=desk.sim.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _person(desk: Any, account: str = "sim-user") -> httpx.Client:
    scopes = [s.value for s in (*TRAINING_SCOPES, *SPEND_SCOPES)]
    return _http(desk, desk.sim.mint_token(account, scopes=scopes).get_secret_value())


def _workload(desk: Any) -> httpx.Client:
    return _http(desk, desk.sim.mint_token(principal=WORKLOAD).get_secret_value())


def _quote(desk: Any, body: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = desk.quote(body)
    assert answer.status_code == 201, answer.text
    quote: dict[str, Any] = answer.json()["data"]
    return quote


# --- tokens ---------------------------------------------------------------------------------


def test_a_workload_token_is_minted_with_the_workload_scopes_only(desk):
    who = _workload(desk).get("/v0/auth/whoami").json()["data"]

    # v0.5: no training:decide either; a decision is a person's.
    assert who["scopes"] == [s.value for s in WORKLOAD_SCOPES]


@pytest.mark.parametrize("scope", PERSON_SCOPES, ids=str)
def test_the_simulator_refuses_a_spend_scope_for_a_workload(desk, scope):
    answer = httpx.post(
        f"{desk.sim.url}/_sim/tokens",
        json={"account": "sim-user", "scopes": [scope.value], "principal": WORKLOAD},
    )

    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == "scopes"
    assert scope.value in answer.json()["error"]["message"]


def test_a_person_can_be_minted_the_spend_scopes(desk):
    who = _person(desk).get("/v0/auth/whoami").json()["data"]

    assert {"spend:confirm", "spend:authorize"} <= set(who["scopes"])
    assert who["principal"] == "user:sim-user"


def test_capabilities_advertise_spend_authority(desk):
    assert desk.http.get("/v0/capabilities").json()["data"]["spend_authority"] is True


# --- quotes and their confirmation ------------------------------------------------------------


def test_a_quote_names_its_confirm_page_and_states_its_manifest(desk):
    quote = _quote(desk)

    assert re.fullmatch(r"[A-Z]{4}-[A-Z]{4}", quote["user_code"])
    assert quote["confirm_url"] == f"{desk.sim.url}/confirm?user_code={quote['user_code']}"
    assert quote["state"] == "pending"
    assert quote["manifest"]["model_size"] == "8B"
    assert desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"] == quote


def test_a_person_confirms_a_quote_and_the_backend_records_the_principal(desk):
    quote = _quote(desk)
    person = _person(desk)

    answer = person.post(
        f"/v0/training-quotes/{quote['quote_id']}/confirmations", json={"note": "Ada"}
    )

    assert answer.status_code == 200, answer.text
    confirmation = answer.json()["data"]
    assert confirmation["state"] == "confirmed"
    assert (confirmation["principal"], confirmation["note"]) == ("user:sim-user", "Ada")
    assert confirmation["quote_id"] == quote["quote_id"]
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "confirmed"
    assert stated["confirmation"] == confirmation


def test_confirming_twice_answers_the_same_confirmation(desk):
    quote = _quote(desk)
    person = _person(desk)
    path = f"/v0/training-quotes/{quote['quote_id']}/confirmations"

    first = person.post(path, json={"note": "Ada"}).json()["data"]
    second = person.post(path, headers={IDEMPOTENCY_HEADER: "again"}).json()["data"]

    assert first == second


def test_a_workload_token_cannot_confirm(desk):
    quote = _quote(desk)

    answer = _workload(desk).post(f"/v0/training-quotes/{quote['quote_id']}/confirmations")

    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
    assert "spend:confirm" in answer.json()["error"]["message"]
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "pending"


def test_a_workload_token_may_decline_and_a_decline_is_final(desk):
    quote = _quote(desk)
    workload = _workload(desk)

    declined = workload.post(f"/v0/training-quotes/{quote['quote_id']}/declines")
    confirm = _person(desk).post(f"/v0/training-quotes/{quote['quote_id']}/confirmations")

    assert declined.status_code == 200, declined.text
    assert (declined.json()["data"]["state"], declined.json()["data"]["principal"]) == (
        "declined",
        WORKLOAD,
    )
    assert confirm.status_code == 409
    error = confirm.json()["error"]
    assert error["code"] == "QUOTE_ALREADY_DECIDED"
    assert error["details"] == {"state": "declined", "principal": WORKLOAD}
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "declined"


def test_a_quote_declined_at_the_backend_makes_no_run(desk):
    body = desk.body()
    quote = _quote(desk, body)
    desk.http.post(f"/v0/training-quotes/{quote['quote_id']}/declines")

    answer = desk.submit({**body, "quote_id": quote["quote_id"]}, confirm=False)

    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "QUOTE_ALREADY_DECIDED"
    assert desk.sim.runs() == []


def test_another_person_cannot_confirm_a_quote_someone_confirmed(desk):
    quote = _quote(desk)
    path = f"/v0/training-quotes/{quote['quote_id']}/confirmations"
    _person(desk).post(path)
    other = _http(
        desk,
        desk.sim.mint_token(
            scopes=["spend:confirm"], principal="user:grace@example.com"
        ).get_secret_value(),
    )

    answer = other.post(path)

    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "QUOTE_ALREADY_DECIDED"


def test_a_confirmed_quote_makes_one_run_and_is_then_used(desk):
    body = desk.confirmed(desk.body())
    run = desk.start(body)
    quote_id = body["quote_id"]

    stated = desk.http.get(f"/v0/training-quotes/{quote_id}").json()["data"]
    confirm = _person(desk).post(f"/v0/training-quotes/{quote_id}/confirmations")

    assert run["run_id"]
    assert stated["state"] == "used"
    assert confirm.status_code == 409
    assert confirm.json()["error"]["code"] == "CONFIRMATION_USED"


def test_an_expired_quote_cannot_be_confirmed(desk_for):
    from prefect_ito.simulator import builtin_scenario

    desk = desk_for(builtin_scenario("default").model_copy(update={"quote_ttl_seconds": 0.2}))
    quote = _quote(desk)
    time.sleep(0.3)

    answer = _person(desk).post(f"/v0/training-quotes/{quote['quote_id']}/confirmations")

    assert answer.status_code == 410
    assert answer.json()["error"]["code"] == "CONFIRMATION_EXPIRED"
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "expired"


def test_another_accounts_quote_is_not_found(desk):
    quote = _quote(desk)

    read = _person(desk, "acme").get(f"/v0/training-quotes/{quote['quote_id']}")
    confirm = _person(desk, "acme").post(f"/v0/training-quotes/{quote['quote_id']}/confirmations")

    assert (read.status_code, read.json()["error"]["code"]) == (404, "QUOTE_NOT_FOUND")
    assert (confirm.status_code, confirm.json()["error"]["code"]) == (404, "QUOTE_NOT_FOUND")


def test_a_backend_without_spend_confirmation_serves_no_spend_authority(desk_for):
    from prefect_ito.simulator import builtin_scenario

    desk = desk_for(builtin_scenario("default").model_copy(update={"spend_confirmation": False}))

    capabilities = desk.http.get("/v0/capabilities").json()["data"]
    answer = _person(desk).get("/v0/spend-authorizations")

    assert capabilities["spend_authority"] is False
    assert (answer.status_code, answer.json()["error"]["code"]) == (
        501,
        "CAPABILITY_NOT_AVAILABLE",
    )


# --- standing authorizations ------------------------------------------------------------------


def _authorization(**limits: Any) -> dict[str, Any]:
    expires = datetime.now(UTC) + timedelta(days=7)
    limits.setdefault("data_ref_patterns", ["*"])
    return {"name": "nightly 8B", "limits": limits, "expires_at": expires.isoformat()}


def test_a_person_creates_lists_reads_and_revokes_an_authorization(desk):
    person = _person(desk)
    body = _authorization(max_budget_usd=300_000, model_sizes=["8B"], max_runs=3)

    created = person.post("/v0/spend-authorizations", json=body, headers={IDEMPOTENCY_HEADER: "a1"})
    replayed = person.post(
        "/v0/spend-authorizations", json=body, headers={IDEMPOTENCY_HEADER: "a1"}
    )

    assert created.status_code == 201, created.text
    data = created.json()["data"]
    assert (data["state"], data["principal"], data["used"]) == (
        "active",
        "user:sim-user",
        {"runs": 0, "spend_usd": 0.0},
    )
    assert replayed.status_code == 200
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json()["data"] == data
    listed = desk.http.get("/v0/spend-authorizations").json()["data"]["authorizations"]
    assert listed == [data]
    path = f"/v0/spend-authorizations/{data['authorization_id']}"
    assert desk.http.get(path).json()["data"] == data

    revoked = person.delete(path).json()["data"]

    assert (revoked["state"], revoked["revoked_by"]) == ("revoked", "user:sim-user")
    assert desk.http.get(path).json()["data"]["state"] == "revoked"


def test_a_key_reused_for_another_authorization_is_refused(desk):
    person = _person(desk)
    headers = {IDEMPOTENCY_HEADER: "a1"}
    person.post("/v0/spend-authorizations", json=_authorization(max_runs=1), headers=headers)

    answer = person.post(
        "/v0/spend-authorizations", json=_authorization(max_runs=2), headers=headers
    )

    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "IDEMPOTENCY_KEY_REUSED")


def test_a_workload_token_can_neither_create_nor_revoke_an_authorization(desk):
    person, workload = _person(desk), _workload(desk)
    created = person.post(
        "/v0/spend-authorizations", json=_authorization(), headers={IDEMPOTENCY_HEADER: "a1"}
    ).json()["data"]

    create = workload.post(
        "/v0/spend-authorizations", json=_authorization(), headers={IDEMPOTENCY_HEADER: "a2"}
    )
    revoke = workload.delete(f"/v0/spend-authorizations/{created['authorization_id']}")

    for answer in (create, revoke):
        assert answer.status_code == 403
        assert "spend:authorize" in answer.json()["error"]["message"]
    assert desk.http.get("/v0/spend-authorizations").json()["data"]["authorizations"] == [created]


def test_another_accounts_authorization_is_not_found(desk):
    created = (
        _person(desk)
        .post("/v0/spend-authorizations", json=_authorization(), headers={IDEMPOTENCY_HEADER: "a1"})
        .json()["data"]
    )
    other = _person(desk, "acme")

    answer = other.delete(f"/v0/spend-authorizations/{created['authorization_id']}")

    assert (answer.status_code, answer.json()["error"]["code"]) == (
        404,
        "SPEND_AUTHORIZATION_NOT_FOUND",
    )
    assert other.get("/v0/spend-authorizations").json()["data"]["authorizations"] == []


def test_a_device_login_gives_a_person_the_spend_scopes(desk):
    device = httpx.post(f"{desk.sim.url}/v0/auth/device").json()["data"]
    approve_in_browser(device["verification_uri_complete"], device["user_code"], "ada")
    time.sleep(device["interval"])

    grant = httpx.post(
        f"{desk.sim.url}/v0/auth/token", json={"device_code": device["device_code"]}
    ).json()["data"]

    assert {"spend:confirm", "spend:authorize", "training:submit"} <= set(grant["scope"].split())


def test_a_zone_less_expiry_is_refused_and_stores_nothing_that_breaks_a_listing(desk):
    # Before: 500, and every later listing of the account answered 500 too.
    person = _person(desk)
    body = {**_authorization(max_budget_usd=1e6), "expires_at": "2030-01-01T00:00:00"}

    refused = person.post("/v0/spend-authorizations", json=body, headers={IDEMPOTENCY_HEADER: "z"})
    listed = person.get("/v0/spend-authorizations")

    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "expires_at" in refused.text
    assert listed.status_code == 200 and listed.json()["data"]["authorizations"] == []
