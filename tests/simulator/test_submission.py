"""Submission: idempotent replay, key reuse, re-attach lookups, BOOKING_BUSY, scaffold."""

from __future__ import annotations

import pytest

from prefect_ito.contract import IDEMPOTENCY_HEADER, REPLAYED_HEADER


def test_same_key_and_body_replays_the_same_run(desk):
    first = desk.submit(key="k")
    second = desk.submit(key="k")

    assert first.status_code == 201
    assert first.json()["data"]["replayed"] is False
    assert REPLAYED_HEADER not in first.headers
    assert second.status_code == 200
    assert second.json()["data"]["replayed"] is True
    assert second.headers[REPLAYED_HEADER] == "true"
    assert second.json()["data"]["run"]["run_id"] == first.json()["data"]["run"]["run_id"]
    assert len(desk.sim.runs()) == 1


def test_same_key_with_another_body_is_refused(desk):
    desk.start(key="k")

    response = desk.submit(desk.body(budget_usd=1.0), key="k")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert len(desk.sim.runs()) == 1


def test_run_is_found_by_idempotency_key(desk):
    run = desk.start(key="lost-answer")

    found = desk.http.get("/v0/training-runs", params={"idempotency_key": "lost-answer"})
    missing = desk.http.get("/v0/training-runs", params={"idempotency_key": "never-used"})

    assert [r["run_id"] for r in found.json()["data"]["runs"]] == [run["run_id"]]
    assert missing.json()["data"]["runs"] == []


def test_reattach_lists_the_bookings_unfinished_run_and_busy_refuses_another(desk_for):
    desk = desk_for("loss-spike")  # holds at a decision, so the run stays unfinished
    run = desk.start(key="first")

    active = desk.http.get(
        "/v0/training-runs", params={"booking_id": run["booking_id"], "active": "true"}
    ).json()["data"]["runs"]
    other = desk.submit(desk.body(target="code assistant"), key="second")

    assert [(r["run_id"], r["manifest_digest"]) for r in active] == [
        (run["run_id"], run["manifest_digest"])
    ]
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "BOOKING_BUSY"


def test_same_manifest_under_a_new_key_is_the_same_submission(desk_for):
    desk = desk_for("loss-spike")
    run = desk.start(key="first")

    again = desk.submit(key="after-restart")

    assert again.status_code == 200
    assert again.json()["data"]["run"]["run_id"] == run["run_id"]
    assert len(desk.sim.runs()) == 1


def test_a_finished_run_frees_the_booking(desk):
    run = desk.finished(desk.start(key="first"))

    second = desk.submit(desk.body(target="code assistant"), key="second")
    active = desk.http.get(
        "/v0/training-runs", params={"booking_id": run["booking_id"], "active": "true"}
    )

    assert run["state"] == "succeeded"
    assert second.status_code == 201
    assert [r["run_id"] for r in active.json()["data"]["runs"]] == [
        second.json()["data"]["run"]["run_id"]
    ]


def test_scaffold_refuses_submission_and_says_not_live(desk_for):
    desk = desk_for(scaffold=True)

    capabilities = desk.http.get("/v0/capabilities").json()["data"]
    response = desk.submit()

    assert capabilities["training_run"]["live"] is False
    assert response.status_code == 501
    assert response.json()["error"]["code"] == "CAPABILITY_NOT_AVAILABLE"
    assert desk.sim.runs() == []


def _raw(desk, content: bytes, key: str | None = "k"):
    headers = {"content-type": "application/json"}
    if key:
        headers[IDEMPOTENCY_HEADER] = key
    return desk.http.post("/v0/training-runs", content=content, headers=headers)


@pytest.mark.parametrize(
    ("change", "status", "code", "field"),
    [
        ({"post_training": "ppo"}, 422, "VALIDATION_ERROR", "post_training"),
        ({"budget_usd": -5}, 422, "VALIDATION_ERROR", "budget_usd"),
        ({"budget_usd": 0}, 422, "VALIDATION_ERROR", "budget_usd"),
        ({"model_size": "huge"}, 422, "VALIDATION_ERROR", "model_size"),
        ({"data_refs": []}, 422, "VALIDATION_ERROR", "data_refs"),
        ({"manifest_digest": "sha256:" + "0" * 64}, 422, "VALIDATION_ERROR", "manifest_digest"),
        ({"booking_id": "bk-nope"}, 404, "BOOKING_NOT_FOUND", None),
        ({"booking_id": "bk-h200-expired"}, 409, "BOOKING_NOT_ELIGIBLE", None),
        ({"booking_id": "bk-h200-pending"}, 409, "BOOKING_NOT_ELIGIBLE", None),
        ({"booking_id": "bk-h200-revoked"}, 409, "BOOKING_NOT_ELIGIBLE", None),
        ({"booking_id": "bk-h200-released"}, 409, "BOOKING_NOT_ELIGIBLE", None),
    ],
)
def test_bad_submissions_get_the_right_envelope(desk, change, status, code, field):
    body = desk.body()
    if "booking_id" in change:
        body = desk.body(**change)  # a consistent digest: only the booking is wrong
    else:
        body.update(change)

    response = desk.submit(body)

    assert response.status_code == status
    envelope = response.json()
    assert envelope["ok"] is False
    assert envelope["live_api_contacted"] is False
    assert envelope["error"]["code"] == code
    assert envelope["error"]["field"] == field
    assert response.headers["X-Request-Id"]
    assert desk.sim.runs() == []


@pytest.mark.parametrize(
    ("content", "key", "field"),
    [
        (b'{"booking_id": ', "k", "body"),
        (b"[1, 2]", "k", None),
        (b"", "k", "body"),
        (b'{"budget_usd": Infinity}', "k", None),
        (b'{"budget_usd": NaN}', "k", None),
        (b"{}", None, "Idempotency-Key"),
    ],
)
def test_malformed_requests_are_validation_errors_not_500(desk, content, key, field):
    response = _raw(desk, content, key)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    if field is not None:
        assert response.json()["error"]["field"] == field


def test_non_finite_budget_is_refused(desk):
    body = desk.body()
    text = desk.http.build_request("POST", "/", json=body).content.decode()
    text = text.replace('"budget_usd":250000.0', '"budget_usd":1e999')

    response = _raw(desk, text.encode())

    assert response.status_code == 422
    assert response.json()["error"]["field"] == "budget_usd"


@pytest.mark.parametrize("authorization", ["", "Bearer not-a-token", "Basic abc"])
def test_missing_or_unknown_token_is_unauthenticated(desk, authorization):
    response = desk.http.get("/v0/capabilities", headers={"Authorization": authorization})

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v0/no-such-route", 404, "NOT_FOUND"),
        ("DELETE", "/v0/capabilities", 404, "NOT_FOUND"),
        ("GET", "/v0/training-runs/run_missing", 404, "RUN_NOT_FOUND"),
        ("GET", "/v0/bookings/bk-nope/training-eligibility", 404, "BOOKING_NOT_FOUND"),
        ("GET", "/v0/training-runs/run_missing?wait=-1&after_version=0", 422, "VALIDATION_ERROR"),
        ("POST", "/v0/training-runs/run_missing/cancel", 404, "RUN_NOT_FOUND"),
    ],
)
def test_unknown_things_get_envelopes(desk, method, path, status, code):
    response = desk.http.request(method, path)

    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_eligibility_reports_the_booking(desk):
    data = desk.http.get(f"/v0/bookings/{desk.body()['booking_id']}/training-eligibility").json()

    assert data["data"]["eligible"] is True
    assert (data["data"]["gpu_sku"], data["data"]["node_count"], data["data"]["gpus_per_node"]) == (
        "H200",
        2,
        8,
    )
    assert data["data"]["fabric"] == "InfiniBand"


def test_a_booking_id_has_the_same_limit_in_the_body_as_in_a_path(desk):
    body = desk.body() | {"booking_id": "b" * 129}  # the digest no longer matters: refused first

    response = desk.submit(body, key="long-id")
    eligibility = desk.http.get(f"/v0/bookings/{'b' * 129}/training-eligibility")

    assert response.status_code == eligibility.status_code == 422
    assert response.json()["error"]["field"] == "booking_id"


def test_another_account_on_a_shared_booking_gets_busy_and_nothing_of_the_run(desk_for):
    # Before: another account's submission of the same manifest got 200, Idempotent-Replayed
    # and the whole run (its id, request, who confirmed it), though reading it answered 404.
    desk = desk_for("loss-spike")  # holds at a decision, so the run stays unfinished
    run = desk.start(key="theirs")
    with desk.person(account="other-account", principal="user:mallory") as other:
        quote = other.post("/v0/training-quotes", json=desk.body()).json()["data"]["quote_id"]
        confirmed = other.post(f"/v0/training-quotes/{quote}/confirmations", json={})
        assert confirmed.status_code == 200, confirmed.text
        answer = other.post(
            "/v0/training-runs",
            json={**desk.body(), "quote_id": quote},
            headers={IDEMPOTENCY_HEADER: "mine"},
        )
        read = other.get(f"/v0/training-runs/{run['run_id']}")

    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "BOOKING_BUSY"
    assert REPLAYED_HEADER not in answer.headers
    assert run["run_id"] not in answer.text and "user:ada" not in answer.text
    assert read.status_code == 404
    assert len(desk.sim.runs()) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target", "chat\u202e"),
        ("data_refs", ["s3://team/\u200bcorpus/"]),
        ("booking_id", "bk-h200-2x8-ib\u2066"),
    ],
)
def test_an_invisible_character_in_what_a_person_confirms_is_refused(desk, field, value):
    # Before: a bidi override or a zero-width space passed, so a quote could read as another.
    quoted = desk.quote({**desk.body(), field: value})

    assert quoted.status_code == 422, quoted.text
    assert quoted.json()["error"]["code"] == "VALIDATION_ERROR"
    assert desk.sim.runs() == []
