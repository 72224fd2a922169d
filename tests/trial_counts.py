"""How many randomized trials a test plays: all of them for the reliability report, fewer daily.

The figures in docs/reliability.md come from runs with ``--reliability-report``, which play every
trial. An everyday ``uv run pytest`` plays a smaller share of the same seeded plans — every route
and phase still at least once (the crash trials: once each) — so that the whole suite stays within
its time on two cores.
"""

from __future__ import annotations

FULL = False
"""Whether this run writes the reliability report (set by ``tests/conftest.py``)."""


def count(full: int, everyday: int) -> int:
    """Return ``full`` in a reliability-report run, else ``everyday``."""
    return full if FULL else everyday
