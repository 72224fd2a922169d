"""The backend's refusals of a submission that a person or a new quote can mend.

The backend alone decides whether a run may be created (:mod:`prefect_ito.backend.desk`). When it
refuses because a standing authorization does not cover the quote, or because the quote expired,
was used or no longer stands, nothing was created and spending goes on: it asks a person, or
quotes again (:func:`prefect_ito.people.spend.submit_with_consent`). Such a refusal is returned
as a value, not raised, so that the flow's ``submit_training_run`` task ends Completed — the
backend's answer — rather than Failed with a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect_ito.exceptions import (
    AuthorizationDoesNotCover,
    ConfirmationExpired,
    ConfirmationRequired,
    ConfirmationUsed,
    ItoAPIError,
)

__all__ = ["MENDABLE_REFUSALS", "SubmissionRefused"]

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
