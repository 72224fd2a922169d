"""Answers are taken only for questions asked; of answers sent at once, one is taken and told so.

Anyone with Prefect API access can write a flow run's inputs, also before the pause that reads
them, and press Resume. These tests write what such a person could, through Prefect's own API,
against the session's Prefect server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from flow_helpers import answered_suspension, parameters, spiked_run, wait_for_pause
from prefect import flow, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.flow_engine import run_flow_async
from prefect.flow_runs import aresume_flow_run
from prefect.input import create_flow_run_input
from prefect.states import Paused, Running, Suspended
from rich.console import Console

from prefect_ito.backend import desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.terminal import run_training
from prefect_ito.cli.training import _decide
from prefect_ito.exceptions import AnsweredByAnother
from prefect_ito.parameters import BookingClaim, SupervisionParameters, TrainingParameters
from prefect_ito.people import answers, approval, asking, spend
from prefect_ito.people.approval import RestartDecision
from prefect_ito.supervision.tasks import TaskSteps

EVE = {"decision": "approve", "decided_by": "Eve", "reason": "written before anyone saw it"}
ADA = {"decision": "reject", "decided_by": "Ada", "reason": "looked at the chart"}


class Suspension(Exception):
    """Stands for the end of the process that Prefect's suspension brings."""


@pytest.fixture
def suspensions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the flow runs here suspend (as from a deployment); return the keys suspended under."""
    keys: list[str] = []

    async def suspend(key: str, *, message: str, timeout: int, form: Any) -> None:
        keys.append(key)
        raise Suspension(key)

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", suspend)
    return keys


def flow_run_id() -> Any:
    return FlowRunContext.get().flow_run.id


async def stored(key: str) -> dict[str, Any] | None:
    async with get_client() as client:
        record = await answers.read_answer(client, flow_run_id(), key)
    return None if record is None else record.decoded_value


def ignored(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and key in record.getMessage()
        and "before the question was asked" in record.getMessage()
    ]


async def test_a_restart_answer_written_before_the_suspension_is_ignored_and_a_person_asked(
    prefect_server, suspensions, caplog
):
    run = spiked_run()
    key = approval.pause_key(run.pending_action)
    response = answers.response_key("suspended", key)

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, EVE, flow_run_id=flow_run_id())
        try:
            return await approval.ask_person(run, timeout=60, poll_interval=1)
        except Suspension:
            return await stored(response)

    left = await asked()

    assert suspensions == [key]  # the person is asked; before, Eve's answer was taken
    assert left is None
    assert ignored(caplog, response)


async def test_a_spend_answer_written_before_the_suspension_is_ignored_and_a_person_asked(
    start_simulator, suspensions, caplog
):
    simulator = start_simulator("default")
    request = TrainingParameters(**parameters(simulator)["training"]).to_request(
        BookingClaim(booking_id="bk-h200-2x8-ib")
    )
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        quote = await desk.quote_training_run(client, request)
    key = spend.pause_key(quote.manifest_digest)
    response = answers.response_key("suspended", key)
    # Since v0.4 the form cannot confirm; a decline written in advance must not stand either.
    early = {"decision": "decline", "reason": "Eve, before anyone was asked"}

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, early, flow_run_id=flow_run_id())
        steps = TaskSteps(ItoCredentials(api_url=simulator.url), SupervisionParameters())
        try:
            return await spend.wait_for_person(
                steps, quote, request, again=False, timeout=60, poll_interval=1
            )
        except Suspension:
            return await stored(response)

    left = await asked()

    assert suspensions == [key]  # the person is asked; the early answer was not taken
    assert left is None
    assert ignored(caplog, response)
    assert [r for r in simulator.requests() if r.path.endswith("/declines")] == []


async def test_an_answer_older_than_its_suspension_is_ignored_and_asked_again_under_a_new_key(
    prefect_server, suspensions, caplog
):
    # Prefect's server deletes a pause's inputs when the pause begins, in one transaction; an
    # input written beside it may still outlive it (or a state may be written directly). It is
    # older than the question: no answer to it.
    run = spiked_run()
    key = approval.pause_key(run.pending_action)
    response = answers.response_key("suspended", key)

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, EVE, flow_run_id=flow_run_id())
        async with get_client() as client:
            suspended = Suspended(timeout_seconds=300, pause_key=key)
            await client.set_flow_run_state(flow_run_id(), suspended, force=True)
            await client.set_flow_run_state(flow_run_id(), Running(), force=True)
        try:
            return await approval.ask_person(run, timeout=60, poll_interval=1)
        except Suspension:
            return await stored(response)

    left = await asked()

    # Prefect returns at once from a pause under a key that fired: asked under a key of its own.
    assert suspensions == [f"{key}-again-2"]
    assert left is None
    assert ignored(caplog, response)


async def test_an_answer_given_after_the_suspension_is_taken_and_nobody_asked_twice(
    prefect_server, suspensions
):
    run = spiked_run()
    key = approval.pause_key(run.pending_action)

    @flow
    async def resumed() -> Any:
        await answered_suspension(key, ADA)
        return await approval.ask_person(run, timeout=60, poll_interval=1)

    decision = await resumed()

    assert suspensions == []
    assert (decision.decision, decision.decided_by) == ("reject", "Ada")


async def test_an_answer_is_found_behind_many_inputs_whose_keys_start_with_its_key(
    prefect_server, suspensions
):
    # Prefect's input filter matches a key prefix, oldest first, a page at a time.
    run = spiked_run()
    key = approval.pause_key(run.pending_action)
    response = answers.response_key("suspended", key)

    @flow
    async def resumed() -> Any:
        for n in range(120):
            await create_flow_run_input(f"{response}-{n}", EVE, flow_run_id=flow_run_id())
        await answered_suspension(key, ADA)
        return await approval.ask_person(run, timeout=60, poll_interval=1)

    decision = await resumed()

    assert suspensions == []  # before: the answer went unseen and the person was asked again
    assert (decision.decision, decision.decided_by) == ("reject", "Ada")


async def in_process(asked: Any, answer: dict[str, Any]) -> Any:
    """Run ``asked`` here; once it pauses, answer through Prefect's resume API, as the UI does."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(asked)
    running = asyncio.ensure_future(run_flow_async(asked, flow_run=flow_run, return_type="state"))
    paused = await wait_for_pause(flow_run.id)
    await aresume_flow_run(flow_run.id, run_input=answer)
    state = await asyncio.wait_for(running, timeout=120)
    return paused, await state.result()


async def test_an_answer_written_before_an_in_process_pause_is_logged_and_the_person_decides(
    prefect_server, caplog
):
    # Prefect 3.9.1's server deletes it when the pause begins, silently; now the log says so.
    run = spiked_run()
    key = approval.pause_key(run.pending_action)
    response = answers.response_key("paused", key)

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, EVE, flow_run_id=flow_run_id())
        return await approval.ask_person(run, timeout=60, poll_interval=1)

    paused, decision = await in_process(asked, ADA)

    assert paused.state_details.pause_key == key
    assert (decision.decision, decision.decided_by) == ("reject", "Ada")
    assert ignored(caplog, response)


async def test_a_question_whose_pause_key_fired_unanswered_is_asked_again(prefect_server):
    # Before, Prefect returned at once from the pause under a used key, with an empty form: the
    # flow run failed on a validation error instead of asking.
    run = spiked_run()
    key = approval.pause_key(run.pending_action)

    @flow
    async def asked() -> Any:
        async with get_client() as client:
            # A pause under the key that ended without an answer (Prefect counts the key fired).
            await client.set_flow_run_state(
                flow_run_id(), Paused(pause_key=key, timeout_seconds=60)
            )
            await client.set_flow_run_state(flow_run_id(), Running(), force=True)
        return await approval.ask_person(run, timeout=60, poll_interval=1)

    paused, decision = await in_process(asked, ADA)

    assert paused.state_details.pause_key == f"{key}-again-2"
    assert (decision.decision, decision.decided_by) == ("reject", "Ada")


async def test_of_four_answers_at_once_one_is_taken_and_the_three_others_are_told(
    prefect_server, monkeypatch
):
    run = spiked_run()
    # All four have seen the pause before any resumes: four people pressing at once.
    everyone_saw_it = asyncio.Barrier(4)
    resume_with = answers.resume_with

    async def at_once(*args: Any) -> answers.Kept:
        await everyone_saw_it.wait()
        return await resume_with(*args)

    monkeypatch.setattr(answers, "resume_with", at_once)

    @flow
    async def asked() -> Any:
        return await approval.ask_person(run, timeout=120, poll_interval=1)

    async with get_client() as client:
        flow_run = await client.create_flow_run(asked)
    running = asyncio.ensure_future(run_flow_async(asked, flow_run=flow_run, return_type="state"))
    await wait_for_pause(flow_run.id)
    people = [("approve", "Ann"), ("reject", "Bo"), ("approve", "Cy"), ("reject", "Di")]

    async def decide(choice: str, name: str) -> dict[str, Any]:
        approve = choice == "approve"
        return await _decide(
            flow_run.id, approve=approve, reject=not approve, reason="seen it", name=name
        )

    results = await asyncio.gather(*(decide(*person) for person in people), return_exceptions=True)
    decision = await (await asyncio.wait_for(running, timeout=120)).result()

    sent = [result for result in results if isinstance(result, dict)]
    told = [result for result in results if isinstance(result, AnsweredByAnother)]
    assert len(sent) == 1 and len(told) == 3, results  # before: four "Sent"
    assert (sent[0]["decision"], sent[0]["decided_by"]) == (decision.decision, decision.decided_by)
    taken = f"another answer was taken first: {decision.decision} by {decision.decided_by}"
    assert all(str(error) == taken for error in told)


async def test_the_terminal_says_when_another_answer_was_taken_first(prefect_server):
    run = spiked_run()

    @flow
    async def asked() -> Any:
        return await approval.ask_person(run, timeout=120, poll_interval=1)

    async def ada(flow_run: FlowRun, description: str) -> RestartDecision:
        # While Ada reads the evidence, someone answers in the Prefect UI.
        await aresume_flow_run(flow_run.id, run_input=EVE)
        return RestartDecision.model_validate(ADA)

    console = Console(record=True, width=200)
    state = await run_training(asked, {}, ada, console, poll=0.3)

    decision = await state.result()
    assert (decision.decision, decision.decided_by) == ("approve", "Eve")
    assert "Another answer was taken first: approve by Eve." in console.export_text()
