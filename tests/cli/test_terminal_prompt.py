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


def test_the_chart_is_named_not_dumped_as_base64_at_the_terminal():
    markdown = "before\n\n![Training loss by step](data:image/svg+xml;base64,PHN2Zz4=)\n\nafter"

    shown = terminal.without_images(markdown)

    assert "base64" not in shown
    assert "*(Training loss by step: a chart, shown in the Prefect UI)*" in shown
