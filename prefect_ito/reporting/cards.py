"""What each artifact card says: pure functions from a backend run to markdown, tables, numbers.

One card per concern — progress, gates, telemetry, decisions — each a function of the backend run
and of the pending actions supervision saw (a decided action is no longer on the run, so where a
restart would have started from is only known from then). Nothing here talks to Prefect or the
backend; :mod:`prefect_ito.reporting.report` publishes the cards and the terminal prints the same
words.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect_ito.contract import GateStatus, RunState, StageStatus, Telemetry, TrainingRun
from prefect_ito.reporting import charts
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.decisions import Actions, Cell, decision_rows, decisions, headline
from prefect_ito.reporting.forecast import forecast
from prefect_ito.reporting.moments import when as when  # many callers read it here
from prefect_ito.reporting.run_view import Hold, telemetry_rows


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


def hold_cost(run: TrainingRun, now: datetime | None = None) -> str | None:
    """Return what the pending decision's hold has cost, as of ``now``; None if not said."""
    hold = Hold.of(run.pending_action)
    return hold.sentence(now or datetime.now(UTC)) if hold is not None else None


def forecast_line(run: TrainingRun) -> str | None:
    """Return the run's forecast in one line; None when there is none (see ``forecast``)."""
    found = forecast(run)
    return found.sentence() if found is not None else None


def decisions_markdown(run: TrainingRun, actions: Actions | None = None) -> str:
    """Return the decisions card: who decided each proposed action, how, why and when.

    One short two-column table per decision, so that who and why never scroll out of sight;
    its rows are :func:`~prefect_ito.reporting.decisions.decision_rows`, as at the terminal.
    """
    rows = decisions(run, actions)
    title = f"## Decisions — run {md.code(run.run_id)}"
    lines = [title, "", headline(rows, run), ""]
    held = hold_cost(run)
    if held is not None:
        lines += [f"**Waiting for a person: {held}.**", ""]
    for number, row in enumerate(rows, start=1):
        by = f" by {md.text(row.who())}" if row.who() else ""
        (label, first), *others = decision_rows(row)
        lines += [
            f"### {number}. {row.outcome().split(':')[0].capitalize()}{by}",
            "",
            f"| {label} | {_cell(first)} |",  # the header row says the most
            "|---|---|",
            *(f"| {name} | {_cell(cell)} |" for name, cell in others),
            "",
        ]
    if any(row.action is None for row in rows):
        lines += ["— : proposed before this supervisor attached; the backend keeps no more."]
    return "\n".join(lines).rstrip() + "\n"


def _cell(cell: Cell) -> str:
    """Return a decision's cell for a markdown table: their words inert, ours as written."""
    if cell.theirs is None and not cell.ours:
        return "—"
    theirs = ""
    if cell.theirs is not None:
        theirs = md.code(cell.theirs, cell=True) if cell.code else md.text(cell.theirs)
    shown = theirs + _ours(cell.ours)
    return f"**{shown}**" if cell.strong else shown


def _ours(text: str) -> str:
    """Return prefect-ito's own words for a table cell: on one line, no cell ended early."""
    return " ".join(text.split("\n")).replace("|", "\\|")


def telemetry_markdown(run: TrainingRun, actions: Actions | None = None) -> str:
    """Return the telemetry card: the loss chart, the telemetry table
    (:data:`~prefect_ito.reporting.run_view.TELEMETRY`, as at the terminal), and fault
    tolerance."""
    t: Telemetry = run.telemetry
    ft = run.fault_tolerance
    lines = [f"## Telemetry — run {md.code(run.run_id)} ({md.text(run.state.value)})", ""]
    if t.loss_history:
        svg = charts.draw(charts.loss_chart(run, actions))
        lines += [charts.markdown_image(svg, "Training loss by step"), ""]
    for note in (forecast_line(run), hold_cost(run)):
        lines += [f"{note}.", ""] if note is not None else []
    lines += ["| measure | value |", "|---|---|"]
    lines += [
        f"| {label} | {_ours(text)} |" for label, text in telemetry_rows(t, decisions(run, actions))
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
