"""Contract v0: the account-wide change feed — which runs moved, for one watcher of many runs.

A watcher that follows hundreds of deferred runs asks once for everything that changed after a
cursor, instead of holding a long-poll per run. The feed names the runs and their new version;
the run itself is read as usual when its change matters.
"""

from __future__ import annotations

from pydantic import Field

from prefect_ito.contract.envelope import _Model
from prefect_ito.contract.runs import RunState
from prefect_ito.contract.spend import QuoteState


class RunChange(_Model):
    """One run whose version moved past the cursor, and what a watcher needs to judge it."""

    run_id: str
    version: int = Field(ge=1)
    state: RunState
    current_stage: str | None = None
    pending_action: bool = Field(description="Whether the run waits for a person's decision.")


class QuoteChange(_Model):
    """v0.4: a quote that a person confirmed, or someone declined, after the cursor."""

    quote_id: str
    state: QuoteState = Field(description="The quote's state after the change.")


class ChangePage(_Model):
    """The runs of the account that changed after ``after``, and the cursor to ask after next.

    Without ``after`` the answer is at once, empty, with the current cursor: a starting point.
    A cursor is opaque to clients but for being passed back; it never goes backwards.
    """

    changes: list[RunChange]
    quotes: list[QuoteChange] = Field(
        default_factory=list,
        description="v0.4: the quotes answered (confirmed or declined) after the cursor, for a "
        "watcher of flow runs that wait for a person's confirmation.",
    )
    cursor: int = Field(ge=0)
