"""Authority at the simulator: scopes per endpoint, the principal, bookings bound to accounts."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from device_login import approve_in_browser

from prefect_ito.contract import (
    ALL_SCOPES,
    IDEMPOTENCY_HEADER,
    TRAINING_SCOPES,
    BookingStatus,
    Scope,
)
from prefect_ito.simulator import SimBooking

DECISION = {"decision": "approve", "decided_by": "Ada", "reason": "looked at the curve"}

# (scope the endpoint needs, method, path template, body)
ENDPOINTS = [
    (Scope.READ, "GET", "/v0/capabilities", None),
    (Scope.READ, "GET", "/v0/bookings/bk-h200-2x8-ib/training-eligibility", None),
    (Scope.READ, "GET", "/v0/training-runs", None),
    (Scope.READ, "GET", "/v0/training-runs/changes", None),
    (Scope.READ, "GET", "/v0/training-runs/{run_id}", None),
    (Scope.READ, "GET", "/v0/training-runs/{run_id}/events", None),
    (Scope.READ, "POST", "/v0/training-quotes", "quote"),  # creates nothing (v0.3)
    (Scope.READ, "GET", "/v0/spend-authorizations", None),  # v0.4
    (Scope.SUBMIT, "POST", "/v0/training-runs", "submission"),
    (Scope.DECIDE, "POST", "/v0/training-runs/{run_id}/actions/{action_id}/decision", DECISION),
    (Scope.CANCEL, "POST", "/v0/training-runs/{run_id}/cancel", {"reason": "test"}),
]


def _call(desk, token: str, method: str, template: str, body: Any, run: dict[str, Any]):
    path = template.format(run_id=run["run_id"], action_id=run["pending_action"]["action_id"])
    if body in ("submission", "quote"):
        # Another booking, so that a new run could be created (the spiked one holds its own).
        request = desk.body(booking_id="bk-h100-1x8-ib", target="another")
        body = desk.confirmed(request) if body == "submission" else request
    return httpx.request(
        method,
        f"{desk.sim.url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}", IDEMPOTENCY_HEADER: "scope-test"},
    )


@pytest.fixture
def spiked(desk_for):
    """A simulator whose one run waits for a decision."""
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    return desk, run


@pytest.mark.parametrize(("scope", "method", "path", "body"), ENDPOINTS)
def test_a_token_without_the_scope_gets_403_naming_it_and_nothing_changes(
    spiked, scope, method, path, body
):
    desk, run = spiked
    others = [other.value for other in ALL_SCOPES if other is not scope]
    token = desk.sim.mint_token(scopes=others).get_secret_value()

    answer = _call(desk, token, method, path, body, run)

    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "INSUFFICIENT_SCOPE"
    assert scope.value in error["message"]
    assert token not in answer.text
    after = desk.run(run["run_id"])
    assert (after["state"], after["decisions"]) == ("awaiting_decision", [])
    assert len(desk.sim.runs()) == 1


@pytest.mark.parametrize(("scope", "method", "path", "body"), ENDPOINTS)
def test_a_token_with_only_that_scope_is_let_through(spiked, scope, method, path, body):
    desk, run = spiked
    token = desk.sim.mint_token(scopes=[scope.value]).get_secret_value()

    answer = _call(desk, token, method, path, body, run)

    assert answer.status_code in (200, 201), answer.text


def test_whoami_reports_principal_and_scopes_to_any_valid_token(desk):
    token = desk.sim.mint_token(
        "acme", scopes=[], principal="service:nightly-train"
    ).get_secret_value()

    who = httpx.get(f"{desk.sim.url}/v0/auth/whoami", headers={"Authorization": f"Bearer {token}"})

    assert who.status_code == 200
    data = who.json()["data"]
    assert (data["account"], data["principal"], data["scopes"]) == (
        "acme",
        "service:nightly-train",
        [],
    )
    assert token not in who.text


def test_a_minted_token_speaks_for_the_account_user_by_default(desk):
    data = desk.http.get("/v0/auth/whoami").json()["data"]

    assert data["principal"] == "user:sim-user"
    assert data["scopes"] == [scope.value for scope in TRAINING_SCOPES]


def _device_login(desk) -> dict[str, Any]:
    device = httpx.post(f"{desk.sim.url}/v0/auth/device").json()["data"]
    approve_in_browser(device["verification_uri_complete"], device["user_code"], "ada")
    time.sleep(device["interval"])
    answer = httpx.post(
        f"{desk.sim.url}/v0/auth/token", json={"device_code": device["device_code"]}
    )
    grant: dict[str, Any] = answer.json()["data"]
    return grant


def test_a_device_login_grants_every_scope_by_default(desk):
    grant = _device_login(desk)

    assert grant["scope"].split() == [scope.value for scope in ALL_SCOPES]
    headers = {"Authorization": f"Bearer {grant['access_token']}"}
    who = httpx.get(f"{desk.sim.url}/v0/auth/whoami", headers=headers).json()["data"]
    assert who["scopes"] == grant["scope"].split()


def test_a_scenario_can_limit_what_a_device_login_grants(desk_for):
    from prefect_ito.simulator import builtin_scenario

    desk = desk_for(builtin_scenario("default").with_options(login_scopes=[Scope.READ]))
    grant = _device_login(desk)
    headers = {"Authorization": f"Bearer {grant['access_token']}"}

    submitted = httpx.post(
        f"{desk.sim.url}/v0/training-runs",
        json=desk.body(),
        headers={**headers, IDEMPOTENCY_HEADER: "k"},
    )

    assert grant["scope"] == "training:read"
    assert submitted.status_code == 403
    assert "training:submit" in submitted.json()["error"]["message"]


def test_a_decision_records_the_principal_beside_the_typed_name(spiked):
    desk, run = spiked
    token = desk.sim.mint_token(principal="user:ada@example.com").get_secret_value()
    action = run["pending_action"]["action_id"]

    answer = httpx.post(
        f"{desk.sim.url}/v0/training-runs/{run['run_id']}/actions/{action}/decision",
        json={**DECISION, "decided_by": "Ada Lovelace"},
        headers={"Authorization": f"Bearer {token}"},
    )

    assert answer.status_code == 200, answer.text
    [record] = answer.json()["data"]["decisions"]
    assert (record["decided_by"], record["principal"]) == ("Ada Lovelace", "user:ada@example.com")


def test_a_booking_of_another_account_is_not_found_and_never_revealed(desk):
    desk.sim.add_booking(
        SimBooking(booking_id="bk-theirs", status=BookingStatus.COMPLETED, account="acme")
    )
    theirs = desk.sim.mint_token("acme").get_secret_value()

    mine = desk.http.get("/v0/bookings/bk-theirs/training-eligibility")
    absent = desk.http.get("/v0/bookings/bk-nowhere/training-eligibility")
    submitted = desk.submit(desk.body(booking_id="bk-theirs"), key="k-theirs")
    owner = httpx.get(
        f"{desk.sim.url}/v0/bookings/bk-theirs/training-eligibility",
        headers={"Authorization": f"Bearer {theirs}"},
    )

    assert (mine.status_code, submitted.status_code) == (404, 404)
    assert mine.json()["error"] == absent.json()["error"]
    assert submitted.json()["error"]["code"] == "BOOKING_NOT_FOUND"
    assert desk.sim.runs() == []
    assert owner.status_code == 200
    assert (owner.json()["data"]["account"], owner.json()["data"]["eligible"]) == ("acme", True)


def test_eligibility_names_the_account_that_asks_for_a_shared_booking(desk):
    eligibility = desk.http.get("/v0/bookings/bk-h200-2x8-ib/training-eligibility").json()

    assert eligibility["data"]["account"] == "sim-user"
