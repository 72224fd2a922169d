"""The simulator's ticker catches up only the runs that changed: with thousands of runs in one
step for hours, a tick drove each of them every 20 ms and took a core of its own."""

from __future__ import annotations

from datetime import UTC, datetime

from ito_fakes import FakeClock
from spend_helpers import confirmed_on

from prefect_ito.contract import TrainingRequest
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.builtins import SECOND_COMPLETED_BOOKING
from prefect_ito.simulator.engine import Engine

BOOKINGS = ("bk-h200-2x8-ib", SECOND_COMPLETED_BOOKING)


def test_a_tick_drives_only_the_runs_whose_step_ended_and_the_feed_still_names_them(
    monkeypatch,
):
    clock = FakeClock()
    scenario = builtin_scenario("default").model_copy(
        update={"start_at": datetime(2026, 12, 1, tzinfo=UTC), "time_scale": 1.0}
    )
    engine = Engine(scenario, clock=clock)
    for i, booking in enumerate(BOOKINGS):
        request = TrainingRequest(
            booking_id=booking, model_size="8B", data_refs=["catalog://ito/web"],
            target="chat", budget_usd=250_000.0,
        ).to_submission()  # fmt: skip
        engine.submit("acct", f"key-{i}", confirmed_on(engine, "acct", request))
    driven: list[str] = []
    drive = engine._drive

    def counted(rec, now):
        driven.append(rec.run_id)
        drive(rec, now)

    monkeypatch.setattr(engine, "_drive", counted)
    engine.advance_changes()  # each run once: when its step ends is not known yet
    cursor = engine.changes("acct", None).cursor
    versions = {run_id: rec.version for run_id, rec in engine.runs.items()}
    driven.clear()

    clock.now += 1.0  # a second into steps that last hours
    engine.advance_changes()
    assert driven == []
    assert engine.changes("acct", cursor).changes == []

    clock.now += 7 * 3600  # past data preparation (six hours) and the next step
    engine.advance_changes()
    assert sorted(driven) == sorted(engine.runs)
    moved = {change.run_id for change in engine.changes("acct", cursor).changes}
    assert moved == set(engine.runs)
    assert all(rec.version > versions[run_id] for run_id, rec in engine.runs.items())
