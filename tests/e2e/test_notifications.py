"""People are told when a training run needs them: the shipped Automations, end to end.

A real server and process worker; a webhook receiver on loopback behind Prefect's own
``CustomWebhookNotificationBlock``; ``deployments/automations.yaml`` created from the file with
the block's id filled in as docs/deployments.md says. A spend wait and a restart wait each send
their message (with the link to that flow run, and no token), both show in ``prefect-ito inbox``
while a run parked for the watcher does not, and answering sends the closing message.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from cli_in_process import in_process
from e2e_stack import (
    ACCOUNT,
    APPROVE_BOOKING,
    CHECKOUT,
    CONFIRM_BOOKING,
    LOST_BOOKING,
    NIGHTLY,
    NIGHTS_BOOKING,
    Stack,
    backend_runs,
    completed,
    decide_as_the_person,
    environment,
    named,
    on_booking,
    start_training,
    start_watcher,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.schedules import IntervalSchedule
from prefect.events import emit_event
from prefect.events.schemas.automations import AutomationCore
from prefect.states import Cancelled
from processes import stop_process

from prefect_ito.contract import DecisionChoice, DecisionRequest

AUTOMATIONS = CHECKOUT / "deployments" / "automations.yaml"
BLOCK = "ito-e2e-people"
MESSAGE_WAIT = 30.0
"""How long a message may take after the pause: the brief's promise to a person."""


# SQLite only: events and Automations are the same on either database.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True),
]


class Receiver:
    """A webhook receiver on loopback that records every POST body."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(self.rfile.read(length).decode())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def messages(self, containing: str) -> list[dict[str, str]]:
        return [json.loads(b) for b in list(self.bodies) if containing in b]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    running.thread.start()
    try:
        yield running
    finally:
        running.server.shutdown()
        running.server.server_close()


def create_shipped_automations(stack: Stack, receiver: Receiver, scratch: Path) -> None:
    """Save the webhook block and create the shipped Automations, as docs/deployments.md says."""
    CustomWebhookNotificationBlock(
        name="ito-e2e",
        url=receiver.url,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        allow_private_urls=True,
    ).save(BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]
    env = environment(stack.api_url, scratch / "automations")
    # The documented lines, word for word but for the block's name and the file's place.
    script = (
        f'ID=$({sys.executable} -c "from prefect.blocks.core import Block; '
        f"print(Block.load('custom-webhook/{BLOCK}')._block_document_id)\")\n"
        f'sed "s/ITO_NOTIFY_BLOCK_ID/$ID/" {AUTOMATIONS} > {scratch}/ito-automations.yaml\n'
        f"{sys.executable} -m prefect automation create --from-file "
        f"{scratch}/ito-automations.yaml\n"
    )
    result = subprocess.run(
        ["bash", "-euc", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Created 4 automation(s)" in result.stdout, result.stdout


def paused_under(prefix: str):
    def check(flow_run) -> bool:
        state = flow_run.state
        key = state.state_details.pause_key if state else None
        return bool(state and state.is_paused() and key and key.startswith(prefix))

    return check


def inbox(stack: Stack, scratch: Path) -> list[dict]:
    """Return ``prefect-ito inbox --json``'s rows, run in this process: what it reads is the
    server's, the same from a child."""
    result = in_process("inbox", "--json", env=environment(stack.api_url, scratch / "inbox"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)["data"]


@pytest.fixture
async def shipped_automations(stack: Stack) -> AsyncIterator[None]:
    """Delete the shipped Automations a test created: they watch a server other tests share."""
    yield
    names = [a["name"] for a in yaml.safe_load(AUTOMATIONS.read_text())["automations"]]
    async with get_client() as client:
        for name in names:
            for automation in await client.read_automations_by_name(name):
                await client.delete_automation(automation.id)


async def test_a_spend_and_a_restart_wait_notify_show_in_the_inbox_and_close_when_answered(
    stack: Stack, receiver: Receiver, tmp_path: Path, shipped_automations: None
):
    # Without a watcher, a parked run stays parked while the inbox is read. It is stopped while
    # the Automations are created (each takes its time: the watcher ends its sweep first).
    await asyncio.gather(
        asyncio.to_thread(create_shipped_automations, stack, receiver, tmp_path),
        asyncio.to_thread(stop_process, stack.watcher, timeout=30),
    )
    spend = await start_training({**on_booking(CONFIRM_BOOKING), "authorization": None})
    restart = await start_training(on_booking(APPROVE_BOOKING))
    parked = await start_training(on_booking(LOST_BOOKING, defer_after=1))

    for flow_run, prefix in ((spend, "spend-"), (restart, "restart-")):
        await wait_for_flow_run(flow_run.id, paused_under(prefix))
        # The link opens that flow run's page in this server's UI.
        link = f"{stack.api_url.removesuffix('/api')}/runs/flow-run/{flow_run.id}"
        (needed, *_) = await wait_for(
            lambda link=link: receiver.messages(link), timeout=MESSAGE_WAIT
        )
        assert needed["subject"].startswith("Itô training needs you: "), needed
        assert "Evidence: " in needed["body"] and "Or run: prefect-ito " in needed["body"]
    await wait_for_flow_run(parked.id, paused_under("defer-"))

    waiting = {entry["flow_run_id"]: entry for entry in inbox(stack, tmp_path)}
    assert {str(spend.id), str(restart.id)} <= set(waiting), waiting
    assert str(parked.id) not in waiting
    assert waiting[str(restart.id)]["command"].startswith(f"prefect-ito decide {restart.id}")
    assert waiting[str(spend.id)]["kind"] == "spend" and waiting[str(spend.id)]["asked"]

    # The restart's flow run is suspended with no process: the watcher resumes it once the
    # backend says a person decided. It starts now, the parked run gone, before anyone answers.
    async with get_client() as client:
        await client.set_flow_run_state(parked.id, Cancelled(), force=True)
    assert stack.watcher_env is not None and stack.watcher_log is not None
    stack.watcher = start_watcher(stack.watcher_env, stack.watcher_log)

    # The Automations watch the whole server, which other tests share: a question of theirs
    # that expires meanwhile sends its own closing message (seen in CI), to be told apart.
    other = f"{stack.api_url.removesuffix('/api')}/runs/flow-run/{uuid.uuid4()}"
    receiver.bodies.append(
        json.dumps({"subject": "Itô training: nobody answered in time (other)", "body": other})
    )
    # A spend is declined through Prefect's API, as its form sends it; a restart is decided at
    # the backend by a person (contract v0.5), with a note. Each sends its closing message.
    async with get_client() as client:
        await client.resume_flow_run(spend.id, run_input={"decision": "decline", "reason": "no"})
    rejected = DecisionRequest(decision=DecisionChoice.REJECT, decided_by="Ada", reason="noise")
    await decide_as_the_person(stack, APPROVE_BOOKING, rejected, "notifications-decision")

    def closed(flow_run: FlowRun) -> list[dict[str, str]]:
        link = f"{stack.api_url.removesuffix('/api')}/runs/flow-run/{flow_run.id}"
        return [m for m in receiver.messages(link) if "answered" in m["subject"]]

    closing = await wait_for(
        lambda: closed(restart) and closed(spend) and closed(restart) + closed(spend),
        timeout=120,
    )
    assert any(
        f"> By: user:{ACCOUNT}" in m["body"] and "> Answer: reject" in m["body"] for m in closing
    ), closing
    assert any("> Answer: declined" in m["body"] for m in closing), closing
    assert stack.token.get_secret_value() not in "".join(receiver.bodies)


async def test_a_question_nobody_answers_gets_its_reminder_with_the_question_s_facts(
    stack: Stack, receiver: Receiver
):
    # The reminder is a proactive trigger: it fires on an answer that does not come, so its
    # message renders the facts of the question it follows.
    async with get_client() as client:
        automation_id = await _create_reminder(client, receiver, within=REMINDER_WITHIN)
    try:
        emit_event(
            event="ito.training.person.needed",
            resource={"prefect.resource.id": "ito.question.reminder-check"},
            payload={
                "asked": "confirm the spend of $23k–$34k on booking bk-reminder",
                "evidence": "estimate $23k–$34k, ceiling $250,000",
                "deadline": "2026-12-03 09:00 UTC",
                "link": "http://127.0.0.1/runs/flow-run/reminder-check",
                "command": "prefect-ito confirm --quote quote_reminder",
                "flow_run_id": "reminder-check",
            },
        )
        (reminder, *_) = await wait_for(
            reminders_of("bk-reminder", receiver), timeout=REMINDER_WITHIN + 3 * MESSAGE_WAIT
        )
    finally:
        async with get_client() as client:
            await client.delete_automation(automation_id)
    # The event was sent from no flow run, as a forger's would be: no link or command of its own.
    assert reminder["subject"] == (
        "Reminder, Itô training still waits: a question (no flow run named)"
    ), reminder
    assert "> confirm the spend of $23k–$34k on booking bk-reminder" in reminder["body"], reminder
    assert "> Answer by: 2026-12-03 09:00 UTC" in reminder["body"], reminder
    assert "prefect-ito confirm --quote quote_reminder" not in reminder["body"], reminder
    assert "treat this message as forged" in reminder["body"], reminder


async def _create_reminder(client: PrefectClient, receiver: Receiver, within: int) -> UUID:
    """Create the shipped reminder Automation, sending to ``receiver`` after ``within`` seconds.

    Shipped at 30 min; 10 s is the least Prefect takes. The file otherwise as shipped, the block
    id filled in.
    """
    block = CustomWebhookNotificationBlock(
        name="ito-e2e-reminder", url=receiver.url, allow_private_urls=True,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    )  # fmt: skip
    block_id = await block.asave(f"{BLOCK}-reminder", overwrite=True)
    (shipped,) = [
        a for a in yaml.safe_load(AUTOMATIONS.read_text())["automations"]
        if a["name"] == "ito-person-reminder"
    ]  # fmt: skip
    shipped["trigger"]["within"] = within
    shipped["actions"][0]["block_document_id"] = str(block_id)
    return await client.create_automation(AutomationCore.model_validate(shipped))


def reminders_of(booking: str, receiver: Receiver):
    """Return a check for the reminders about ``booking`` (the "needed" message comes too)."""

    def check() -> list[dict[str, str]]:
        return [m for m in receiver.messages(booking) if m["subject"].startswith("Reminder")]

    return check


NIGHTS = 3
NIGHT_SECONDS = 10
"""A night of the nightly schedule here: each scheduled flow run starts this long after the last.

Short, since the later nights are scheduled only once the first night waits for a person: what
they prove (they start while it waits) does not hang on how long the first night takes to get
there on a busy machine."""
REMINDER_WITHIN = 10
"""The reminder's wait here, in seconds: shipped at 30 min; 10 s is the least Prefect takes."""


async def test_a_nightly_schedule_over_a_training_that_outlasts_three_nights_asks_once(
    stack: Stack, receiver: Receiver, tmp_path: Path
):
    """The shipped nightly deployment, on an interval schedule whose nights are 10 s, over a run
    that waits at a loss spike for a person through three nights: one backend run, one question,
    one needed and one answered event, a reminder only while it is open, and no inbox row after."""
    first_night = datetime.now(UTC)
    async with get_client() as client:
        deployment_id = await _nightly_on(client, NIGHTS_BOOKING, first_night)
        reminder = await _create_reminder(client, receiver, within=REMINDER_WITHIN)
        try:
            # What Prefect's scheduler service does on its loop, asked for now: the first night,
            # due at once; once it waits for a person, the loop again, three nights in all.
            await _schedule(client, deployment_id, first_night, nights=1)
            (night,) = await _runs_of(client, deployment_id)
            first = await wait_for_flow_run(night.id, named("Suspended"))
            await _schedule(client, deployment_id, first_night, nights=NIGHTS)
            nights = await _runs_of(client, deployment_id)
            assert len(nights) == NIGHTS and nights[0].id == first.id, nights
            ids = [night.id for night in nights]
            # Each later night ends at once, asking nothing: the first night's run holds it.
            for later in nights[1:]:
                await wait_for_flow_run(later.id, named("BookingBusy"))
            # The question is open all this while: its reminder comes, once.
            await wait_for(lambda: _reminders(receiver, first.id), timeout=60)
            approve = DecisionRequest(decision=DecisionChoice.APPROVE, reason="a data glitch")
            await decide_as_the_person(stack, NIGHTS_BOOKING, approve, "three-nights-decision")
            await wait_for_flow_run(first.id, completed)
            told = await _question_events(client, ids, "answered")
            # A question asked again would have its reminder by then: wait longer than its
            # REMINDER_WITHIN from now, reading the inbox meanwhile.
            quiet_until = asyncio.get_running_loop().time() + REMINDER_WITHIN + 5
            waiting = inbox(stack, tmp_path)
            await asyncio.sleep(quiet_until - asyncio.get_running_loop().time())
            asked = await _question_events(client, ids, "needed")
        finally:
            await client.delete_automation(reminder)
            await client.delete_deployment(deployment_id)

    assert len(backend_runs(stack, NIGHTS_BOOKING)) == 1
    # One question, asked by the first night alone, and said answered once.
    assert len(asked) == 1 and str(first.id) in asked[0]["resource"]["prefect.resource.id"]
    assert [e["resource"]["prefect.resource.id"] for e in told] == [
        e["resource"]["prefect.resource.id"] for e in asked
    ]
    assert len(_reminders(receiver, first.id)) == 1  # while it was open; none after the answer
    assert not {str(i) for i in ids} & {e["flow_run_id"] for e in waiting}


async def _nightly_on(client: PrefectClient, booking_id: str, first_night: datetime) -> UUID:
    """Create the shipped nightly deployment again on ``booking_id``, with short nights from
    ``first_night`` on."""
    nightly = await client.read_deployment_by_name(NIGHTLY)
    return await client.create_deployment(
        flow_id=nightly.flow_id,
        name="three-nights",
        entrypoint=nightly.entrypoint,
        work_pool_name=nightly.work_pool_name,
        pull_steps=nightly.pull_steps,
        parameters={**nightly.parameters, **on_booking(booking_id)},
        parameter_openapi_schema=nightly.parameter_openapi_schema,
        # Paused, Prefect's scheduler service leaves it alone (it would schedule a hundred runs
        # at its next loop); the test asks the server's own scheduling for three nights.
        paused=True,
        schedules=[
            DeploymentScheduleCreate(
                schedule=IntervalSchedule(
                    interval=timedelta(seconds=NIGHT_SECONDS), anchor_date=first_night
                ),
                max_scheduled_runs=NIGHTS,
            )
        ],
    )


async def _schedule(
    client: PrefectClient, deployment_id: UUID, first_night: datetime, nights: int
) -> None:
    """Ask the server to schedule the deployment's first ``nights`` nights from ``first_night``,
    as its scheduler service does; a night already scheduled is kept, not made again."""
    response = await client._client.post(
        f"/deployments/{deployment_id}/schedule",
        json={"start_time": first_night.isoformat(), "max_runs": nights},
    )
    response.raise_for_status()


async def _runs_of(client: PrefectClient, deployment_id: UUID) -> list[FlowRun]:
    """Return the deployment's flow runs, by the time each was scheduled for."""
    only_this = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
    runs = await client.read_flow_runs(deployment_filter=only_this)
    return sorted(runs, key=lambda run: run.expected_start_time or datetime.max.replace(tzinfo=UTC))


async def _question_events(
    client: PrefectClient, flow_run_ids: list[UUID], said: str
) -> list[dict[str, Any]]:
    """Return the ``ito.training.person.<said>`` events Prefect holds of these flow runs'
    questions, once it holds one (it writes what it receives a moment later)."""
    body = {
        "filter": {
            "event": {"name": [f"ito.training.person.{said}"]},
            "resource": {"id_prefix": [f"ito.question.{i}." for i in flow_run_ids]},
        },
        "limit": 50,
    }

    async def read() -> list[dict[str, Any]]:
        response = await client._client.post("/events/filter", json=body)
        response.raise_for_status()
        return list(response.json()["events"])

    async with asyncio.timeout(60):
        while not (events := await read()):
            await asyncio.sleep(1)
    return events


def _reminders(receiver: Receiver, flow_run_id: UUID) -> list[dict[str, str]]:
    return [m for m in receiver.messages(str(flow_run_id)) if m["subject"].startswith("Reminder")]
