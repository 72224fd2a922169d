"""What a flow run follows and cancels is the backend's answer, never a record in Prefect.

Each test is a colleague's attack with Prefect API access and no Itô token: writing a flow-run
input, a parameter or a state, then letting the shipped flows act on it. The simulator's runs
are the judge.
"""

from __future__ import annotations

import asyncio
from typing import Any

from flow_helpers import parameters
from prefect import get_client
from prefect.flow_engine import run_flow_async
from prefect.states import Cancelled

from prefect_ito.backend import desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.flow_runs import _read_status
from prefect_ito.contract import DecisionChoice, DecisionRequest, RunState
from prefect_ito.exceptions import BookingBusy
from prefect_ito.flows import ito_attach_training, ito_cancel_training, ito_training
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.keys import (
    ACTION_RECORD_PREFIX,
    BACKEND_RUN_KEY,
    QUESTION_RECORD_PREFIX,
)

SLOW = 1_000
"""A time scale at which a backend run is still training when the test acts on it."""


async def _run(flow: Any, params: dict[str, Any], record: str | None = None) -> Any:
    """Create a flow run, write ``record`` as its backend-run record first (the attack), run it."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(flow, parameters=params)
        if record is not None:
            await client.create_flow_run_input(flow_run.id, BACKEND_RUN_KEY, record)
    state = await run_flow_async(flow, flow_run=flow_run, parameters=params, return_type="state")
    return flow_run, state


async def _unfinished(simulator: SimulatorServer) -> str:
    """Start a colleague's training flow run and return its backend run once it trains."""
    flow = asyncio.ensure_future(ito_training(**parameters(simulator), return_state=True))
    async with asyncio.timeout(30):
        while not simulator.runs():
            await asyncio.sleep(0.1)
    flow.cancel()
    return simulator.runs()[0].run.run_id


async def test_a_record_naming_an_old_run_is_no_success_of_this_flow_run(start_simulator):
    # Before: the nightly flow run followed the old run it was told of, ended Completed with
    # that run's scores, and nothing trained on its own request.
    simulator = start_simulator("default")
    old = await ito_training(**parameters(simulator, target="chat"))
    nightly, state = await _run(ito_training, parameters(simulator), record=old.run_id)

    assert state.is_completed(), state.message
    result = await state.result()
    assert result.run_id != old.run_id
    made = [r.run for r in simulator.runs() if r.run.run_id == result.run_id]
    assert made and made[0].client_reference == str(nightly.id)
    assert len(simulator.runs()) == 2


async def test_a_booking_busy_with_another_flow_run_s_run_is_not_followed(start_simulator):
    # Before: a second flow run of the same request on the booking re-attached to the first's
    # unfinished run, and asked its questions again.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    theirs = await _unfinished(simulator)
    _, state = await _run(ito_training, parameters(simulator))

    assert state.is_failed() and state.name == BookingBusy.state_name, state.name
    assert theirs in (state.message or "")
    assert f"prefect-ito attach {theirs}" in (state.message or "")
    made_by = simulator.runs()[0].run.client_reference
    assert f"flow run {made_by}" in (state.message or "")  # who owns its questions
    assert len(simulator.runs()) == 1


async def test_a_flow_run_given_the_same_key_never_asks_another_flow_run_s_question(
    start_simulator,
):
    # Before: a second flow run given the first's idempotency key (a scheduler's key, a job
    # started twice) found the first's unfinished run by that key, followed it, and asked its
    # restart question a second time: two "needs you" messages, a twin left waiting after the
    # real answer.
    simulator = start_simulator("loss-spike")
    key = "nightly-2026-12-05"
    first = asyncio.ensure_future(_run(ito_training, parameters(simulator, idempotency_key=key)))
    try:
        async with asyncio.timeout(60):
            while not (simulator.runs() and simulator.runs()[0].run.pending_action):
                await asyncio.sleep(0.1)
        twin_parameters = parameters(simulator, idempotency_key=key)
        async with get_client() as client:
            twin = await client.create_flow_run(ito_training, parameters=twin_parameters)
        following = asyncio.ensure_future(
            run_flow_async(
                ito_training, flow_run=twin, parameters=twin_parameters, return_type="state"
            )
        )
        await _recorded_a_run(twin.id)  # it follows the run (and would ask, before)
        await _decide_at_backend(simulator)  # a person answers the question, once
        _, owner_state = await first
        state = await following
    finally:
        first.cancel()

    assert owner_state.is_completed(), owner_state.message
    assert state.is_completed(), state.message  # the same submission: followed to its end
    assert len(simulator.runs()) == 1
    async with get_client() as client:  # the twin recorded no question and never paused
        kept = await client.filter_flow_run_input(twin.id, "ito-", limit=50, exclude_keys=set())
        history = await client.read_flow_run_states(twin.id)
    questions = (ACTION_RECORD_PREFIX, QUESTION_RECORD_PREFIX)
    assert not [record.key for record in kept if record.key.startswith(questions)], kept
    assert not [each for each in history if each.is_paused()], history


async def _recorded_a_run(flow_run_id: Any) -> None:
    """Return once the flow run recorded the backend run it follows."""
    async with asyncio.timeout(60), get_client() as client:
        while not await client.filter_flow_run_input(
            flow_run_id, BACKEND_RUN_KEY, limit=1, exclude_keys=set()
        ):
            await asyncio.sleep(0.2)


async def _decide_at_backend(simulator: SimulatorServer) -> None:
    run = simulator.runs()[0].run
    assert run.pending_action is not None
    decision = DecisionRequest(decision=DecisionChoice.APPROVE, reason="looked at it")
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        await desk.decide_action(client, run, run.pending_action.action_id, decision)


async def test_a_decoy_flow_run_cancelled_stops_nobody_else_s_run(start_simulator):
    # Before: a decoy flow run naming a colleague's run (by `run_id`, by the record, or by the
    # colleague's idempotency key) had that run cancelled by the cancel-on-cancelled flow.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    theirs = await _unfinished(simulator)
    key = simulator.runs()[0].idempotency_key
    decoy_parameters = {**parameters(simulator, idempotency_key=key), "run_id": theirs}
    async with get_client() as client:
        decoy = await client.create_flow_run(ito_training, parameters=decoy_parameters)
        await client.create_flow_run_input(decoy.id, BACKEND_RUN_KEY, theirs)
        await client.set_flow_run_state(decoy.id, Cancelled(), force=True)

    said = await ito_cancel_training(str(decoy.id))

    assert "nothing to cancel" in said
    assert simulator.runs()[0].run.state is not RunState.CANCELLED
    assert not [r for r in simulator.requests() if r.path.endswith("/cancel")]


async def test_a_forged_cancelled_event_cancels_nothing(start_simulator):
    # Before: the cancel flow acted on the event's word for a flow run Prefect held as running.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    params = parameters(simulator)
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=params)
    flow = asyncio.ensure_future(
        run_flow_async(ito_training, flow_run=flow_run, parameters=params, return_type="state")
    )
    async with asyncio.timeout(30):
        while not simulator.runs():
            await asyncio.sleep(0.1)

    said = await ito_cancel_training(str(flow_run.id))
    flow.cancel()

    assert "not cancelled, in Prefect" in said
    assert simulator.runs()[0].run.state is not RunState.CANCELLED


async def test_cancelling_an_attach_flow_run_detaches(start_simulator):
    # Before: cancelling a flow run that only followed a run by its id cancelled that run.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    theirs = await _unfinished(simulator)
    attach = await _attach_flow_run(simulator, theirs, cancelled=True)

    said = await ito_cancel_training(str(attach.id))

    assert "has no backend run" in said
    assert simulator.runs()[0].run.state is not RunState.CANCELLED


async def test_status_of_an_attach_flow_run_shows_the_run_it_follows(start_simulator):
    # Shown, never acted on: the one place a run_id parameter is read is to show it.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    theirs = await _unfinished(simulator)
    attach = await _attach_flow_run(simulator, theirs)

    shown = await _read_status(attach.id)

    assert shown["backend_run"].run_id == theirs


async def _attach_flow_run(simulator: SimulatorServer, run_id: str, *, cancelled: bool = False):
    """Create an ``ito-attach-training`` flow run on ``run_id`` (cancelled in Prefect, if so)."""
    async with get_client() as client:
        attach = await client.create_flow_run(
            ito_attach_training,
            parameters={"run_id": run_id, "credentials": {"api_url": simulator.url}},
        )
        if cancelled:
            await client.set_flow_run_state(attach.id, Cancelled(), force=True)
    return attach
