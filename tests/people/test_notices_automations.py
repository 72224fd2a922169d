"""The shipped Automations file: valid for Prefect once the block's id is in, and readable.

No server: Prefect's own models validate the file, its own template renderer renders each
message from a question's payload, and its own label matching says which flow-run failures
count as an expired question.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml
from prefect.events.schemas.automations import AutomationCore
from prefect.server.events.schemas.events import matches  # the server evaluates triggers
from prefect.server.utilities.user_templates import render_user_template

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
    "command": "prefect-ito decide f-1 --approve|--reject --reason TEXT --name NAME",
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


async def test_the_needed_message_renders_every_fact_of_the_payload():
    action = automations()[0].actions[0]
    context = {"event": {"payload": PAYLOAD}}
    body = await render_user_template(action.body, context)  # type: ignore[union-attr]
    subject = await render_user_template(action.subject, context)  # type: ignore[union-attr]
    assert subject == f"Itô training needs you: {PAYLOAD['asked']}"
    for fact in ("evidence", "deadline", "held", "link", "command"):
        assert PAYLOAD[fact] in body, fact


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
