"""Text from people and the backend stays text in every markdown prefect-ito writes.

Targets, data references, ids, names, notes, stage names and the backend's warnings go into
cards, their descriptions and the forms a person answers. Parsed as the Prefect UI parses them
(CommonMark with GFM tables), no hostile value may become an image, a link or HTML, open a table
cell, or add a line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token
from played_runs import play

from prefect_ito.contract import TrainingRequest, TrainingRun
from prefect_ito.people import approval
from prefect_ito.reporting import cards, quote_card
from prefect_ito.reporting import markdown as md
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.engine import Engine

HOSTILE = [
    "x` ![p](http://evil.test/a.png) `y",
    "``![p](http://evil.test/b.png)``",
    "`",
    "a|b|c",
    "</td><img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "<http://evil.test>",
    "line\n\n# Heading\n| a | b |",
    "**bold** _it_ ~~s~~ \\` \\",
    "![x](http://evil.test/c.png)",
    "   ",  # only blanks: a list item of it had no paragraph, which changed the markdown's shape
]
hostile = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet="`![]()<>|\\*_#~:/. \nahx", min_size=1, max_size=40),
)
PARSER = MarkdownIt("commonmark").enable("table")
CHART_PREFIX = "data:image/svg+xml;base64,"


def _tokens(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield token
        yield from _tokens(token.children or [])


def assert_inert(markdown: str, benign: str) -> None:
    """Assert ``markdown`` holds no live markup but the charts, and the shape of ``benign``."""
    tokens = PARSER.parse(markdown)
    for token in _tokens(tokens):
        assert token.type not in ("link_open", "html_inline", "html_block"), (token, markdown)
        if token.type == "image":
            assert str(token.attrs.get("src", "")).startswith(CHART_PREFIX), markdown
    assert markdown.count("\n") == benign.count("\n"), markdown
    widths: list[int] = []
    for token in tokens:
        if token.type == "tr_open":
            widths.append(0)
        elif token.type in ("th_open", "td_open"):
            widths[-1] += 1
        elif token.type == "table_close":
            assert len(set(widths)) == 1, (widths, markdown)
            widths = []
    shape = [t.type for t in tokens if t.type.endswith("_open")]
    assert shape == [t.type for t in PARSER.parse(benign) if t.type.endswith("_open")], markdown


# --- the helpers ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(value=hostile)
def test_text_is_shown_as_written_and_never_markup(value):
    shown = PARSER.parseInline(md.text(value))[0].children or []

    assert [t.type for t in shown if t.type != "softbreak"] in (["text"], [])
    # CommonMark decodes a character reference, but the Prefect UI shows one as written.
    assert "&#" not in md.text(value)
    written = " ".join(value.splitlines()).replace("\r", " ")
    if written and not written.strip(" "):  # only spaces: the first is a no-break space
        written = "\u00a0" + written[1:]
    assert "".join(t.content for t in shown) == written or "\n" in value or "\r" in value


@settings(max_examples=300, deadline=None)
@given(value=hostile)
def test_code_is_one_span_that_nothing_closes(value):
    (span,) = PARSER.parseInline(f"a {md.code(value)} b")[0].children[1:2]

    assert span.type == "code_inline"
    assert span.content.strip(" ") == " ".join(value.splitlines()).strip(" ") or "\n" in value


# --- the builders ---------------------------------------------------------------------------


def _quote_and_request(value: str) -> tuple[Any, Any]:
    engine = Engine(builtin_scenario("default"))
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=[value, "s3://a/"],
        target=value, budget_usd=250_000.0,
    ).to_submission()  # fmt: skip
    quote = engine.quote("acct", request)
    quote = quote.model_copy(update={"booking_id": value, "warnings": [value, "plain"]})
    return quote, request.model_copy(update={"booking_id": value})


def spend_form(value: str) -> str:
    return quote_card.describe(*_quote_and_request(value))


def _hostile_run(value: str, *, decide: str | None) -> tuple[TrainingRun, dict[str, Any]]:
    run, seen = play("demo" if decide else "loss-spike", decide=decide)
    decisions = [
        record.model_copy(update={"decided_by": value, "reason": value, "principal": value})
        for record in run.decisions
    ]
    stages = [stage.model_copy(update={"name": f"{stage.name} {value}"}) for stage in run.stages]
    run = run.model_copy(
        update={"run_id": value, "booking_id": value, "decisions": decisions, "stages": stages}
    )
    return run, seen


def decision_form(value: str) -> str:
    run, _ = play("loss-spike", decide=None)
    action = run.pending_action
    assert action is not None and action.proposed_checkpoint is not None
    checkpoint = action.proposed_checkpoint.model_copy(update={"checkpoint_id": value})
    action = action.model_copy(update={"stage": value, "proposed_checkpoint": checkpoint})
    run = run.model_copy(update={"run_id": value, "booking_id": value, "pending_action": action})
    return approval.describe(run, action)


def decisions_card(value: str) -> str:
    return cards.decisions_markdown(*_hostile_run(value, decide="approve"))


def telemetry_card(value: str) -> str:
    return cards.telemetry_markdown(*_hostile_run(value, decide="approve"))


def descriptions(value: str) -> str:
    run, _ = _hostile_run(value, decide="approve")
    waiting, _ = _hostile_run(value, decide=None)
    waiting = waiting.model_copy(update={"current_stage": value})
    return "\n".join(
        [
            cards.progress_description(run),
            cards.gates_description(run),
            cards.progress_description(waiting),
        ]
    )


BUILDERS: dict[str, Callable[[str], str]] = {
    "spend form": spend_form,
    "decision form": decision_form,
    "decisions card": decisions_card,
    "telemetry card": telemetry_card,
    "card descriptions": descriptions,
}


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("builder", list(BUILDERS))
def test_hostile_text_stays_text_in_every_builder(builder, value):
    # Before, a backtick in a target closed its code span and ![p](http://…) became an image.
    build = BUILDERS[builder]

    assert_inert(build(value), build("plain"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile, builder=st.sampled_from(list(BUILDERS)))
def test_any_text_stays_text_in_every_builder(builder, value):
    build = BUILDERS[builder]

    assert_inert(build(value), build("plain"))
