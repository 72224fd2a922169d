"""What each artifact card says: pure functions from a backend run to markdown, tables, numbers.

One card per concern — progress, gates, telemetry, decisions — each a function of the backend run
and of the pending actions supervision saw (a decided action is no longer on the run, so where a
restart would have started from is only known from then). Nothing here talks to Prefect or the
backend; :mod:`prefect_ito.reporting.report` publishes the cards and the terminal prints the same
words.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from prefect_ito.contract import (
    DecisionChoice,
    GateStatus,
    PendingAction,
    RunState,
    StageStatus,
    Telemetry,
    TrainingRun,
)
from prefect_ito.questions import question_for
from prefect_ito.reporting import charts
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.forecast import forecast
from prefect_ito.reporting.holding import held_for
from prefect_ito.reporting.moments import asked
from prefect_ito.reporting.moments import when as when  # many callers read it here

Actions = Mapping[str, PendingAction]
"""Pending actions seen on a run, by action id."""


def progress_percent(run: TrainingRun) -> float:
    """Return the share of the planned stages that are behind the run, as a percentage."""
    if not run.stages:
        return 0.0
    done = sum(stage.status.done for stage in run.stages)
    return 100.0 * done / len(run.stages)


def gate_rows(run: TrainingRun) -> list[dict[str, Any]]:
    """Return one table row per eval of every gate that has results."""
    return [
        {
            "stage": stage.name,
            "battery": stage.gate.battery,
            "eval": result.name,
            "metric": result.metric,
            "score": result.score,
            "threshold": result.threshold,
            "pass": result.passed,
        }
        for stage in run.stages
        if stage.gate is not None
        for result in stage.gate.evals
    ]


def progress_description(run: TrainingRun) -> str:
    """Return the progress card's one line: where the run is, the stages and gates behind it,
    and what comes next; or how it ended, and where it stopped.

    A progress card holds only a percentage, which says nothing of what the run does: this line
    says the rest. The Artifacts tab shows only the first forty characters or so: what matters
    comes first.
    """
    done = sum(stage.status.done for stage in run.stages)
    gated = [stage.gate for stage in run.stages if stage.gate is not None]
    passed = sum(gate.status is GateStatus.PASSED for gate in gated)
    where = f"{done} of {len(run.stages)} stages done, {passed} of {len(gated)} gates passed"
    if run.state.terminal:
        stopped = next((s.name for s in run.stages if s.status in _STOPPED), None)
        at = f"; stopped in {md.text(stopped)}" if stopped else ""
        return f"{md.text(run.state.value.capitalize().replace('_', ' '))}: {where}{at}."
    following = next(
        (
            s.name
            for s in run.stages
            if s.status is StageStatus.PENDING and s.name != run.current_stage
        ),
        None,
    )
    then = f"; next: {md.text(following)}" if following else "; no stage after it"
    if run.state is RunState.AWAITING_DECISION:
        return f"{md.text(run.current_stage)} waits for a decision; {where}{then}."
    return f"Now {md.text(run.current_stage or 'starting')}; {where}{then}."


_STOPPED = (StageStatus.FAILED, StageStatus.REFUSED, StageStatus.CANCELLED)
"""The statuses of the stage a run that did not succeed stopped in."""


def gates_description(run: TrainingRun) -> str:
    """Return the gates card's one line: how many evals, and which failed."""
    rows = gate_rows(run)
    failed = [md.text(f"{row['stage']} {row['eval']}") for row in rows if not row["pass"]]
    if not failed:
        return f"{len(rows)} evals, all passed."
    return f"{len(rows)} evals, {len(failed)} failed: {', '.join(failed)}."


def spend(t: Telemetry) -> str:
    """Return spend against the ceiling: ``$1,234.00 of $250,000.00 (0% of the ceiling)``."""
    return (
        f"${t.spend_usd:,.2f} of ${t.budget_usd:,.2f} "
        f"({t.spend_usd / t.budget_usd:.0%} of the ceiling)"
    )


def hold_cost(run: TrainingRun, now: datetime | None = None) -> str | None:
    """Return what the pending decision's hold has cost, as of ``now``; None if not said.

    A card is written when the run changes, and a held run does not change: the line says
    when it was counted and the hourly rate, so that a reader can tell what it is by now.
    """
    action = run.pending_action
    found = held_for(action, now) if action is not None else None
    if action is None or found is None or action.hold_usd_per_hour is None:
        return None
    return (
        f"{found.sentence()} as of {when(now or datetime.now(UTC))} "
        f"(${action.hold_usd_per_hour:,.0f} an hour while nobody decides)"
    )


def forecast_line(run: TrainingRun) -> str | None:
    """Return the run's forecast in one line; None when there is none (see ``forecast``)."""
    found = forecast(run)
    return found.sentence() if found is not None else None


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


def decisions_markdown(run: TrainingRun, actions: Actions | None = None) -> str:
    """Return the decisions card: who decided each proposed action, how, why and when.

    One short two-column table per decision, so that who and why never scroll out of sight.
    """
    rows = decisions(run, actions)
    title = f"## Decisions — run {md.code(run.run_id)}"
    lines = [title, "", decisions_headline(rows, run), ""]
    held = hold_cost(run)
    if held is not None:
        lines += [f"**Waiting for a person: {held}.**", ""]
    for number, row in enumerate(rows, start=1):
        facts = row.facts() or [("proposed", "—")]
        by = f" by {md.text(row.who())}" if row.who() else ""
        lines += [
            f"### {number}. {row.outcome().split(':')[0].capitalize()}{by}",
            "",
            f"| decision | **{row.outcome()}** |",  # the header row says the most
            "|---|---|",
            f"| decided by | {_decider(row)} |",
            *([f"| note | {_cell(row.note())} |"] if row.note() else []),
            "| {} | {} |".format(*asked(row.held_since, row.proposed_at)),
            f"| decided at | {when(row.decided_at)} |",
            f"| why | {_cell(row.reason)} |",
            *(f"| {name} | {_cell(value)} |" for name, value in facts),
            "",
        ]
    if any(row.action is None for row in rows):
        lines += ["— : proposed before this supervisor attached; the backend keeps no more."]
    return "\n".join(lines).rstrip() + "\n"


def _decider(row: DecisionSummary) -> str:
    """Return who decided, for a card: the principal, or a name nobody authenticated."""
    if row.principal:
        return _code(row.principal)
    if row.decided_by:
        return f"{_cell(row.decided_by)} (a name; the backend authenticated nobody)"
    return "—"


def decisions_headline(rows: list[DecisionSummary], run: TrainingRun) -> str:
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


def _code(value: str | None) -> str:
    """Return ``value`` as inline code for a table cell, or — when absent."""
    return "—" if not value else md.code(value, cell=True)


def _cell(text: str | None) -> str:
    """Return text safe inside a markdown table cell, or — when absent."""
    return "—" if not text else md.text(text)


def loss_summary(t: Telemetry, rows: list[DecisionSummary]) -> str:
    """Return the loss curve in one sentence: where it started, where it is, what stood out.

    Args:
        t: The run's telemetry.
        rows: Its decisions (:func:`decisions`), which name the spikes.
    """
    history = t.loss_history
    if not history:
        return "No loss reported yet."
    first, last = history[0], history[-1]
    sentence = (
        f"Loss {first.loss:.2f} at step {first.step:,} → {last.loss:.2f} at step {last.step:,} "
        f"(lowest {min(p.loss for p in history):.2f})."
    )
    for row in rows:
        if row.step is not None and row.loss is not None:
            sentence += f" Spike {row.loss:.2f} at step {row.step:,}: {row.outcome()}."
    return sentence


def telemetry_markdown(run: TrainingRun, actions: Actions | None = None) -> str:
    """Return the telemetry card: the loss chart, goodput, spend, and fault tolerance."""
    t: Telemetry = run.telemetry
    ft = run.fault_tolerance
    lines = [f"## Telemetry — run {md.code(run.run_id)} ({md.text(run.state.value)})", ""]
    if t.loss_history:
        svg = charts.draw(charts.loss_chart(run, actions))
        lines += [charts.markdown_image(svg, "Training loss by step"), ""]
    for note in (forecast_line(run), hold_cost(run)):
        lines += [f"{note}.", ""] if note is not None else []
    lines += [
        loss_summary(t, decisions(run, actions)),
        "",
        "| measure | value |",
        "|---|---|",
        f"| goodput | {t.goodput:.1%} |",
        f"| interruption rate | {t.interruption_rate_per_day:.2f} per day |",
        f"| checkpoint bandwidth | {t.checkpoint_bandwidth_gbps:.1f} GB/s |",
        f"| spend | {spend(t)} |",
        f"| tokens processed | {t.tokens_processed:,} |",
        f"| step | {t.step:,} |",
    ]
    lines += _staleness_rows(run)
    lines += ["", "### Interruptions", ""]
    lines += _interruption_lines(run) or ["None." if run.state.terminal else "None so far."]
    lines += [
        "",
        f"Targets: detect < {ft.detect_target_seconds // 60} min, "
        f"resume < {ft.resume_target_seconds // 60} min. Checkpoints saved: {len(ft.checkpoints)}.",
    ]
    return "\n".join(lines)


def _staleness_rows(run: TrainingRun) -> list[str]:
    return [
        f"| post-training staleness bound | {stage.details.rlvr.staleness_bound_steps} steps "
        f"({md.text(stage.details.rlvr.algorithm)}) |"
        for stage in run.stages
        if stage.details.rlvr is not None
    ]


def _interruption_lines(run: TrainingRun) -> list[str]:
    ft = run.fault_tolerance
    lines = []
    for item in ft.interruptions:
        detect_ok = "✓" if item.detect_seconds < ft.detect_target_seconds else "✗"
        if item.resume_seconds is None:
            resumed = "recovering"
        else:
            resume_ok = "✓" if item.resume_seconds < ft.resume_target_seconds else "✗"
            resumed = f"resumed in {item.resume_seconds / 60:.1f} min {resume_ok}"
        lines.append(
            f"- {md.code(item.stage)} at {when(item.at)}: detected in "
            f"{item.detect_seconds / 60:.1f} min {detect_ok}, {resumed}"
        )
    return lines
