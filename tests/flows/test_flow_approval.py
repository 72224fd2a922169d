"""People decide loss-spike restarts; the flow relays their decision exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from flow_helpers import Person, parameters, wait_for_pause
from prefect import get_client
from rich.console import Console

from prefect_ito.contract import DecisionChoice, RunState
from prefect_ito.flows import ito_training
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.scenario import SpikeSpec
from prefect_ito.terminal import run_training


def decision_posts(simulator: Any) -> list[Any]:
    return [r for r in simulator.requests() if r.method == "POST" and r.path.endswith("/decision")]


async def test_approval_is_relayed_once_and_the_run_completes(start_simulator):
    simulator = start_simulator("loss-spike")
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    assert len(person.asked) == 1 and "Loss spike in `pretrain`" in person.asked[0]
    assert len([p for p in decision_posts(simulator) if p.status < 300]) == 1
    run = simulator.runs()[0].run
    assert [(d.decision, d.decided_by) for d in run.decisions] == [(DecisionChoice.APPROVE, "Ada")]


async def test_rejection_is_relayed_and_the_run_goes_on(start_simulator):
    simulator = start_simulator("loss-spike")
    state = await run_training(
        ito_training, parameters(simulator), Person(approve=False), Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    run = simulator.runs()[0].run
    assert [d.decision for d in run.decisions] == [DecisionChoice.REJECT]
    assert len([p for p in decision_posts(simulator) if p.status < 300]) == 1


async def test_two_spikes_in_one_stage_are_both_asked_and_answered(start_simulator):
    base = builtin_scenario("default")
    spikes = [
        SpikeSpec(stage="pretrain", at_fraction=0.3),
        SpikeSpec(stage="pretrain", at_fraction=0.7),
    ]
    scenario = base.model_validate(
        {**base.model_dump(), "run": {**base.run.model_dump(), "loss_spikes": spikes}}
    )
    simulator = start_simulator(scenario)
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    assert len(person.asked) == 2
    run = simulator.runs()[0].run
    assert len(run.decisions) == 2
    assert len({d.action_id for d in run.decisions}) == 2


async def test_nobody_deciding_ends_as_awaiting_decision_and_leaves_it_pending(start_simulator):
    simulator = start_simulator("loss-spike")
    state = await ito_training(**parameters(simulator, approval_timeout=7), return_state=True)

    assert state.is_failed() and state.name == "AwaitingDecision"
    run = simulator.runs()[0].run
    assert run.state is RunState.AWAITING_DECISION and run.pending_action is not None
    assert decision_posts(simulator) == []

    # Running the flow again re-attaches and asks again.
    again = await run_training(
        ito_training, parameters(simulator), Person(True), Console(quiet=True), poll=0.3
    )
    assert again.is_completed(), again.message
    assert len(simulator.runs()) == 1


async def test_a_person_in_another_process_resumes_through_the_api(start_simulator, prefect_server):
    simulator = start_simulator("loss-spike")
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=parameters(simulator))
    from prefect.flow_engine import run_flow_async

    flow = asyncio.ensure_future(
        run_flow_async(
            ito_training, flow_run=flow_run, parameters=parameters(simulator), return_type="state"
        )
    )
    paused = await wait_for_pause(flow_run.id)
    keyset = paused.state_details.run_input_keyset
    async with get_client() as client:
        schema = json.loads(await client.read_flow_run_input(flow_run.id, keyset["schema"]))
    assert set(schema["properties"]) == {"approve", "decided_by", "reason"}
    assert schema["properties"]["approve"]["default"] is False

    decide = subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", "decide", str(flow_run.id), "--approve",
         "--reason", "spike was a data blip", "--name", "Grace"],
        env={**os.environ, "PREFECT_API_URL": prefect_server}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert decide.returncode == 0, decide.stdout + decide.stderr

    state = await asyncio.wait_for(flow, timeout=120)
    assert state.is_completed(), state.message
    run = simulator.runs()[0].run
    assert [(d.decided_by, d.reason) for d in run.decisions] == [("Grace", "spike was a data blip")]
