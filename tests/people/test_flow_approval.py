"""People decide loss-spike restarts at the backend, as themselves (contract v0.5); the flow only
waits for the backend to say so, and never relays a decision."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime
from typing import Any

import pytest
from flow_helpers import (
    RECHECK,
    DecidedAtTheBackend,
    Person,
    answered_suspension,
    parameters,
    spiked_run,
    wait_for_pause,
)
from prefect import flow, get_client
from rich.console import Console

from prefect_ito.cli.terminal import run_training
from prefect_ito.contract import DecisionChoice, RunState
from prefect_ito.flows import ito_training
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.scenario import SpikeSpec


def decision_posts(simulator: Any) -> list[Any]:
    return [r for r in simulator.requests() if r.method == "POST" and r.path.endswith("/decision")]


async def test_an_approval_at_the_backend_is_recorded_once_and_the_run_completes(start_simulator):
    simulator = start_simulator("loss-spike")
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    assert len(person.asked) == 1 and "Loss spike in `pretrain`" in person.asked[0]
    assert len([p for p in decision_posts(simulator) if p.status < 300]) == 1  # the person's
    run = simulator.runs()[0].run
    assert [(d.decision, d.decided_by) for d in run.decisions] == [(DecisionChoice.APPROVE, "Ada")]
    assert (run.decisions[0].principal or "").startswith("user:")  # who decided: a person


async def test_a_rejection_at_the_backend_lets_the_run_go_on(start_simulator):
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


async def test_a_person_in_another_process_decides_at_the_backend_and_the_form_only_rechecks(
    start_simulator, prefect_server
):
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
    # The form decides nothing: its one choice reads the backend again, and it has no default.
    assert schema["properties"]["decision"]["enum"] == ["recheck"]
    assert "default" not in schema["properties"]["decision"]
    assert "approve" not in json.dumps(schema["properties"]["decision"]["enum"])
    async with get_client() as client:
        # An approval through Prefect's API, as before v0.5: Prefect's server refuses it.
        forged = {"decision": "approve", "decided_by": "Eve", "reason": "pressed Submit"}
        refused = await client.resume_flow_run(flow_run.id, run_input=forged)
    assert refused.status.value == "REJECT", refused.details
    assert simulator.runs()[0].run.decisions == []

    person = simulator.mint_token("flow-tests", principal="user:grace").get_secret_value()
    decide = subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", "decide", str(flow_run.id), "--approve",
         "--reason", "spike was a data blip", "--name", "Grace"],
        env={**os.environ, "PREFECT_API_URL": prefect_server, "ITO_COMPUTE_TOKEN": person,
             "ITO_COMPUTE_API_URL": simulator.url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert decide.returncode == 0, decide.stdout + decide.stderr
    assert "Approved at the backend as user:grace" in decide.stdout

    state = await asyncio.wait_for(flow, timeout=120)
    assert state.is_completed(), state.message
    run = simulator.runs()[0].run
    assert [(d.principal, d.decided_by, d.reason) for d in run.decisions] == [
        ("user:grace", "Grace", "spike was a data blip")
    ]


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
    assert "**Decide at the backend**, signed in as yourself" in form
    assert "`prefect-ito decide`" in form and "choose **recheck** here" in form
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
    # once more: the flow proposed a suspension Prefect then refused.
    from prefect_ito.people import approval, asking

    async def no_second_suspension(*_: Any, **__: Any) -> None:
        raise AssertionError("suspended again")

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", no_second_suspension)
    run = spiked_run()
    steps = DecidedAtTheBackend(run)

    @flow
    async def resumed() -> Any:
        await answered_suspension(approval.pause_key(run.pending_action), RECHECK)
        return await approval.wait_for_decision(steps, run, timeout=60, poll_interval=1)

    decided = await resumed()

    assert decided.pending_action is None and steps.reads == 1


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
        await approval.wait_for_decision(
            DecidedAtTheBackend(run), run, timeout=3_600, poll_interval=1
        )

    with pytest.raises(Suspended):
        await asked()

    checkpoint = run.pending_action.proposed_checkpoint.checkpoint_id
    assert len(said) == 1
    assert re.fullmatch(
        rf"Waiting for a person: approve or reject a restart from {re.escape(checkpoint)} at the "
        r"backend by \d{4}-\d\d-\d\d \d\d:\d\d UTC",
        said[0],
    ), said


async def test_a_recheck_before_anyone_decided_says_it_is_still_pending_and_where_to_decide(
    monkeypatch, prefect_server, caplog
):
    # Before: the flow asked again with no word that nothing had changed at the backend.
    from prefect_ito.people import approval, asking

    class Suspended(Exception):
        pass

    async def suspend(*_: Any, **__: Any) -> None:
        raise Suspended  # asked again: the end of the process, as under a worker

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", suspend)
    run = spiked_run()
    steps = DecidedAtTheBackend(run, pending_reads=1)

    @flow
    async def rechecked() -> Any:
        await answered_suspension(approval.pause_key(run.pending_action), RECHECK)
        return await approval.wait_for_decision(steps, run, timeout=60, poll_interval=1)

    with caplog.at_level(logging.INFO, logger=steps.logger.name), pytest.raises(Suspended):
        await rechecked()

    (said,) = [r.getMessage() for r in caplog.records if "still pending" in r.getMessage()]
    assert run.pending_action.action_id in said
    assert approval.where_to_decide(run.pending_action) in said
