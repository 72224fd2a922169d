"""What a wait for a person costs: how long the backend has held a run, and about how much.

The backend says when it began holding a run for a decision (``PendingAction.held_since``) and
what holding costs per hour (``hold_usd_per_hour``: the booking's GPUs held idle). This module
turns the two into one sentence for cards, forms, the inbox and notifications:
"held 2 h 14 min: about $1,350 of GPU time".

No Prefect import: the command line, which imports no Prefect for most commands, uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from prefect_ito.contract import PendingAction

_ROUND_ABOVE_USD = 100.0
"""Amounts from here up are rounded to three significant figures ("about $1,350")."""


@dataclass(frozen=True)
class Held:
    """How long a run has been held for a decision, and what that cost so far."""

    seconds: float
    usd: float

    def duration(self) -> str:
        """Return the time held: minutes under an hour ("14 min"), else hours and minutes."""
        minutes = max(0, int(self.seconds // 60))
        hours, minutes = divmod(minutes, 60)
        if hours == 0:
            return f"{minutes} min" if minutes else "under 1 min"
        days, hours = divmod(hours, 24)
        if days == 0:
            return f"{hours} h {minutes} min"
        return f"{days} d {hours} h"

    def cost(self) -> str:
        """Return the cost held, rounded as a person would say it; never "about $0"."""
        if self.usd < 1:
            return "under $1"
        if self.usd < _ROUND_ABOVE_USD:
            return f"about ${self.usd:,.0f}"
        digits = len(str(int(self.usd))) - 3
        return f"about ${round(self.usd, -digits):,.0f}"

    def sentence(self) -> str:
        """Return e.g. "held 2 h 14 min: about $1,350 of GPU time"."""
        return f"held {self.duration()}: {self.cost()} of GPU time"


def held(since: datetime, usd_per_hour: float, now: datetime | None = None) -> Held:
    """Return how long a run has been held since ``since`` and what that cost at the rate given.

    Args:
        since: When the hold began (aware).
        usd_per_hour: What holding costs per hour, in US dollars.
        now: The moment to count to; default: now. A ``since`` in the future counts as none.
    """
    seconds = max(0.0, ((now or datetime.now(UTC)) - since).total_seconds())
    return Held(seconds=seconds, usd=seconds / 3600 * usd_per_hour)


def held_for(action: PendingAction, now: datetime | None = None) -> Held | None:
    """Return what holding the run for ``action`` has cost so far; None if the backend did not say.

    Both ``held_since`` and ``hold_usd_per_hour`` are needed: an older backend sends neither.
    """
    if action.held_since is None or action.hold_usd_per_hour is None:
        return None
    return held(action.held_since, action.hold_usd_per_hour, now)
