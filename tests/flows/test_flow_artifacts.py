"""What the flow run's Artifacts tab holds: one card per concern, attached to the flow run."""

from __future__ import annotations

from collections import Counter

from flow_helpers import Person, parameters
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from rich.console import Console

from prefect_ito.cli.terminal import run_training
from prefect_ito.flows import ito_training
from prefect_ito.reporting.report import TrainingSummary, artifact_key


async def test_each_concern_is_one_card_on_the_flow_run_and_the_decision_is_on_record(
    start_simulator,
):
    # Before: a new version of three cards per report, each attached to a report_progress task
    # run (about 26 cards for one run), and no card recorded the decision.
    simulator = start_simulator("loss-spike")
    state = await run_training(
        ito_training, parameters(simulator), Person(approve=True), Console(quiet=True), poll=0.3
    )
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    run_id = simulator.runs()[0].run.run_id

    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )

    found = [a for a in found if a.key is not None]  # not Prefect's record of the flow's result
    kinds = ("progress", "gates", "telemetry", "decisions")
    assert Counter(a.key for a in found) == {artifact_key(run_id, kind): 1 for kind in kinds}
    assert all(a.task_run_id is None for a in found)  # the flow run's, not a task run's
    card = {a.key.split("-")[1]: a for a in found}
    assert card["progress"].data == 100.0
    assert card["progress"].description == "Succeeded: 5 of 5 stages done, 3 of 3 gates passed."
    assert "data:image/svg+xml;base64," in card["telemetry"].data
    assert "| decided by | `user:flow-tests` |" in card["decisions"].data  # whom the backend saw
    assert "| note | Ada |" in card["decisions"].data
    assert "| why | looked at it |" in card["decisions"].data
    assert card["decisions"].description == "1 restart proposed: 1 approved."
    # The restart's facts, as its question says them (markdown-escaped text in the card).
    assert "| restart checkpoint | ckpt\\-pretrain\\-" in card["decisions"].data

    summary = await state.aresult()
    assert isinstance(summary, TrainingSummary)
    (decision,) = summary.decisions
    assert decision.decided_by == "Ada" and decision.checkpoint_id.startswith("ckpt-pretrain-")
