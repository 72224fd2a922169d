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
from typing import Any

from prefect import State
from prefect.logging.handlers import PrefectConsoleHandler
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_ito.exceptions import ItoError
from prefect_ito.reporting import cards
from prefect_ito.reporting.report import SEEN, TrainingSummary

__all__ = [
    "OutcomeFormatter",
    "TaskChatterFilter",
    "final_summary",
    "print_outcome",
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
    """Keep task-run chatter and outcome tracebacks off the console handlers (only those)."""
    if verbose:
        yield
        return
    chatter = TaskChatterFilter()
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    formatters = [h.formatter for h in handlers]
    for handler in handlers:
        handler.addFilter(chatter)
        handler.setFormatter(OutcomeFormatter(handler.formatter))
    try:
        yield
    finally:
        for handler, formatter in zip(handlers, formatters, strict=True):
            handler.removeFilter(chatter)
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
        return ["Decisions: no restart was proposed."]
    tables: list[Table | str] = []
    for number, row in enumerate(summary.decisions, start=1):
        table = Table(
            title=f"Decision {number} of {len(summary.decisions)}",
            title_justify="left",
            show_header=False,
        )
        table.add_column("what")
        table.add_column("value")
        table.add_row("decision", escape(row.outcome()))
        table.add_row("decided by", escape(row.decided_by or "—"))
        table.add_row("authenticated as", escape(row.principal or "—"))
        table.add_row("decided at", cards.when(row.decided_at))
        table.add_row("why", escape(row.reason or "—"))
        if row.step is not None and row.loss is not None:
            table.add_row(
                "loss spike", escape(f"{row.loss:.2f} at step {row.step:,} in {row.stage}")
            )
        table.add_row("restart checkpoint", escape(row.checkpoint_id or "—"))
        tables.append(table)
    return tables


def _telemetry(summary: TrainingSummary) -> Table:
    t = summary.telemetry
    table = Table(title="Telemetry", title_justify="left", show_header=False)
    table.add_column("measure")
    table.add_column("value")
    table.add_row("goodput", f"{t.goodput:.1%}")
    table.add_row("interruption rate", f"{t.interruption_rate_per_day:.2f} per day")
    table.add_row("checkpoint bandwidth", f"{t.checkpoint_bandwidth_gbps:.1f} GB/s")
    table.add_row("spend", cards.spend(t))
    table.add_row("tokens processed", f"{t.tokens_processed:,}")
    table.add_row("loss", cards.loss_summary(t, summary.decisions))
    return table


def without_images(markdown: str) -> str:
    """Return ``markdown`` with its data-URI images (the chart) named instead of shown."""
    return _DATA_IMAGE.sub(r"*(\1: a chart, shown in the Prefect UI)*", markdown)


_DATA_IMAGE = re.compile(r"!\[([^\]]*)\]\(data:[^)]*\)")
