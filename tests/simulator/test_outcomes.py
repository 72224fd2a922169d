"""Every scenario outcome is reachable and reported with its code and stage."""

from __future__ import annotations

from prefect_ito.contract import RunState, TrainingRun


def _stages(run):
    return {stage["name"]: stage["status"] for stage in run["stages"]}


def test_default_run_passes_every_stage_of_its_plan(desk):
    run = desk.finished(desk.start(desk.body(post_training="rlvr")))

    parsed = TrainingRun.model_validate(run)
    assert parsed.state is RunState.SUCCEEDED
    assert parsed.outcome is None
    assert [s.name for s in parsed.stages] == [
        "data_prep",
        "parallelism",
        "pretrain",
        "mid_train",
        "long_context",
        "post_training.sft",
        "post_training.dpo",
        "post_training.rlvr",
    ]
    assert set(_stages(run).values()) == {"passed"}
    assert all(s.gate.status == "passed" for s in parsed.stages[2:] if s.gate)
    rlvr = parsed.stages[-1].details.rlvr
    assert rlvr is not None
    assert (rlvr.algorithm, rlvr.stability_fixes) == ("GRPO", ["DAPO"])
    prep = parsed.stages[0].details.data_prep
    assert prep is not None
    assert prep.manifest_digest == run["manifest_digest"]
    assert prep.custom_data is False
    assert prep.ladder is None
    plan = parsed.stages[1].details.parallelism
    assert plan is not None
    assert plan.data * plan.tensor * plan.pipeline == 16
    assert parsed.fault_tolerance.checkpoints
    assert 0 < parsed.telemetry.spend_usd <= parsed.telemetry.budget_usd
    assert parsed.telemetry.tokens_processed > 0
    assert parsed.telemetry.loss_history


def test_post_training_recipe_sets_the_plan(desk):
    run = desk.start(desk.body(post_training="dpo"))

    assert [s["name"] for s in run["stages"]][-2:] == ["post_training.sft", "post_training.dpo"]


def test_gate_failure_stops_the_run_and_leaves_later_stages_pending(desk_for):
    desk = desk_for("gate-failure")
    run = desk.finished(desk.start())

    assert run["state"] == "gate_failed"
    assert run["outcome"]["code"] == "GATE_FAILED"
    assert run["outcome"]["stage"] == "mid_train"
    stages = _stages(run)
    assert (stages["pretrain"], stages["mid_train"], stages["long_context"]) == (
        "passed",
        "failed",
        "pending",
    )
    gate = next(s["gate"] for s in run["stages"] if s["name"] == "mid_train")
    assert gate["status"] == "failed"
    assert [e["name"] for e in gate["evals"] if not e["passed"]] == ["gsm8k"]


def test_wasteful_parallelism_is_refused(desk_for):
    desk = desk_for("refused")
    run = desk.finished(desk.start())

    assert run["state"] == "refused"
    assert run["outcome"]["code"] == "PARALLELISM_REFUSED"
    assert run["outcome"]["stage"] == "parallelism"
    plan = run["stages"][1]["details"]["parallelism"]
    assert plan["refused"] is True
    assert plan["reason"]


def test_ladder_rejects_custom_data(desk_for):
    desk = desk_for("ladder-rejection")
    run = desk.finished(desk.start(desk.body(data_refs=["s3://team/corpus.jsonl"])))

    assert run["state"] == "refused"
    assert run["outcome"]["code"] == "LADDER_REJECTED"
    assert run["outcome"]["stage"] == "data_prep"
    prep = run["stages"][0]["details"]["data_prep"]
    assert prep["custom_data"] is True
    assert prep["ladder"]["accepted"] is False


def test_ladder_is_not_consulted_for_catalog_data(desk_for):
    desk = desk_for("ladder-rejection")
    run = desk.wait_for(desk.start(), lambda r: r["current_stage"] not in (None, "data_prep"))

    assert run["stages"][0]["status"] == "passed"
    assert run["stages"][0]["details"]["data_prep"]["ladder"] is None


def test_budget_exhaustion_stops_the_run_at_the_ceiling(desk_for):
    desk = desk_for("budget-exhausted")
    run = desk.finished(desk.start())

    assert run["state"] == "budget_exhausted"
    assert run["outcome"]["code"] == "BUDGET_EXHAUSTED"
    assert run["outcome"]["stage"] is not None
    assert run["telemetry"]["spend_usd"] == run["telemetry"]["budget_usd"]


def test_stall_stops_progress_and_heartbeat(desk_for):
    desk = desk_for("stall")
    run = desk.wait_for(desk.start(), lambda r: r["telemetry"]["step"] > 0)
    run = desk.wait_for(run, lambda r: r["heartbeat_at"] == desk.run(r["run_id"])["heartbeat_at"])

    later = desk.run(run["run_id"], after_version=run["version"], wait=0.5)

    assert later["state"] == "running"
    assert later["version"] == run["version"]
    assert later["heartbeat_at"] == run["heartbeat_at"]
    assert later["telemetry"]["step"] == run["telemetry"]["step"]


def test_interruptions_are_reported_with_detect_and_resume_times(desk_for):
    desk = desk_for("interruptions")
    run = desk.finished(desk.start())

    interruptions = run["fault_tolerance"]["interruptions"]
    events = desk.http.get(f"/v0/training-runs/{run['run_id']}/events").json()["data"]["events"]
    kinds = [e["type"] for e in events]
    assert run["state"] == "succeeded"
    assert [i["stage"] for i in interruptions] == ["pretrain", "pretrain", "mid_train"]
    assert all(i["resume_seconds"] is not None for i in interruptions)
    assert kinds.count("interruption_detected") == 3
    assert run["telemetry"]["goodput"] < 1
    assert run["telemetry"]["interruption_rate_per_day"] > 0


def test_event_log_reads_on_from_a_sequence_number(desk):
    run = desk.finished(desk.start())
    url = f"/v0/training-runs/{run['run_id']}/events"

    page = desk.http.get(url).json()["data"]
    rest = desk.http.get(url, params={"after": 3}).json()["data"]

    assert [e["seq"] for e in page["events"]] == list(range(1, page["last_seq"] + 1))
    assert page["events"][0]["type"] == "run_accepted"
    assert page["events"][-1]["type"] == "run_finished"
    assert rest["events"] == page["events"][3:]
    assert rest["last_seq"] == page["last_seq"]


def test_per_booking_overrides_run_side_by_side(desk_for):
    from prefect_ito.simulator import builtin_scenario

    failing = builtin_scenario("gate-failure").run.model_dump()["curriculum"]
    scenario = builtin_scenario("default").model_copy(
        update={"booking_overrides": {"bk-h100-1x8-ib": {"curriculum": failing}}}
    )
    desk = desk_for(scenario)

    good = desk.start(key="a")
    bad = desk.start(desk.body(booking_id="bk-h100-1x8-ib"), key="b")

    assert desk.finished(good)["state"] == "succeeded"
    assert desk.finished(bad)["state"] == "gate_failed"
