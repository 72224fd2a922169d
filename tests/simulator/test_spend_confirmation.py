"""Training quotes and spend confirmations: no new run without a confirmed quote."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from prefect_ito.contract import IDEMPOTENCY_HEADER, TrainingRunRequest
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.pipeline import planned_hours


def error(response):
    return response.status_code, response.json()["error"]["code"], response.json()["error"]["field"]


def test_a_quote_previews_the_plan_and_estimate_and_creates_no_work(desk):
    body = desk.body(post_training="sft")

    response = desk.quote(body)

    assert response.status_code == 201, response.text
    quote = response.json()["data"]
    assert quote["manifest_digest"] == body["manifest_digest"]
    assert quote["booking_id"] == body["booking_id"]
    assert quote["budget_usd"] == body["budget_usd"]
    plan = quote["plan"]
    stages = ["data_prep", "parallelism", "pretrain", "mid_train", "long_context"]
    assert plan["stages"] == [*stages, "post_training.sft"]
    assert (plan["custom_data"], plan["ladder_check"]) == (False, False)
    assert plan["parallelism"]["refused"] is False
    assert plan["parallelism"]["precision"] == "bf16"
    for estimate in ("gpu_hours", "cost_usd", "duration_hours"):
        assert 0 < plan[estimate]["low"] < plan[estimate]["high"]
    # The estimate follows the scenario's own script: 16 GPUs at the script's hourly rate.
    script = builtin_scenario("default").run
    hours = planned_hours(TrainingRunRequest.model_validate(body), script)
    assert plan["duration_hours"]["low"] <= hours <= plan["duration_hours"]["high"]
    assert plan["cost_usd"]["high"] == pytest.approx(
        plan["gpu_hours"]["high"] * script.gpu_hour_usd
    )
    assert quote["within_budget"] is True
    assert quote["ends_before_term"] is True
    assert quote["warnings"] == []
    assert desk.sim.runs() == []


def test_a_quote_says_custom_data_goes_through_the_ladder(desk):
    quote = desk.quote(desk.body(data_refs=["catalog://x", "s3://acme/corpus"])).json()["data"]

    assert (quote["plan"]["custom_data"], quote["plan"]["ladder_check"]) == (True, True)
    assert any("150M ladder" in warning for warning in quote["warnings"])


def test_a_quote_shows_the_backends_refusal_before_anything_runs(desk_for):
    desk = desk_for("refused")

    quote = desk.quote().json()["data"]

    assert quote["plan"]["parallelism"]["refused"] is True
    assert "idle" in quote["plan"]["parallelism"]["reason"]
    assert desk.sim.runs() == []


def test_a_quote_weighs_the_budget_and_the_bookings_term(desk_for):
    scenario = builtin_scenario("budget-exhausted")
    ended = datetime(2026, 1, 1, tzinfo=UTC)
    booking = scenario.bookings[0].model_copy(update={"term_end": ended})
    desk = desk_for(scenario.model_copy(update={"bookings": [booking]}))

    quote = desk.quote().json()["data"]

    assert quote["within_budget"] is False
    assert quote["ends_before_term"] is False
    assert len(quote["warnings"]) == 2


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"booking_id": "bk-unknown"}, (404, "BOOKING_NOT_FOUND", None)),
        ({"booking_id": "bk-h200-pending"}, (409, "BOOKING_NOT_ELIGIBLE", None)),
    ],
)
def test_a_quote_needs_a_booking_that_may_train(desk, changes, expected):
    assert error(desk.quote(desk.body(**changes))) == expected


def test_a_quote_checks_the_digest_and_the_fields(desk):
    wrong_digest = {**desk.body(), "manifest_digest": "sha256:" + "0" * 64}
    bad_budget = {**desk.body(), "budget_usd": -1}

    assert error(desk.quote(wrong_digest)) == (422, "VALIDATION_ERROR", "manifest_digest")
    assert error(desk.quote(bad_budget))[1:] == ("VALIDATION_ERROR", "budget_usd")


def test_a_backend_that_cannot_train_quotes_nothing(desk_for):
    desk = desk_for("unavailable")

    assert error(desk.quote()) == (501, "CAPABILITY_NOT_AVAILABLE", None)


def test_a_backend_without_spend_confirmation_serves_no_quotes(desk_for):
    # Before, the quote was served although Capabilities.spend_confirmation said it was not.
    scenario = builtin_scenario("default").model_copy(update={"spend_confirmation": False})
    desk = desk_for(scenario)

    response = desk.quote()

    assert error(response) == (501, "CAPABILITY_NOT_AVAILABLE", None)
    assert "spend_confirmation" in response.json()["error"]["message"]
    assert desk.http.get("/v0/capabilities").json()["data"]["spend_confirmation"] is False


def test_a_new_run_without_a_quote_is_refused(desk):
    response = desk.submit(confirm=False)

    assert error(response) == (428, "CONFIRMATION_REQUIRED", "quote_id")
    assert desk.sim.runs() == []


def test_a_quote_nobody_confirmed_at_the_backend_makes_no_run(desk):
    quote = desk.quote().json()["data"]

    response = desk.submit({**desk.body(), "quote_id": quote["quote_id"]})

    assert error(response) == (428, "CONFIRMATION_REQUIRED", "quote_id")
    details = response.json()["error"]["details"]
    assert (details["quote_id"], details["user_code"]) == (quote["quote_id"], quote["user_code"])
    assert details["confirm_url"] == quote["confirm_url"]
    assert desk.sim.runs() == []


def test_a_v0_3_client_written_confirmation_gets_a_clear_error_and_no_run(desk):
    quote = desk.quote().json()["data"]
    written = {"quote_id": quote["quote_id"], "confirmed_by": "Ada Lovelace", "via": "person"}

    for body in (
        {**desk.body(), "confirmation": written},
        {**desk.body(), "confirmation": written, "quote_id": quote["quote_id"]},
    ):
        response = desk.submit(body, confirm=False)
        assert error(response) == (400, "CONTRACT_VERSION_UNSUPPORTED", "confirmation")
        assert "ito.training.v0.5" in response.json()["error"]["message"]
    assert desk.sim.runs() == []


def test_only_a_submissions_body_answers_a_v0_3_confirmation_as_an_old_contract(desk):
    # A quote's body is a submission's (v0.3 carried a confirmation there too); a decision's
    # never did, and an unknown member in it is a plain validation error.
    decision = {"decision": "approve", "decided_by": "Ada", "reason": "ok", "confirmation": {}}

    quoted = desk.quote({**desk.body(), "confirmation": {"via": "person"}})
    decided = desk.http.post("/v0/training-runs/run_1/actions/act_1/decision", json=decision)

    assert error(quoted) == (400, "CONTRACT_VERSION_UNSUPPORTED", "confirmation")
    assert error(decided) == (422, "VALIDATION_ERROR", "confirmation")


def test_a_quote_must_be_for_this_very_request(desk):
    other_data = desk.confirmed(desk.body(data_refs=["catalog://other"]))["quote_id"]

    response = desk.submit({**desk.body(), "quote_id": other_data})
    unknown = desk.submit({**desk.body(), "quote_id": "quote_never_made"})

    assert error(response) == (409, "CONFIRMATION_MISMATCH", "manifest_digest")
    assert error(unknown) == (404, "QUOTE_NOT_FOUND", "quote_id")
    assert desk.sim.runs() == []


def test_a_mismatch_names_every_field_that_differs_the_budget_first(desk):
    # Before, a quote for another budget was refused naming only manifest_digest (the budget is
    # part of the manifest, so its digest differs too): nothing said that the budget was at fault.
    other_budget = desk.confirmed(desk.body(budget_usd=1_000.0))["quote_id"]

    response = desk.submit({**desk.body(), "quote_id": other_budget})

    assert error(response) == (409, "CONFIRMATION_MISMATCH", "budget_usd")
    problem = response.json()["error"]
    assert problem["details"] == {"fields": ["budget_usd", "manifest_digest"]}
    assert "budget_usd" in problem["message"]
    assert "1000" in problem["message"].replace(",", "")
    assert desk.sim.runs() == []


def test_another_accounts_quote_confirms_nothing(desk):
    stranger = desk.sim.mint_token("stranger").get_secret_value()
    quoted = desk.http.post(
        "/v0/training-quotes", json=desk.body(), headers={"Authorization": f"Bearer {stranger}"}
    ).json()["data"]

    response = desk.submit({**desk.body(), "quote_id": quoted["quote_id"]})

    assert error(response) == (404, "QUOTE_NOT_FOUND", "quote_id")


def test_an_expired_quote_confirms_nothing(desk_for):
    # Long enough to quote and confirm on a starved machine (0.2 s once expired in between).
    desk = desk_for(builtin_scenario("default").model_copy(update={"quote_ttl_seconds": 1.0}))
    body = desk.confirmed(desk.body())
    time.sleep(1.5)

    response = desk.submit(body)

    assert error(response) == (410, "CONFIRMATION_EXPIRED", "quote_id")
    assert desk.sim.runs() == []


def test_the_run_records_the_person_the_backend_authenticated_and_its_manifest(desk):
    body = desk.confirmed(desk.body(), principal="user:grace")

    run = desk.start(body)

    record = run["confirmation"]
    assert record["quote_id"] == body["quote_id"]
    assert (record["confirmed_by"], record["via"]) == ("user:grace", "person")
    assert record["submitted_by"] == "user:sim-user"
    assert record["confirmed_at"]
    assert run["request"].get("quote_id") is None


def test_one_quote_makes_at_most_one_run_and_the_same_key_still_replays_it(desk):
    body = desk.confirmed(desk.body())
    first = desk.start(body, key="first")
    desk.http.post(f"/v0/training-runs/{first['run_id']}/cancel", json={})

    again = desk.submit(body, key="second")
    replay = desk.submit(body, key="first")

    assert error(again) == (409, "CONFIRMATION_USED", "quote_id")
    assert replay.status_code == 200, replay.text
    assert replay.json()["data"]["run"]["run_id"] == first["run_id"]
    assert [run.run_id for run in desk.sim.runs()] == [first["run_id"]]


def test_the_same_manifest_on_a_busy_booking_stays_the_same_submission(desk_for):
    desk = desk_for("loss-spike")  # holds at a decision, so the run stays unfinished
    body = desk.confirmed(desk.body())
    first = desk.start(body, key="first")

    again = desk.http.post("/v0/training-runs", json=body, headers={IDEMPOTENCY_HEADER: "second"})

    assert again.status_code == 200, again.text
    assert again.json()["data"]["run"]["run_id"] == first["run_id"]
    assert len(desk.sim.runs()) == 1


def test_the_estimate_grows_with_the_model_size(desk):
    # Before, 150M, 8B and 1.5T were quoted the same: the estimate ignored the model size.
    quotes = {
        size: desk.quote(desk.body(model_size=size)).json()["data"]
        for size in ("150M", "8B", "70B", "1.5T")
    }

    for estimate in ("gpu_hours", "cost_usd", "duration_hours"):
        highs = [quote["plan"][estimate]["high"] for quote in quotes.values()]
        assert highs == sorted(highs), estimate
        assert len(set(highs)) == 4, estimate
    # Training hours follow the parameter count (compute is about 6 × parameters × tokens, and
    # the tokens are the script's); data preparation and planning do not.
    script = builtin_scenario("default").run
    fixed = script.data_prep_hours + script.parallelism_hours
    training = {
        size: q["plan"]["duration_hours"]["high"] / 1.3 - fixed for size, q in quotes.items()
    }
    assert training["70B"] / training["8B"] == pytest.approx(70 / 8)
    assert training["1.5T"] / training["8B"] == pytest.approx(1500 / 8)
    assert quotes["8B"]["within_budget"] is True  # 250,000 USD covers the 8B run
    assert quotes["70B"]["within_budget"] is False
    assert quotes["1.5T"]["ends_before_term"] is False
    assert len(quotes["1.5T"]["warnings"]) == 2


def test_a_run_takes_as_long_as_its_model_size_needs(desk):
    run = desk.finished(desk.start(desk.body(model_size="150M")))

    assert run["state"] == "succeeded"
    pretrain = next(stage for stage in run["stages"] if stage["name"] == "pretrain")
    took = datetime.fromisoformat(pretrain["finished_at"]) - datetime.fromisoformat(
        pretrain["started_at"]
    )
    hours = builtin_scenario("default").run.curriculum[0].hours
    assert took.total_seconds() / 3600 == pytest.approx(hours * 0.15 / 8, rel=1e-3)


def test_a_model_too_large_for_any_term_is_quoted_not_refused_with_a_500(desk):
    quote = desk.quote(desk.body(model_size="9999.99T"))

    assert quote.status_code == 201, quote.text
    assert quote.json()["data"]["ends_before_term"] is False
