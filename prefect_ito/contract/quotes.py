"""Contract v0.3: what a training request would do and cost, before anyone confirms the spend.

``POST /v0/training-quotes`` takes the submission body and answers a :class:`TrainingQuote`: the
backend's plan preview, its estimate and a quote id that expires. It creates no work and spends
nothing. Contract v0.4: a person confirms the quote at the backend (or a standing authorization
covers it), and a submission names it by ``quote_id``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Self

from pydantic import Field, field_validator, model_validator

from prefect_ito.contract.envelope import ManifestDigest, QuoteId, _Model
from prefect_ito.contract.requests import TrainingRequest
from prefect_ito.contract.runs import ParallelismPlan
from prefect_ito.contract.spend import QuoteConfirmation, QuoteState


class CostRange(_Model):
    """An estimate as a range: ``low`` ≤ ``high``, both finite and not negative."""

    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @field_validator("low", "high")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("an estimate must be finite")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


class PlanPreview(_Model):
    """The plan the backend would follow for a request, and what it expects it to take."""

    parallelism: ParallelismPlan = Field(
        description="The parallelism and precision the backend would choose, or its refusal "
        "(`refused` with a `reason`): a refused plan is never worth submitting."
    )
    stages: list[str] = Field(description="The planned stage names, in order.")
    custom_data: bool = Field(description="Whether any data reference is outside `catalog://`.")
    ladder_check: bool = Field(
        description="Whether the data goes through the 150M ladder decision job first (custom "
        "data does; a rejection stops the run as `LADDER_REJECTED`)."
    )
    gpu_hours: CostRange = Field(description="Estimated GPU hours (GPUs × wall-clock hours).")
    cost_usd: CostRange = Field(description="Estimated spend in US dollars.")
    duration_hours: CostRange = Field(description="Estimated wall-clock hours to the end.")


class TrainingQuote(_Model):
    """The answer to ``POST /v0/training-quotes``: a plan, an estimate, a quote id to confirm."""

    quote_id: QuoteId
    booking_id: str
    manifest_digest: ManifestDigest
    budget_usd: float = Field(gt=0, description="The request's spend ceiling.")
    plan: PlanPreview
    within_budget: bool = Field(description="Whether `plan.cost_usd.high` ≤ `budget_usd`.")
    term_end: datetime = Field(description="When the booking's term ends.")
    ends_before_term: bool = Field(
        description="Whether now + `plan.duration_hours.high` ≤ `term_end`: the run is expected "
        "to end before the booking does."
    )
    expires_at: datetime = Field(
        description="After this, a submission confirming this quote gets `CONFIRMATION_EXPIRED`."
    )
    warnings: list[str] = Field(
        default_factory=list, description="What a person should know before confirming."
    )
    booking_usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="What the booking costs per hour in US dollars, whether or not "
        "anything trains on it: the cost of a spend question left waiting (absent from older "
        "backends).",
    )
    manifest: TrainingRequest | None = Field(
        default=None,
        description="v0.4: the manifest the quote was made for (the six fields of the "
        "canonical manifest), as the backend read it: what a person confirms.",
    )
    confirm_url: str | None = Field(
        default=None,
        description="v0.4: the backend's page where a person signs in, reads this quote and "
        "confirms or declines it (the device-login pattern).",
    )
    user_code: str | None = Field(
        default=None,
        max_length=32,
        description="v0.4: a short code that names this quote on the confirm page, for a "
        "person to compare with what the terminal shows.",
    )
    state: QuoteState | None = Field(
        default=None,
        description="v0.4: `pending`, `confirmed`, `declined`, `expired`, `used` or "
        "`superseded` (its confirmation carried to a newer quote of the same manifest, which is "
        "the one to use). An open enum; a state a client does not know is not confirmed.",
    )
    confirmation: QuoteConfirmation | None = Field(
        default=None,
        description="v0.4: the person's answer (confirmed or declined), with the principal the "
        "backend authenticated; absent while nobody answered.",
    )
    client_reference: str | None = Field(
        default=None,
        description="v0.5: the quote request's `client_reference` (the caller's own id for "
        "what asked, a flow run for prefect-ito), kept with the quote and shown on the confirm "
        "page; null when the request carried none.",
    )
    carried_from: QuoteId | None = Field(
        default=None,
        description="v0.4: the quote of the same manifest a person confirmed, whose "
        "confirmation carried to this one (after several carry-overs, still the quote the "
        "person confirmed, never one in between). A person's confirmation carries to a new "
        "quote only while it is unused and younger than the quotes' lifetime, and only if the "
        "new estimate's high end is no higher and the run is still expected to end before the "
        "booking's term.",
    )
    not_carried: list[str] = Field(
        default_factory=list,
        description="v0.4: why an earlier person's confirmation of this manifest did not carry "
        "to this quote (what changed since), so that a client can say so when it asks again.",
    )
