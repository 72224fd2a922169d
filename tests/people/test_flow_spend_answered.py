"""A spend question is one story, told once: needed, then answered, for every way it is answered.

What people are told is what Prefect holds: the flow's ``person.needed`` and ``person.answered``
events of the question, and the messages the shipped reminder Automation sends to a webhook
receiver here (it waits for the answer, and says "still waits" when none came). The person does
what a person does: confirms or declines at the backend with a token of their own (its page,
``prefect-ito confirm``), or answers at the terminal ``train`` runs in, or sends the Prefect
form's ``recheck``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from flow_helpers import logs_until, parameters
from prefect import flow, get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.events.filters import EventFilter, EventResourceFilter
from prefect.events.schemas.automations import AutomationCore
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

AUTOMATIONS = Path(__file__).resolve().parents[2] / "deployments" / "automations.yaml"


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


@pytest.fixture
def suspending(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a question's suspension end the flow's process, as under a worker."""

    async def suspend(*_: Any, **__: Any) -> None:
        raise ProcessEnded

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "suspend", suspend)


async def suspended_then_resumed(simulator: Any, how: str | None) -> tuple[Any, Any]:
    """Run a flow that asks for its spend and suspends; then, unless ``how`` is None, a person
    answers at the backend and the flow runs again from the top, as once resumed (by the
    watcher, say). Return the flow run's id and the request."""
    credentials = ItoCredentials(api_url=simulator.url)
    training = TrainingParameters(**parameters(simulator)["training"])
    request = training.to_request(BookingClaim(booking_id=training.booking))

    @flow
    async def asking_for_a_spend() -> Any:
        flow_run_id = current_flow_run_id()
        steps = TaskSteps(credentials, SupervisionParameters())
        with pytest.raises(ProcessEnded):
            await submit_with_consent(steps, request, "key-answered", str(flow_run_id))
        if how is None:
            return None
        asked = await waits.latest_wait(flow_run_id, waits.QuoteWait)  # type: ignore[arg-type]
        assert asked is not None
        await answer_as_the_person(simulator, asked.quote_id, how)
        steps = TaskSteps(credentials, SupervisionParameters())  # a new process's
        try:
            return await submit_with_consent(steps, request, "key-answered", str(flow_run_id))
        except SpendDeclined:
            return None

    state = await asking_for_a_spend(return_state=True)  # type: ignore[call-overload]
    return state.state_details.flow_run_id, request


@pytest.mark.parametrize("how", ["confirm", "decline"])
async def test_a_spend_answered_at_the_backend_while_suspended_is_said_answered_on_resume(
    start_simulator, suspending, how
):
    # Before: a deployment's run suspended for its spend, resumed by the watcher once a person
    # confirmed on the backend's page, ran on from the top without a word: no person.answered,
    # so no closing message, and the reminder (which waits for it) said "still waits" later.
    simulator = start_simulator("default")

    flow_run_id, request = await suspended_then_resumed(simulator, how)

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


class Receiver:
    """A webhook receiver on loopback that keeps every message's subject."""

    def __init__(self) -> None:
        subjects: list[str] = []
        self.subjects = subjects

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                subjects.append(json.loads(self.rfile.read(length))["subject"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reminders_of(self, flow_run_name: str) -> list[str]:
        return [s for s in list(self.subjects) if s.startswith("Reminder") and flow_run_name in s]


@pytest.fixture
async def reminder() -> AsyncIterator[Receiver]:
    """The shipped reminder Automation, sending to a receiver here; 10 s after the question
    (the least Prefect takes) instead of 30 min, the file otherwise as shipped."""
    receiver = Receiver()
    block = CustomWebhookNotificationBlock(
        name="ito-reminder-tests", url=receiver.url, allow_private_urls=True,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    )  # fmt: skip
    block_id = await block.asave(f"ito-reminder-tests-{uuid.uuid4().hex[:8]}")
    (shipped,) = [
        a for a in yaml.safe_load(AUTOMATIONS.read_text())["automations"]
        if a["name"] == "ito-person-reminder"
    ]  # fmt: skip
    shipped["trigger"]["within"] = 10
    shipped["actions"][0]["block_document_id"] = str(block_id)
    async with get_client() as client:
        automation_id = await client.create_automation(AutomationCore.model_validate(shipped))
    try:
        yield receiver
    finally:
        async with get_client() as client:
            await client.delete_automation(automation_id)
        receiver.server.shutdown()
        receiver.server.server_close()


async def test_the_reminder_is_withdrawn_once_the_spend_was_answered(
    start_simulator, suspending, reminder
):
    # Before: the reminder said "still waits" of a spend confirmed at the backend minutes before.
    simulator = start_simulator("default")
    answered, _ = await suspended_then_resumed(simulator, "confirm")
    unanswered, _ = await suspended_then_resumed(simulator, None)  # asked later: its reminder
    async with get_client() as client:
        names = {i: (await client.read_flow_run(i)).name for i in (answered, unanswered)}

    # The question nobody answered gets its reminder; the one answered before it, none.
    async with asyncio.timeout(120):
        while not reminder.reminders_of(names[unanswered]):
            await asyncio.sleep(0.5)
    assert reminder.reminders_of(names[answered]) == []


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
