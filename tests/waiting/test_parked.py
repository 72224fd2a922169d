"""A flow run parked for the watcher says so, on the session's Prefect server: its Suspended
state's message, its progress card, an INFO line in its log, no ERROR line at the end of its
process; and a Resume by hand while nothing changed parks it again, saying why.

The flow runs come from a deployment (only those may suspend) and run in this process, as a
worker would run them: the suspension ends the run's process here with Prefect's own signal.
"""

from __future__ import annotations

import logging
from typing import Any

from flow_helpers import logs_until, parameters, training_deployment
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterType,
)
from prefect.exceptions import Pause
from prefect.flow_engine import run_flow_async

from prefect_ito.flows import ito_training
from prefect_ito.reporting.report import PARKED_LINE
from prefect_ito.waiting.deferral import PARKED
from prefect_ito.waiting.flow_run import _SuspensionIsNoError

SLOW = 200.0
"""Simulated seconds per real second: data_prep, the first stage, lasts 108 s, so once started the
backend run stays put for the whole test."""
PATIENCE = 2.0
"""Seconds a flow run waits for a change before it parks: the run starts data_prep at once, and a
flow run that parked before it saw that start (0.5 s, on a busy machine) found the run changed
when resumed, and rightly parked under a new key."""


async def run_once(flow_run: Any, params: dict[str, Any]) -> Any:
    """Run the deployment's flow run here until it ends or suspends; return its state."""
    try:
        return await run_flow_async(
            ito_training, flow_run=flow_run, parameters=params, return_type="state"
        )
    except Pause as pause:  # the end of the process, as under a worker
        return pause.state


async def progress_card_descriptions(flow_run_id: Any) -> list[str]:
    """Return the descriptions of the flow run's progress cards, as the Artifacts tab shows."""
    only_progress = ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
        type=ArtifactFilterType(any_=["progress"]),
    )
    async with get_client() as client:
        found = await client.read_artifacts(artifact_filter=only_progress)
    return [artifact.description or "" for artifact in found]


async def parked_flow_run(start_simulator: Any) -> tuple[Any, dict[str, Any]]:
    simulator = start_simulator("default", time_scale=SLOW)
    params = parameters(simulator, mode="deferred", defer_after=PATIENCE)
    deployment = await training_deployment("parked-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": params["training"]}
        )
    state = await run_once(flow_run, params)
    assert state.name == "Suspended", state
    return flow_run, params


async def test_a_parked_run_says_it_waits_for_the_backend_and_ends_without_an_error(
    start_simulator,
):
    flow_run, _ = await parked_flow_run(start_simulator)

    async with get_client() as client:
        state = (await client.read_flow_run(flow_run.id)).state
    assert state.name == "Suspended" and state.state_details.pause_key.startswith("defer-")
    assert state.message.startswith("Parked: waiting for the backend (run ")
    assert "prefect-ito watch resumes this run" in state.message
    assert "nothing to do" in state.message
    (card,) = await progress_card_descriptions(flow_run.id)
    assert PARKED_LINE == (
        "Parked: waiting for the backend; prefect-ito watch resumes this run when its backend "
        "run changes; nothing to do."
    )
    assert card.startswith(f"{PARKED_LINE} Now ")  # then where the run is, as before
    logs = await logs_until(flow_run.id, "Finished in state Suspended")
    assert [log.level for log in logs if log.message == PARKED] == [logging.INFO]
    assert [log.message for log in logs if log.level >= logging.ERROR] == []
    ended = [log for log in logs if log.message.startswith("Finished in state Suspended")]
    assert [log.level for log in ended] == [logging.INFO]


async def test_resume_by_hand_while_nothing_changed_parks_again_and_says_why(start_simulator):
    flow_run, params = await parked_flow_run(start_simulator)
    async with get_client() as client:
        first = (await client.read_flow_run(flow_run.id)).state
        await client.resume_flow_run(flow_run.id)  # what the UI's Resume button does
        resumed = await client.read_flow_run(flow_run.id)

    state = await run_once(resumed, params)

    assert state.name == "Suspended", state
    async with get_client() as client:
        again = (await client.read_flow_run(flow_run.id)).state
    assert again.state_details.pause_key == f"{first.state_details.pause_key}-2"
    assert again.message == first.message
    logs = await logs_until(flow_run.id, "a Resume by hand changes nothing here")
    said = [log for log in logs if "a Resume by hand changes nothing here" in log.message]
    assert [log.level for log in said] == [logging.INFO]


def test_only_the_end_of_a_suspended_process_is_lowered_to_info():
    lowered = _SuspensionIsNoError()

    def level(message: str, at: int = logging.ERROR) -> int:
        record = logging.LogRecord("prefect.flow_runs", at, __file__, 1, message, None, None)
        assert lowered.filter(record)
        return record.levelno

    assert level("Finished in state Suspended(type=PAUSED)") == logging.INFO
    assert level("Finished in state Suspended('Parked: waiting…', type=PAUSED)") == logging.INFO
    assert level("Finished in state Paused(type=PAUSED)") == logging.INFO
    assert level("Finished in state Failed('boom', type=FAILED)") == logging.ERROR
    assert level("Finished in state Crashed(type=CRASHED)") == logging.ERROR
    assert level("Something else about Suspended(type=PAUSED)") == logging.ERROR


async def test_a_prefect_without_its_private_step_still_suspends_the_public_way(monkeypatch):
    # The message on the state needs a private step of Prefect's; should a later Prefect move
    # it, runs still suspend (without the message), rather than fail to import.
    from prefect_ito.waiting import flow_run

    asked: dict[str, object] = {}

    async def public(**kwargs: object) -> str:
        asked.update(kwargs)
        return "stored answer"

    monkeypatch.setattr(flow_run, "mark_flow_run_suspension_requested", None)
    monkeypatch.setattr(flow_run, "asuspend_flow_run", public)

    assert await flow_run.suspend("defer-x", message="Parked", timeout=5) == "stored answer"
    assert asked == {"wait_for_input": None, "timeout": 5, "key": "defer-x"}
