"""The backend's refusals of a submission that a person or a new quote can mend.

The backend alone decides whether a run may be created (:mod:`prefect_ito.backend.desk`). When it
refuses because a standing authorization does not cover the quote, or because the quote expired,
was used or no longer stands, nothing was created and spending goes on: it asks a person, or
quotes again (:func:`prefect_ito.people.spend.submit_with_consent`). Such a refusal is returned
as a value, not raised, so that the flow's ``submit_training_run`` task ends Completed — the
backend's answer — rather than Failed with a traceback.

A person asked because a standing authorization did not cover the run is told which and why
(:class:`Uncovered`): when first asked, and again by a watcher that tells people again of a
question Prefect lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from prefect_ito.contract import ID_MAX_LENGTH
from prefect_ito.exceptions import (
    AuthorizationDoesNotCover,
    ConfirmationExpired,
    ConfirmationRequired,
    ConfirmationUsed,
    ItoAPIError,
)

__all__ = ["MENDABLE_REFUSALS", "NO_AUTHORIZATION", "SubmissionRefused", "Uncovered"]

NO_AUTHORIZATION = "no standing authorization is named, so only a person can allow this spend"
"""Why a person is asked about a spend when the flow run names no standing authorization."""

MENDABLE_REFUSALS = (
    AuthorizationDoesNotCover,
    ConfirmationExpired,
    ConfirmationUsed,
    ConfirmationRequired,
)
"""The backend's refusals of a submission that a person or a new quote can mend: nothing was
created, and spending goes on (asks a person, or quotes again)."""


@dataclass(frozen=True)
class SubmissionRefused:
    """The backend refused a submission for a reason a person or a new quote can mend; nothing
    was created (see the module docstring)."""

    error: ItoAPIError
    """The refusal, one of :data:`MENDABLE_REFUSALS`, as the backend stated it (its message is
    safe to show)."""

    def reason(self) -> str:
        """Return why, in the backend's words: its ``details.reason`` if it gave one."""
        said = self.error.details.get("reason")
        return said if isinstance(said, str) and said else self.error.message


class Uncovered(BaseModel):
    """A standing authorization the backend said does not cover a run, and the backend's reason:
    why a person is asked about its spend instead."""

    model_config = ConfigDict(frozen=True)

    authorization_id: str = Field(
        min_length=1, max_length=ID_MAX_LENGTH, description="The authorization refused."
    )
    reason: str = Field(description="Why it does not cover the run, in the backend's words.")

    def why(self, name: str) -> str:
        """Return why a person is asked, in one line, ``name`` being what people call it."""
        which = self.authorization_id
        if name != which:
            which = f"{name} ({which})"
        return f"the standing authorization {which} does not cover this run: {self.reason}"
