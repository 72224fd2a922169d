"""How a moment is written for a person, everywhere prefect-ito shows one."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["when"]


def when(moment: datetime | None) -> str:
    """Return a timestamp as a person reads it: ``2026-11-30 09:12 UTC``."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
