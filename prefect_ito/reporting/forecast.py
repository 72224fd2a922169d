"""A live forecast of a training run: spend at completion and time to finish, with a band.

From one snapshot of the run, the backend's ``telemetry.progress`` (the share of its planned
work behind the run) and what the run has cost and taken so far:

- **median**: the rate so far carried to the end. Spend at completion is ``spend / progress``;
  time to finish is the time so far (``updated_at − created_at``) times ``(1 − p) / p``. The
  rate so far already holds what went wrong so far (a restart that redid work, an interruption),
  which is why it is used rather than the quote's plan.
- **band**: a fixed share of what remains, −20 % / +30 %
  (:data:`LOW_SHARE`, :data:`HIGH_SHARE`). The high end allows for more restarts and
  interruptions than so far, as the desk's own quotes do (+30 % of the plan); the low end for the
  rate so far carrying one-off costs that need not recur (a single restart in the largest stage
  redoes about a tenth of it). A share of the *remaining* spend narrows the band as the run nears
  its end, as it should; at the half-way point it spans about a quarter of the total. We chose
  fixed shares over the variance of the burn rate because the contract gives one snapshot of a
  run, not a history of its rate: a card, ``status`` and a re-entered flow all see the same
  snapshot, so all say the same forecast.
- **at risk**: the median passes the ceiling — more likely than not, the backend stops the run
  as ``budget_exhausted`` before it ends. The median, not the low end: the low end passes only
  when even the best case fails, too late for a person to act; the event carries both ends, so
  an Automation may ask for more.

No forecast (None) before :data:`MIN_PROGRESS` of the work, when nothing has been spent, for a
finished run, or from a backend that does not report ``progress`` (older than this field): a
count of stages would be no measure, the stages differ in length by a hundred times.

No Prefect import: the command line uses it without Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect_ito.contract import TrainingRun

LOW_SHARE = 0.8
"""The low end: the remaining spend and time at 80 % of the rate so far."""
HIGH_SHARE = 1.3
"""The high end: the remaining spend and time at 130 % of the rate so far."""
MIN_PROGRESS = 0.01
"""Below 1 % of the planned work, the rate so far says too little to forecast from."""


SAID = "forecast: "
"""How a forecast sentence begins, on a card and in an event's message."""


@dataclass(frozen=True)
class Forecast:
    """What a run is expected to cost and take, from its rate so far."""

    spend_usd: float
    budget_usd: float
    progress: float
    low_usd: float
    median_usd: float
    high_usd: float
    seconds_left: float
    seconds_left_high: float

    @property
    def at_risk(self) -> bool:
        """Tell whether the median forecast passes the budget ceiling."""
        return self.median_usd > self.budget_usd

    def sentence(self) -> str:
        """Return e.g. "forecast: $24,000–$31,000 at completion of $250,000 budget, ~9 days to
        finish"."""
        return f"{SAID}{self.figures()}"

    def figures(self) -> str:
        """Return the sentence without its first word, for a line already labelled Forecast."""
        line = (
            f"${_round(self.low_usd):,.0f}–${_round(self.high_usd):,.0f} at completion "
            f"of ${self.budget_usd:,.0f} budget, ~{_duration(self.seconds_left)} to finish"
        )
        if self.at_risk:
            line += " — likely to reach the ceiling before it ends"
        return line

    def payload(self) -> dict[str, float]:
        """Return the forecast's numbers, as numbers, for an event or ``--json``."""
        return {
            "forecast_low_usd": round(self.low_usd, 2),
            "forecast_median_usd": round(self.median_usd, 2),
            "forecast_high_usd": round(self.high_usd, 2),
            "budget_usd": self.budget_usd,
            "spend_usd": self.spend_usd,
            "progress": self.progress,
            "seconds_to_finish": round(self.seconds_left),
        }


def forecast(run: TrainingRun) -> Forecast | None:
    """Return the run's forecast; None when there is nothing to forecast from (see the module)."""
    t = run.telemetry
    p = t.progress
    if run.finished or p is None or p < MIN_PROGRESS or t.spend_usd <= 0:
        return None
    left = (1 - p) / p
    elapsed = max(0.0, (run.updated_at - run.created_at).total_seconds())
    remaining = t.spend_usd * left
    return Forecast(
        spend_usd=t.spend_usd,
        budget_usd=t.budget_usd,
        progress=p,
        low_usd=t.spend_usd + remaining * LOW_SHARE,
        median_usd=t.spend_usd + remaining,
        high_usd=t.spend_usd + remaining * HIGH_SHARE,
        seconds_left=elapsed * left,
        seconds_left_high=elapsed * left * HIGH_SHARE,
    )


def _round(usd: float) -> float:
    """Round to three significant figures: a forecast is not exact to the dollar."""
    if usd < 100:
        return round(usd)
    return round(usd, 2 - len(str(int(usd))) + 1)


def _duration(seconds: float) -> str:
    """Return e.g. "9 days", "14 h", "under 1 h"."""
    hours = seconds / 3600
    if hours >= 48:
        return f"{hours / 24:,.0f} days"
    if hours >= 1:
        return f"{hours:,.0f} h"
    return "under 1 h"
