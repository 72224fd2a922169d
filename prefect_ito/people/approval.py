"""Waiting for a person to decide a backend's pending action at the backend (contract v0.5).

The backend holds the run and proposes something (a restart after a loss spike, a later deadline:
each kind is a question of :mod:`prefect_ito.questions`, which says everything shown of it); only
a person decides, and only at the backend, which knows who they are: on its decide page (the
action's ``decide_url`` and ``user_code``), or with a token of their own (``prefect-ito decide``,
or the terminal ``train`` runs in). The backend records their principal. Nothing written in
Prefect decides anything: a flow run never relays a decision, whatever its token may do.

So the flow only waits: for the backend to say the action is no longer pending. A flow run from a
deployment suspends (holding no infrastructure; ``prefect-ito watch`` resumes it once the action
is answered), any other pauses in-process and reads the run at every poll. The Prefect form shows
the evidence, the chart, the decide link and its code, and offers only **recheck**: read the
backend again. Asked through :mod:`prefect_ito.people.asking`; the main flow (never a subflow:
Prefect cannot suspend subflows) waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from prefect.input import RunInput
from pydantic import Field

from prefect_ito.backend.operations import (
    POLL_TRAINING_RUN,
    READ_TRAINING_RUN,
    TRANSIENT_FAULTS,
    Operation,
    P,
    R,
)
from prefect_ito.contract import DecisionRecord, PendingAction, TrainingRun
from prefect_ito.exceptions import AwaitingDecision, ItoRunOutcome
from prefect_ito.people import asking, notices
from prefect_ito.questions import ActionQuestion, question_for
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.holding import held_for
from prefect_ito.reporting.moments import when
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.flow_run import current_flow_run_id
from prefect_ito.waiting.keys import action_pause_key
from prefect_ito.waiting.waits import recheck_answer

Choice = Literal["approve", "reject"]

WHAT_THE_FORM_DOES = (
    "recheck: you decided at the backend (its page, the link above, or prefect-ito decide with "
    "your own login); the flow reads the run from the backend again. Only a decision made there "
    "counts: nothing typed here approves or rejects what the backend proposes."
)


def _one_to_pick(schema: dict[str, Any]) -> None:
    schema.pop("const", None)
    schema["enum"] = ["recheck"]


class RestartCheck(RunInput):
    """What a person can do in Prefect about a proposed action (a restart, a deadline extension):
    have the backend read again.

    Approving and rejecting are not among the choices: a person decides at the backend, which
    knows who they are. ``decision`` is required and has no default, so a form submitted
    untouched is refused.
    """

    decision: Literal["recheck"] = Field(
        title="Decision",
        description=WHAT_THE_FORM_DOES,
        # One choice, as a list: Prefect's UI draws a `const` as a value nobody can pick.
        json_schema_extra=_one_to_pick,
    )
    reason: str = Field(default="", description="Anything to note in the flow run's log.")


class Supervisor(Protocol):
    """What waiting for a decision needs of a supervisor
    (:class:`~prefect_ito.supervision.steps.Steps`)."""

    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]

    async def perform(self, operation: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Do a backend operation (see :mod:`prefect_ito.backend.operations`)."""

    async def record_action(self, run: TrainingRun, action: PendingAction) -> None:
        """Record the action a person is asked about, for a watcher and for a terminal."""


def pause_key(action: PendingAction) -> str:
    """Return the pause key for an action: stable across re-entries, letters digits and dashes."""
    return action_pause_key(action.kind, action.action_id)


def _question(action: PendingAction) -> ActionQuestion:
    question = question_for(action)
    if question is None:  # supervision asks only about kinds it knows (gates.decidable)
        raise ValueError(f"action {action.action_id} is of a kind this version does not know")
    return question


def describe(run: TrainingRun, action: PendingAction) -> str:
    """Return the markdown a person reads above the decision form: evidence, chart, choices.

    The Resume dialog is narrow and does not wrap table cells: values stay short, and the chart
    is drawn at the dialog's width. What is said of the action comes from its kind's question.
    """
    question = _question(action)
    t = run.telemetry
    chart = question.chart(run, action)
    choices = question.choices(action)
    return "\n".join(
        [
            f"### {question.heading(action)}",
            "",
            question.situation(run, action)
            + " Nothing happens until a person decides; prefect-ito never decides by itself.",
            "",
            "| evidence | value |",
            "|---|---|",
            *(f"| {name} | {value} |" for name, value in question.rows(run, action)),
            *_held_rows(action),
            f"| spent so far | ${t.spend_usd:,.0f} of ${t.budget_usd:,.0f} "
            f"({t.spend_usd / t.budget_usd:.0%}) |",
            "",
            *([chart, ""] if chart else []),
            "**Decide at the backend**, signed in as yourself — "
            + _where_md(action)
            + f". Nothing typed in Prefect approves or rejects {question.subject}.",
            "",
            *(f"- **{choice.value}**: {text}" for choice, text in choices.items()),
            "",
            "Then choose **recheck** here, or just wait: `prefect-ito watch` (or this flow run, "
            "while it waits in its process) sees the decision and goes on.",
        ]
    )


def _where_md(action: PendingAction) -> str:
    """Return where a person decides ``action``, as markdown: the page's link and its code."""
    command = f"or with {md.code('prefect-ito decide')} and your own login"
    if action.decide_url and md.is_http_url(action.decide_url):
        # The address is shown too: a terminal shows a link's text, not where it points.
        code = f", code {md.code(action.user_code)}" if action.user_code else ""
        page = f"[the decide page]({action.decide_url}) ({md.code(action.decide_url)})"
        return f"on {page}{code}, {command}"
    return command.removeprefix("or ")


def _held_rows(action: PendingAction) -> list[str]:
    """Return the rows that say since when the backend holds the run, and what that costs.

    The hold is dated by the wall clock; ``proposed_at`` is on the run's own timeline, which a
    simulated run compresses (its weeks pass in minutes), so it is shown only when the backend
    says nothing of the hold.
    """
    if action.held_since is None:
        return [f"| proposed at | {when(action.proposed_at)} |"]
    rows = [f"| held since | {when(action.held_since)} |"]
    if (cost := held_for(action)) is not None and action.hold_usd_per_hour is not None:
        # Two short cells: the form's narrow column does not wrap them.
        rows.append(f"| holding costs | ${action.hold_usd_per_hour:,.0f} an hour |")
        rows.append(f"| held so far | {cost.duration()}: {cost.cost()} |")
    return rows


def still_pending(run: TrainingRun, action: PendingAction) -> bool:
    """Tell whether ``run`` still waits for a decision on ``action``."""
    return run.pending_action is not None and run.pending_action.action_id == action.action_id


def decision_on(run: TrainingRun, action: PendingAction) -> DecisionRecord | None:
    """Return the backend's record of the decision on ``action``, if it made one."""
    return next((d for d in reversed(run.decisions) if d.action_id == action.action_id), None)


async def wait_for_decision(
    steps: Supervisor, run: TrainingRun, *, timeout: float, poll_interval: float
) -> TrainingRun | None:
    """Wait until the backend says the run's pending action was decided; return the run then.

    Returns None if the flow run was cancelled while it waited.

    Raises:
        AwaitingDecision: nobody decided in time; the action stays pending at the backend.
    """
    action = run.pending_action
    if action is None:
        raise ValueError(f"run {run.run_id} waits for no decision")
    await steps.record_action(run, action)
    fresh = False
    while True:
        answer = await _ask(steps, run, action, timeout, poll_interval, fresh=fresh)
        if answer is None:
            return None
        now = await steps.perform(READ_TRAINING_RUN, run.run_id)
        if not still_pending(now, action):
            announce_decision(steps, now, action)
            return now
        steps.logger.warning(
            "Rechecked: %s is still pending at the backend (run %s): nobody decided it. "
            "Decide at %s; asking again.",
            action.action_id,
            run.run_id,
            where_to_decide(action),
        )
        fresh = True


async def wait_for_owner(
    steps: Supervisor,
    run: TrainingRun,
    owner: str,
    still_asks: Callable[[], Awaitable[str | None]],
    *,
    timeout: float,
    poll_interval: float,
) -> TrainingRun | None:
    """Wait, asking nobody, until the backend says the run's pending action was decided.

    The run's questions are ``owner``'s to ask (the submission the backend says made it): this
    supervisor follows the same submission, so it records no question, sends no notice and
    pauses for no form — one question per backend question, however many follow the run.
    Returns the run still waiting once ``still_asks`` says nobody else asks any more (the owner
    ended): then this supervisor asks. Returns None if the flow run was cancelled meanwhile.

    Raises:
        AwaitingDecision: nobody decided in time; the action stays pending at the backend.
    """
    action = run.pending_action
    if action is None:
        raise ValueError(f"run {run.run_id} waits for no decision")
    question = _question(action)
    steps.logger.info(
        "%s. It is %s's to ask, which the backend says made the run, so it is not asked again "
        "here; this flow run goes on once it is decided: %s.",
        question.waiting(action),
        owner,
        where_to_decide(action),
    )
    flow_run_id = current_flow_run_id()
    give_up_at = asyncio.get_running_loop().time() + timeout
    while still_pending(run, action):
        if await stop_requested(flow_run_id):
            return None
        if await still_asks() is None:
            steps.logger.info("Nobody else asks it any more (%s ended): asking it here.", owner)
            return run
        if asyncio.get_running_loop().time() >= give_up_at:
            raise AwaitingDecision(
                f"nobody decided on {question.subject} proposed for run {run.run_id} "
                f"({action.action_id}) within {timeout:g} s; {owner} asks it, and it stays "
                "pending at the backend",
                run_id=run.run_id,
            )
        await asyncio.sleep(poll_interval)
        try:
            run = await steps.perform(POLL_TRAINING_RUN, run.run_id)
        except TRANSIENT_FAULTS:
            continue  # a busy backend for a moment: the next poll reads it again
    steps.logger.info(
        "The backend no longer holds run %s for %s (state %s).",
        run.run_id,
        action.action_id,
        run.state.value,
    )
    return run


async def _ask(
    steps: Supervisor,
    run: TrainingRun,
    action: PendingAction,
    timeout: float,
    poll_interval: float,
    *,
    fresh: bool,
) -> RestartCheck | None:
    async def settled() -> RestartCheck | None:
        try:
            now = await steps.perform(POLL_TRAINING_RUN, run.run_id)
        except TRANSIENT_FAULTS:
            return None  # a busy backend for a moment: the next poll reads it again
        if still_pending(now, action):
            return None
        return RestartCheck.model_validate(recheck_answer(f"{action.action_id} was decided"))

    question = _question(action)

    def waiting() -> None:
        steps.logger.warning("%s: %s.", question.waiting(action), where_to_decide(action))
        notices.action_needed(run, action, question, timeout=timeout)

    def timed_out() -> ItoRunOutcome:
        return AwaitingDecision(
            f"nobody decided on {question.subject} proposed for run {run.run_id} "
            f"({action.action_id}) within {timeout:g} s; it stays pending at the backend, and "
            "running the flow again re-attaches and asks again",
            run_id=run.run_id,
        )

    return await asking.ask(
        RestartCheck,
        key=pause_key(action),
        description=describe(run, action),
        asks=question.asks(action),
        timeout=timeout,
        poll_interval=poll_interval,
        waiting=waiting,
        timed_out=timed_out,
        settled=settled,
        fresh=fresh,
    )


def where_to_decide(action: PendingAction) -> str:
    """Say where a person decides ``action``: the backend's page and code, or their own login."""
    if action.decide_url:
        return f"{action.decide_url} (code {action.user_code or 'on the page'})"
    return "prefect-ito decide, logged in as yourself"


def announce_decision(steps: Supervisor, run: TrainingRun, action: PendingAction) -> None:
    """Say in the flow's log, and to people (``person.answered``), who decided ``action`` at the
    backend. A flow run resumed after the decision says it on re-entry: the event's id is the
    question's, so Prefect keeps one however often it is said.
    """
    record = decision_on(run, action)
    if record is None:
        steps.logger.info(
            "The backend no longer holds run %s for %s (state %s).",
            run.run_id,
            action.action_id,
            run.state.value,
        )
        return
    who = record.principal or "someone the backend did not name"
    question = _question(action)
    steps.logger.info(
        "%s %s %s at the backend: %s",
        who,
        "approved" if record.decision.value == "approve" else "rejected",
        question.subject,
        record.reason,
    )
    notices.action_answered(action, record, question)
