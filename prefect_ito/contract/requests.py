"""Contract v0: what a client sends — training requests, spend confirmations, decisions, cancels."""

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
    BookingId,
    ClientReference,
    ManifestDigest,
    ModelSize,
    NonEmptyStr,
    QuoteId,
    _Model,
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
    """How a spend was confirmed: by a person, or under a standing authorization one created."""

    PERSON = "person"
    STANDING_AUTHORIZATION = "standing_authorization"


class SpendConfirmation(_Model):
    """A confirmation that a person stands behind a submission's spend (contract v0.3).

    It names the quote the person saw (:class:`~prefect_ito.contract.TrainingQuote`); the backend
    checks the quote was made for this account, booking, manifest digest and budget, and consumes
    it with the run it creates.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    quote_id: QuoteId
    confirmed_by: NonEmptyStr = Field(
        description="The name the confirming person gave; under a standing authorization, the "
        "person who created it."
    )
    via: ConfirmationVia = Field(
        description="`person`: a person confirmed this quote; `standing_authorization`: a "
        "standing authorization a person created in advance covers it."
    )
    authorization: NonEmptyStr | None = Field(
        default=None,
        description="The standing authorization's name, when `via` is `standing_authorization`.",
    )


class TrainingRunRequest(TrainingRequest):
    """The body of ``POST /v0/training-runs``: the request, its manifest digest, its confirmation.

    Neither the confirmation nor the client reference is part of the manifest: the digest covers
    the six request fields only.
    """

    manifest_digest: ManifestDigest
    confirmation: SpendConfirmation | None = Field(
        default=None,
        description="Contract v0.3: a new run needs one (`CONFIRMATION_REQUIRED` without it); a "
        "replay of an earlier submission does not.",
    )
    client_reference: ClientReference | None = Field(
        default=None,
        description="Contract v0.3: the caller's stable reference for this submission, kept on "
        "the run and found with `GET /v0/training-runs?client_reference=…` for as long as the "
        "run exists. A backend makes at most one run per reference and account "
        "(`CLIENT_REFERENCE_IN_USE`). Send it only to a backend whose capabilities say "
        "`client_reference: true`.",
    )

    def confirmed(self, confirmation: SpendConfirmation) -> TrainingRunRequest:
        """Return this submission carrying ``confirmation``."""
        return self.model_copy(update={"confirmation": confirmation})

    def referenced(self, client_reference: str | None) -> TrainingRunRequest:
        """Return this submission carrying ``client_reference`` (None: without one)."""
        return self.model_validate({**self.model_dump(), "client_reference": client_reference})


class DecisionChoice(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class DecisionRequest(_Model):
    """The body of ``POST …/actions/{action_id}/decision``: a person's answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: DecisionChoice
    decided_by: NonEmptyStr = Field(description="The name the deciding person gave.")
    reason: NonEmptyStr


class CancelRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str | None = Field(default=None, max_length=512)
