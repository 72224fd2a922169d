"""One view of a run: its telemetry table, and what ``status`` says of it.

- :data:`TELEMETRY` is the telemetry table: one :class:`Measure` per row — its label, the fields
  of the contract's ``Telemetry`` it shows, and its text. The telemetry card and the terminal's
  summary show every row, in this order; ``--json`` carries the fields themselves (a summary's
  ``telemetry``). A field the backend sends is shown once a row names it, and only then:
  ``tests/reporting/test_run_view.py`` fails while a field of ``Telemetry`` is in no row, or is
  named but not shown by the card, the terminal or the JSON.
- :class:`RunView` is what ``status`` shows of a run: its state, stage, spend, forecast, what
  holding it for a decision costs, and the pending decision. It is built from the backend's run
  (:meth:`RunView.of`) or from a progress card's metadata (:meth:`RunView.from_card`), and
  rendered to that metadata (:meth:`RunView.card_metadata`: the words a person reads in the
  Prefect UI, and the numbers as one JSON document), the terminal and ``--json``
  (:meth:`RunView.numbers`).

No Prefect import: the command line shows a run without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError, model_serializer

from prefect_ito.contract import PendingAction, Telemetry, TrainingRun
from prefect_ito.questions import question_for
from prefect_ito.reporting.decisions import DecisionSummary
from prefect_ito.reporting.forecast import Forecast, forecast
from prefect_ito.reporting.holding import held
from prefect_ito.reporting.moments import when

__all__ = [
    "NUMBERS_KEY",
    "TELEMETRY",
    "Hold",
    "Measure",
    "RunView",
    "loss_summary",
    "spend",
    "telemetry_rows",
]


def spend(spend_usd: float, budget_usd: float) -> str:
    """Return spend against the ceiling: ``$1,234.00 of $250,000.00 (0% of the ceiling)``."""
    return f"${spend_usd:,.2f} of ${budget_usd:,.2f} ({spend_usd / budget_usd:.0%} of the ceiling)"


def loss_summary(t: Telemetry, rows: Sequence[DecisionSummary]) -> str:
    """Return the loss curve in one sentence: where it started, where it is, what stood out.

    Args:
        t: The run's telemetry: the curve (downsampled) and the latest loss and step.
        rows: Its decisions (:func:`~prefect_ito.reporting.decisions.decisions`), which name
            the spikes.
    """
    history = t.loss_history
    if not history:
        if t.loss is None:
            return "No loss reported yet."
        return f"Loss {t.loss:.2f} at step {t.step:,}."
    first = history[0]
    # The latest loss is the run's own; the curve's last point may be older (downsampled).
    loss, step = (t.loss, t.step) if t.loss is not None else (history[-1].loss, history[-1].step)
    lowest = min(loss, *(p.loss for p in history))
    sentence = (
        f"Loss {first.loss:.2f} at step {first.step:,} → {loss:.2f} at step {step:,} "
        f"(lowest {lowest:.2f})."
    )
    for row in rows:
        if row.step is not None and row.loss is not None:
            sentence += f" Spike {row.loss:.2f} at step {row.step:,}: {row.outcome()}."
    return sentence


def _progress(t: Telemetry, rows: Sequence[DecisionSummary]) -> str:
    if t.progress is None:
        return "not reported"
    return f"{t.progress:.0%} of the planned work"


@dataclass(frozen=True)
class Measure:
    """One row of the telemetry table: its label, the ``Telemetry`` fields it shows, its text."""

    label: str
    fields: tuple[str, ...]
    text: Callable[[Telemetry, Sequence[DecisionSummary]], str]


TELEMETRY: tuple[Measure, ...] = (
    Measure("goodput", ("goodput",), lambda t, _: f"{t.goodput:.1%}"),
    Measure(
        "interruption rate",
        ("interruption_rate_per_day",),
        lambda t, _: f"{t.interruption_rate_per_day:.2f} per day",
    ),
    Measure(
        "checkpoint bandwidth",
        ("checkpoint_bandwidth_gbps",),
        lambda t, _: f"{t.checkpoint_bandwidth_gbps:.1f} GB/s",
    ),
    Measure("spend", ("spend_usd", "budget_usd"), lambda t, _: spend(t.spend_usd, t.budget_usd)),
    Measure("tokens processed", ("tokens_processed",), lambda t, _: f"{t.tokens_processed:,}"),
    Measure("step", ("step",), lambda t, _: f"{t.step:,}"),
    Measure("progress", ("progress",), _progress),
    Measure("loss", ("loss", "loss_history"), loss_summary),
)
"""The telemetry table: every row the telemetry card and the terminal show, in order."""


def telemetry_rows(t: Telemetry, rows: Sequence[DecisionSummary]) -> list[tuple[str, str]]:
    """Return the telemetry table's rows, label and text, as every renderer shows them."""
    return [(measure.label, measure.text(t, rows)) for measure in TELEMETRY]


class Hold(BaseModel):
    """Since when the backend holds a run for a person, and what holding it costs an hour."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, strict=True)

    since: AwareDatetime
    usd_per_hour: float

    @classmethod
    def of(cls, action: PendingAction | None) -> Hold | None:
        """Return the hold of the pending ``action``; None unless the backend says both (an
        older backend says neither)."""
        if action is None or action.held_since is None or action.hold_usd_per_hour is None:
            return None
        return cls(since=action.held_since, usd_per_hour=action.hold_usd_per_hour)

    def numbers(self, now: datetime) -> dict[str, Any]:
        """Return what holding has cost from ``since`` to ``now``, as numbers (the moments as
        ISO text). Counted when it is shown, not when it was written: the cost grows."""
        cost = held(self.since, self.usd_per_hour, now)
        return {
            "since": self.since.isoformat(),
            "seconds": round(cost.seconds),
            "usd": round(cost.usd, 2),
            "usd_per_hour": self.usd_per_hour,
            "as_of": now.isoformat(),
        }

    def sentence(self, now: datetime) -> str:
        """Return e.g. "held 2 h 14 min: about $1,350 of GPU time as of 2026-11-30 11:14 UTC
        ($600 an hour while nobody decides)": a card is written when the run changes, and a
        held run does not change, so the line says when it was counted and the hourly rate."""
        cost = held(self.since, self.usd_per_hour, now).sentence()
        return f"{cost} as of {when(now)} (${self.usd_per_hour:,.0f} an hour while nobody decides)"


NUMBERS_KEY = "numbers"
"""The progress card's metadata key of the view's numbers, one JSON document
(:class:`_CardNumbers`). Prefect keeps metadata values as text of up to 500 characters."""
_WORDS = ("spend", "forecast", "held")
"""The progress card's metadata keys of what a person reads, beside its numbers."""
_LEGACY_FORECAST_PREFIX = "forecast_"
"""Before :data:`NUMBERS_KEY`, each number was a metadata key of its own, as a numeric string:
``spend_usd``, ``budget_usd``, ``held_since``, ``hold_usd_per_hour`` and this prefix before the
name of each other :class:`Forecast` field."""


class _CardNumbers(BaseModel):
    """The numbers a progress card keeps of its view, as typed JSON. Anyone with Prefect API
    access may write a card: a document that is not this (a NaN, a moment without a zone) is
    read as no numbers, never half-read; a number written as text is no number."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, strict=True)

    spend_usd: float | None = None
    budget_usd: float | None = None
    forecast: Forecast | None = None
    hold: Hold | None = None


class RunView(BaseModel):
    """What ``status`` shows of a backend run, and where it comes from: the backend, read at
    ``as_of``, or a progress card written at ``as_of`` (possibly stale, ``stale_because``)."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    source: Literal["backend", "card"]
    as_of: datetime | None
    stale_because: str | None = None
    shown_at: datetime
    """When the view was made: what holding the run cost is counted to then."""
    run_id: str | None = None
    state: str | None = None
    stage: str | None = None
    spend_usd: float | None = None
    budget_usd: float | None = None
    forecast: Forecast | None = None
    hold: Hold | None = None
    pending_decision: str | None = None
    said: dict[str, str | None] | None = None
    """A card's own words for its spend, forecast and hold (None from the backend): shown where
    its numbers are missing (a card older than them)."""

    @classmethod
    def of(cls, run: TrainingRun, now: datetime | None = None) -> RunView:
        """Return the view of a run read from the backend at ``now`` (default: now)."""
        now = now or datetime.now(UTC)
        return cls(
            source="backend",
            as_of=now,
            shown_at=now,
            run_id=run.run_id,
            state=run.state.value,
            stage=run.current_stage or None,
            spend_usd=run.telemetry.spend_usd,
            budget_usd=run.telemetry.budget_usd,
            forecast=forecast(run),
            hold=Hold.of(run.pending_action),
            pending_decision=_pending(run.pending_action),
        )

    @classmethod
    def from_card(
        cls,
        metadata: dict[str, str],
        *,
        written_at: datetime | None,
        stale_because: str,
        now: datetime | None = None,
    ) -> RunView:
        """Return the view a progress card's metadata keeps, as of when it was written.

        Its numbers come from its JSON document (:data:`NUMBERS_KEY`), or, from a card written
        before it, from one numeric string each; never from its words. What holding the run
        cost is counted to ``now``: a held run does not change, so its card is not written again.
        """
        numbers = _card_numbers(metadata)
        return cls(
            source="card",
            as_of=written_at,
            stale_because=stale_because,
            shown_at=now or datetime.now(UTC),
            run_id=metadata.get("run_id"),
            state=metadata.get("state"),
            stage=metadata.get("stage") or None,
            spend_usd=numbers.spend_usd,
            budget_usd=numbers.budget_usd,
            forecast=numbers.forecast,
            hold=numbers.hold,
            pending_decision=metadata.get("pending_decision") or None,
            said={key: metadata.get(key) or None for key in _WORDS},
        )

    def spend_text(self) -> str | None:
        """Return the spend against the ceiling in words; a card's own words without numbers."""
        if self.spend_usd is None or not self.budget_usd:
            return self._said("spend")
        return spend(self.spend_usd, self.budget_usd)

    def forecast_text(self) -> str | None:
        """Return the forecast's figures ("$27,100–$36,600 at completion of …"), if any."""
        if self.forecast is not None:
            return self.forecast.figures()
        said = self._said("forecast")
        # A card of some versions said "forecast: …"; the figures say it once.
        return said.removeprefix("forecast: ") if said else None

    def held_text(self) -> str | None:
        """Return what holding the run cost ("held 2 h …"), counted to when it is shown."""
        if self.hold is not None:
            return self.hold.sentence(self.shown_at)
        return self._said("held")

    def _said(self, key: str) -> str | None:
        said = (self.said or {}).get(key)
        return str(said) if said else None

    def card_metadata(self) -> dict[str, str]:
        """Return the progress card's metadata: what a person reads in the Prefect UI, and the
        numbers as one JSON document (:data:`NUMBERS_KEY`), so that no reader parses words."""
        numbers = _CardNumbers(
            spend_usd=self.spend_usd,
            budget_usd=self.budget_usd,
            forecast=self.forecast,
            hold=self.hold,
        )
        return {
            "run_id": self.run_id or "",
            "state": self.state or "",
            "stage": self.stage or "",
            "spend": self.spend_text() or "",
            "pending_decision": self.pending_decision or "",
            # Under the key "forecast": its figures, so that it reads "forecast: $…" once.
            "forecast": self.forecast_text() or "",
            "held": self.held_text() or "",
            NUMBERS_KEY: numbers.model_dump_json(),
        }

    @model_serializer
    def numbers(self) -> dict[str, Any]:
        """Return the view for ``--json``: numbers as numbers, each null when there is none."""
        ratio = None
        if self.spend_usd is not None and self.budget_usd:
            ratio = self.spend_usd / self.budget_usd
        found = self.forecast
        return {
            "source": self.source,
            "as_of": self.as_of.isoformat() if self.as_of else None,
            "stale_because": self.stale_because,
            "run_id": self.run_id,
            "state": self.state,
            "stage": self.stage,
            "spend_usd": self.spend_usd,
            "budget_usd": self.budget_usd,
            "spend_fraction": ratio,
            "forecast": {**asdict(found), "at_risk": found.at_risk} if found else None,
            "held": self.hold.numbers(self.shown_at) if self.hold else None,
            "pending_decision": self.pending_decision,
            "card_text": self.said,
        }


def _pending(action: PendingAction | None) -> str | None:
    """Return the pending decision in one line, as its kind's question says it."""
    if action is None:
        return None
    question = question_for(action)
    if question is not None:
        return question.status(action)
    return f"{action.kind} at step {action.step:,} in {action.stage}"


def _card_numbers(metadata: dict[str, str]) -> _CardNumbers:
    """Return a card's numbers: its JSON document, else its numeric strings (an older card)."""
    document = metadata.get(NUMBERS_KEY)
    if document is None:
        return _legacy_numbers(metadata)
    try:
        return _CardNumbers.model_validate_json(document)
    except ValidationError:
        return _CardNumbers()


def _legacy_numbers(metadata: dict[str, str]) -> _CardNumbers:
    """Return the numbers of a card written before :data:`NUMBERS_KEY`: a numeric string each
    (still read: a flow run supervised by an older version keeps its card until it writes
    another)."""
    spent, budget = _number(metadata, "spend_usd"), _number(metadata, "budget_usd")
    known = {"spend_usd": spent, "budget_usd": budget}
    values = {
        item.name: known.get(item.name, _number(metadata, _LEGACY_FORECAST_PREFIX + item.name))
        for item in fields(Forecast)
    }
    found = None if None in values.values() else Forecast(**values)  # type: ignore[arg-type]
    since, rate = _moment(metadata.get("held_since")), _number(metadata, "hold_usd_per_hour")
    hold = Hold(since=since, usd_per_hour=rate) if since and rate is not None else None
    return _CardNumbers(spend_usd=spent, budget_usd=budget, forecast=found, hold=hold)


def _number(metadata: dict[str, str], key: str) -> float | None:
    """Return the metadata value as a finite number; None if absent or not a number."""
    try:
        value = float(metadata.get(key) or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _moment(text: str | None) -> datetime | None:
    """Return the metadata value as an aware moment; None if absent or not one."""
    try:
        moment = datetime.fromisoformat(text or "")
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None
