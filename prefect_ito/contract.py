"""The Itô desk training API, contract v0: the wire models, and the single source of truth.

Every byte prefect-ito exchanges with a desk backend is one of these models. The client parses
responses into them, the reference simulator serves them, and the committed OpenAPI document
(``docs/contract/ito-training-v0.openapi.json``) is generated from them. ``docs/contract.md``
explains the semantics in prose.

There is deliberately no model for booking, reserving, quoting, purchasing or releasing capacity,
and none for overriding an eval gate: the contract has no such endpoints.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_serializer,
    field_validator,
)

SCHEMA_VERSION: Final = "ito.training.v0"
API_PREFIX = "/v0"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
REQUEST_ID_HEADER = "X-Request-Id"
MAX_WAIT_SECONDS = 60
"""The longest ``wait`` a long-poll read may ask for; longer values are capped."""
DETECT_TARGET_SECONDS = 600
"""The backend's target for detecting an interruption (10 minutes)."""
RESUME_TARGET_SECONDS = 900
"""The backend's target for resuming after an interruption (15 minutes)."""

T = TypeVar("T")

ModelSize = Annotated[
    str,
    StringConstraints(pattern=r"^[1-9][0-9]{0,3}(\.[0-9]{1,2})?[MBT]$"),
    Field(description="Parameter count such as `150M`, `8B` or `70B`.", examples=["8B"]),
]
ManifestDigest = Annotated[
    str,
    StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$"),
    Field(description="`sha256:<hex>` of the canonical JSON manifest of the request."),
]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class _Model(BaseModel):
    """Base for wire models: unknown fields are tolerated so the backend may add to v0."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class ErrorCode(StrEnum):
    """Stable error codes carried in ``error.code``."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    TOKEN_REVOKED = "TOKEN_REVOKED"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    NOT_FOUND = "NOT_FOUND"
    BOOKING_NOT_FOUND = "BOOKING_NOT_FOUND"
    BOOKING_NOT_ELIGIBLE = "BOOKING_NOT_ELIGIBLE"
    CAPABILITY_NOT_AVAILABLE = "CAPABILITY_NOT_AVAILABLE"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    BOOKING_BUSY = "BOOKING_BUSY"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    ACTION_NOT_PENDING = "ACTION_NOT_PENDING"
    DECISION_CONFLICT = "DECISION_CONFLICT"
    RATE_LIMITED = "RATE_LIMITED"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    AUTHORIZATION_PENDING = "AUTHORIZATION_PENDING"
    SLOW_DOWN = "SLOW_DOWN"
    ACCESS_DENIED = "ACCESS_DENIED"
    EXPIRED_TOKEN = "EXPIRED_TOKEN"
    INTERNAL_ERROR = "INTERNAL_ERROR"


ERROR_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.TOKEN_REVOKED: 401,
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.BOOKING_NOT_FOUND: 404,
    ErrorCode.BOOKING_NOT_ELIGIBLE: 409,
    ErrorCode.CAPABILITY_NOT_AVAILABLE: 501,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: 409,
    ErrorCode.BOOKING_BUSY: 409,
    ErrorCode.RUN_NOT_FOUND: 404,
    ErrorCode.ACTION_NOT_PENDING: 409,
    ErrorCode.DECISION_CONFLICT: 409,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.AUTHORIZATION_PENDING: 400,
    ErrorCode.SLOW_DOWN: 400,
    ErrorCode.ACCESS_DENIED: 400,
    ErrorCode.EXPIRED_TOKEN: 400,
    ErrorCode.INTERNAL_ERROR: 500,
}
"""The HTTP status that goes with each code."""


class ApiError(_Model):
    """The ``error`` member of a failed response. ``message`` is safe to show and log."""

    code: ErrorCode
    message: str
    field: str | None = Field(default=None, description="The offending request field, if any.")


class Envelope(_Model, Generic[T]):
    """Every response body: ``ok`` with ``data``, or not ``ok`` with ``error``."""

    ok: bool
    live_api_contacted: bool = Field(
        description="True only when a live production backend produced this answer."
    )
    notice: str | None = Field(default=None, description="A human note, e.g. a simulator banner.")
    data: T | None = None
    error: ApiError | None = None


# --- capabilities -------------------------------------------------------------------------------


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


# --- bookings -----------------------------------------------------------------------------------


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


# --- training runs: requests --------------------------------------------------------------------


class TrainingRequest(_Model):
    """What a training request asks for: the fields its manifest digest covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    booking_id: NonEmptyStr
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
        """Return the canonical JSON manifest: sorted keys, no whitespace, UTF-8."""
        fields = self.model_dump(mode="json", include=set(TrainingRequest.model_fields))
        return json.dumps(
            fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()

    def digest(self) -> str:
        """Return the manifest digest, ``sha256:<hex>`` of :meth:`canonical_manifest`."""
        return "sha256:" + hashlib.sha256(self.canonical_manifest()).hexdigest()

    def to_submission(self) -> TrainingRunRequest:
        """Return the submission body, stamped with this request's manifest digest."""
        return TrainingRunRequest(**self.model_dump(), manifest_digest=self.digest())


class TrainingRunRequest(TrainingRequest):
    """The body of ``POST /v0/training-runs``: the request and its manifest digest."""

    manifest_digest: ManifestDigest


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


# --- training runs: state -----------------------------------------------------------------------


class RunState(StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    AWAITING_DECISION = "awaiting_decision"
    SUCCEEDED = "succeeded"
    GATE_FAILED = "gate_failed"
    REFUSED = "refused"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self not in _UNFINISHED


_UNFINISHED = frozenset({RunState.ACCEPTED, RunState.RUNNING, RunState.AWAITING_DECISION})


class StageStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    REFUSED = "refused"
    CANCELLED = "cancelled"


class GateStatus(StrEnum):
    PENDING = "pending"
    PASSED = "passed"
    FAILED = "failed"


class EvalResult(_Model):
    name: str
    metric: str
    score: float
    threshold: float
    higher_is_better: bool = True
    passed: bool


class Gate(_Model):
    """A stage's fixed eval battery and its result."""

    battery: str
    status: GateStatus
    evals: list[EvalResult] = Field(default_factory=list)


class LadderVerdict(_Model):
    """The 150M-ladder decision job's verdict on custom data."""

    model_size: str = "150M"
    accepted: bool
    reason: str | None = None


class DataPrepDetails(_Model):
    manifest_digest: str
    documents: int = Field(ge=0)
    duplicates_removed: int = Field(ge=0)
    contaminated_removed: int = Field(ge=0, description="Removed by decontamination.")
    decontamination_suite: str
    custom_data: bool
    ladder: LadderVerdict | None = None


class ParallelismPlan(_Model):
    data: int = Field(ge=1)
    tensor: int = Field(ge=1)
    pipeline: int = Field(ge=1)
    expert: int = Field(ge=1)
    context: int = Field(ge=1)
    precision: str
    refused: bool = False
    reason: str | None = Field(default=None, description="Why a wasteful combination was refused.")


class RlvrDetails(_Model):
    algorithm: str = "GRPO"
    stability_fixes: list[str] = Field(default_factory=lambda: ["DAPO"])
    staleness_bound_steps: int = Field(ge=0, description="Trainer/rollout staleness bound.")


class StageDetails(_Model):
    data_prep: DataPrepDetails | None = None
    parallelism: ParallelismPlan | None = None
    rlvr: RlvrDetails | None = None
    message: str | None = None


class Stage(_Model):
    """One stage of the plan the backend chose, in order."""

    name: str = Field(
        description="As the backend plans it: data_prep, parallelism, pretrain, mid_train, "
        "long_context, post_training.sft, post_training.dpo, post_training.rlvr."
    )
    status: StageStatus
    gate: Gate | None = None
    details: StageDetails = Field(default_factory=StageDetails)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class CheckpointRef(_Model):
    checkpoint_id: str
    step: int = Field(ge=0)


class PendingAction(_Model):
    """A human-gated action: the backend holds the run until a person decides."""

    action_id: str
    kind: Literal["loss_spike_restart"]
    stage: str
    step: int = Field(ge=0)
    loss: float
    baseline_loss: float
    proposed_checkpoint: CheckpointRef
    proposed_at: datetime


class DecisionRecord(_Model):
    action_id: str
    decision: DecisionChoice
    decided_by: str
    reason: str
    decided_at: datetime


class Interruption(_Model):
    stage: str
    at: datetime
    detect_seconds: float = Field(ge=0)
    resume_seconds: float | None = Field(default=None, ge=0, description="None while recovering.")


class Checkpoint(_Model):
    checkpoint_id: str
    stage: str
    step: int = Field(ge=0)
    size_gb: float = Field(ge=0)
    duration_seconds: float = Field(ge=0)
    method: str = "async_dcp"
    at: datetime


class FaultTolerance(_Model):
    detect_target_seconds: int = DETECT_TARGET_SECONDS
    resume_target_seconds: int = RESUME_TARGET_SECONDS
    interruptions: list[Interruption] = Field(default_factory=list)
    checkpoints: list[Checkpoint] = Field(default_factory=list)


class LossPoint(_Model):
    step: int
    loss: float


class Telemetry(_Model):
    goodput: float = Field(ge=0, le=1, description="Fraction of wall time spent on useful steps.")
    interruption_rate_per_day: float = Field(ge=0)
    checkpoint_bandwidth_gbps: float = Field(ge=0)
    spend_usd: float = Field(ge=0)
    budget_usd: float = Field(gt=0)
    tokens_processed: int = Field(ge=0)
    step: int = Field(ge=0)
    loss: float | None = None
    loss_history: list[LossPoint] = Field(default_factory=list, description="Downsampled.")


class RunOutcome(_Model):
    """Why a run ended, for every terminal state but ``succeeded``."""

    code: str
    message: str
    stage: str | None = None


class TrainingRun(_Model):
    run_id: str
    version: int = Field(ge=0, description="Increases on every change of the run.")
    state: RunState
    booking_id: str
    manifest_digest: str
    request: TrainingRunRequest
    created_at: datetime
    updated_at: datetime
    heartbeat_at: datetime = Field(
        description="The backend's last sign of life for the workload; advances while healthy."
    )
    stages: list[Stage]
    current_stage: str | None = None
    pending_action: PendingAction | None = None
    decisions: list[DecisionRecord] = Field(default_factory=list)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    telemetry: Telemetry
    outcome: RunOutcome | None = None


class Submission(_Model):
    """The answer to a submission: the run, and whether it is a replay of an earlier one."""

    run: TrainingRun
    replayed: bool


class TrainingRunList(_Model):
    runs: list[TrainingRun]


class EventType(StrEnum):
    RUN_ACCEPTED = "run_accepted"
    STAGE_STARTED = "stage_started"
    STAGE_PASSED = "stage_passed"
    STAGE_FAILED = "stage_failed"
    STAGE_REFUSED = "stage_refused"
    CHECKPOINT_SAVED = "checkpoint_saved"
    INTERRUPTION_DETECTED = "interruption_detected"
    RESUMED = "resumed"
    LOSS_SPIKE_DETECTED = "loss_spike_detected"
    DECISION_RECORDED = "decision_recorded"
    CANCEL_REQUESTED = "cancel_requested"
    RUN_FINISHED = "run_finished"


class RunEvent(_Model):
    seq: int = Field(ge=1)
    run_id: str
    type: EventType
    at: datetime
    stage: str | None = None
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class EventPage(_Model):
    events: list[RunEvent]
    last_seq: int = Field(ge=0, description="Pass as `after` to read on.")


# --- device authorization (RFC 8628 shape) ------------------------------------------------------


class DeviceAuthorization(_Model):
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int = 5


class DeviceTokenRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device_code: NonEmptyStr
    grant_type: Literal["urn:ietf:params:oauth:grant-type:device_code"] = (
        "urn:ietf:params:oauth:grant-type:device_code"
    )


class TokenGrant(_Model):
    """A bearer token. Held as ``SecretStr`` so no repr, log or dump shows it."""

    access_token: SecretStr
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int
    scope: str

    @field_serializer("access_token", when_used="json")
    def _reveal_on_wire(self, value: SecretStr) -> str:
        # Only the wire form carries the secret; python-mode dumps keep it masked.
        return value.get_secret_value()


class WhoAmI(_Model):
    account: str
    backend: str
    expires_at: datetime
    scopes: list[str]


class Revocation(_Model):
    revoked: bool
