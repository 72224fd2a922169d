"""A spend question is one story, told once: needed, then answered, for every way it is answered.

What people are told is what Prefect holds: the flow's ``person.needed`` and ``person.answered``
events of the question (the shipped Automations turn them into messages, and the reminder waits
for the answer). The person does what a person does: confirms or declines at the backend with a
token of their own (its page, ``prefect-ito confirm``), or answers at the terminal ``train``
runs in, or sends the Prefect form's ``recheck``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from flow_helpers import logs_until, parameters
from prefect import flow, get_client
from prefect.events.filters import EventFilter, EventResourceFilter
from spend_helpers import PERSON
from test_flow_spend import Confirmer, run_with

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import ALL_SCOPES
from prefect_ito.exceptions import SpendDeclined
from prefect_ito.parameters import BookingClaim, SupervisionParameters, TrainingParameters
from prefect_ito.people import asking
from prefect_ito.people.notices import PERSON_ANSWERED, PERSON_NEEDED
from prefect_ito.people.spend import pause_key, submit_with_consent
from prefect_ito.supervision.tasks import TaskSteps
from prefect_ito.waiting import waits
from prefect_ito.waiting.flow_run import current_flow_run_id


class ProcessEnded(Exception):
    """A suspension: the flow run's process ends, and a resume runs the flow from the top."""


async def question_events(flow_run_id: Any) -> list[Any]:
    """Return the events Prefect holds of the flow run's questions, once one says it was
    answered (Prefect writes what it receives a little later), oldest first."""
    filter_ = EventFilter(resource=EventResourceFilter(id_prefix=[f"ito.question.{flow_run_id}."]))
    async with asyncio.timeout(30), get_client() as client:
        while True:
            events = (await client.read_events(filter=filter_, limit=50)).events
            if any(event.event == PERSON_ANSWERED for event in events):
                await asyncio.sleep(1)  # a second one would be in the same batch or the next
                events = (await client.read_events(filter=filter_, limit=50)).events
                return sorted(events, key=lambda event: event.occurred)
            await asyncio.sleep(0.5)


async def answer_as_the_person(simulator: Any, quote_id: str, how: str) -> None:
    """Confirm or decline at the backend as the tests' person, as its page or `confirm` does."""
    token = simulator.mint_token("flow-tests", scopes=ALL_SCOPES, principal=PERSON)
    async with ItoClient(simulator.url, token) as person:
        answering = person.confirm_quote if how == "confirm" else person.decline_quote
        await answering(quote_id, note="looked at it", idempotency_key=f"tests-{uuid.uuid4()}")


@pytest.mark.parametrize("how", ["confirm", "decline"])
async def test_a_spend_answered_at_the_backend_while_suspended_is_said_answered_on_resume(
    start_simulator, monkeypatch, how
):
    # Before: a deployment's run suspended for its spend, resumed by the watcher once a person
    # confirmed on the backend's page, ran on from the top without a word: no person.answered,
    # so no closing message, and the reminder (which waits for it) said "still waits" later.
    async def suspend(*_: Any, **__: Any) -> None:
        raise ProcessEnded

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", suspend)
    simulator = start_simulator("default")
    credentials = ItoCredentials(api_url=simulator.url)
    training = TrainingParameters(**parameters(simulator)["training"])
    request = training.to_request(BookingClaim(booking_id=training.booking))

    @flow
    async def suspended_then_resumed() -> Any:
        flow_run_id = current_flow_run_id()
        steps = TaskSteps(credentials, SupervisionParameters())
        with pytest.raises(ProcessEnded):
            await submit_with_consent(steps, request, "key-answered", str(flow_run_id))
        asked = await waits.latest_wait(flow_run_id, waits.QuoteWait)  # type: ignore[arg-type]
        assert asked is not None
        await answer_as_the_person(simulator, asked.quote_id, how)
        # Resumed (by the watcher, say): the flow runs again from the top, in a new process.
        steps = TaskSteps(credentials, SupervisionParameters())
        try:
            return await submit_with_consent(steps, request, "key-answered", str(flow_run_id))
        except SpendDeclined:
            return None

    state = await suspended_then_resumed(return_state=True)  # type: ignore[call-overload]

    flow_run_id = state.state_details.flow_run_id
    events = await question_events(flow_run_id)
    assert [event.event for event in events] == [PERSON_NEEDED, PERSON_ANSWERED]
    needed, answered = events
    question = f"ito.question.{flow_run_id}.{pause_key(request.digest())}"
    # The same question, so the reminder that waits for its answer is withdrawn.
    assert needed.resource.id == answered.resource.id == question
    assert answered.payload["answer"] == ("confirmed" if how == "confirm" else "declined")
    assert answered.payload["answered_by"] == PERSON
    assert answered.payload["note"] == "looked at it"
    assert any(r.id == f"prefect.flow-run.{flow_run_id}" for r in answered.related)
    assert (simulator.runs() != []) is (how == "confirm")


async def test_a_spend_confirmed_at_the_terminal_is_said_answered_once(start_simulator):
    simulator = start_simulator("default")

    state = await run_with(simulator, Confirmer(simulator, "confirm"))

    assert state.is_completed(), state.message
    events = await question_events(state.state_details.flow_run_id)
    assert [event.event for event in events] == [PERSON_NEEDED, PERSON_ANSWERED]
    assert events[1].payload["answer"] == "confirmed"


async def test_a_recheck_before_any_confirmation_says_it_is_still_pending_and_where_to_confirm(
    start_simulator,
):
    # Before: the flow asked again with no word that nothing had changed at the backend.
    simulator = start_simulator("default")
    person = Confirmer(simulator, "recheck", "confirm")

    state = await run_with(simulator, person)

    assert state.is_completed(), state.message
    assert len(person.asked) == 2  # asked again after the recheck, then confirmed
    quote = person.asked[0].quote
    assert quote is not None
    logs = await logs_until(state.state_details.flow_run_id, "still pending")
    (said,) = [log.message for log in logs if "still pending" in log.message]
    assert quote.quote_id in said and "/confirm" in said
    assert f"prefect-ito confirm {quote.quote_id}" in said
    events = await question_events(state.state_details.flow_run_id)
    assert [event.event for event in events].count(PERSON_ANSWERED) == 1
