"""The ``ito.training.budget.at_risk`` event: sent once, before a run exhausts its budget, and
never for a run well within it. A real Prefect server and the simulator on loopback."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from flow_helpers import parameters, prefect_events

from prefect_ito.flows import ito_training
from prefect_ito.reporting.report import BUDGET_AT_RISK
from prefect_ito.simulator import builtin_scenario

SCALE = 100_000.0
"""Slow enough that the flow reads the run a few times before its ceiling (about 10 s in)."""


def all_of(wanted: set[str]) -> Callable[[list[dict[str, Any]]], bool]:
    """Tell, of Prefect's events, whether every one of ``wanted`` is there."""
    return lambda events: wanted <= {event["event"] for event in events}


async def test_a_run_that_will_exhaust_its_budget_is_flagged_before_it_does(start_simulator):
    # The default 8B run costs about $25,900; a ceiling of $15,000 stops it in pretrain.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SCALE))

    state = await ito_training(**parameters(simulator, budget_usd=15_000.0), return_state=True)

    assert state.name == "BudgetExhausted", state.message
    run_id = simulator.runs()[0].run.run_id
    events = await prefect_events(run_id, all_of({BUDGET_AT_RISK, "ito.training.finished"}))
    (at_risk,) = [e for e in events if e["event"] == BUDGET_AT_RISK]
    (finished,) = [e for e in events if e["event"] == "ito.training.finished"]
    payload = at_risk["payload"]
    assert payload["budget_usd"] == 15_000.0
    assert isinstance(payload["forecast_low_usd"], float)
    assert payload["forecast_low_usd"] <= payload["forecast_median_usd"]
    assert payload["forecast_median_usd"] > 15_000.0
    assert payload["forecast_median_usd"] <= payload["forecast_high_usd"]
    # Raised before the end: at a spend short of the ceiling, at an earlier backend time, and
    # sent before the run's end was relayed.
    assert payload["spend_usd"] < 15_000.0
    assert datetime.fromisoformat(payload["backend_at"]) < datetime.fromisoformat(
        finished["payload"]["backend_at"]
    )
    assert at_risk["occurred"] < finished["occurred"]


async def test_a_run_well_within_its_budget_is_never_flagged(start_simulator):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SCALE))

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    run_id = simulator.runs()[0].run.run_id
    events = await prefect_events(run_id, all_of({"ito.training.finished"}))
    names = [e["event"] for e in events]
    assert "ito.training.finished" in names
    assert BUDGET_AT_RISK not in names
