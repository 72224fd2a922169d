"""The live forecast, judged against simulated runs whose end is known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from ito_fakes import FakeClock
from spend_helpers import confirmed_on

from prefect_ito.contract import DecisionRequest, RunState, TrainingRequest, TrainingRun
from prefect_ito.reporting.cards import telemetry_markdown
from prefect_ito.reporting.forecast import forecast
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.engine import Engine

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def played(scenario: str, budget_usd: float = 250_000.0) -> list[TrainingRun]:
    """Play one run of ``scenario`` to its end, approving every restart; return each version."""
    clock = FakeClock()
    engine = Engine(builtin_scenario(scenario).model_copy(update={"start_at": START}), clock)
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://ito/web"],
        target="chat", budget_usd=budget_usd,
    ).to_submission()  # fmt: skip
    run = engine.submit("acct", "key-1", confirmed_on(engine, "acct", request)).run
    versions = {run.version: run}
    while not run.finished:
        clock.now += 0.02
        run = engine.record("acct", run.run_id).snapshot()
        versions[run.version] = run
        if run.pending_action is not None:
            body = DecisionRequest(decision="approve", decided_by="Ada", reason="a blip")
            action_id = run.pending_action.action_id
            run = engine.decide("acct", run.run_id, action_id, body, None, principal="user:a")
            versions[run.version] = run
    return [versions[v] for v in sorted(versions)]


def test_the_band_at_half_way_holds_the_final_spend_of_a_run_with_a_restart():
    # demo: two interruptions and a restart that redoes part of pretrain.
    runs = played("demo")
    final = runs[-1]
    assert final.state is RunState.SUCCEEDED and final.telemetry.progress == 1.0
    half = next(r for r in runs if (r.telemetry.progress or 0) >= 0.5)

    found = forecast(half)

    assert found is not None
    assert found.low_usd <= final.telemetry.spend_usd <= found.high_usd
    assert not found.at_risk
    took = (final.updated_at - half.updated_at).total_seconds()
    assert found.seconds_left * 0.8 <= took <= found.seconds_left_high


def test_a_run_well_within_its_budget_is_never_at_risk():
    runs = played("default")

    forecasts = [found for run in runs if (found := forecast(run)) is not None]

    assert len(forecasts) > 5
    assert not any(found.at_risk for found in forecasts)


def test_a_run_that_will_exhaust_its_budget_is_at_risk_long_before_it_does():
    # The default 8B run costs about $25,900; a ceiling of $15,000 stops it in pretrain.
    runs = played("default", budget_usd=15_000.0)
    assert runs[-1].state is RunState.BUDGET_EXHAUSTED

    first = next(run for run in runs if (found := forecast(run)) is not None and found.at_risk)

    assert first.telemetry.spend_usd < 0.1 * 15_000
    assert first.updated_at < runs[-1].updated_at


def test_no_forecast_without_the_backend_s_progress_or_for_a_finished_run():
    runs = played("default")
    started = next(run for run in runs if (run.telemetry.progress or 0) > 0.1)
    older = started.model_copy(
        update={"telemetry": started.telemetry.model_copy(update={"progress": None})}
    )

    assert forecast(older) is None
    assert forecast(runs[-1]) is None
    assert forecast(runs[0]) is None  # nothing spent, nothing done yet


def test_the_telemetry_card_says_the_forecast():
    runs = played("default")
    half = next(r for r in runs if (r.telemetry.progress or 0) >= 0.5)

    card = telemetry_markdown(half)

    assert "forecast: $" in card and "at completion of $250,000 budget, ~" in card
    assert "days to finish" in card


def test_the_sentence_rounds_and_says_days():
    runs = played("default")
    half = next(r for r in runs if (r.telemetry.progress or 0) >= 0.5)
    found = forecast(half)
    assert found is not None

    sentence = found.sentence()

    assert sentence.startswith("forecast: $")
    low, high = (int(x.lstrip("$").replace(",", "")) for x in sentence.split()[1].split("–"))
    assert low == pytest.approx(found.low_usd, rel=0.01) and low % 100 == 0
    assert high == pytest.approx(found.high_usd, rel=0.01)
    assert found.seconds_left > timedelta(days=2).total_seconds()
