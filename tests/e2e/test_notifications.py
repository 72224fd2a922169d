"""People are told when a training run needs them: the shipped Automations, end to end.

A real server and process worker; a webhook receiver on loopback behind Prefect's own
``CustomWebhookNotificationBlock``; ``deployments/automations.yaml`` created from the file with
the block's id filled in as docs/deployments.md says. A spend wait and a restart wait each send
their message (with the link to that flow run, and no token), both show in ``prefect-ito inbox``
while a run parked for the watcher does not, and answering sends the closing message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from e2e_stack import (
    ACCOUNT,
    APPROVE_BOOKING,
    CHECKOUT,
    CONFIRM_BOOKING,
    LOST_BOOKING,
    Stack,
    decide_as_the_person,
    environment,
    on_booking,
    start_training,
    start_watcher,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.schemas.objects import FlowRun
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
    env = environment(stack.api_url, scratch / "inbox")
    result = subprocess.run(
        [sys.executable, "-m", "prefect_ito.cli", "inbox", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
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
    create_shipped_automations(stack, receiver, tmp_path)
    # Without a watcher, a parked run stays parked while the inbox is read.
    stop_process(stack.watcher, timeout=30)  # mid-test: let it end its sweep
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

    # The restart's flow run is suspended with no process: the watcher resumes it once the
    # backend says a person decided.
    async with get_client() as client:
        await client.set_flow_run_state(parked.id, Cancelled(), force=True)
    assert stack.watcher_env is not None and stack.watcher_log is not None
    stack.watcher = start_watcher(stack.watcher_env, stack.watcher_log)
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
    # message renders the facts of the question it follows. Shipped at 30 min; 10 s here (the
    # least Prefect takes), the file otherwise as shipped, the block id filled in.
    block = CustomWebhookNotificationBlock(
        name="ito-e2e-reminder", url=receiver.url, allow_private_urls=True,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    )  # fmt: skip
    block_id = await block.asave(f"{BLOCK}-reminder", overwrite=True)
    (shipped,) = [
        a for a in yaml.safe_load(AUTOMATIONS.read_text())["automations"]
        if a["name"] == "ito-person-reminder"
    ]  # fmt: skip
    shipped["trigger"]["within"] = 10
    shipped["actions"][0]["block_document_id"] = str(block_id)
    async with get_client() as client:
        automation_id = await client.create_automation(AutomationCore.model_validate(shipped))
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
            reminders_of("bk-reminder", receiver), timeout=10 + 3 * MESSAGE_WAIT
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


def reminders_of(booking: str, receiver: Receiver):
    """Return a check for the reminders about ``booking`` (the "needed" message comes too)."""

    def check() -> list[dict[str, str]]:
        return [m for m in receiver.messages(booking) if m["subject"].startswith("Reminder")]

    return check
