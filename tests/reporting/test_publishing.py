"""One artifact per card on the flow run: a re-entry updates it in place; no change, no write."""

from __future__ import annotations

from played_runs import play
from prefect import flow, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from prefect_ito.reporting import report as reporting
from prefect_ito.reporting.publishing import Publisher


async def artifacts_of(flow_run_id):
    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )


async def test_a_re_entered_flow_run_updates_its_cards_in_place(prefect_server):
    waiting, seen = play("demo", decide=None)
    later = waiting.model_copy(
        update={"telemetry": waiting.telemetry.model_copy(update={"spend_usd": 99_999.0})}
    )

    # A waiting run's cards say what the wait cost "as of" the minute they were made, so cards
    # made either side of a minute differ: each list is made once, and whichever cards differ
    # between the two runs are the ones a publish must write.
    before, after = reporting.cards(waiting, seen), reporting.cards(later, seen)
    differ = {
        old.key
        for old, new in zip(before, after, strict=True)
        if old.fingerprint() != new.fingerprint()
    }
    spend_shown_on = {reporting.artifact_key(waiting.run_id, k) for k in ("progress", "telemetry")}
    assert spend_shown_on <= differ

    @flow
    async def supervising() -> list[int]:
        first = await Publisher().publish(before)
        # A resumed suspension runs the flow again in a new process: a new publisher.
        again = Publisher()
        unchanged = await again.publish(before)
        changed = await again.publish(after)
        return [first, unchanged, changed]

    state = await supervising(return_state=True)

    assert await state.aresult() == [3, 0, len(differ)]
    found = await artifacts_of(state.state_details.flow_run_id)
    assert sorted(a.key.split("-")[1] for a in found) == ["decisions", "progress", "telemetry"]
    assert all(a.task_run_id is None for a in found)
    (progress,) = [a for a in found if a.key.startswith("ito-progress-")]
    assert "$99,999.00" in progress.metadata_["spend"]


async def test_nothing_is_published_outside_a_flow_run(prefect_server):
    waiting, seen = play("demo", decide=None)

    assert await Publisher().publish(reporting.cards(waiting, seen)) == 0
