"""Contract v0.4 from the attacker's side: only the backend's record of a person allows a run.

A colleague with Prefect API access holds at most the worker's token: the four training scopes,
no spend scope. These tests try every way such a token could make a run, and check the
simulator's runs (its own record) as the judge. Then what a person's confirmation or standing
authorization allows: one run each, on the quote's cost and term, counted at the backend.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from prefect_ito.contract import IDEMPOTENCY_HEADER

WORKER = "service:prefect-worker"


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _worker(desk: Any) -> httpx.Client:
    token = desk.sim.mint_token(principal=WORKER).get_secret_value()
    return httpx.Client(
        base_url=desk.sim.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _post(client: httpx.Client, path: str, body: Any, key: str) -> httpx.Response:
    return client.post(path, json=body, headers={IDEMPOTENCY_HEADER: key})


def _authorize(desk: Any, **limits: Any) -> dict[str, Any]:
    limits.setdefault("data_ref_patterns", ["*"])
    body = {
        "name": "nightly",
        "limits": limits,
        "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
    }
    with desk.person() as person:
        answer = _post(person, "/v0/spend-authorizations", body, f"auth-{len(limits)}-{limits}")
    assert answer.status_code in (200, 201), answer.text
    created: dict[str, Any] = answer.json()["data"]
    return created


def test_a_workload_token_alone_creates_no_run_whatever_it_sends(desk):
    worker = _worker(desk)
    body = desk.body(model_size="70B", budget_usd=5_000_000.0)
    quote = _post(worker, "/v0/training-quotes", body, "q").json()["data"]
    quote_id = quote["quote_id"]
    written = {"quote_id": quote_id, "confirmed_by": "Ada Lovelace", "via": "person"}
    limits = {"max_budget_usd": 1e12, "booking_id_patterns": ["*"]}
    attempts = [
        _post(worker, f"/v0/training-quotes/{quote_id}/confirmations", {"note": "Ada"}, "c"),
        _post(
            worker,
            "/v0/spend-authorizations",
            {"name": "x", "limits": limits, "expires_at": "2099-01-01T00:00:00Z"},
            "a",
        ),
        _post(worker, "/v0/training-runs", body, "r1"),
        _post(worker, "/v0/training-runs", {**body, "quote_id": quote_id}, "r2"),
        _post(worker, "/v0/training-runs", {**body, "confirmation": written}, "r3"),
        _post(
            worker,
            "/v0/training-runs",
            {**body, "quote_id": quote_id, "authorization_id": "sa_forged"},
            "r4",
        ),
        _post(
            worker,
            "/v0/training-runs",
            {
                **body,
                "quote_id": quote_id,
                "confirmation": written,
                "authorization_id": "(unsaved)",
            },
            "r5",
        ),
    ]

    assert [_error(answer) for answer in attempts] == [
        (403, "INSUFFICIENT_SCOPE"),
        (403, "INSUFFICIENT_SCOPE"),
        (428, "CONFIRMATION_REQUIRED"),
        (428, "CONFIRMATION_REQUIRED"),
        (400, "CONTRACT_VERSION_UNSUPPORTED"),
        (404, "SPEND_AUTHORIZATION_NOT_FOUND"),
        (400, "CONTRACT_VERSION_UNSUPPORTED"),
    ]
    assert desk.sim.runs() == []
    stated = worker.get(f"/v0/training-quotes/{quote_id}").json()["data"]
    assert (stated["state"], stated["confirmation"]) == ("pending", None)


def test_a_standing_authorization_a_person_made_lets_the_worker_submit_once_within_it(desk):
    authorization = _authorize(desk, max_budget_usd=300_000.0, max_runs=1)
    worker = _worker(desk)
    body = desk.body()
    quote = _post(worker, "/v0/training-quotes", body, "q1").json()["data"]
    named = {
        **body,
        "quote_id": quote["quote_id"],
        "authorization_id": authorization["authorization_id"],
    }

    run = _post(worker, "/v0/training-runs", named, "r1")

    assert run.status_code == 201, run.text
    record = run.json()["data"]["run"]["confirmation"]
    assert (record["via"], record["confirmed_by"]) == ("standing_authorization", "user:ada")
    assert (record["authorization"], record["submitted_by"]) == (
        authorization["authorization_id"],
        WORKER,
    )
    used = worker.get(f"/v0/spend-authorizations/{authorization['authorization_id']}").json()
    assert used["data"]["used"] == {"runs": 1, "spend_usd": body["budget_usd"]}
    assert used["data"]["state"] == "exhausted"


CORPUS = "s3://team-bucket/corpus/*"
CORPUS_ONLY = {"max_budget_usd": 1e9, "data_ref_patterns": [CORPUS]}
# Before v0.5, naming a colleague's nightly authorization made a $300k run on the attacker's
# poisoned corpus: the limits said nothing about data.
POISONED = [
    ["s3://team-bucket/poisoned-corpus/"],
    ["s3://team-bucket/corpus-evil/shard-0"],
    ["s3://team-bucket/corpus/../poisoned-corpus/"],
    ["s3://team-bucket/corpus/%2e%2e/poisoned-corpus/"],
    ["s3://team-bucket/corpus/web", "s3://attacker/poisoned-corpus/"],
]


@pytest.mark.parametrize(
    ("limits", "changes", "why"),
    [
        ({"max_budget_usd": 1_000.0}, {}, "budget"),
        ({"max_budget_usd": 1e9, "model_sizes": ["8B"]}, {"model_size": "150M"}, "model size"),
        ({"max_budget_usd": 1e9, "booking_id_patterns": ["bk-nightly-*"]}, {}, "matches none"),
        ({"max_budget_usd": 1e12}, {"model_size": "1.5T", "budget_usd": 1e10}, "term"),
        *[(CORPUS_ONLY, {"data_refs": refs}, "the data") for refs in POISONED],
    ],
    ids=[
        "budget",
        "model-size",
        "booking",
        "outlasts-the-term",
        "data-in-another-folder",
        "data-with-a-longer-name",
        "data-with-dot-segments",
        "data-percent-encoded",
        "data-one-of-two",
    ],
)
def test_an_authorization_that_does_not_cover_the_quote_makes_nothing(desk, limits, changes, why):
    authorization = _authorize(desk, **limits)
    worker = _worker(desk)
    body = desk.body(**changes)
    quote = _post(worker, "/v0/training-quotes", body, "q").json()["data"]
    named = {
        **body,
        "quote_id": quote["quote_id"],
        "authorization_id": authorization["authorization_id"],
    }

    answer = _post(worker, "/v0/training-runs", named, "r")

    assert _error(answer) == (403, "AUTHORIZATION_DOES_NOT_COVER")
    assert why in answer.json()["error"]["details"]["reason"]
    assert desk.sim.runs() == []
    kept = worker.get(f"/v0/spend-authorizations/{authorization['authorization_id']}").json()
    assert kept["data"]["used"] == {"runs": 0, "spend_usd": 0.0}


def test_a_standing_authorization_covers_the_data_its_person_named(desk):
    authorization = _authorize(desk, **CORPUS_ONLY)
    body = desk.body(data_refs=["s3://team-bucket/corpus/web/2026-10/", "s3://team-bucket/corpus/"])
    quote = desk.quote(body).json()["data"]
    named = {
        **body,
        "quote_id": quote["quote_id"],
        "authorization_id": authorization["authorization_id"],
    }

    answer = desk.submit(named, confirm=False)

    assert answer.status_code == 201, answer.text


def test_a_new_standing_authorization_must_name_its_data(desk):
    body = {
        "name": "nightly",
        "limits": {"max_budget_usd": 1e9},
        "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
    }
    with desk.person() as person:
        answer = _post(person, "/v0/spend-authorizations", body, "no-data")
        listed = person.get("/v0/spend-authorizations").json()["data"]["authorizations"]

    assert _error(answer) == (422, "VALIDATION_ERROR")
    assert answer.json()["error"]["field"] == "limits.data_ref_patterns"
    assert listed == []


def test_a_revoked_authorization_covers_nothing(desk):
    authorization = _authorize(desk, max_budget_usd=1e9)
    with desk.person() as person:
        person.delete(f"/v0/spend-authorizations/{authorization['authorization_id']}")
    quote = desk.quote().json()["data"]
    named = {
        **desk.body(),
        "quote_id": quote["quote_id"],
        "authorization_id": authorization["authorization_id"],
    }

    answer = desk.submit(named, confirm=False)

    assert _error(answer) == (403, "AUTHORIZATION_DOES_NOT_COVER")
    assert "revoked" in answer.json()["error"]["message"]
    assert desk.sim.runs() == []


def test_a_confirmation_makes_one_run_and_carries_to_no_later_quote_once_used(desk):
    body = desk.confirmed(desk.body())
    first = desk.start(body, key="first")
    desk.http.post(f"/v0/training-runs/{first['run_id']}/cancel", json={})
    desk.finished(first)

    confirm_again = desk.confirm_quote(body["quote_id"])
    requote = desk.quote().json()["data"]
    second = desk.submit({**desk.body(), "quote_id": requote["quote_id"]}, key="second")

    assert _error(confirm_again) == (409, "CONFIRMATION_USED")
    assert (requote["state"], requote["carried_from"]) == ("pending", None)
    assert _error(second) == (428, "CONFIRMATION_REQUIRED")
    assert len(desk.sim.runs()) == 1


def test_a_confirmation_carries_to_a_new_quote_of_the_same_manifest_when_nothing_got_worse(desk):
    first = desk.quote().json()["data"]
    desk.confirm_quote(first["quote_id"])

    second = desk.quote().json()["data"]
    run = desk.start({**desk.body(), "quote_id": second["quote_id"]})

    assert second["state"] == "confirmed"
    assert second["carried_from"] == first["quote_id"]
    assert second["confirmation"]["principal"] == "user:ada"
    stated = desk.http.get(f"/v0/training-quotes/{first['quote_id']}").json()["data"]
    assert stated["state"] == "superseded"
    assert run["confirmation"]["carried_from"] == first["quote_id"]
    assert run["confirmation"]["confirmed_by"] == "user:ada"
    # The old quote's confirmation moved to the new one: confirming it again is refused.
    assert _error(desk.confirm_quote(first["quote_id"])) == (409, "CONFIRMATION_USED")
    assert len(desk.sim.runs()) == 1


def test_after_two_carry_overs_a_run_names_the_quote_a_person_confirmed(desk):
    # Before: after two carry-overs, `carried_from` named the middle quote, which nobody
    # confirmed; a client showing "confirmed on quote …" pointed at the wrong one.
    first = desk.quote().json()["data"]
    desk.confirm_quote(first["quote_id"])
    second = desk.quote().json()["data"]
    third = desk.quote().json()["data"]

    run = desk.start({**desk.body(), "quote_id": third["quote_id"]})

    assert (second["carried_from"], third["carried_from"]) == (first["quote_id"],) * 2
    assert third["state"] == "confirmed"
    assert run["confirmation"]["carried_from"] == first["quote_id"]
    assert run["confirmation"]["quote_id"] == third["quote_id"]


def test_a_pricier_requote_waits_for_a_person_and_says_what_changed(desk):
    # Before: a person confirmed $23k–$34k on 2 nodes; the booking became 20 nodes, the flow
    # quoted again and submitted on the old confirmation; the run ran to a $250,000 ceiling.
    booking = next(b for b in desk.sim.bookings() if b.booking_id == desk.body()["booking_id"])
    first = desk.quote().json()["data"]
    desk.confirm_quote(first["quote_id"])
    desk.sim.add_booking(booking.model_copy(update={"node_count": 20}))

    second = desk.quote().json()["data"]
    answer = desk.submit({**desk.body(), "quote_id": second["quote_id"]}, confirm=False)

    assert second["plan"]["cost_usd"]["high"] > first["plan"]["cost_usd"]["high"]
    assert (second["state"], second["carried_from"]) == ("pending", None)
    assert any("rose from" in change for change in second["not_carried"])
    assert _error(answer) == (428, "CONFIRMATION_REQUIRED")
    assert "rose from" in answer.json()["error"]["message"]
    assert desk.sim.runs() == []


def test_a_requote_that_may_outlast_the_term_waits_for_a_person(desk):
    booking = next(b for b in desk.sim.bookings() if b.booking_id == desk.body()["booking_id"])
    first = desk.quote().json()["data"]
    desk.confirm_quote(first["quote_id"])
    soon = datetime.now(UTC) + timedelta(hours=1)
    desk.sim.add_booking(booking.model_copy(update={"term_end": soon}))

    second = desk.quote().json()["data"]

    assert second["state"] == "pending"
    assert any("outlast" in change for change in second["not_carried"])
    answer = desk.submit({**desk.body(), "quote_id": second["quote_id"]}, confirm=False)
    assert _error(answer) == (428, "CONFIRMATION_REQUIRED")
    assert desk.sim.runs() == []


@pytest.mark.parametrize("allowed_by", ["person", "authorization"])
def test_a_confirmed_quote_on_a_booking_that_grew_since_makes_no_run(desk, allowed_by):
    # Found by the randomized spend attempts: a quote a person confirmed at $34k on 2 nodes
    # was still taken after the booking became 20 nodes (up to $337k), since only new quotes
    # were priced again. What a person confirmed is the cost and term they saw.
    booking = next(b for b in desk.sim.bookings() if b.booking_id == desk.body()["booking_id"])
    body = desk.body()
    quote = desk.quote(body).json()["data"]
    named = {**body, "quote_id": quote["quote_id"]}
    if allowed_by == "person":
        desk.confirm_quote(quote["quote_id"])
    else:
        authorization = _authorize(desk, max_budget_usd=1e9)
        named["authorization_id"] = authorization["authorization_id"]
    desk.sim.add_booking(booking.model_copy(update={"node_count": 20}))

    answer = _post(_worker(desk), "/v0/training-runs", named, "stale")

    assert _error(answer) == (428, "CONFIRMATION_REQUIRED")
    assert any("rose from" in reason for reason in answer.json()["error"]["details"]["reasons"])
    assert desk.sim.runs() == []
