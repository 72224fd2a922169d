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
from flow_helpers import (
    DecidedAtTheBackend,
    answered_suspension,
    parameters,
    spiked_run,
    wait_for_pause,
)
from prefect import flow, get_client
from prefect.context import FlowRunContext
from prefect.flow_engine import run_flow_async
from prefect.input import create_flow_run_input
from prefect.states import Paused, Running, Suspended

from prefect_ito.backend import desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import TrainingRun
from prefect_ito.parameters import BookingClaim, SupervisionParameters, TrainingParameters
from prefect_ito.people import answers, approval, asking, spend
from prefect_ito.supervision.tasks import TaskSteps

EVE = {"decision": "recheck", "reason": "written before anyone saw it"}
ADA = {"decision": "recheck", "reason": "Ada decided at the backend"}
FORGED = {"decision": "approve", "decided_by": "Eve", "reason": "the form of before v0.5"}


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


def proposed(pending_reads: int = 0) -> tuple[TrainingRun, DecidedAtTheBackend, str]:
    """Return a run whose restart is proposed, the steps that read it decided at the backend
    after ``pending_reads`` reads, and the pause key its question is asked under."""
    run = spiked_run()
    return run, DecidedAtTheBackend(run, pending_reads), approval.pause_key(run.pending_action)


async def decided(steps: DecidedAtTheBackend, run: TrainingRun) -> TrainingRun:
    """Wait for the run's decision as the flow does, polling every second."""
    return await approval.wait_for_decision(steps, run, timeout=60, poll_interval=1)


async def decided_or_left(steps: DecidedAtTheBackend, run: TrainingRun, response: str) -> Any:
    """Wait for the decision; once the flow suspends to ask a person, return what is left
    under ``response`` (None: the early answer was removed, not taken)."""
    try:
        return await decided(steps, run)
    except Suspension:
        return await stored(response)


def ignored(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and key in record.getMessage()
        and "before the question was asked" in record.getMessage()
    ]


@pytest.mark.parametrize("fired", [False, True], ids=["before-it", "before-a-suspension-of-its"])
async def test_a_restart_answer_older_than_its_suspension_is_ignored_and_a_person_asked(
    prefect_server, suspensions, caplog, fired
):
    # ``fired``: Prefect's server deletes a pause's inputs when the pause begins, in one
    # transaction; an input written beside it may still outlive it (or a state may be written
    # directly). It is older than the question: no answer to it.
    run, steps, key = proposed()
    response = answers.response_key("suspended", key)

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, EVE, flow_run_id=flow_run_id())
        if fired:
            async with get_client() as client:
                suspended = Suspended(timeout_seconds=300, pause_key=key)
                await client.set_flow_run_state(flow_run_id(), suspended, force=True)
                await client.set_flow_run_state(flow_run_id(), Running(), force=True)
        return await decided_or_left(steps, run, response)

    left = await asked()

    # The person is asked (before, Eve's answer was taken); Prefect returns at once from a pause
    # under a key that fired, so then under a key of its own.
    assert suspensions == ([f"{key}-again-2"] if fired else [key])
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
                steps,
                quote,
                request,
                again=False,
                why=spend.NO_AUTHORIZATION,
                timeout=60,
                poll_interval=1,
            )
        except Suspension:
            return await stored(response)

    left = await asked()

    assert suspensions == [key]  # the person is asked; the early answer was not taken
    assert left is None
    assert ignored(caplog, response)
    assert [r for r in simulator.requests() if r.path.endswith("/declines")] == []


async def test_an_answer_given_after_the_suspension_is_taken_and_nobody_asked_twice(
    prefect_server, suspensions
):
    run, steps, key = proposed()

    @flow
    async def resumed() -> Any:
        await answered_suspension(key, ADA)
        return await decided(steps, run)

    decision = await resumed()

    assert suspensions == []
    assert decision.pending_action is None and steps.reads == 1  # the backend, read once


async def test_an_answer_is_found_behind_many_inputs_whose_keys_start_with_its_key(
    prefect_server, suspensions
):
    # Prefect's input filter matches a key prefix, oldest first, a page at a time.
    run, steps, key = proposed()
    response = answers.response_key("suspended", key)

    @flow
    async def resumed() -> Any:
        for n in range(120):
            await create_flow_run_input(f"{response}-{n}", EVE, flow_run_id=flow_run_id())
        await answered_suspension(key, ADA)
        return await decided(steps, run)

    decision = await resumed()

    assert suspensions == []  # before: the answer went unseen and the person was asked again
    assert decision.pending_action is None and steps.reads == 1  # the backend, read once


async def in_process(asked: Any) -> Any:
    """Run ``asked`` here until it pauses, then until a person's decision at the backend (which
    the flow reads at every poll) resumes it; return the pause and the result."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(asked)
    running = asyncio.ensure_future(run_flow_async(asked, flow_run=flow_run, return_type="state"))
    paused = await wait_for_pause(flow_run.id)
    state = await asyncio.wait_for(running, timeout=120)
    return paused, await state.result()


async def test_an_answer_written_before_an_in_process_pause_is_logged_and_the_person_decides(
    prefect_server, caplog
):
    # Prefect 3.9.1's server deletes it when the pause begins, silently; now the log says so.
    run, steps, key = proposed(1)
    response = answers.response_key("paused", key)

    @flow
    async def asked() -> Any:
        await create_flow_run_input(response, EVE, flow_run_id=flow_run_id())
        return await decided(steps, run)

    paused, decision = await in_process(asked)

    assert paused.state_details.pause_key == key
    assert decision.pending_action is None and steps.reads >= 2
    assert ignored(caplog, response)


async def test_a_question_whose_pause_key_fired_unanswered_is_asked_again(prefect_server):
    # Before, Prefect returned at once from the pause under a used key, with an empty form: the
    # flow run failed on a validation error instead of asking.
    run, steps, key = proposed(1)

    @flow
    async def asked() -> Any:
        async with get_client() as client:
            # A pause under the key that ended without an answer (Prefect counts the key fired).
            await client.set_flow_run_state(
                flow_run_id(), Paused(pause_key=key, timeout_seconds=60)
            )
            await client.set_flow_run_state(flow_run_id(), Running(), force=True)
        return await decided(steps, run)

    paused, decision = await in_process(asked)

    assert paused.state_details.pause_key == f"{key}-again-2"
    assert decision.pending_action is None and steps.reads >= 2


async def test_an_approval_written_in_prefect_decides_nothing_and_the_person_is_asked_again(
    prefect_server, suspensions, caplog
):
    # Before v0.5, an answer anyone with Prefect API access stored ("approve", any name) was
    # relayed to the backend as a person's decision. Now the form takes only "recheck", and an
    # answer of another shape is no answer: removed, logged, and the person asked again.
    run, steps, key = proposed(10)

    @flow
    async def resumed() -> Any:
        await answered_suspension(key, FORGED)
        return await decided_or_left(steps, run, answers.response_key("suspended", key))

    left = await resumed()

    assert left is None and steps.reads == 0  # nothing taken, nothing read as an answer
    assert suspensions == [f"{key}-again-2"]  # asked again, under a key of its own
    assert any(
        "in a shape the question's form does not take" in record.getMessage()
        for record in caplog.records
    )
