"""Every final state of ``ito-training``, against a real Prefect server and the simulator."""

from __future__ import annotations

from typing import Any

import pytest
from flow_helpers import parameters
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from prefect_ito.contract import RunState, StageStatus
from prefect_ito.flows import ito_training
from prefect_ito.reporting.report import TrainingSummary, artifact_key
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.envelopes import NOTICE


async def run_flow(params: dict[str, Any]) -> Any:
    return await ito_training(**params, return_state=True)


def posts(simulator: Any) -> list[Any]:
    return [entry for entry in simulator.requests() if entry.method == "POST"]


def only_run(simulator: Any) -> Any:
    runs = simulator.runs()
    assert len(runs) == 1
    return runs[0].run


async def test_success_completes_with_a_summary_and_artifacts(start_simulator):
    simulator = start_simulator("default")
    state = await run_flow(parameters(simulator, post_training="rlvr"))

    assert state.is_completed(), state.message
    summary = await state.aresult()
    assert isinstance(summary, TrainingSummary)
    run = only_run(simulator)
    assert summary.run_id == run.run_id
    assert summary.state is RunState.SUCCEEDED
    assert [stage.name for stage in summary.stages] == [stage.name for stage in run.stages]
    assert "post_training.rlvr" in [stage.name for stage in summary.stages]
    assert summary.gates and all(row["pass"] for row in summary.gates)
    # Where the answers came from: the simulator, which says so.
    assert (summary.live_api_contacted, summary.notice) == (False, NOTICE)
    assert summary.api_url is not None and summary.api_url.rstrip("/") == simulator.url

    async with get_client() as client:
        keys = [artifact_key(run.run_id, kind) for kind in ("progress", "gates", "telemetry")]
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys))
        )
    latest = {artifact.key: artifact for artifact in artifacts}
    assert set(latest) == set(keys)
    progress = [a for a in artifacts if a.key == keys[0]]
    assert max(float(a.data) for a in progress) == pytest.approx(100.0)
    telemetry = [a for a in artifacts if a.key == keys[2]]
    assert any("goodput" in str(a.data) and "Loss" in str(a.data) for a in telemetry)


async def test_unavailable_capability_stops_without_any_post(start_simulator):
    simulator = start_simulator("default", scaffold=True)
    state = await run_flow(parameters(simulator))

    assert state.is_failed() and state.name == "Unavailable"
    assert "cannot run training" in state.message
    assert posts(simulator) == []
    assert simulator.runs() == []


@pytest.mark.parametrize(
    "booking", ["bk-h200-pending", "bk-h200-expired", "bk-h200-revoked", "bk-h200-released"]
)
async def test_ineligible_booking_submits_nothing(start_simulator, booking):
    simulator = start_simulator("default")
    state = await run_flow(parameters(simulator, booking=booking))

    assert state.is_failed() and state.name == "BookingNotEligible"
    assert posts(simulator) == []


async def test_unknown_booking_submits_nothing(start_simulator):
    simulator = start_simulator("default")
    state = await run_flow(parameters(simulator, booking="bk-does-not-exist"))

    assert state.name == "BookingNotEligible"
    assert posts(simulator) == []


async def test_booking_that_does_not_match_the_handover_submits_nothing(start_simulator):
    from prefect_ito.blocks import ItoBooking

    simulator = start_simulator("default")
    handed_over = ItoBooking(
        booking_id="bk-h200-2x8-ib",
        gpu_sku="H100",
        node_count=2,
        gpus_per_node=8,
        fabric="InfiniBand",
    )
    state = await run_flow(parameters(simulator, booking=handed_over))

    assert state.name == "BookingNotEligible"
    assert "gpu_sku" in state.message
    assert posts(simulator) == []


async def test_busy_booking_stops_as_booking_busy(start_simulator):
    simulator = start_simulator("loss-spike")
    first = await run_flow(parameters(simulator, approval_timeout=7))
    assert first.name == "AwaitingDecision"

    state = await run_flow(parameters(simulator, target="another-capability"))

    assert state.is_failed() and state.name == "BookingBusy"
    assert len(simulator.runs()) == 1


async def test_gate_failure_names_the_eval_and_leaves_later_stages_unstarted(start_simulator):
    simulator = start_simulator("gate-failure")
    state = await run_flow(parameters(simulator, post_training="sft"))

    assert state.is_failed() and state.name == "GateFailed"
    assert "mid_train" in state.message and "gsm8k" in state.message
    run = only_run(simulator)
    statuses = {stage.name: stage.status for stage in run.stages}
    assert statuses["mid_train"] is StageStatus.FAILED
    later = run.stages[[stage.name for stage in run.stages].index("mid_train") + 1 :]
    assert later and all(stage.status is StageStatus.PENDING for stage in later)


async def test_a_plan_the_backend_refuses_stops_before_anyone_is_asked(start_simulator):
    # Before spend confirmation the run was submitted and refused at its parallelism stage; the
    # quote now shows the refusal, so nothing is submitted and nobody is asked to confirm.
    simulator = start_simulator("refused")
    state = await run_flow(parameters(simulator, authorization=None))

    assert state.is_failed() and state.name == "Refused", state.message
    assert "nothing was submitted" in state.message and "idle" in state.message
    assert [entry.path for entry in posts(simulator)] == ["/v0/training-quotes"]
    assert simulator.runs() == []


@pytest.mark.parametrize(
    ("scenario", "name", "data"),
    [
        ("ladder-rejection", "Refused", ["s3://acme/custom-corpus/"]),
        ("budget-exhausted", "BudgetExhausted", ["catalog://ito/web-2026-10"]),
    ],
)
async def test_backend_outcomes_end_in_named_states(start_simulator, scenario, name, data):
    simulator = start_simulator(scenario)
    state = await run_flow(parameters(simulator, data=data))

    assert state.is_failed() and state.name == name, state.message
    assert only_run(simulator).state.terminal


async def test_stall_ends_supervision_without_touching_the_run(start_simulator):
    simulator = start_simulator("stall")
    state = await run_flow(parameters(simulator, stall_timeout=3))

    assert state.is_failed() and state.name == "Stalled"
    run = only_run(simulator)
    assert run.state is RunState.RUNNING
    assert not [p for p in posts(simulator) if p.path.endswith("/cancel")]


async def test_deadline_ends_supervision_and_the_run_goes_on(start_simulator):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=20_000))
    state = await run_flow(parameters(simulator, deadline=2))

    assert state.is_failed() and state.name == "DeadlineExceeded"
    assert not only_run(simulator).state.terminal


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"budget_usd": -5.0}, "budget_usd"),
        ({"budget_usd": float("inf")}, "budget_usd"),
        ({"model_size": "eight billion"}, "model_size"),
        ({"data": []}, "data"),
        ({"post_training": "ppo"}, "post_training"),
        ({"booking_block": "also-a-block"}, "exactly one"),
    ],
)
async def test_invalid_parameters_fail_before_any_backend_call(start_simulator, changes, fragment):
    simulator = start_simulator("default")
    state = await ito_training.with_options(validate_parameters=False)(
        **parameters(simulator, **changes), return_state=True
    )

    assert state.is_failed() and state.name == "InvalidParameters"
    assert fragment in state.message
    assert simulator.requests() == []


async def test_saved_blocks_are_loaded_by_name(start_simulator):
    from prefect_ito.blocks import ItoBooking, ItoCredentials

    simulator = start_simulator("default")
    await ItoCredentials(api_url=simulator.url).save("outcomes-desk", overwrite=True)
    await ItoBooking(
        booking_id="bk-h200-2x8-ib", gpu_sku="H200", node_count=2, gpus_per_node=8,
        fabric="InfiniBand",
    ).save("outcomes-booking", overwrite=True)  # fmt: skip
    params = parameters(
        simulator, credentials="outcomes-desk", booking=None, booking_block="outcomes-booking"
    )

    state = await run_flow(params)

    assert state.is_completed(), state.message
    assert len(simulator.runs()) == 1


async def test_an_unknown_block_name_is_an_invalid_parameter(start_simulator):
    simulator = start_simulator("default")
    state = await run_flow(parameters(simulator, credentials="no-such-block"))

    assert state.name == "InvalidParameters"
    assert "no-such-block" in state.message
    assert simulator.requests() == []
