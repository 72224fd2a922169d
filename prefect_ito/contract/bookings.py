"""Contract v0: what the backend can do, and its view of a booking."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    Field,
    WithJsonSchema,
    field_validator,
)

from prefect_ito.contract.envelope import (
    MAX_WAIT_SECONDS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_PATTERN,
    _Model,
)
from prefect_ito.contract.open_enum import OpenEnum, note_unknown, open_enum_schema


class PostTraining(StrEnum):
    """Post-training recipe: the pipeline SFT → DPO → RLVR up to and including this step."""

    SFT = "sft"
    DPO = "dpo"
    RLVR = "rlvr"


class Capability(_Model):
    live: bool
    detail: str | None = None


class Capabilities(_Model):
    schema_version: str = Field(
        default=SCHEMA_VERSION,
        pattern=SCHEMA_VERSION_PATTERN,
        description="The contract version the backend speaks: `ito.training.v0` or a later "
        "minor version such as `ito.training.v0.2`.",
    )
    training_run: Capability
    post_training_recipes: list[
        # Open in answers (the backend may offer a recipe added later), closed in requests.
        Annotated[PostTraining, WithJsonSchema(open_enum_schema(PostTraining, title="Recipe"))]
    ] = Field(
        description="The recipes offered. A client skips those it does not know: it cannot ask "
        "for them."
    )
    long_poll: bool
    max_wait_seconds: int = MAX_WAIT_SECONDS
    change_feed: bool = Field(
        default=False,
        description="Whether GET /v0/training-runs/changes serves the account-wide change feed.",
    )
    spend_confirmation: bool = Field(
        default=False,
        description="Contract v0.3: whether POST /v0/training-quotes is served and a new run "
        "needs a confirmed quote (v0.4: a `quote_id` a person confirmed at the backend, or an "
        "`authorization_id` that covers it). prefect-ito submits nothing to a live backend "
        "without it.",
    )
    client_reference: bool = Field(
        default=False,
        description="Contract v0.3: whether a submission may carry `client_reference`, kept on "
        "the run, and GET /v0/training-runs finds runs by it with no retention limit.",
    )
    spend_authority: bool = Field(
        default=False,
        description="Contract v0.4: whether a person confirms a quote at the backend "
        "(POST /v0/training-quotes/{quote_id}/confirmations, scope `spend:confirm`) and "
        "standing authorizations are backend objects (/v0/spend-authorizations).",
    )

    @field_validator("post_training_recipes", mode="before")
    @classmethod
    def _skip_unknown_recipes(cls, value: Any) -> Any:
        # PostTraining stays closed, since requests carry it; a recipe added by a newer backend
        # must not make the whole capabilities answer unreadable.
        if not isinstance(value, list):
            return value
        known = {recipe.value for recipe in PostTraining}
        for item in value:
            if isinstance(item, str) and item and item not in known:
                note_unknown("PostTraining", item)
        return [item for item in value if not isinstance(item, str) or not item or item in known]


class BookingStatus(OpenEnum):
    """A booking's status at the backend; only ``completed`` may train (never an unknown one)."""

    COMPLETED = "completed"
    PENDING = "pending"
    EXPIRED = "expired"
    REVOKED = "revoked"
    RELEASED = "released"


class TrainingEligibility(_Model):
    """The backend's view of a booking: the only proof that a booking exists and may train."""

    booking_id: str
    status: BookingStatus
    gpu_sku: str
    node_count: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    fabric: str
    region: str
    term_end: datetime
    eligible: bool
    reason: str | None = Field(default=None, description="Why the booking is not eligible.")
    account: str | None = Field(
        default=None,
        description="The account that holds the booking (v0.2): always the authenticated "
        "account, since a booking of another account is not found. A client trains only on a "
        "booking whose answer names its own account.",
    )
