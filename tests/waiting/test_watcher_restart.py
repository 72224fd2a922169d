"""``Watcher`` and flow runs that wait for a person to decide a restart at the backend (contract
v0.5), against a real Prefect server and the simulator: it resumes such a run with ``recheck``
once the backend's action is decided — on the change feed or by reading the run — never while it
is pending, and it decides nothing itself.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from flow_helpers import BOOKING, REQUEST, training_deployment
from prefect import get_client
from prefect.input import keyset_from_paused_state
from prefect.states import Running, Suspended
from spend_helpers import covering_authorization
from test_watcher_spend import (
    QUOTE_REQUEST,
    RESUME_WITHIN,
    is_paused,
    needed_events,
    resume_inputs,
    resumed_once_settled,
    said_again,
    sweep_and_close,
)

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import ALL_SCOPES, DecisionChoice, DecisionRequest, TrainingRun
from prefect_ito.people.approval import RestartCheck, pause_key
from prefect_ito.people.notices import PERSON_NEEDED, event_id, tell_again
from prefect_ito.simulator import builtin_scenario
from prefect_ito.waiting.waits import ActionWait, record_wait
from prefect_ito.waiting.watcher import Watcher


async def spiked(simulator, client_reference: str | None = None) -> TrainingRun:
    """Submit the tests' request under a standing authorization; return it once it waits."""
    authorization = covering_authorization(simulator).authorization_id
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        quote = await client.quote_training_run(QUOTE_REQUEST.to_submission())
        body = QUOTE_REQUEST.to_submission().spending(quote.quote_id, authorization)
        body = body.model_copy(update={"client_reference": client_reference})
        run = (await client.submit_training_run(body, idempotency_key=str(uuid.uuid4()))).run
        async with asyncio.timeout(30):
            while run.pending_action is None:
                run = await client.get_training_run(run.run_id, after_version=run.version, wait=1.0)
    return run


async def running_flow_run():
    """Return a new flow run of the training deployment, running."""
    deployment = await training_deployment("watcher-restart-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": {**REQUEST, "booking": BOOKING}}
        )
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
    return flow_run


async def deciding_flow_run(run: TrainingRun, *, api_url: str, flow_run=None):
    """Leave a flow run (a new one by default) suspended on ``run``'s action as
    ``wait_for_decision`` does."""
    assert run.pending_action is not None
    flow_run = flow_run or await running_flow_run()
    record = ActionWait(api_url=api_url, run_id=run.run_id, action_id=run.pending_action.action_id)
    await record_wait(flow_run.id, record)
    suspended = Suspended(pause_key=pause_key(run.pending_action))
    keyset = keyset_from_paused_state(suspended)
    suspended.state_details.run_input_keyset = keyset
    await RestartCheck.with_initial_data(description="restart").asave(
        keyset, flow_run_id=flow_run.id
    )
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, suspended, force=True)
    return flow_run


async def decide(simulator, run: TrainingRun, choice: DecisionChoice) -> None:
    """Decide the run's action at the backend as a person, with a token of their own."""
    assert run.pending_action is not None
    token = simulator.mint_token(
        "flow-tests", scopes=[s.value for s in ALL_SCOPES], principal="user:ada"
    )
    async with ItoClient(simulator.url, token) as person:
        await person.decide(
            run.run_id,
            run.pending_action.action_id,
            DecisionRequest(decision=choice, reason="looked at the curve"),
            idempotency_key=f"tests-{uuid.uuid4()}",
        )


@pytest.mark.parametrize("feed", [True, False], ids=["change-feed", "per-run-reads"])
async def test_a_run_is_resumed_within_seconds_of_its_restart_being_decided(
    start_simulator, flow_runs, feed
):
    simulator = start_simulator(
        builtin_scenario("loss-spike").model_copy(update={"change_feed": feed})
    )
    run = await spiked(simulator)
    flow_run = await deciding_flow_run(run, api_url=simulator.url)
    flow_runs.append(flow_run)
    _, took = await resumed_once_settled(
        flow_run.id, lambda: decide(simulator, run, DecisionChoice.APPROVE)
    )

    print(f"resumed {took:.2f} s after the decision")
    assert took < RESUME_WITHIN, took
    # Resumed with the one answer the form takes, which decides nothing: the flow reads the run.
    (given,) = await resume_inputs(flow_run.id)
    assert given["decision"] == "recheck" and run.pending_action.action_id in given["reason"]
    posts = [r for r in simulator.requests() if r.path.endswith("/decision")]
    assert len(posts) == 1  # the person's; the watcher decided nothing
    assert simulator.runs()[0].run.decisions[0].principal == "user:ada"


async def test_a_run_whose_restart_is_pending_is_never_resumed(start_simulator, flow_runs):
    simulator = start_simulator("loss-spike")
    run = await spiked(simulator)
    flow_run = await deciding_flow_run(run, api_url=simulator.url)
    flow_runs.append(flow_run)
    watcher = Watcher(wait=0.5, lost_after=None)
    await sweep_and_close(watcher, times=3)

    assert watcher.resumed == [] and await is_paused(flow_run.id)
    assert [r for r in simulator.requests() if r.path.endswith("/decision")] == []


async def test_a_question_whose_saying_prefect_lost_is_said_again_once_from_the_backend(
    start_simulator, flow_runs
):
    # Prefect's SQLite event writer can drop a batch: a `person.needed` that never arrived.
    simulator = start_simulator("loss-spike")
    flow_run = await running_flow_run()
    flow_runs.append(flow_run)
    run = await spiked(simulator, client_reference=str(flow_run.id))
    await deciding_flow_run(run, api_url=simulator.url, flow_run=flow_run)
    # A decoy names the same backend run in a record of its own: it made no run, so its question
    # is never said, whatever its record names.
    decoy = await deciding_flow_run(run, api_url=simulator.url)
    flow_runs.append(decoy)
    assert await needed_events(flow_run.id) == []

    watcher = Watcher(wait=0.5, lost_after=None, tell_again=tell_again, tell_again_after=0.0)
    told = await said_again(watcher, flow_run.id)

    assert told.id == event_id(
        str(flow_run.id), pause_key(run.pending_action), run.pending_action.action_id,
        PERSON_NEEDED,
    )  # fmt: skip
    # What the backend says, linked to the flow run Prefect holds; the decoy is told nothing.
    assert told.payload["kind"] == "restart" and run.run_id in told.payload["asked"]
    assert told.payload["command"].startswith(f"prefect-ito decide {flow_run.id}")
    assert any(r.id == f"prefect.flow-run.{flow_run.id}" for r in told.related)
    assert await needed_events(decoy.id) == []
    assert watcher.resumed == [] and await is_paused(flow_run.id)
