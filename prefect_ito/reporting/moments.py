"""How a moment is written for a person, everywhere prefect-ito shows one.

People read the wall clock. A backend run keeps a clock of its own (a simulated run compresses
its weeks into minutes), so a moment on the run's clock is shown only under a label that says so.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect_ito.contract import PendingAction

__all__ = ["asked", "said_asked", "when"]


def when(moment: datetime | None) -> str:
    """Return a timestamp as a person reads it: ``2026-11-30 09:12 UTC``."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def asked(held_since: datetime | None, proposed_at: datetime | None) -> tuple[str, str]:
    """Return when a proposed action was put to a person, as a label and a moment.

    On the wall clock when the backend says when it began holding the run (``held_since``),
    beside the moment a person decided; else when it was proposed, labelled as the run's clock.
    """
    if held_since is not None:
        return "asked at", when(held_since)
    if proposed_at is not None:
        return "proposed at (the run's clock)", when(proposed_at)
    return "proposed at", "—"


def said_asked(action: PendingAction) -> str:
    """Return :func:`asked` of ``action`` as words in a line: ``asked at 2026-12-05 00:36 UTC``."""
    return " ".join(asked(action.held_since, action.proposed_at))
