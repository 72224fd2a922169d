"""The codes a person checks on the decide page, one per proposed action, and the page's URL.

Kept by the engine rather than drawn in a run's pipeline: a code must name one action among every
run's, and a code stays known once its action is decided or dropped, so the page can say what
became of it rather than call it a wrong guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prefect_ito.simulator.ids import DECIDE_PAGE, user_code


@dataclass(frozen=True)
class Proposal:
    """What a code names: a run and one of its actions."""

    run_id: str
    action_id: str


def normalize(code: str) -> str:
    """Return a code as it is kept: a person may type it with spaces or in lower case."""
    return code.strip().upper()


class ActionCodes:
    """Every code one simulator gave an action since its scenario loaded."""

    def __init__(self, draw: Callable[[], str] = user_code) -> None:
        self._draw = draw
        self._named: dict[str, Proposal] = {}

    def issue(self, run_id: str, action_id: str, base_url: str | None) -> tuple[str, str | None]:
        """Return a new code for an action, unlike any given before, and its decide page's URL
        (None when the run was not submitted over HTTP, so no base URL is known)."""
        code = self._draw()
        while code in self._named:  # 20⁸ codes make a repeat rare; rare is not never
            code = self._draw()
        self._named[code] = Proposal(run_id, action_id)
        url = f"{base_url.rstrip('/')}{DECIDE_PAGE}?user_code={code}" if base_url else None
        return code, url

    def find(self, code: str) -> Proposal | None:
        """Return what a code names, pending or not, if it was ever given."""
        return self._named.get(normalize(code))
