"""What a wait for a person costs, said in one sentence."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pytest

from prefect_ito.contract import PendingAction
from prefect_ito.reporting.holding import Held, held, held_for

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "usd", "sentence"),
    [
        (2 * 3600 + 14 * 60, 1_349.6, "held 2 h 14 min: about $1,350 of GPU time"),
        (14 * 60 + 59, 13.2, "held 14 min: about $13 of GPU time"),
        (20, 0.3, "held under 1 min: under $1 of GPU time"),
        (3 * 86_400 + 2 * 3600, 123_456.0, "held 3 d 2 h: about $123,000 of GPU time"),
        (3600, 456.4, "held 1 h 0 min: about $456 of GPU time"),
    ],
)
def test_the_sentence_rounds_as_a_person_would(seconds, usd, sentence):
    assert Held(seconds=seconds, usd=usd).sentence() == sentence


def test_held_counts_the_hours_at_the_rate():
    found = held(NOW - timedelta(hours=2, minutes=30), 56.0, now=NOW)

    assert found == Held(seconds=9_000.0, usd=140.0)


def test_a_hold_dated_in_the_future_counts_as_none():
    assert held(NOW + timedelta(minutes=5), 56.0, now=NOW) == Held(seconds=0.0, usd=0.0)


def _action(**fields):
    return PendingAction(
        action_id="act_1", kind="loss_spike_restart", stage="pretrain", step=10, loss=9.0,
        baseline_loss=3.0, proposed_checkpoint={"checkpoint_id": "c", "step": 5},
        proposed_at=NOW, **fields,
    )  # fmt: skip


def test_held_for_an_action_the_backend_priced():
    action = _action(held_since=NOW - timedelta(hours=1), hold_usd_per_hour=56.0)

    assert held_for(action, now=NOW) == Held(seconds=3600.0, usd=56.0)


@pytest.mark.parametrize(
    "fields",
    [{}, {"held_since": NOW}, {"hold_usd_per_hour": 56.0}],
    ids=["neither", "since", "rate"],
)
def test_held_for_is_none_when_the_backend_did_not_say(fields):
    assert held_for(_action(**fields), now=NOW) is None


@pytest.mark.slow
def test_the_module_imports_no_prefect():
    # The command line imports it without Prefect; a subprocess sees a clean import.
    import subprocess

    code = "import sys, prefect_ito.reporting.holding; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_cards_of_a_held_run_say_what_the_hold_costs(desk_for_held_run):
    from prefect_ito.reporting.cards import decisions_markdown, hold_cost, telemetry_markdown

    run = desk_for_held_run
    line = hold_cost(run, now=run.pending_action.held_since + timedelta(hours=2, minutes=14))

    assert line is not None
    assert line.startswith("held 2 h 14 min: about $125 of GPU time as of ")
    assert "($56 an hour while nobody decides)" in line
    assert "of GPU time as of" in decisions_markdown(run)
    assert "of GPU time as of" in telemetry_markdown(run)


def test_no_hold_cost_from_a_backend_that_does_not_say(desk_for_held_run):
    from prefect_ito.reporting.cards import hold_cost

    action = desk_for_held_run.pending_action.model_copy(update={"held_since": None})

    assert hold_cost(desk_for_held_run.model_copy(update={"pending_action": action})) is None


@pytest.fixture
def desk_for_held_run():
    from spend_helpers import confirmed_on

    from prefect_ito.contract import TrainingRequest
    from prefect_ito.simulator import builtin_scenario
    from prefect_ito.simulator.engine import Engine

    clock = [1_000.0]
    engine = Engine(builtin_scenario("loss-spike"), clock=lambda: clock[0])
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://ito/web"],
        target="chat", budget_usd=250_000.0,
    ).to_submission()  # fmt: skip
    run = engine.submit("acct", "key-1", confirmed_on(engine, "acct", request)).run
    clock[0] += 10
    held = engine.record("acct", run.run_id).snapshot()
    assert held.pending_action is not None
    return held
