"""People decide loss-spike restarts; the flow relays their decision exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime
from typing import Any

import pytest
from flow_helpers import Person, answered_suspension, parameters, spiked_run, wait_for_pause
from prefect import flow, get_client
from rich.console import Console

from prefect_ito.cli.terminal import run_training
from prefect_ito.contract import DecisionChoice, RunState
from prefect_ito.flows import ito_training
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.scenario import SpikeSpec


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
    keyed = {"idempotency_key": "restart-once"}
    state = await ito_training(
        **parameters(simulator, approval_timeout=7, **keyed), return_state=True
    )

    assert state.is_failed() and state.name == "AwaitingDecision"
    run = simulator.runs()[0].run
    assert run.state is RunState.AWAITING_DECISION and run.pending_action is not None
    assert decision_posts(simulator) == []

    # Running the flow again under the same key re-attaches and asks again.
    again = await run_training(
        ito_training, parameters(simulator, **keyed), Person(True), Console(quiet=True), poll=0.3
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
    # Approve or reject is an explicit, required choice: no tick box that defaults to reject.
    assert set(schema["properties"]) == {"decision", "decided_by", "reason"}
    assert schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert "default" not in schema["properties"]["decision"]
    assert set(schema["required"]) == {"decision", "decided_by", "reason"}
    async with get_client() as client:
        # The form submitted without choosing: Prefect's server checks it against the schema.
        untouched = {"decided_by": "Grace", "reason": "pressed Submit"}
        refused = await client.resume_flow_run(flow_run.id, run_input=untouched)
    assert refused.status.value == "REJECT", refused.details
    assert "decision" in str(refused.details)

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


async def test_the_form_shows_evidence_with_headers_the_chart_the_spend_and_the_choices(
    start_simulator,
):
    simulator = start_simulator("loss-spike")
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    (form,) = person.asked
    assert "| evidence | value |\n|---|---|" in form  # before: an empty header row
    assert "![Training loss by step, up to the spike](data:image/svg+xml;base64," in form
    assert "| spike | loss 17.28 at step 12,000 |" in form
    assert "| its step | 10,000 (2,000 steps back) |" in form
    assert re.search(r"\| spent so far \| \$[\d,]+ of \$250,000 \(\d+%\) \|", form)
    assert "- **approve**: the backend restarts from `ckpt-pretrain-" in form
    assert "- **reject**: the run goes on from step" in form
    # Before, the run's simulated clock dated the proposal ahead (2035 in one run, eight days
    # in another): the form now says since when the run is held, by the wall clock, and what
    # holding it costs.
    assert "proposed at" not in form
    held = re.search(r"\| held since \| (\d{4}-\d\d-\d\d) ", form)
    assert held is not None
    assert abs((date.fromisoformat(held.group(1)) - datetime.now(UTC).date()).days) <= 1
    assert re.search(r"\| holding costs \| \$[\d,]+ an hour \|", form)
    # Short cells: the Resume dialog's column does not wrap them (a longer one was cut off).
    assert re.search(r"\| held so far \| [^|]{1,30} \|", form)


async def test_a_resumed_suspension_takes_the_stored_answer_without_suspending_again(
    monkeypatch, prefect_server
):
    # After a resume from the UI, the logs said "Waiting for a person… Suspending flow run"
    # once more before "approved": the flow proposed a suspension Prefect then refused.
    from prefect_ito.people import approval, asking

    async def no_second_suspension(*_: Any, **__: Any) -> None:
        raise AssertionError("suspended again")

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", no_second_suspension)
    run = spiked_run()

    @flow
    async def resumed() -> approval.RestartDecision | None:
        # What Prefect stored when a person resumed with the earlier form's tick box.
        answer = {"approve": True, "decided_by": "Grace", "reason": "blip"}
        await answered_suspension(approval.pause_key(run.pending_action), answer)
        return await approval.ask_person(run, timeout=60, poll_interval=1)

    decision = await resumed()

    assert decision is not None and decision.decision == "approve"
    assert decision.to_request().decided_by == "Grace"


async def test_a_restart_wait_says_what_it_asks_and_names_the_checkpoint(
    monkeypatch, prefect_server
):
    # Before, a run suspended for a restart decision said only "answer the form under Resume":
    # in the runs list it told nobody what was asked.
    from prefect_ito.people import approval, asking

    said: list[str] = []

    class Suspended(Exception):
        pass

    async def suspend(key: str, *, message: str, **_: Any) -> None:
        said.append(message)
        raise Suspended  # the end of the process, as under a worker

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", suspend)
    run = spiked_run()

    @flow
    async def asked() -> None:
        await approval.ask_person(run, timeout=3_600, poll_interval=1)

    with pytest.raises(Suspended):
        await asked()

    checkpoint = run.pending_action.proposed_checkpoint.checkpoint_id
    assert len(said) == 1
    assert re.fullmatch(
        rf"Waiting for a person: approve or reject a restart from {re.escape(checkpoint)} "
        r"by \d{4}-\d\d-\d\d \d\d:\d\d UTC",
        said[0],
    ), said
