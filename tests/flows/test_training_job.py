"""``ItoTrainingJob`` / ``ItoTrainingRun``: Prefect's job conventions over the same code path."""

from __future__ import annotations

import pytest
from flow_helpers import BOOKING, REQUEST
from prefect import flow
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import RunState
from prefect_ito.exceptions import BookingBusy, DecisionRequired, GateFailed
from prefect_ito.jobs import ItoTrainingJob, ItoTrainingRun
from prefect_ito.parameters import TrainingParameters
from prefect_ito.reporting.report import TrainingSummary


class TestItoTrainingJobStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return ItoTrainingJob


def make_job(simulator, **changes) -> ItoTrainingJob:
    training = TrainingParameters(**{**REQUEST, "booking": BOOKING, **changes})
    return ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator),
    )


async def test_trigger_wait_and_fetch_result(start_simulator):
    simulator = start_simulator("default")
    run = await make_job(simulator, post_training="dpo").trigger()
    await run.wait_for_completion()
    summary = await run.fetch_result()

    assert isinstance(summary, TrainingSummary)
    assert summary.state is RunState.SUCCEEDED
    assert summary.run_id == run.run_id == simulator.runs()[0].run.run_id
    assert summary.stages[-1].name == "post_training.dpo"


async def test_trigger_twice_reattaches_instead_of_submitting_again(start_simulator):
    simulator = start_simulator("loss-spike")
    job = make_job(simulator, idempotency_key="nightly-1")
    first = await job.trigger()
    second = await job.trigger()

    assert first.run_id == second.run_id
    assert len(simulator.runs()) == 1


async def test_a_second_submission_of_the_request_names_the_run_it_would_follow(start_simulator):
    # Without a key of its own, the second trigger is another submission: the booking's
    # unfinished run is not its to follow, so it says which run that is and how to attach.
    simulator = start_simulator("loss-spike")
    first = await make_job(simulator).trigger()

    with pytest.raises(BookingBusy, match=f"prefect-ito attach {first.run_id}"):
        await make_job(simulator).trigger()
    assert len(simulator.runs()) == 1


async def test_outside_a_flow_a_pending_restart_raises_decision_required(start_simulator):
    simulator = start_simulator("loss-spike")
    run = await make_job(simulator).trigger()

    with pytest.raises(DecisionRequired) as raised:
        await run.wait_for_completion()

    assert raised.value.action.kind == "loss_spike_restart"
    assert raised.value.action == simulator.runs()[0].run.pending_action


async def test_attach_and_cancel(start_simulator):
    simulator = start_simulator("loss-spike")
    job = make_job(simulator)
    run_id = (await job.trigger()).run_id

    attached = await ItoTrainingRun.attach(job, run_id)
    cancelled = await attached.cancel("no longer needed")

    assert cancelled.state is RunState.CANCELLED
    assert simulator.runs()[0].run.state is RunState.CANCELLED


async def test_fetch_result_raises_the_typed_outcome(start_simulator):
    simulator = start_simulator("gate-failure")
    run = await make_job(simulator).trigger()
    await run.wait_for_completion()

    with pytest.raises(GateFailed) as raised:
        await run.fetch_result()
    assert raised.value.stage == "mid_train"
    assert raised.value.eval_name == "gsm8k"


async def test_inside_a_flow_a_person_decides_as_in_the_training_flow(start_simulator):
    from flow_helpers import answer_pauses_with

    simulator = start_simulator("loss-spike")

    @flow
    async def train_with_job() -> TrainingSummary:
        run = await make_job(simulator).trigger()
        await run.wait_for_completion()
        return await run.fetch_result()

    state = await answer_pauses_with(train_with_job, approve=True, console=Console(quiet=True))

    assert state.is_completed(), state.message
    assert [d.decided_by for d in simulator.runs()[0].run.decisions] == ["Ada"]
