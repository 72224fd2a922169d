"""Telling people they are needed: the Prefect events a wait for a person emits, and its record.

When a training flow run starts waiting for a person (to confirm a spend, or to decide what a
backend proposes: a restart, a deadline extension), it emits :data:`PERSON_NEEDED` once per
question, and :data:`PERSON_ANSWERED` once someone answered. The Automations shipped in
``deployments/automations.yaml`` turn them into messages through whatever Prefect notification
block a user has (Slack, Teams, email, a webhook), plus a reminder when nobody answered in time
and a closing message when the deadline passed (from Prefect's own flow-run events: a suspended
run holds no process at its deadline). ``docs/deployments.md`` shows how to create them.

Each event's payload is a :class:`Question`: what is asked, the evidence in one line, the
deadline, what the wait cost so far, the link to the flow run's page (its Resume form) and the
command that answers it — numbers as numbers, never a token. Event ids are derived from the flow
run and the question, so a flow run that re-enters and asks the same question again notifies
nobody twice (Prefect's triggers skip an event id they have seen).

The same facts are kept as a flow-run input (``ito-question-<pause key>``) that
``prefect-ito inbox`` reads. Anyone with Prefect API access can write that input too: it is only
ever displayed, never acted on.

One module past ~400 lines: a question is told, told again by a watcher (:func:`tell_again`,
from the backend) and answered from the one :class:`Question` built here, so that every telling
says the same.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta
from uuid import UUID

import httpx
from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.events import emit_event
from prefect.events.filters import EventFilter, EventIDFilter
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.utilities.urls import url_for
from pydantic import BaseModel, Field

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.refusals import NO_AUTHORIZATION, Uncovered
from prefect_ito.contract import (
    DecisionRecord,
    PendingAction,
    QuoteState,
    SpendAuthorizationState,
    TrainingQuote,
    TrainingRun,
)
from prefect_ito.exceptions import SpendAuthorizationNotFound
from prefect_ito.questions import ActionQuestion, question_for
from prefect_ito.questions.commands import confirm_command, decide_command
from prefect_ito.questions.registry import Kind
from prefect_ito.questions.spend import SPEND
from prefect_ito.reporting.holding import Held, held
from prefect_ito.waiting.flow_run import current_flow_run_id
from prefect_ito.waiting.keys import QUESTION_RECORD_PREFIX, spend_pause_key
from prefect_ito.waiting.waits import ActionWait, QuoteWait, WaitRecord, question_deadline

__all__ = [
    "PERSON_ANSWERED",
    "PERSON_NEEDED",
    "Question",
    "action_answered",
    "action_needed",
    "confirm_command",
    "decide_command",
    "spend_answered",
    "spend_needed",
    "tell_again",
]

PERSON_NEEDED = "ito.training.person.needed"
"""Emitted once when a training flow run starts waiting for a person's answer to a question."""


PERSON_ANSWERED = "ito.training.person.answered"
"""Emitted once when someone answered the question (``answered_by``, ``answer`` in the payload)."""

_EVENT_NAMESPACE = uuid.UUID("5c0b1f0e-8f2d-4b7a-9e61-3a4d2c9b7e15")


class Question(BaseModel):
    """What a person is asked, as notifications and ``prefect-ito inbox`` show it.

    Read back from Prefect it is display-only: anyone with API access may have written it.
    """

    kind: Kind = Field(
        description="What is asked: to confirm a spend, or to decide a restart or a deadline "
        "extension."
    )
    key: str = Field(description="The question's pause key.")
    flow_run_id: str = Field(description="The flow run that waits.")
    asked: str = Field(description="What is asked, in one line.")
    evidence: str = Field(description="The evidence, in one line.")
    why: str | None = Field(
        default=None,
        description="Why a person is needed now, in one line: e.g. which standing "
        "authorization does not cover a spend, and why.",
    )
    asked_at: datetime = Field(description="When the flow run started waiting.")
    deadline: datetime = Field(description="When the question expires unanswered.")
    link: str | None = Field(description="The flow run's page in the Prefect UI (its form).")
    command: str = Field(description="The prefect-ito command that answers it.")
    held_since: datetime | None = Field(default=None, description="Since when the wait costs.")
    held_usd_per_hour: float | None = Field(default=None, description="What waiting costs/hour.")
    held: str | None = Field(default=None, description="What the wait cost so far, in words.")
    held_usd: float | None = Field(default=None, description="What the wait cost so far, USD.")
    numbers: dict[str, float] = Field(
        default_factory=dict, description="The evidence's numbers (estimate, ceiling, loss…)."
    )

    def held_now(self, now: datetime | None = None) -> Held | None:
        """Return what the wait has cost until ``now``; None if nobody said what it costs."""
        if self.held_since is None or self.held_usd_per_hour is None:
            return None
        return held(self.held_since, self.held_usd_per_hour, now)


def spend_needed(
    quote: TrainingQuote, *, timeout: float, why: str | None = None
) -> Question | None:
    """Announce that the flow run waits for a person to confirm or decline ``quote``, ``why``
    saying why a person is needed now.

    Returns the question, or None outside a flow run.
    """
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return None
    asked = _spend_question(quote, flow_run_id, datetime.now(UTC), timeout, why)
    return _needed(asked, identity=quote.quote_id)


def _spend_question(
    quote: TrainingQuote,
    flow_run_id: UUID,
    asked_at: datetime,
    timeout: float,
    why: str | None = None,
) -> Question:
    cost = quote.plan.cost_usd
    return Question(
        kind=SPEND.name,
        key=_spend_key(quote),
        flow_run_id=str(flow_run_id),
        asked=f"Confirm or decline a training spend on booking {quote.booking_id}",
        evidence=f"estimate ${cost.low:,.0f}–${cost.high:,.0f}, ceiling "
        f"${quote.budget_usd:,.0f} (quote {quote.quote_id})",
        why=why,
        asked_at=asked_at,
        deadline=asked_at + timedelta(seconds=timeout),
        link=_link(flow_run_id),
        command=confirm_command(quote.quote_id),
        held_since=asked_at if quote.booking_usd_per_hour is not None else None,
        held_usd_per_hour=quote.booking_usd_per_hour,
        numbers={
            "estimate_low_usd": cost.low,
            "estimate_high_usd": cost.high,
            "ceiling_usd": quote.budget_usd,
        },
    )


def action_needed(
    run: TrainingRun, action: PendingAction, question: ActionQuestion, *, timeout: float
) -> Question | None:
    """Announce that the flow run waits for a person to decide ``action`` (of ``question``'s
    kind) at the backend. Returns the question, or None outside a flow run."""
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return None
    now = datetime.now(UTC)
    asked = _action_question(run, action, question, flow_run_id, now, timeout)
    return _needed(asked, identity=action.action_id)


def _action_question(
    run: TrainingRun,
    action: PendingAction,
    question: ActionQuestion,
    flow_run_id: UUID,
    asked_at: datetime,
    timeout: float,
) -> Question:
    return Question(
        kind=question.name,
        key=question.pause_key(action),
        flow_run_id=str(flow_run_id),
        asked=question.asked(run, action),
        evidence=question.evidence(action),
        asked_at=asked_at,
        deadline=asked_at + timedelta(seconds=timeout),
        link=_link(flow_run_id),
        command=decide_command(flow_run_id),
        held_since=action.held_since,
        held_usd_per_hour=action.hold_usd_per_hour,
        numbers=question.numbers(action),
    )


async def tell_again(flow_run: FlowRun, wait: WaitRecord, client: ItoClient) -> bool:
    """Say again that ``flow_run`` waits for a person, if Prefect holds no ``person.needed`` of
    the question; return whether it was said.

    Prefect may lose an event (its SQLite writer drops a batch after a restart), and a question
    nobody hears of is never answered. The watcher calls this for a question the backend still
    holds open, :data:`~prefect_ito.waiting.watcher.TELL_AGAIN_AFTER_SECONDS` after it was asked.
    What is said comes from the backend (the run and its pending action, read with the watcher's
    own token) and from Prefect's own flow run (its link, the pause's deadline), never from the
    record that named it, which anyone may write; and only for a run or a quote the backend says
    this flow run asked for (its ``client_reference``). The event keeps the question's id, so
    Prefect (and its triggers) keep one, and a message already sent is not sent twice.
    """
    state = flow_run.state
    if state is None or not state.is_paused():
        return False
    asked_at = state.timestamp
    deadline = question_deadline(state)
    timeout = (deadline - asked_at).total_seconds() if deadline else 0.0
    found = await _open_question(flow_run.id, wait, client, asked_at, timeout)
    # The question, asked again after a recheck, waits under its key and a suffix of its own.
    if found is None or not (state.state_details.pause_key or "").startswith(found[0].key):
        return False
    asked, identity = found
    event = event_id(asked.flow_run_id, asked.key, identity, PERSON_NEEDED)
    if await _held(event):
        return False
    _emit_needed(asked, event, related=[_flow_run_resource(flow_run)])
    return True


async def _open_question(
    flow_run_id: UUID, wait: WaitRecord, client: ItoClient, asked_at: datetime, timeout: float
) -> tuple[Question, str] | None:
    """Return the question ``wait`` names as the backend states it, and its identity, while the
    backend holds it open for this flow run; else None."""
    reference = str(flow_run_id)
    if isinstance(wait, QuoteWait):
        quote = await client.get_quote(wait.quote_id)
        if quote.state is not QuoteState.PENDING or quote.client_reference != reference:
            return None
        why = await _why_asked(wait, client)
        return _spend_question(quote, flow_run_id, asked_at, timeout, why), quote.quote_id
    if not isinstance(wait, ActionWait):
        return None
    run = await client.get_training_run(wait.run_id)
    action = run.pending_action
    question = question_for(action)
    if action is None or question is None or action.action_id != wait.action_id:
        return None
    if run.client_reference != reference:
        return None
    return _action_question(run, action, question, flow_run_id, asked_at, timeout), action.action_id


async def _why_asked(wait: QuoteWait, client: ItoClient) -> str | None:
    """Return why a person is asked about the quote ``wait`` names, as when first asked: that
    no standing authorization was named, or which one does not cover the run and why.

    The authorization is read at the backend (its name, and its state now: revoked, expired);
    the backend's reason for refusing an authorization still active is known only from the
    record, which anyone may write, so it is shown quoted, as the record's words. None when the
    record does not say (one written before it did), or names an authorization this account
    does not hold.
    """
    if wait.refused is None:
        return NO_AUTHORIZATION if wait.named_authorization is False else None
    try:
        held = await client.get_spend_authorization(wait.refused.authorization_id)
    except SpendAuthorizationNotFound:
        return None
    if held.state is SpendAuthorizationState.ACTIVE:
        recorded = _quoted(wait.refused.reason)
        reason = f"the backend's reason, as the flow run recorded it: {recorded}"
    else:
        reason = f"the authorization is {held.state.value}"
    return Uncovered(authorization_id=held.authorization_id, reason=reason).why(held.name)


def _quoted(text: str, limit: int = 300) -> str:
    """Return ``text`` in quotation marks, on one line and at most ``limit`` characters."""
    line = " ".join(text.split()).replace('"', "'")
    return f'"{line[:limit]}…"' if len(line) > limit else f'"{line}"'


async def _held(identity: UUID) -> bool:
    """Tell whether Prefect holds the event ``identity`` (a Prefect that cannot say: it may)."""
    try:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(id=EventIDFilter(id=[identity])), limit=1
            )
    except (httpx.HTTPError, PrefectHTTPStatusError):
        return True
    return bool(page.events)


def _flow_run_resource(flow_run: FlowRun) -> dict[str, str]:
    """The flow run, as a related resource: what the Automations' messages name and link."""
    return {
        "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
        "prefect.resource.role": "flow-run",
        "prefect.resource.name": flow_run.name,
    }


def spend_answered(quote: TrainingQuote) -> None:
    """Announce that ``quote`` (as the backend states it after a person acted) was answered.

    Nothing is announced while the quote is still pending (the question is asked again).
    """
    answer = quote.confirmation
    state = quote.state.value if quote.state else None
    if state not in ("confirmed", "declined"):
        return
    _answered(
        SPEND.name,
        _spend_key(quote),
        quote.quote_id,
        answered_by=answer.principal if answer else None,
        answer=state,
        note=answer.note if answer else None,
    )


def action_answered(
    action: PendingAction, record: DecisionRecord, question: ActionQuestion
) -> None:
    """Announce that a person decided ``action`` (of ``question``'s kind), as the backend
    recorded."""
    _answered(
        question.name,
        question.pause_key(action),
        action.action_id,
        answered_by=record.principal,
        answer=record.decision.value,
        note=record.reason,
    )


def event_id(flow_run_id: str, key: str, identity: str, event: str) -> UUID:
    """Return the id of a question's event: the same on every re-entry of the flow run."""
    return uuid.uuid5(_EVENT_NAMESPACE, f"{flow_run_id}:{key}:{identity}:{event}")


def resource(flow_run_id: str, key: str, kind: Kind) -> dict[str, str]:
    """Return the Prefect resource that stands for a question (the same for each of its events)."""
    return {
        "prefect.resource.id": f"ito.question.{flow_run_id}.{key}",
        "prefect.resource.name": key,
        "ito.question.kind": kind,
        "ito.flow-run.id": flow_run_id,
    }


def _needed(question: Question, *, identity: str) -> Question:
    _emit_needed(question, event_id(question.flow_run_id, question.key, identity, PERSON_NEEDED))
    _record(question)
    return question


def _emit_needed(
    question: Question, identity: UUID, related: list[dict[str, str]] | None = None
) -> None:
    payload = question.model_dump(mode="json")
    if (cost := question.held_now()) is not None:
        payload.update(held=cost.sentence(), held_usd=round(cost.usd, 2))
    emit_event(
        event=PERSON_NEEDED,
        resource=resource(question.flow_run_id, question.key, question.kind),
        related=related,
        payload=payload,
        id=identity,
    )


def _answered(
    kind: Kind, key: str, identity: str, *, answered_by: str | None, answer: str, note: str | None
) -> None:
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return
    emit_event(
        event=PERSON_ANSWERED,
        resource=resource(str(flow_run_id), key, kind),
        payload={
            "kind": kind,
            "key": key,
            "flow_run_id": str(flow_run_id),
            "answered_by": answered_by or "someone",
            "answer": answer,
            "note": note or "",
            "link": _link(flow_run_id),
        },
        id=event_id(str(flow_run_id), key, identity, PERSON_ANSWERED),
    )


def _record(question: Question) -> None:
    """Keep the question where ``prefect-ito inbox`` reads it: a flow-run input of its own.

    Synchronous, because the flow's "waiting" callback is: a suspension that follows at once
    ends the process, and a record written in the background might never arrive.
    """
    key = QUESTION_RECORD_PREFIX + question.key
    flow_run_id = UUID(question.flow_run_id)
    try:
        with get_client(sync_client=True) as client:
            # A new quote of the same manifest replaces the record; none yet is fine.
            with contextlib.suppress(ObjectNotFound, PrefectHTTPStatusError):
                client.delete_flow_run_input(flow_run_id, key)
            client.create_flow_run_input(flow_run_id, key, question.model_dump_json())
    except (PrefectHTTPStatusError, httpx.TransportError) as error:
        # The inbox misses this question's details; the question itself still stands.
        get_run_logger().warning("Could not keep the question's record for the inbox: %s", error)


def _link(flow_run_id: UUID) -> str | None:
    return url_for("flow-run", obj_id=flow_run_id)


def _spend_key(quote: TrainingQuote) -> str:
    return spend_pause_key(quote.manifest_digest)
