"""The terminal prompt asks for an explicit approve or reject; silence decides nothing."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_ito import terminal


@pytest.fixture
def typed(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Script what the person types; None is the end of input."""
    answers: list[str | None] = []
    prompts: list[str] = []

    async def read_line(console: Any, prompt: str) -> str | None:
        prompts.append(prompt)
        return answers.pop(0)

    monkeypatch.setattr(terminal, "_read_line", read_line)
    return answers


async def test_an_empty_or_unclear_answer_asks_again_instead_of_rejecting(typed):
    # Before, Enter at "Approve the restart? [y/N]" rejected the restart.
    typed += ["", "maybe", "r", "Ada", "bad shard"]

    decision = await terminal.ask_at_terminal(None, "### Loss spike")  # type: ignore[arg-type]

    assert decision is not None
    assert (decision.decision, decision.decided_by, decision.reason) == (
        "reject",
        "Ada",
        "bad shard",
    )
    assert typed == []


async def test_the_end_of_input_leaves_the_decision_to_someone_else(typed):
    typed += [None]

    assert await terminal.ask_at_terminal(None, "### Loss spike") is None  # type: ignore[arg-type]


async def test_the_spend_is_confirmed_only_by_typing_it_out(typed):
    typed += ["", "yes", "c", "Grace", ""]
    pause = terminal.SpendPause(None, "### Confirm the spend", "sha256:" + "0" * 64)  # type: ignore[arg-type]

    decision = await terminal.confirm_at_terminal(pause)

    assert decision is not None
    assert (decision.decision, decision.confirmed_by, decision.reason) == ("confirm", "Grace", "")
    assert decision.manifest_digest == pause.manifest_digest
    assert typed == []


async def test_declining_at_the_terminal_and_the_end_of_input(typed):
    pause = terminal.SpendPause(None, "### Confirm the spend", "sha256:" + "0" * 64)  # type: ignore[arg-type]
    typed += ["decline", "Grace", "too dear", None]

    declined = await terminal.confirm_at_terminal(pause)
    unanswered = await terminal.confirm_at_terminal(pause)

    assert declined is not None and declined.decision == "decline"
    assert declined.reason == "too dear"
    assert unanswered is None


def test_the_chart_is_named_not_dumped_as_base64_at_the_terminal():
    markdown = "before\n\n![Training loss by step](data:image/svg+xml;base64,PHN2Zz4=)\n\nafter"

    shown = terminal.without_images(markdown)

    assert "base64" not in shown
    assert "*(Training loss by step: a chart, shown in the Prefect UI)*" in shown


def test_task_chatter_leaves_the_console_only_and_only_when_not_verbose():
    import logging

    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    from prefect_ito.views import TaskChatterFilter, quiet_tasks

    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    chatter = TaskChatterFilter()
    assert not chatter.filter(
        record("prefect.task_runs", logging.INFO, "Finished in state Completed()")
    )
    assert chatter.filter(record("prefect.task_runs", logging.ERROR, "Finished in state Failed()"))
    assert chatter.filter(
        record("prefect.flow_runs", logging.INFO, "Finished in state Completed()")
    )
    assert chatter.filter(record("prefect.flow_runs", logging.INFO, "Stage pretrain: passed"))

    root = logging.getLogger().handlers
    console = [h for h in root if isinstance(h, PrefectConsoleHandler)]
    api = [
        h for h in logging.getLogger("prefect.task_runs").handlers if isinstance(h, APILogHandler)
    ]
    assert console and api
    with quiet_tasks():
        assert all(any(isinstance(f, TaskChatterFilter) for f in h.filters) for h in console)
        assert not any(isinstance(f, TaskChatterFilter) for h in api for f in h.filters)
    with quiet_tasks(verbose=True):
        assert not any(isinstance(f, TaskChatterFilter) for h in console for f in h.filters)
    assert not any(isinstance(f, TaskChatterFilter) for h in console for f in h.filters)


def test_an_expected_outcome_is_one_console_line_and_keeps_its_traceback_for_the_api():
    import logging
    import sys

    from prefect.logging.handlers import PrefectConsoleHandler

    from prefect_ito.exceptions import IdempotencyKeyReused
    from prefect_ito.views import OutcomeFormatter, quiet_tasks

    def failed_with(error: Exception) -> logging.LogRecord:
        try:
            raise error
        except Exception:
            exc_info = sys.exc_info()
        return logging.LogRecord(
            "prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None, exc_info
        )

    formatter = OutcomeFormatter(logging.Formatter("%(message)s"))
    expected = failed_with(IdempotencyKeyReused("used for a different request"))
    unexpected = failed_with(KeyError("bug"))

    assert formatter.format(expected) == "Task run failed"
    assert expected.exc_info is not None  # the API handler still sends the traceback
    assert "Traceback" in logging.Formatter().format(expected)
    assert "Traceback" in formatter.format(unexpected)  # a bug keeps its traceback
    console = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    before = [h.formatter for h in console]
    with quiet_tasks():
        assert all(isinstance(h.formatter, OutcomeFormatter) for h in console)
    assert [h.formatter for h in console] == before


def test_the_decide_command_is_printed_on_one_line_to_copy(monkeypatch):
    # Before, an 80-column terminal broke it before "--reason".
    from uuid import uuid4

    from rich.console import Console

    monkeypatch.setattr(terminal, "has_real_server", lambda: True)
    console = Console(width=60, record=True)
    flow_run_id = uuid4()

    terminal._announce_pause(console, flow_run_id)

    command = f"prefect-ito decide {flow_run_id} --approve|--reject --reason TEXT --name NAME"
    assert command in console.export_text().splitlines()[-1]


def test_the_summary_names_the_run_once_on_a_line_of_its_own():
    # Before, the run was named again as the stage table's title, wrapped to its narrow width.
    from played_runs import play
    from rich.console import Console

    from prefect_ito.reporting import TrainingSummary
    from prefect_ito.views import print_summary

    run, seen = play("demo", decide="approve")
    console = Console(width=100, record=True)

    print_summary(console, TrainingSummary.of(run, actions=seen))

    text = console.export_text()
    assert text.splitlines()[0] == f"Backend run {run.run_id}: succeeded"
    assert text.count(run.run_id) == 1
    for title in ("Stages", "Gates", "Decision 1 of 1", "Telemetry"):
        assert title in text
