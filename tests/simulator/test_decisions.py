"""Loss spikes hold the run for a decision; decisions and cancels are repeat-safe."""

from __future__ import annotations

import pytest

from prefect_ito.simulator import builtin_scenario


def _awaiting(desk, scenario="loss-spike"):
    return desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")


@pytest.fixture
def spiked(desk_for):
    desk = desk_for("loss-spike")
    return desk, _awaiting(desk)


def test_loss_spike_waits_with_a_pending_action(spiked):
    _, run = spiked

    action = run["pending_action"]
    assert action["kind"] == "loss_spike_restart"
    assert action["stage"] == "pretrain"
    assert action["loss"] > action["baseline_loss"]
    assert action["proposed_checkpoint"]["step"] <= action["step"]
    assert run["outcome"] is None


def test_the_spike_is_in_the_loss_history_and_an_approval_steps_back_from_it(spiked):
    # Before, the spike's reading never reached the history, so no chart could show it.
    desk, run = spiked
    action = run["pending_action"]
    spike = {"step": action["step"], "loss": action["loss"]}
    assert run["telemetry"]["loss_history"][-1] == spike

    done = desk.finished(desk.decide(run, "approve").json()["data"])

    history = done["telemetry"]["loss_history"]
    at = history.index(spike)
    assert history[at + 1]["step"] == action["proposed_checkpoint"]["step"]


def test_progress_freezes_while_waiting_but_heartbeat_goes_on(spiked):
    desk, run = spiked

    later = desk.run(run["run_id"], after_version=run["version"], wait=0.3)

    assert later["version"] == run["version"]
    assert later["telemetry"]["step"] == run["telemetry"]["step"]
    assert later["heartbeat_at"] > run["heartbeat_at"]


def test_approve_restarts_from_the_checkpoint_and_goes_on(spiked):
    desk, run = spiked
    checkpoint = run["pending_action"]["proposed_checkpoint"]

    answer = desk.decide(run, "approve")
    done = desk.finished(answer.json()["data"])

    assert answer.status_code == 200
    assert done["state"] == "succeeded"
    assert [d["decision"] for d in done["decisions"]] == ["approve"]
    events = desk.http.get(f"/v0/training-runs/{run['run_id']}/events").json()["data"]["events"]
    kinds = [e["type"] for e in events]
    spike = kinds.index("loss_spike_detected")
    assert kinds[spike + 1 : spike + 3] == ["decision_recorded", "resumed"]
    steps = [p["step"] for p in done["telemetry"]["loss_history"]]
    assert checkpoint["step"] in steps


def test_reject_goes_on_without_restart(spiked):
    desk, run = spiked

    done = desk.finished(desk.decide(run, "reject").json()["data"])

    events = desk.http.get(f"/v0/training-runs/{run['run_id']}/events").json()["data"]["events"]
    kinds = [e["type"] for e in events]
    spike = kinds.index("loss_spike_detected")
    assert done["state"] == "succeeded"
    assert kinds[spike + 1] == "decision_recorded"
    assert "resumed" not in kinds


def test_same_decision_twice_is_idempotent_and_a_conflicting_one_is_refused(spiked):
    desk, run = spiked

    first = desk.decide(run, "approve", **{"Idempotency-Key": "d1"})
    repeat = desk.decide(run, "approve", **{"Idempotency-Key": "d1"})
    conflict = desk.decide(run, "reject")

    assert first.status_code == repeat.status_code == 200
    assert len(repeat.json()["data"]["decisions"]) == 1
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "DECISION_CONFLICT"


def test_decision_on_no_pending_action_is_refused(spiked):
    desk, run = spiked
    url = f"/v0/training-runs/{run['run_id']}/actions/act_other/decision"

    response = desk.http.post(url, json={"decision": "approve", "decided_by": "A", "reason": "r"})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "ACTION_NOT_PENDING"


def test_two_spikes_each_wait_for_a_decision(desk_for):
    desk = desk_for("two-spikes")
    first = _awaiting(desk)
    after = desk.decide(first, "reject").json()["data"]
    second = desk.wait_for(after, lambda r: r["state"] == "awaiting_decision")

    assert second["pending_action"]["stage"] == "mid_train"
    assert desk.finished(desk.decide(second, "approve").json()["data"])["state"] == "succeeded"


def test_cancel_is_idempotent_and_leaves_the_booking_alone(spiked):
    desk, run = spiked
    url = f"/v0/training-runs/{run['run_id']}/cancel"

    first = desk.http.post(url, json={"reason": "not needed"}, headers={"Idempotency-Key": "c1"})
    again = desk.http.post(url, json={"reason": "not needed"}, headers={"Idempotency-Key": "c1"})
    eligibility = desk.http.get(f"/v0/bookings/{run['booking_id']}/training-eligibility")

    cancelled = first.json()["data"]
    assert cancelled["state"] == "cancelled"
    assert cancelled["outcome"] == {
        "code": "CANCELLED",
        "message": "not needed",
        "stage": "pretrain",
    }
    assert cancelled["pending_action"] is None
    assert again.json()["data"]["version"] == cancelled["version"]
    assert eligibility.json()["data"]["eligible"] is True
    assert eligibility.json()["data"]["status"] == "completed"


def test_cancel_of_a_finished_run_returns_it_unchanged(desk):
    run = desk.finished(desk.start())

    response = desk.http.post(f"/v0/training-runs/{run['run_id']}/cancel")

    assert response.status_code == 200
    assert response.json()["data"] == run


def test_reusing_a_cancel_key_for_another_body_is_refused(spiked):
    desk, run = spiked
    url = f"/v0/training-runs/{run['run_id']}/cancel"
    desk.http.post(url, json={"reason": "one"}, headers={"Idempotency-Key": "c1"})

    response = desk.http.post(url, json={"reason": "two"}, headers={"Idempotency-Key": "c1"})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"


def test_a_cancel_that_takes_time_passes_through_cancelling(desk_for):
    scenario = builtin_scenario("loss-spike")
    slow = scenario.model_copy(
        # About 0.6 real seconds at the tests' time scale (simulator_fixture.FAST).
        update={"run": scenario.run.model_copy(update={"cancel_seconds": 2_400_000})}
    )
    desk = desk_for(slow)
    run = _awaiting(desk)
    url = f"/v0/training-runs/{run['run_id']}/cancel"

    cancelling = desk.http.post(url, json={"reason": "not needed"}).json()["data"]
    active = desk.http.get(
        "/v0/training-runs", params={"booking_id": run["booking_id"], "active": "true"}
    ).json()["data"]["runs"]
    decision = desk.decide(run, "approve")
    again = desk.http.post(url, json={"reason": "not needed"}).json()["data"]
    cancelled = desk.wait_for(cancelling, lambda r: r["state"] != "cancelling")

    assert (cancelling["state"], cancelling["terminal"]) == ("cancelling", False)
    assert cancelling["pending_action"] is None and cancelling["outcome"] is None
    assert [r["run_id"] for r in active] == [run["run_id"]]  # still holds the booking
    assert decision.json()["error"]["code"] == "ACTION_NOT_PENDING"
    assert again["state"] == "cancelling"  # a second cancel changes nothing
    assert (cancelled["state"], cancelled["terminal"]) == ("cancelled", True)
    assert cancelled["outcome"]["code"] == "CANCELLED"
    assert {s["status"] for s in cancelled["stages"]} <= {"passed", "pending", "cancelled"}
    events = desk.http.get(f"{url[: -len('/cancel')]}/events").json()["data"]["events"]
    assert [e["type"] for e in events][-2:] == ["cancel_requested", "run_finished"]
