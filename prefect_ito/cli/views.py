"""What the terminal shows of a training flow: stage lines as they change, and one summary.

``train``, ``attach`` and ``demo`` end with the same :func:`print_outcome`: the final state, then
stages, gates, decisions and telemetry — the cards of the Prefect UI, as tables. While the flow
runs, the terminal shows one line per stage change (the flow's own log lines, which the Prefect
UI shows too) rather than a Rich live table: Prefect's console handler writes log lines to the
same terminal at any moment, and the decision prompt must be able to take it over, both of which
a live table would fight. Prefect's per-task "Finished in state Completed()" lines, one or more a
poll, are kept off the console unless ``--verbose``; the Prefect API still receives every one.
So is the traceback Prefect logs when a task ends with an expected outcome (a refused key, a
revoked token): the console shows its one line, the Prefect API the whole record.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prefect import State
from prefect.logging.handlers import PrefectConsoleHandler
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_ito.cli.temporary_prefect import has_real_server
from prefect_ito.exceptions import ItoError, TerminalClosed
from prefect_ito.people.notices import decide_command
from prefect_ito.reporting.decisions import decision_rows
from prefect_ito.reporting.report import SEEN, TrainingSummary
from prefect_ito.reporting.run_view import Hold, RunView, telemetry_rows
from prefect_ito.waiting.cancellation import DETACHED_AT_TERMINAL, TERMINAL_WENT_AWAY

__all__ = [
    "DetachFilter",
    "OutcomeFormatter",
    "TaskChatterFilter",
    "final_summary",
    "held_line",
    "held_numbers",
    "held_text",
    "print_cancel",
    "print_detached",
    "print_outcome",
    "print_status",
    "print_summary",
    "quiet_tasks",
    "without_images",
]


class TaskChatterFilter(logging.Filter):
    """Drops the console lines Prefect writes for every task run that simply completed."""

    def filter(self, record: logging.LogRecord) -> bool:
        chatter = (
            record.name == "prefect.task_runs"
            and record.levelno < logging.WARNING
            and str(record.msg).startswith("Finished in state")
        )
        return not chatter


class DetachFilter(logging.Filter):
    """Drops the ERROR lines Prefect and the flow write when the person at the terminal detached.

    A deliberate detach is no error: the command says so in one line of its own
    (:func:`print_detached`). The records still reach the Prefect API, where the flow run ends
    in its ``Detached`` state.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # The flow's own end, and the end of whichever task the detach interrupted (a gate's
        # wait, say): "Finished in state Failed('Task run encountered an exception Detached:
        # detached at the terminal: …')".
        detach = (
            DETACHED_AT_TERMINAL in message
            or TERMINAL_WENT_AWAY in message
            or message.startswith(
                ("Finished in state Detached(", "Finished in state TerminalClosed(")
            )
        )
        return not (record.name.startswith("prefect.") and detach)


class OutcomeFormatter(logging.Formatter):
    """Formats as ``inner`` does, without the traceback of an expected outcome.

    Prefect logs every exception a task ends with, traceback included; for an
    :class:`~prefect_ito.exceptions.ItoError` the message says it all. The record itself is left
    as it is, so other handlers (the Prefect API's) still get the traceback.
    """

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and isinstance(record.exc_info[1], ItoError):
            record = copy.copy(record)
            record.exc_info = record.exc_text = None
        return self.inner.format(record)


@contextlib.contextmanager
def quiet_tasks(verbose: bool = False) -> Iterator[None]:
    """Keep task-run chatter, outcome tracebacks and a detach's ERROR lines off the console
    handlers (only those); ``verbose`` keeps the chatter and the tracebacks."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    filters: list[logging.Filter] = [DetachFilter()] + ([] if verbose else [TaskChatterFilter()])
    formatters = [h.formatter for h in handlers]
    for handler in handlers:
        for added in filters:
            handler.addFilter(added)
        if not verbose:
            handler.setFormatter(OutcomeFormatter(handler.formatter))
    try:
        yield
    finally:
        for handler, formatter in zip(handlers, formatters, strict=True):
            for added in filters:
                handler.removeFilter(added)
            handler.setFormatter(formatter)


def final_summary(state: State[Any]) -> TrainingSummary | None:
    """Return the summary of the backend run a flow run in this process ended with, if any.

    A completed flow's result is its summary; any other ending is summed up from the last run
    the flow reported here (a failed gate, a refusal, a detach…). None when it never got a run.
    """
    if state.is_completed():
        result = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
        if isinstance(result, TrainingSummary):
            return result
    flow_run_id = state.state_details.flow_run_id
    run = SEEN.latest(flow_run_id) if flow_run_id else None
    return TrainingSummary.of(run) if run is not None else None


def print_outcome(console: Console, state: State[Any]) -> None:
    """Print how the flow run ended, then the summary of its backend run."""
    console.print(f"Final state: [bold]{escape(state.name or '')}[/] {escape(state.message or '')}")
    summary = final_summary(state)
    if summary is not None:
        print_summary(console, summary)


def print_summary(console: Console, summary: TrainingSummary) -> None:
    """Print the run's stages, gates, decisions and telemetry as tables."""
    console.print(
        f"[bold]Backend run {escape(summary.run_id)}: {escape(summary.state.value)}[/]",
        soft_wrap=True,
    )
    console.print(_stages(summary))
    if summary.gates:
        console.print(_gates(summary))
    for part in _decisions(summary):
        console.print(part)
    console.print(_telemetry(summary))
    if summary.outcome is not None:
        console.print(f"Outcome: {summary.outcome.code}: {summary.outcome.message}", markup=False)


def _stages(summary: TrainingSummary) -> Table:
    table = Table(title="Stages", title_justify="left")
    for column in ("stage", "status", "gate"):
        table.add_column(column)
    for stage in summary.stages:
        table.add_row(
            *(escape(cell) for cell in (stage.name, stage.status.value, stage.gate or "—"))
        )
    return table


def _gates(summary: TrainingSummary) -> Table:
    table = Table(title="Gates", title_justify="left")
    for column in ("stage", "battery", "eval", "score", "bar", "pass"):
        table.add_column(column)
    for row in summary.gates:
        table.add_row(
            escape(row["stage"]),
            escape(row["battery"]),
            escape(f"{row['eval']} ({row['metric']})"),
            f"{row['score']:g}",
            f"{row['threshold']:g}",
            "✓" if row["pass"] else "✗",
        )
    return table


def _decisions(summary: TrainingSummary) -> list[Table | str]:
    if not summary.decisions:
        return ["Decisions: nothing was proposed to a person."]
    tables: list[Table | str] = []
    for number, row in enumerate(summary.decisions, start=1):
        table = Table(
            title=f"Decision {number} of {len(summary.decisions)}",
            title_justify="left",
            show_header=False,
        )
        table.add_column("what")
        table.add_column("value")
        for name, cell in decision_rows(row):
            shown = escape(cell.theirs or "") + escape(cell.ours)
            table.add_row(escape(name), shown or "—")
        tables.append(table)
    return tables


def _telemetry(summary: TrainingSummary) -> Table:
    table = Table(title="Telemetry", title_justify="left", show_header=False)
    table.add_column("measure")
    table.add_column("value")
    for label, text in telemetry_rows(summary.telemetry, summary.decisions):
        table.add_row(label, escape(text))
    return table


def without_images(markdown: str, *, ui: bool | None = None) -> str:
    """Return ``markdown`` with its data-URI images (the chart) named instead of shown.

    Args:
        markdown: A card or form description.
        ui: Whether a Prefect UI shows the chart; default: whether a real Prefect server is
            configured (in ephemeral mode there is no UI to point at).
    """
    if ui is None:
        ui = has_real_server()
    where = "shown in the Prefect UI" if ui else "not shown at the terminal"
    return _DATA_IMAGE.sub(rf"*(\1: a chart, {where})*", markdown)


_DATA_IMAGE = re.compile(r"!\[([^\]]*)\]\(data:[^)]*\)")


def print_detached(console: Console, state: State[Any]) -> None:
    """Say calmly what a detach left running and how to re-attach: one line, not an error."""
    if state.name == TerminalClosed.state_name:  # its message says it all, signal included
        said = (state.message or "").removeprefix(f"{state.name}: ")
        console.print(f"Stopped: {said}", markup=False, soft_wrap=True)
        return
    summary = final_summary(state)
    if summary is None:
        console.print(
            "Detached: no backend run was started; run the same `prefect-ito train` again.",
            soft_wrap=True,
        )
        return
    console.print(  # a command to copy: never broken across lines
        f"Detached: backend run {escape(summary.run_id)} goes on at the backend; re-attach with "
        f"`prefect-ito attach {escape(summary.run_id)}` (or run the same `prefect-ito train`).",
        soft_wrap=True,
    )


def held_numbers(
    since: datetime | None, usd_per_hour: float | None, now: datetime
) -> dict[str, Any] | None:
    """Return what holding a run has cost from ``since`` to ``now`` at the hourly rate, as
    numbers (:meth:`~prefect_ito.reporting.run_view.Hold.numbers`); None unless both are known
    and make a hold.
    """
    if since is None or usd_per_hour is None:
        return None
    try:  # a record in Prefect, which anyone with API access writes
        hold = Hold(since=since, usd_per_hour=usd_per_hour)
    except ValidationError:  # a moment without a zone, a rate that is no number: not said
        return None
    return hold.numbers(now)


def held_text(numbers: dict[str, Any]) -> str:
    """Return e.g. "held 2 h 14 min: about $1,350 of GPU time as of 2026-11-30 11:14 UTC ($600
    an hour while nobody decides)", from :func:`held_numbers`."""
    since = datetime.fromisoformat(numbers["since"])
    hold = Hold(since=since, usd_per_hour=float(numbers["usd_per_hour"]))
    return hold.sentence(datetime.fromisoformat(numbers["as_of"]))


def held_line(said: str) -> str:
    """Return a line on the cost held from its sentence ("held 2 h …" → "Held 2 h …"): the
    sentence names it, so no label says it twice."""
    return f"Held{said.removeprefix('held')}" if said.startswith("held ") else f"Held: {said}"


def print_status(console: Console, shown: dict[str, Any]) -> None:
    """Print what ``prefect-ito status`` found: the flow run, then its backend run."""
    # Names and messages come from Prefect, where anyone with API access writes them: text only.
    name, state = escape(shown["flow_run_name"]), escape(shown["state_name"] or "?")
    console.print(f"{name}: [bold]{state}[/]")
    if shown["state_message"]:
        console.print(shown["state_message"], markup=False)
    view: RunView | None = shown["backend_run"]
    if view is None:
        # A flow run that ended with none (declined, refused, not live) will never report one.
        console.print(
            "Backend run: none." if shown.get("ended") else "Backend run: none reported yet."
        )
        return
    _print_backend_run(console, view)
    console.print(f"Stage: {view.stage or '—'}", markup=False)
    console.print(f"Spend: {view.spend_text() or '?'}", markup=False)
    if found := view.forecast_text():
        console.print(f"Forecast: {found}", markup=False, soft_wrap=True)
    if said := view.held_text():
        # Counted to now from a card's numbers; a card's words say when they were counted.
        still = ", if still held" if view.source == "card" and view.hold is not None else ""
        console.print(f"{held_line(said)}{still}", markup=False, soft_wrap=True)
    if not view.pending_decision:
        console.print("Pending decision: none")
        return
    console.print(
        f"[bold yellow]Pending decision:[/] {escape(view.pending_decision)}", soft_wrap=True
    )
    console.print(
        f"Decide: {decide_command(shown['flow_run_id'])}",
        soft_wrap=True,  # a command to copy: never broken across lines
    )


def _print_backend_run(console: Console, view: RunView) -> None:
    run = f"Backend run: {view.run_id or '?'} ({view.state or '?'})"
    if view.source == "backend":
        console.print(f"{run}, as the backend states it now.", markup=False, soft_wrap=True)
        return
    written = view.as_of.isoformat() if view.as_of else "an unknown time"
    console.print(
        f"{run}, from the progress card of {written}: it may be "
        f"stale (the backend was not asked: {view.stale_because}).",
        markup=False,
        soft_wrap=True,
    )


_LEFT_TO = {
    "automation": "The backend run is left to the cancel-on-cancelled Automation (the "
    "ito-cancel-training deployment), which cancels it once Prefect marks the flow run Cancelled.",
    "flow_process": "The backend run is left to the process running the flow: its worker's "
    "on_cancellation hook (or the terminal's `prefect-ito train`) cancels it as the flow stops, "
    "and the cancel-on-cancelled Automation after that.",
}


def print_cancel(console: Console, sent: dict[str, Any]) -> None:
    """Print what ``prefect-ito cancel`` did, what it left to others, and the backend run."""
    flow_run = f"Flow run {sent['flow_run_id']} ({sent['flow_run_state_before'] or '?'})"
    if sent.get("flow_run_cancelled_here"):
        console.print(
            f"{flow_run}: no flow process held it, so it was marked Cancelled from here.",
            markup=False,
            soft_wrap=True,
        )
    elif sent["cancel_requested_in_prefect"]:
        console.print(f"{flow_run}: cancellation requested in Prefect.", markup=False)
    else:
        console.print(f"{flow_run} had already ended: its state is left as it is.", markup=False)
    facts: RunView | None = sent["backend_run"]
    if sent.get("follows_run_id"):
        console.print(
            f"It follows backend run {sent['follows_run_id']}, which it did not make: cancelling "
            "it only detaches, and the backend run goes on.",
            markup=False,
            soft_wrap=True,
        )
        if facts is not None:
            _print_backend_run(console, facts)
        return
    if facts is None:
        console.print("No backend run was found for it: nothing to cancel at the backend.")
        return
    if sent["backend_cancelled_here"]:
        console.print(f"Cancelled backend run {facts.run_id} from here.", markup=False)
    if sent["left_to"]:
        console.print(_LEFT_TO[sent["left_to"]], markup=False, soft_wrap=True)
    _print_backend_run(console, facts)
