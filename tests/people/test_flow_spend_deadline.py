"""A deployment's spend question nobody answers ends at its deadline, and its card says so.

A flow run from a deployment suspends while a person may confirm its spend at the backend, and
holds no process. At the question's deadline ``prefect-ito watch`` resumes it (Prefect's own
deadline comes later), and the flow, run again from the top, ends the question itself: the run
ends ``AwaitingConfirmation``, and the ``ito-quote-spend-…`` card in what happened, not in
"Waiting for a person".
"""

from __future__ import annotations

import asyncio
from typing import Any

from flow_helpers import parameters, training_deployment
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.exceptions import Pause
from prefect.flow_engine import run_flow_async

from prefect_ito.flows import ito_training
from prefect_ito.waiting.watcher import Watcher

DEADLINE = 6
"""Seconds a person has to answer: the flow's ``approval_timeout``."""


async def run_until_it_waits(flow_run: Any, params: dict[str, Any]) -> Any:
    """Run the flow run here, as a worker's process would, until it ends or suspends; return
    its state then."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run.id)
        try:
            return await run_flow_async(
                ito_training, flow_run=flow_run, parameters=params, return_type="state"
            )
        except Pause:  # a suspension ends the process (Prefect's engine entry point catches it)
            return (await client.read_flow_run(flow_run.id)).state


async def no_longer_paused(flow_run_id: Any, watcher: Watcher, timeout: float = 60) -> Any:
    """Sweep ``watcher`` until the flow run leaves its suspension; return its state then."""
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            await watcher.sweep()
            state = (await client.read_flow_run(flow_run_id)).state
            if state is not None and not state.is_paused():
                return state
            await asyncio.sleep(0.5)


async def quote_card(flow_run_id: Any) -> Any:
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    (card,) = [a for a in artifacts if (a.key or "").startswith("ito-quote-")]
    return card


async def test_a_spend_nobody_answers_ends_at_its_deadline_with_its_card_saying_so(
    start_simulator,
):
    # Before: Prefect's server failed the suspended run at the deadline with no process to say
    # anything, and the quote's card read "Waiting for a person" for good.
    simulator = start_simulator("default")
    params = parameters(simulator, authorization=None, approval_timeout=DEADLINE)
    deployment = await training_deployment("spend-deadline-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": params["training"]}
        )
    suspended = await run_until_it_waits(flow_run, params)
    assert suspended.is_paused(), suspended
    asked = await quote_card(flow_run.id)
    assert asked.description.startswith("Waiting for a person"), asked.description

    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        left = await no_longer_paused(flow_run.id, watcher)
    finally:
        await watcher.close()
    ended = await run_until_it_waits(flow_run, params) if not left.is_final() else left

    assert ended.name == "AwaitingConfirmation", (ended.name, ended.message)
    assert "nobody confirmed the spend" in (ended.message or "")
    card = await quote_card(flow_run.id)
    assert card.description.startswith("Not submitted: nobody confirmed the spend"), (
        card.description
    )
    assert "nothing was submitted" in card.description
    assert simulator.runs() == []  # nothing spent
