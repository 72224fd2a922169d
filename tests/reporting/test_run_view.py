"""One view of a run: every telemetry field the contract defines is a row of the one telemetry
table, shown on the card, at the terminal and in ``--json``; what ``status`` shows is one typed
view, kept on the progress card as typed JSON and read back, older cards' strings included."""

from __future__ import annotations

import io
import json
import types
import typing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from played_runs import play
from rich.console import Console

from prefect_ito.cli.views import print_status, print_summary
from prefect_ito.contract import Telemetry, TrainingRun
from prefect_ito.reporting.cards import telemetry_markdown
from prefect_ito.reporting.report import TrainingSummary
from prefect_ito.reporting.run_view import NUMBERS_KEY, TELEMETRY, RunView

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _shown(run: TrainingRun) -> dict[str, str]:
    """Return the run's telemetry as the card, the terminal and ``--json`` show it."""
    console = Console(record=True, width=400, file=io.StringIO())
    print_summary(console, TrainingSummary.of(run))
    summary = TrainingSummary.of(run).model_dump(mode="json")
    return {
        "card": telemetry_markdown(run),
        "terminal": console.export_text(),
        "json": json.dumps(summary["telemetry"], sort_keys=True),
    }


def _other(name: str, value: Any) -> Any:
    """Return another value of a telemetry field, of its type and within its bounds."""
    if isinstance(value, list):
        assert value, f"the demo run has no {name}: give the test a run that has some"
        return []
    if value is None:
        kinds = typing.get_args(Telemetry.model_fields[name].annotation)
        return {int: 7, float: 0.5}[next(k for k in kinds if k is not types.NoneType)]
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 + 0.0625
    raise AssertionError(f"no other value for telemetry field {name}={value!r}")


def test_every_telemetry_field_is_a_row_of_the_table_and_shown_everywhere():
    # Before: adding a field to Telemetry touched eleven files, and with the card's line written
    # but not the terminal's (or not the JSON's) every test stayed green.
    run, _ = play("demo", decide=None)
    assert run.telemetry.loss_history and run.telemetry.progress is not None  # a full base
    named = {field for measure in TELEMETRY for field in measure.fields}
    before = _shown(run)

    for name in Telemetry.model_fields:
        assert name in named, f"telemetry field {name} is in no row of run_view.TELEMETRY"
        changed = run.telemetry.model_copy(
            update={name: _other(name, getattr(run.telemetry, name))}
        )
        after = _shown(run.model_copy(update={"telemetry": changed}))
        for where in ("card", "terminal", "json"):
            assert after[where] != before[where], f"{name} is not shown by the {where}"
    for measure in TELEMETRY:  # every row, on both
        assert f"| {measure.label} |" in before["card"]
        assert f"│ {measure.label} " in before["terminal"]


def _legacy_metadata(run: TrainingRun) -> dict[str, str]:
    """The progress card's metadata as versions before the JSON document wrote it: each
    number a numeric string of its own key."""
    view = RunView.of(run, NOW)
    found, hold = view.forecast, view.hold
    assert found is not None and hold is not None
    words = {k: v for k, v in view.card_metadata().items() if k != NUMBERS_KEY}
    return {
        **words,
        "spend_usd": str(view.spend_usd),
        "budget_usd": str(view.budget_usd),
        "forecast_progress": str(found.progress),
        "forecast_low_usd": str(found.low_usd),
        "forecast_median_usd": str(found.median_usd),
        "forecast_high_usd": str(found.high_usd),
        "forecast_seconds_left": str(found.seconds_left),
        "forecast_seconds_left_high": str(found.seconds_left_high),
        "held_since": hold.since.isoformat(),
        "hold_usd_per_hour": str(hold.usd_per_hour),
    }


def _read(metadata: dict[str, str]) -> RunView:
    return RunView.from_card(
        metadata, written_at=NOW, stale_because="not logged in", now=NOW + timedelta(hours=1)
    )


def test_a_progress_card_keeps_the_view_s_numbers_as_typed_json_and_status_reads_them_back():
    run, _ = play("demo", decide=None)
    view = RunView.of(run, NOW)
    metadata = view.card_metadata()

    numbers = json.loads(metadata[NUMBERS_KEY])
    assert numbers["spend_usd"] == run.telemetry.spend_usd  # a number, not a numeric string
    assert isinstance(numbers["forecast"]["low_usd"], float)
    assert "spend_usd" not in metadata and "held_since" not in metadata
    assert all(len(value) <= 500 for value in metadata.values())  # Prefect cuts longer values

    read = _read(metadata)
    assert (read.spend_usd, read.budget_usd) == (view.spend_usd, view.budget_usd)
    assert (read.forecast, read.hold) == (view.forecast, view.hold)
    assert (read.run_id, read.state, read.stage) == (view.run_id, view.state, view.stage)
    assert read.pending_decision == view.pending_decision
    # The same keys whichever way it was read (docs/cli.md names them).
    assert read.numbers().keys() == view.numbers().keys()
    assert read.numbers()["held"]["as_of"] == (NOW + timedelta(hours=1)).isoformat()


def test_a_card_written_by_an_older_version_is_still_read_from_its_numeric_strings():
    run, _ = play("demo", decide=None)
    view = RunView.of(run, NOW)

    read = _read(_legacy_metadata(run))

    assert (read.spend_usd, read.budget_usd) == (view.spend_usd, view.budget_usd)
    assert read.forecast == view.forecast and read.hold == view.hold


@pytest.mark.parametrize(
    "document",
    [
        '{"spend_usd": NaN, "budget_usd": 250000.0}',
        '{"spend_usd": "11917.73", "budget_usd": 250000.0}',
        '{"spend_usd": 1.0, "hold": {"since": "2026-12-05T00:00:00", "usd_per_hour": 5}}',
        "not json",
        '{"spend_usd": 1.0, "forecast": {"low_usd": 3}}',
    ],
)
def test_numbers_a_card_should_not_hold_are_no_numbers_and_its_words_still_show(document):
    # Anyone with Prefect API access may write a card: its numbers are read whole or not at all.
    run, _ = play("demo", decide=None)
    metadata = {**RunView.of(run, NOW).card_metadata(), NUMBERS_KEY: document}

    read = _read(metadata)

    assert (read.spend_usd, read.forecast, read.hold) == (None, None, None)
    assert read.spend_text() == metadata["spend"]
    assert read.forecast_text() == metadata["forecast"]


def test_an_older_card_s_numeric_strings_that_are_not_numbers_are_no_numbers():
    run, _ = play("demo", decide=None)
    legacy = {**_legacy_metadata(run), "spend_usd": "inf", "forecast_low_usd": "cheap"}

    read = _read(legacy)

    assert read.spend_usd is None and read.forecast is None
    assert read.hold is not None  # what was a number is still read


def test_status_says_the_same_from_the_backend_and_from_its_card():
    run, _ = play("demo", decide=None)
    view = RunView.of(run, NOW + timedelta(hours=1))
    read = _read(RunView.of(run, NOW).card_metadata())

    def printed(shown: RunView) -> list[str]:
        console = Console(record=True, width=400, file=io.StringIO())
        flow_run = {"flow_run_id": "f", "flow_run_name": "n", "state_name": "Paused"}
        print_status(console, {**flow_run, "state_message": None, "backend_run": shown})
        return console.export_text().splitlines()[2:]  # past the flow run and where from

    from_backend, from_card = printed(view), printed(read)
    assert from_card[:3] == from_backend[:3]  # stage, spend, forecast
    assert from_card[3] == from_backend[3] + ", if still held"  # counted to now, both
    assert from_card[4:] == from_backend[4:]  # the pending decision, the command


@pytest.mark.parametrize(("ended", "said"), [(False, "none reported yet."), (True, "none.")])
def test_status_of_a_flow_run_with_no_backend_run_says_whether_one_may_come(ended: bool, said: str):
    # A declined spend ends the flow run with no backend run: "none reported yet" promised one.
    console = Console(record=True, width=200, file=io.StringIO())
    shown = {"flow_run_id": "f", "flow_run_name": "n", "state_name": "Declined", "ended": ended}

    print_status(console, {**shown, "state_message": None, "backend_run": None})

    assert console.export_text().splitlines()[-1] == f"Backend run: {said}"
