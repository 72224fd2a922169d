"""Injected faults: dropped answers after commit, 429 with Retry-After, 503, 500, revoked tokens."""

from __future__ import annotations

import httpx
import pytest
from simulator_fixture import with_faults

from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.ids import mint


def test_drop_response_after_commit_creates_the_run_and_cuts_the_connection(desk_for):
    desk = desk_for(with_faults(drop_response_after_commit=1))

    with pytest.raises(httpx.TransportError):
        desk.submit(key="ambiguous")
    runs = desk.sim.runs()
    retry = desk.submit(key="ambiguous")

    assert [r.idempotency_key for r in runs] == ["ambiguous"]
    assert retry.status_code == 200
    assert retry.json()["data"]["replayed"] is True
    assert retry.json()["data"]["run"]["run_id"] == runs[0].run_id
    logged = [r for r in desk.sim.requests() if r.path == "/v0/training-runs"]
    assert [r.dropped for r in logged] == [True, False]


def test_rate_limits_carry_retry_after(desk_for):
    desk = desk_for(with_faults(rate_limited_rate=1.0, retry_after_seconds=7))

    response = desk.http.get("/v0/capabilities")
    admin = httpx.get(f"{desk.sim.url}/_sim/bookings")

    assert response.status_code == 429
    assert response.headers["Retry-After"] == "7"
    assert response.json()["error"]["code"] == "RATE_LIMITED"
    assert admin.status_code == 200  # faults never touch the admin surface


def test_an_unexpected_failure_is_a_500_envelope_with_its_request_id(desk_for):
    desk = desk_for(with_faults(internal_error_rate=1.0))

    response = desk.http.get("/v0/capabilities")
    again = desk.http.get("/v0/capabilities")  # the server goes on answering

    assert response.status_code == again.status_code == 500
    body = response.json()
    assert (body["ok"], body["error"]["code"], body["live_api_contacted"]) == (
        False,
        "INTERNAL_ERROR",
        False,
    )
    request_id = response.headers["X-Request-Id"]
    logged = [r for r in desk.sim.requests() if r.request_id == request_id]
    assert [r.status for r in logged] == [500]


def test_unavailable_rate_gives_503s_in_a_repeatable_sequence(desk_for):
    def statuses(desk):
        return [desk.http.get("/v0/capabilities").status_code for _ in range(20)]

    first = statuses(desk_for(with_faults(unavailable_rate=0.5, seed=3)))
    second = statuses(desk_for(with_faults(unavailable_rate=0.5, seed=3)))

    assert first == second
    assert set(first) == {200, 503}


def test_a_seeded_storm_is_the_same_whatever_order_requests_arrive_in(desk_for):
    # Concurrent callers reach a backend in a different order every run; a seeded storm must
    # still give each request the same fate, or a test of many callers meets a new storm each run.
    def fates(desk, order):
        fate, polls = {}, []
        for index in order:
            keyed = desk.http.get("/v0/training-runs", params={"idempotency_key": f"k-{index}"})
            quoted = desk.quote(desk.body(booking_id=f"bk-{index}"))
            fate[index] = (keyed.status_code == 503, quoted.status_code == 503)
            # An id the backend made is new in every run: a request naming one is known without
            # it, so the nth such poll meets the same fault in every run.
            polls.append(desk.http.get(f"/v0/training-runs/{mint('run')}").status_code == 503)
        return fate, polls

    calls = range(12)
    forwards, polled = fates(desk_for(with_faults(unavailable_rate=0.5, seed=3)), calls)
    backwards, polled_again = fates(
        desk_for(with_faults(unavailable_rate=0.5, seed=3)), reversed(calls)
    )

    assert forwards == backwards
    assert polled == polled_again
    for seen in ({keyed for keyed, _ in forwards.values()}, {q for _, q in forwards.values()}):
        assert seen == {True, False}  # each kind of request met the storm, and got through it
    assert set(polled) == {True, False}


def test_tokens_issued_before_the_revocation_time_die(desk_for):
    desk = desk_for()
    desk.sim.load_scenario(with_faults(revoke_tokens_after_seconds=0))

    old = desk.http.get("/v0/capabilities")
    fresh = desk.sim.mint_token().get_secret_value()
    new = desk.http.get("/v0/capabilities", headers={"Authorization": f"Bearer {fresh}"})

    assert old.status_code == 401
    assert old.json()["error"]["code"] == "TOKEN_REVOKED"
    assert new.status_code == 200


def test_request_log_never_holds_the_token(desk_for):
    desk = desk_for(with_faults(rate_limited_rate=0.3))
    desk.submit(key="k")
    desk.http.get("/v0/training-runs", params={"idempotency_key": "k"})
    desk.http.post("/v0/auth/revoke")

    log = desk.sim.requests()
    raw = httpx.get(f"{desk.sim.url}/_sim/requests").text

    assert desk.token not in raw
    assert {entry.path for entry in log} >= {"/v0/training-runs", "/v0/auth/revoke"}
    assert all(entry.request_id.startswith("req_") for entry in log)
    assert any(entry.idempotency_key == "k" for entry in log)


def test_scenario_load_resets_runs_and_log_but_keeps_tokens(desk):
    desk.start()

    desk.sim.load_scenario(builtin_scenario("stall"))

    assert desk.sim.runs() == []
    assert desk.sim.requests() == []
    assert desk.http.get("/v0/capabilities").status_code == 200
