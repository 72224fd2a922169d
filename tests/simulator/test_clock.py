"""The simulator's timestamps stay plausible however long after the scenario loads a run starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from ito_fakes import FakeClock
from spend_helpers import confirmed_on

from prefect_ito.contract import DecisionRequest, RunState, TrainingRequest
from prefect_ito.simulator import Scenario, builtin_scenario
from prefect_ito.simulator.engine import Engine
from prefect_ito.simulator.runs import RunRecord

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def submit(engine: Engine):
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://ito/web"],
        target="chat", budget_usd=250_000.0,
    ).to_submission()  # fmt: skip
    return engine.submit("acct", "key-1", confirmed_on(engine, "acct", request)).run


class Held(NamedTuple):
    """A run of a built-in scenario some real seconds after its submission: held, if it asks."""

    clock: FakeClock
    scenario: Scenario
    engine: Engine
    run: Any
    record: RunRecord


def held_after(name: str, seconds: float) -> Held:
    """Submit a run of the scenario ``name`` loaded at :data:`START`; let ``seconds`` pass."""
    clock = FakeClock()
    scenario = builtin_scenario(name).model_copy(update={"start_at": START})
    engine = Engine(scenario, clock=clock)
    run = submit(engine)
    clock.now += seconds
    engine.advance()
    (record,) = engine.runs.values()
    return Held(clock, scenario, engine, run, record)


def test_a_run_submitted_long_after_the_load_is_dated_when_it_was_submitted():
    # Before, the scaled clock ran from the load: 750 real seconds at the default scale dated a
    # new run, and its spike's "proposed at", about nine and a half years ahead.
    clock = FakeClock()
    scenario = builtin_scenario("loss-spike").model_copy(update={"start_at": START})
    engine = Engine(scenario, clock=clock)
    clock.now += 750

    run = submit(engine)

    assert run.created_at == START + timedelta(seconds=750)
    clock.now += 10  # four million simulated seconds: past the spike at 60 % of pretrain
    engine.advance()
    (record,) = engine.runs.values()
    assert record.state is RunState.AWAITING_DECISION
    action = record.pending_action
    assert action is not None
    assert timedelta(days=1) < action.proposed_at - run.created_at < timedelta(days=30)


def test_without_a_start_the_clock_is_anchored_at_the_real_time_of_the_load():
    scenario = builtin_scenario("default")
    assert scenario.start_at is None
    before = datetime.now(UTC)
    engine = Engine(scenario)

    run = submit(engine)

    assert before <= run.created_at <= datetime.now(UTC) + timedelta(seconds=5)


def test_a_person_s_wait_passes_in_real_time_and_later_events_follow_on():
    # Before, the wait for a decision ran on the scaled clock: ten real minutes dated the
    # decision, and everything after it, seven and a half years after the proposal.
    clock, _scenario, engine, run, record = held_after("loss-spike", 10)
    action = record.pending_action
    assert action is not None

    clock.now += 600  # a person takes ten minutes
    body = DecisionRequest(decision="approve", decided_by="Ada", reason="blip")
    decided = engine.decide("acct", run.run_id, action.action_id, body, None, principal="user:acct")

    (decision,) = decided.decisions
    assert action.held_since is not None
    assert timedelta(minutes=9) < decision.decided_at - action.held_since < timedelta(minutes=11)
    clock.now += 10
    engine.advance()
    done = record.snapshot()
    assert done.state is RunState.SUCCEEDED
    assert done.updated_at - decision.decided_at < timedelta(days=60)
    events = [event.at for event in record.events]
    assert events == sorted(events)


def test_the_heartbeat_keeps_going_at_the_real_rate_while_a_run_waits():
    clock, _scenario, engine, _run, record = held_after("loss-spike", 10)
    before = record.snapshot()

    clock.now += 30
    engine.advance()
    after = record.snapshot()

    assert after.version == before.version  # no progress while it waits
    assert timedelta(seconds=29) < after.heartbeat_at - before.heartbeat_at < timedelta(seconds=31)


def test_runs_are_dated_when_created_and_listed_in_that_order(desk):
    # Before, a new run's created_at came from two reads of the scaled clock: the microseconds
    # between them, times the time scale, dated it seconds after the answer, with jitter, so a
    # list (oldest first) was not in created_at order.
    answered = []
    for n in range(5):
        run = desk.start(desk.body(budget_usd=250_000.0 + n), key=f"key-{n}")
        answered.append(datetime.now(UTC))
        desk.http.post(f"/v0/training-runs/{run['run_id']}/cancel", json={})
        assert datetime.fromisoformat(run["created_at"]) <= answered[-1]

    runs = desk.http.get("/v0/training-runs").json()["data"]["runs"]

    created = [datetime.fromisoformat(run["created_at"]) for run in runs]
    assert len(created) == 5
    assert created == sorted(created)
    assert all(at <= answer for at, answer in zip(created, answered, strict=True))


def test_a_decision_and_the_hold_before_it_are_dated_by_the_wall_clock():
    # Before, decided_at came from the run's scaled clock: a restart decided on 2026-12-01
    # said "decided at 2026-12-10". People wait and decide in real time.
    # The spike came some real seconds into these ten.
    clock, _scenario, engine, run, record = held_after("loss-spike", 10)
    action = record.pending_action
    assert action is not None
    assert START < action.held_since < START + timedelta(seconds=10)

    clock.now += 3600
    body = DecisionRequest(decision="reject", decided_by="Ada", reason="noise")
    decided = engine.decide("acct", run.run_id, action.action_id, body, None, principal="user:acct")

    (decision,) = decided.decisions
    assert decision.decided_at == START + timedelta(seconds=3610)


def test_a_held_run_says_what_its_gpus_cost_an_hour():
    scenario = builtin_scenario("loss-spike")
    engine = Engine(scenario, clock=FakeClock())
    submit(engine)
    engine._clock.now += 10  # type: ignore[attr-defined]
    engine.advance()
    (record,) = engine.runs.values()
    action = record.pending_action
    assert action is not None

    booking = engine.bookings["bk-h200-2x8-ib"]
    assert action.hold_usd_per_hour == booking.gpus * scenario.run.gpu_hour_usd
    assert action.hold_usd_per_hour > 0


def test_a_deadline_extension_names_deadlines_on_the_wall_clock():
    # Before, deadline_at was the run's scaled clock: a deadline reached some real seconds into
    # the run read as days later. A deadline is a wall-clock one (docs/contract.md).
    _clock, scenario, _engine, _run, record = held_after("deadline-extension", 60)
    action = record.pending_action
    assert action is not None and action.kind == "deadline_extension"
    assert action.deadline_at == action.held_since
    assert START < action.deadline_at < START + timedelta(seconds=60)
    extension = action.proposed_deadline_at - action.deadline_at
    assert extension == timedelta(hours=scenario.run.deadline_extensions[0].extend_hours)
