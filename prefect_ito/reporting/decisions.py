"""The decisions a person was asked about on a run, and the rows each one is shown in.

A decision is shown on the decisions card and at the terminal; both show the rows of
:func:`decision_rows`, in that order, each renderer only writing them its own way (markdown,
a Rich table). Whose words a cell holds decides how each writes it (:class:`Cell`): a person's or
the backend's are made inert, prefect-ito's own are written as they are.

No Prefect import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from prefect_ito.contract import DecisionChoice, PendingAction, TrainingRun
from prefect_ito.questions import question_for
from prefect_ito.reporting.moments import asked, when

Actions = Mapping[str, PendingAction]
"""Pending actions seen on a run, by action id."""

UNPROVEN = " (a name; the backend authenticated nobody)"
"""Said after a name that no backend authenticated (a backend before contract v0.2)."""


class DecisionSummary(BaseModel):
    """An action a person was asked about (a restart, a deadline extension): what was proposed,
    and what they decided."""

    model_config = ConfigDict(frozen=True)

    action_id: str
    action: PendingAction | None = Field(default=None, exclude=True)
    """The action as this supervisor saw it pending; None when it was decided before."""
    decision: DecisionChoice | None = None
    """None while nobody has decided."""
    decided_by: str | None = None
    """A note the person typed beside the decision (before contract v0.5: the name relayed)."""
    principal: str | None = None
    """Who decided, as the backend authenticated them (v0.5: always a person's principal)."""
    reason: str | None = None
    decided_at: datetime | None = None
    stage: str | None = None
    step: int | None = None
    loss: float | None = None
    checkpoint_id: str | None = None
    checkpoint_step: int | None = None
    proposed_at: datetime | None = None
    """When it was proposed, on the run's own clock."""
    held_since: datetime | None = None
    """When the backend began holding the run for a person, on the wall clock."""

    def who(self) -> str | None:
        """Return who decided: the principal the backend authenticated, else the name relayed
        (a backend before contract v0.2 kept no principal)."""
        return self.principal or self.decided_by

    def note(self) -> str | None:
        """Return what the person typed beside an authenticated decision, if anything."""
        return self.decided_by if self.principal and self.decided_by else None

    def outcome(self) -> str:
        """Return what the decision did, in a few words, as the action's kind says it."""
        if self.decision is None:
            return "awaiting a person"
        question = question_for(self.action)
        if question is None:  # not seen pending: the backend's record says only the decision
            return "approved" if self.decision is DecisionChoice.APPROVE else "rejected"
        return question.outcome(self.decision, self.action)

    def facts(self) -> list[tuple[str, str]]:
        """Return what was proposed, as the action's kind says it; [] when it was not seen."""
        question = question_for(self.action)
        return question.facts(self.action) if question and self.action else []


def decisions(run: TrainingRun, actions: Actions | None = None) -> list[DecisionSummary]:
    """Return every decision on the run, oldest first, then the one still pending (if any)."""
    seen = dict(actions or {})
    if run.pending_action is not None:
        seen[run.pending_action.action_id] = run.pending_action
    rows = [
        _summary(seen.get(record.action_id), record.action_id).model_copy(
            update=record.model_dump(exclude={"action_id"})
        )
        for record in run.decisions
    ]
    if run.pending_action is not None:
        rows.append(_summary(run.pending_action, run.pending_action.action_id))
    return rows


def _summary(action: PendingAction | None, action_id: str) -> DecisionSummary:
    if action is None:  # decided before this supervisor saw it: only the backend's record
        return DecisionSummary(action_id=action_id)
    checkpoint = action.proposed_checkpoint  # None only for kinds added to the contract later
    return DecisionSummary(
        action_id=action_id,
        action=action,
        stage=action.stage,
        step=action.step,
        loss=action.loss,
        checkpoint_id=checkpoint.checkpoint_id if checkpoint else None,
        checkpoint_step=checkpoint.step if checkpoint else None,
        proposed_at=action.proposed_at,
        held_since=action.held_since,
    )


def headline(rows: list[DecisionSummary], run: TrainingRun) -> str:
    """Return the decisions in one line: how many, and how they went."""
    if not rows:
        nothing = "Nothing was proposed" if run.state.terminal else "Nothing proposed so far"
        return f"{nothing}: nothing needed a person's decision."
    approved = sum(row.decision is DecisionChoice.APPROVE for row in rows)
    rejected = sum(row.decision is DecisionChoice.REJECT for row in rows)
    waiting = len(rows) - approved - rejected
    counts = [f"{approved} approved"] * bool(approved) + [f"{rejected} rejected"] * bool(rejected)
    counts += [f"{waiting} awaiting a person"] * bool(waiting)
    labels = {q.label for row in rows if (q := question_for(row.action)) is not None}
    label = labels.pop() if len(labels) == 1 else "action"
    return f"{len(rows)} {label}{'s' * (len(rows) > 1)} proposed: {', '.join(counts)}."


@dataclass(frozen=True)
class Cell:
    """What one row of a decision says: words of a person or the backend (``theirs``), then
    prefect-ito's own (``ours``). A renderer makes ``theirs`` inert and writes ``ours`` as is;
    ``code`` marks ``theirs`` as an identifier (inline code on a card), ``strong`` the cell that
    says the most. An empty cell reads —."""

    theirs: str | None = None
    ours: str = ""
    code: bool = False
    strong: bool = False


def decision_rows(row: DecisionSummary) -> list[tuple[str, Cell]]:
    """Return what a decision says, row by row: the decision, who, the note, when it was asked
    and decided, why, then what was proposed (— when it was not seen pending)."""
    label, moment = asked(row.held_since, row.proposed_at)
    rows = [
        ("decision", Cell(ours=row.outcome(), strong=True)),
        ("decided by", _decider(row)),
        *([("note", Cell(theirs=row.note()))] if row.note() else []),
        (label, Cell(ours=moment)),
        ("decided at", Cell(ours=when(row.decided_at))),
        ("why", Cell(theirs=row.reason)),
    ]
    facts = row.facts() or [("proposed", "")]
    return rows + [(name, Cell(theirs=value or None)) for name, value in facts]


def _decider(row: DecisionSummary) -> Cell:
    """Return who decided: the principal, or a name nobody authenticated."""
    if row.principal:
        return Cell(theirs=row.principal, code=True)
    if row.decided_by:
        return Cell(theirs=row.decided_by, ours=UNPROVEN)
    return Cell()
