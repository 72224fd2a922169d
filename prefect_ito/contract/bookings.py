"""Contract v0: what the backend can do, and its view of a booking."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import (
    Field,
)

from prefect_ito.contract.envelope import MAX_WAIT_SECONDS, SCHEMA_VERSION, _Model


class PostTraining(StrEnum):
    """Post-training recipe: the pipeline SFT → DPO → RLVR up to and including this step."""

    SFT = "sft"
    DPO = "dpo"
    RLVR = "rlvr"


class Capability(_Model):
    live: bool
    detail: str | None = None


class Capabilities(_Model):
    schema_version: Literal["ito.training.v0"] = SCHEMA_VERSION
    training_run: Capability
    post_training_recipes: list[PostTraining]
    long_poll: bool
    max_wait_seconds: int = MAX_WAIT_SECONDS
    change_feed: bool = Field(
        default=False,
        description="Whether GET /v0/training-runs/changes serves the account-wide change feed.",
    )


class BookingStatus(StrEnum):
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
