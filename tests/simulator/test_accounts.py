"""Accounts never see each other: every route that names a run, a quote or an authorization.

One account keeps a run waiting for a decision, a pending quote, a standing authorization and
a client reference on a booking several accounts may use; a person of another account, holding
every scope, tries each route on them. The simulator's own record is the judge: nothing of the
first account's is shown, changed or used.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from prefect_ito.contract import IDEMPOTENCY_HEADER

OTHER = "other-account"


@pytest.fixture
def theirs(desk_for) -> tuple[Any, dict[str, str]]:
    """A desk whose account holds a run, a quote and an authorization; return their ids."""
    desk = desk_for("loss-spike")  # holds at a decision, so the run stays unfinished
    run = desk.start({**desk.body(), "client_reference": "ref-theirs"}, key="key-theirs")
    run = desk.wait_for(run, lambda r: r["pending_action"] is not None)
    quote = desk.quote(desk.body(target="chat")).json()["data"]["quote_id"]
    with desk.person() as person:
        authorization = person.post(
            "/v0/spend-authorizations",
            json={
                "name": "nightly",
                "limits": {"max_budget_usd": 1e6, "data_ref_patterns": ["*"]},
                "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
            },
            headers={IDEMPOTENCY_HEADER: "authorize-theirs"},
        )
    assert authorization.status_code == 201, authorization.text
    ids = {
        "run": run["run_id"],
        "action": run["pending_action"]["action_id"],
        "quote": quote,
        "authorization": authorization.json()["data"]["authorization_id"],
        "booking": run["booking_id"],
    }
    return desk, ids


def _tries(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every route another account might use to see or touch what ``ids`` name."""
    run = f"/v0/training-runs/{ids['run']}"
    quote = f"/v0/training-quotes/{ids['quote']}"
    authorization = f"/v0/spend-authorizations/{ids['authorization']}"
    decision = {"decision": "approve", "decided_by": "Mallory", "reason": "looks fine"}
    return [
        ("GET", run, {}),
        ("GET", f"{run}/events", {}),
        ("POST", f"{run}/actions/{ids['action']}/decision", {"json": decision}),
        ("POST", f"{run}/cancel", {"json": {"reason": "mine now"}}),
        ("GET", quote, {}),
        ("POST", f"{quote}/confirmations", {"json": {}}),
        ("POST", f"{quote}/declines", {"json": {}}),
        ("GET", authorization, {}),
        ("DELETE", authorization, {}),
    ]


def test_another_account_finds_none_of_it_by_id_on_any_route(theirs):
    desk, ids = theirs
    with desk.person(account=OTHER, principal="user:mallory") as other:
        answers = [
            (method, path, other.request(method, path, headers=_key(method), **kwargs))
            for method, path, kwargs in _tries(ids)
        ]

    for method, path, answer in answers:
        assert answer.status_code == 404, (method, path, answer.text)
        _assert_names_nothing(answer, ids)
    _assert_untouched(desk, ids)


def test_another_account_finds_none_of_it_in_any_listing(theirs):
    desk, ids = theirs
    with desk.person(account=OTHER, principal="user:mallory") as other:
        listings = [
            other.get("/v0/training-runs"),
            other.get("/v0/training-runs", params={"idempotency_key": "key-theirs"}),
            other.get("/v0/training-runs", params={"client_reference": "ref-theirs"}),
            other.get("/v0/training-runs", params={"booking_id": ids["booking"], "active": True}),
            other.get("/v0/training-runs/changes", params={"after": 0}),
            other.get("/v0/spend-authorizations"),
        ]

    for answer in listings:
        assert answer.status_code == 200, answer.text
        _assert_names_nothing(answer, ids)


def test_another_account_cannot_spend_on_its_quote_or_authorization(theirs):
    desk, ids = theirs
    body = desk.body(target="chat")
    with desk.person(account=OTHER, principal="user:mallory") as other:
        tries = [
            other.post(
                "/v0/training-runs",
                json={**body, "quote_id": ids["quote"]},
                headers={IDEMPOTENCY_HEADER: "on-their-quote"},
            ),
            other.post(
                "/v0/training-runs",
                json={**body, "authorization_id": ids["authorization"]},
                headers={IDEMPOTENCY_HEADER: "on-their-authorization"},
            ),
        ]

    for answer in tries:
        assert answer.status_code >= 400, answer.text
        _assert_names_nothing(answer, {k: v for k, v in ids.items() if k != "booking"})
    assert [r.account for r in desk.sim.runs()] == ["sim-user"]


def _key(method: str) -> dict[str, str]:
    return {IDEMPOTENCY_HEADER: f"other-{method}"} if method != "GET" else {}


def _assert_names_nothing(answer: httpx.Response, ids: dict[str, str]) -> None:
    # The ids a caller sent may come back in its own path, never in what the backend says.
    said = answer.text
    for name in ("run", "action", "quote", "authorization"):
        assert ids[name] not in said, (name, answer.request.url.path, said)
    assert "user:ada" not in said and "user:sim-user" not in said, said


def _assert_untouched(desk: Any, ids: dict[str, str]) -> None:
    (record,) = desk.sim.runs()
    assert record.run.state.value == "awaiting_decision"
    assert record.run.decisions == [] and record.run.pending_action is not None
    with desk.person() as person:
        quote = person.get(f"/v0/training-quotes/{ids['quote']}").json()["data"]
        authorization = person.get(f"/v0/spend-authorizations/{ids['authorization']}")
    assert quote["state"] == "pending"
    assert authorization.json()["data"]["state"] == "active"
