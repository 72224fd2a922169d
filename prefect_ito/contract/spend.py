"""Contract v0.4: spend authority at the backend.

A person's confirmation of a quote is something the backend authenticated: a token of a person
(principal ``user:…``) holding ``spend:confirm`` confirms one quote
(``POST /v0/training-quotes/{quote_id}/confirmations``), and the backend records its principal.
A standing authorization is a backend object a person with ``spend:authorize`` creates
(``POST /v0/spend-authorizations``), with limits the backend checks; from v0.5 the limits name
the data it covers (:func:`data_ref_matches`).
``POST /v0/training-runs`` names the quote (and the authorization, if one is meant); the backend
creates a run only on a person's confirmation of that quote, or an authorization that covers it.
"""

from __future__ import annotations

from datetime import datetime
from fnmatch import fnmatchcase

from pydantic import AwareDatetime, Field

from prefect_ito.contract.auth import Principal
from prefect_ito.contract.envelope import ID_MAX_LENGTH, ModelSize, NonEmptyStr, QuoteId, _Model
from prefect_ito.contract.open_enum import OpenEnum

NOTE_MAX_LENGTH = 256
"""The longest note a person may leave beside their confirmation."""


class QuoteState(OpenEnum):
    """Where a quote stands (v0.4): a client treats a state it does not know as not confirmed."""

    PENDING = "pending"
    """Nobody confirmed or declined it yet, and it has not expired."""
    CONFIRMED = "confirmed"
    """A person confirmed it; it has not made a run yet."""
    DECLINED = "declined"
    """It was declined: it can never make a run."""
    EXPIRED = "expired"
    """It expired before it made a run."""
    USED = "used"
    """It made a run."""
    SUPERSEDED = "superseded"
    """Its confirmation carried to a newer quote of the same manifest, which is the one to use."""


class QuoteAnswer(OpenEnum):
    """What a confirmation records: the person confirmed, or someone declined."""

    CONFIRMED = "confirmed"
    DECLINED = "declined"


class QuoteConfirmationRequest(_Model):
    """The body of a quote confirmation or decline: at most a note beside the principal."""

    note: str | None = Field(
        default=None,
        min_length=1,
        max_length=NOTE_MAX_LENGTH,
        description="Optional: what the person wants on record beside their principal, such "
        "as the name they typed. The backend keeps it as it is and never acts on it.",
    )


class QuoteConfirmation(_Model):
    """A person's answer to a quote, as the backend authenticated and recorded it (v0.4)."""

    confirmation_id: str = Field(max_length=ID_MAX_LENGTH, description="The answer's id.")
    quote_id: QuoteId
    state: QuoteAnswer = Field(description="`confirmed` or `declined`.")
    principal: Principal = Field(
        description="Who answered, as the backend authenticated them: the principal of the "
        "token (or the confirm page's sign-in). Never a name a client wrote."
    )
    note: str | None = Field(default=None, description="The note given with the answer.")
    confirmed_at: datetime = Field(description="When the backend recorded the answer.")


class SpendLimits(_Model):
    """What a standing authorization covers; every limit given must hold (v0.4).

    A limit left out does not restrict. Whatever the limits, an authorization never covers a run
    that is not estimated to end before the booking's term (the quote's `ends_before_term`).
    """

    max_budget_usd: float | None = Field(
        default=None, gt=0, description="Per run: the highest `budget_usd` covered."
    )
    max_estimate_high_usd: float | None = Field(
        default=None, gt=0, description="Per run: the highest `plan.cost_usd.high` covered."
    )
    model_sizes: list[ModelSize] | None = Field(
        default=None, description="Per run: the model sizes covered (exactly as written)."
    )
    targets: list[NonEmptyStr] | None = Field(default=None, description="Per run: the targets.")
    booking_id_patterns: list[NonEmptyStr] | None = Field(
        default=None,
        description="Per run: shell-style patterns (`*`, `?`, `[…]`) one of which the booking "
        "id matches in full, such as `bk-nightly-*`.",
    )
    total_spend_usd: float | None = Field(
        default=None,
        gt=0,
        description="In total: the most the covered runs' budgets (their spend ceilings) may "
        "add up to.",
    )
    max_runs: int | None = Field(default=None, ge=1, description="In total: the most runs.")
    data_ref_patterns: list[NonEmptyStr] | None = Field(
        default=None,
        description="v0.5: per run, shell-style patterns (`*`, `?`, `[…]`, case-sensitive) "
        "over a whole data reference: each of the request's `data_refs` must match one, such "
        "as `s3://team-bucket/corpus/*`. A data reference holding `%`, `\\`, `?`, `#`, a `.` "
        "or `..` segment or an empty segment matches none. `*` alone covers any data. An "
        "authorization without it (made before v0.5) covers no run.",
    )


class NewSpendLimits(SpendLimits):
    """The limits of a new standing authorization (v0.5): a person names the data it covers.

    Required here and optional in :class:`SpendLimits`, which also reads authorizations made
    before v0.5 (those cover no run).
    """

    data_ref_patterns: list[NonEmptyStr] = Field(
        min_length=1,
        description="v0.5, required: shell-style patterns one of which each of a covered "
        'run\'s `data_refs` matches in full (see `SpendLimits.data_ref_patterns`); `["*"]` '
        "names any data, on purpose.",
    )


class SpendAuthorizationRequest(_Model):
    """The body of ``POST /v0/spend-authorizations``: a name, the limits, and an expiry."""

    name: NonEmptyStr = Field(description="A person's name for the authorization.")
    limits: NewSpendLimits
    expires_at: AwareDatetime = Field(
        description="After this the authorization covers nothing: a time with its UTC offset (a "
        "time without one is refused, `422 VALIDATION_ERROR`)."
    )


class SpendAuthorizationState(OpenEnum):
    """Whether an authorization still covers anything (a state a client does not know: no)."""

    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"
    EXHAUSTED = "exhausted"
    """Its total spend or number of runs is used up."""


class SpendUsage(_Model):
    """What the runs an authorization covered have used of its totals."""

    runs: int = Field(ge=0)
    spend_usd: float = Field(ge=0, description="The covered runs' budgets, added up.")


class SpendAuthorization(_Model):
    """A standing authorization, as the backend keeps it (v0.4)."""

    authorization_id: str = Field(max_length=ID_MAX_LENGTH)
    name: str
    account: str
    principal: Principal = Field(description="The person who created it.")
    limits: SpendLimits
    created_at: datetime
    expires_at: datetime
    state: SpendAuthorizationState
    used: SpendUsage
    revoked_at: datetime | None = None
    revoked_by: Principal | None = None


class SpendAuthorizationList(_Model):
    """The account's standing authorizations, newest first."""

    authorizations: list[SpendAuthorization]


_UNRESOLVED_CHARACTERS = ("%", "\\", "?", "#")
"""Characters a store may decode or cut (an escape, a separator, a query or a fragment)."""


def data_ref_ambiguity(data_ref: str) -> str | None:
    """Return why ``data_ref`` may name other data than its text shows, or None when it cannot.

    A pattern is matched against the text, but a store resolves some text its own way:
    ``s3://team-bucket/corpus/../poisoned-corpus/`` starts with the corpus's folder and names
    another. So a data reference holding an escape, a backslash, a query, a fragment, a dot
    segment or an empty segment (anywhere but at the end) matches no pattern: only a person may
    confirm a run on it.
    """
    held = next((c for c in _UNRESOLVED_CHARACTERS if c in data_ref), None)
    if held is not None:
        return f"it holds {held!r}"
    segments = data_ref.split("://", 1)[-1].split("/")
    if any(segment in (".", "..") for segment in segments):
        return "it holds a '.' or '..' segment"
    if "" in segments[:-1]:
        return "it holds an empty segment ('//')"
    return None


def data_ref_matches(pattern: str, data_ref: str) -> bool:
    """Whether ``pattern`` (of ``SpendLimits.data_ref_patterns``) covers ``data_ref``.

    Shell-style (:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[…]``, case-sensitive) over the
    whole data reference, so ``s3://team-bucket/corpus/*`` covers what is under that folder
    and not ``s3://team-bucket/corpus-evil/``; never a data reference with an ambiguity
    (:func:`data_ref_ambiguity`).
    """
    return data_ref_ambiguity(data_ref) is None and fnmatchcase(data_ref, pattern)
