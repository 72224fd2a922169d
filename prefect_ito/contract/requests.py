"""Contract v0: what a client sends — training requests and submissions, decisions, cancels."""

from __future__ import annotations

import hashlib
import math
from enum import StrEnum

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
)

from prefect_ito.contract.bookings import PostTraining
from prefect_ito.contract.envelope import (
    AuthorizationId,
    BookingId,
    ClientReference,
    ManifestDigest,
    ModelSize,
    NonEmptyStr,
    QuoteId,
    _Model,
    invisible_character,
)
from prefect_ito.contract.jcs import canonicalize


class TrainingRequest(_Model):
    """What a training request asks for: the fields its manifest digest covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    booking_id: BookingId
    model_size: ModelSize
    data_refs: list[NonEmptyStr] = Field(min_length=1, description="Data references to train on.")
    target: NonEmptyStr = Field(description="The capability to train for.")
    budget_usd: float = Field(gt=0, description="Spend ceiling in US dollars: finite, positive.")
    post_training: PostTraining | None = None

    @field_validator("booking_id", "target", "data_refs")
    @classmethod
    def _visible(cls, value: str | list[str]) -> str | list[str]:
        # What a person confirms must read as what is sent: no bidi override or zero-width
        # character may make one booking, target or data reference look like another. (Control
        # characters are the client's to refuse: the published digest vectors escape them.)
        for text in [value] if isinstance(value, str) else value:
            if (hidden := invisible_character(text)) is not None:
                raise ValueError(f"must not contain an invisible character (U+{ord(hidden):04X})")
        return value

    @field_validator("budget_usd")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("budget_usd must be a finite amount")
        return value

    def canonical_manifest(self) -> bytes:
        """Return the canonical manifest: the request's fields in RFC 8785 (JCS) form, UTF-8.

        Every field is present, ``post_training`` as ``null`` when unset. JCS writes numbers as
        JavaScript does (a budget of ``250000.0`` is ``250000``) and orders names by UTF-16 code
        units, so a backend in any language reproduces it (see :mod:`prefect_ito.contract.jcs`).
        """
        return canonicalize(self.model_dump(mode="json", include=set(TrainingRequest.model_fields)))

    def digest(self) -> str:
        """Return the manifest digest, ``sha256:<hex>`` of :meth:`canonical_manifest`."""
        return "sha256:" + hashlib.sha256(self.canonical_manifest()).hexdigest()

    def to_submission(self) -> TrainingRunRequest:
        """Return the submission body, stamped with this request's manifest digest."""
        return TrainingRunRequest(**self.model_dump(), manifest_digest=self.digest())


class ConfirmationVia(StrEnum):
    """How a run's spend was confirmed: by a person, or under a standing authorization one made."""

    PERSON = "person"
    STANDING_AUTHORIZATION = "standing_authorization"


class TrainingRunRequest(TrainingRequest):
    """The body of ``POST /v0/training-runs``: the request, its manifest digest, what allows it.

    Contract v0.4: a new run names the quote it spends on (``quote_id``). The backend creates it
    only if a person confirmed that quote at the backend, or if the standing authorization named
    by ``authorization_id`` covers it at that moment; nothing a client writes confirms a spend.
    Neither member is part of the manifest: the digest covers the six request fields only.
    """

    manifest_digest: ManifestDigest
    quote_id: QuoteId | None = Field(
        default=None,
        description="v0.4: the quote this run spends on, made for this account, booking, "
        "manifest digest and budget. A new run needs one (`CONFIRMATION_REQUIRED` without it, "
        "or while nobody confirmed it); a replay of an earlier submission does not.",
    )
    authorization_id: AuthorizationId | None = Field(
        default=None,
        description="v0.4: the standing authorization meant to cover the quote, instead of a "
        "person's confirmation of it. The backend checks it against the quote when the run "
        "would be created (`AUTHORIZATION_DOES_NOT_COVER` when it does not).",
    )
    client_reference: ClientReference | None = Field(
        default=None,
        description="Contract v0.3: the caller's stable reference for this submission, kept on "
        "the run and found with `GET /v0/training-runs?client_reference=…` for as long as the "
        "run exists. A backend makes at most one run per reference and account "
        "(`CLIENT_REFERENCE_IN_USE`). Send it only to a backend whose capabilities say "
        "`client_reference: true`.",
    )

    def spending(self, quote_id: str, authorization_id: str | None = None) -> TrainingRunRequest:
        """Return this submission naming ``quote_id`` (and a standing authorization)."""
        changes = {"quote_id": quote_id, "authorization_id": authorization_id}
        return self.model_validate({**self.model_dump(), **changes})

    def referenced(self, client_reference: str | None) -> TrainingRunRequest:
        """Return this submission carrying ``client_reference`` (None: without one)."""
        return self.model_validate({**self.model_dump(), "client_reference": client_reference})


class DecisionChoice(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class DecisionRequest(_Model):
    """The body of ``POST …/actions/{action_id}/decision``: a person's answer, with their token.

    v0.5: only a person's token (``user:…``, holding ``training:decide``) decides; the backend
    records its principal as who decided. ``decided_by`` is an optional note beside it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: DecisionChoice
    decided_by: NonEmptyStr | None = Field(
        default=None,
        description="Optional: a note the person wants on record, such as their name; never "
        "who decided (the token's principal is).",
    )
    reason: NonEmptyStr


class CancelRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str | None = Field(default=None, max_length=512)
