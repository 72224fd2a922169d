"""Contract v0: a training run as the backend reports it — stages, gates, telemetry, events.

Just past ~400 lines: the run's models are one document on the wire, kept in the file that
mirrors it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)

from prefect_ito.contract.auth import Principal
from prefect_ito.contract.envelope import DETECT_TARGET_SECONDS, RESUME_TARGET_SECONDS, _Model
from prefect_ito.contract.open_enum import OpenEnum
from prefect_ito.contract.requests import DecisionChoice, TrainingRunRequest


class RunState(OpenEnum):
    """A run's state. An unknown state is not terminal: see :attr:`TrainingRun.finished`."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    AWAITING_DECISION = "awaiting_decision"
    CANCELLING = "cancelling"
    """A cancel was accepted and the workload is being stopped: not an end yet (v0.1)."""
    SUCCEEDED = "succeeded"
    GATE_FAILED = "gate_failed"
    REFUSED = "refused"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """Tell whether a run ends in this state; False for a state prefect-ito does not know."""
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.GATE_FAILED,
        RunState.REFUSED,
        RunState.BUDGET_EXHAUSTED,
        RunState.CANCELLED,
        RunState.FAILED,
    }
)


class StageStatus(OpenEnum):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    REFUSED = "refused"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        """Tell whether the stage is behind the run: passed, failed, refused or cancelled.

        False for a status prefect-ito does not know: such a stage is not counted as done.
        """
        return self in _DONE


_DONE = frozenset(
    {StageStatus.PASSED, StageStatus.FAILED, StageStatus.REFUSED, StageStatus.CANCELLED}
)


class GateStatus(OpenEnum):
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


class ActionKind(OpenEnum):
    """What a pending action asks a person to decide."""

    LOSS_SPIKE_RESTART = "loss_spike_restart"
    DEADLINE_EXTENSION = "deadline_extension"
    """v0.5: the run will not finish by its wall-clock deadline; a later one is proposed."""


CONTEXT: dict[ActionKind, tuple[str, ...]] = {
    ActionKind.LOSS_SPIKE_RESTART: ("loss", "baseline_loss", "proposed_checkpoint"),
    ActionKind.DEADLINE_EXTENSION: ("deadline_at", "proposed_deadline_at"),
}
"""The fields each kind of action requires, beside those every action has."""


class PendingAction(_Model):
    """A human-gated action: the backend holds the run until a person decides.

    Each kind requires its own context (:data:`CONTEXT`): ``loss``, ``baseline_loss`` and
    ``proposed_checkpoint`` for a ``loss_spike_restart``; ``deadline_at`` and
    ``proposed_deadline_at`` for a ``deadline_extension``. An action of a kind added later need
    carry neither.
    """

    model_config = ConfigDict(
        extra="ignore",
        frozen=True,
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"kind": {"const": kind.value}}},
                    "then": {"required": list(fields)},
                }
                for kind, fields in CONTEXT.items()
            ]
        },
    )

    action_id: str
    kind: ActionKind
    stage: str
    step: int = Field(ge=0)
    loss: float | None = Field(default=None, description="Required for loss_spike_restart.")
    baseline_loss: float | None = Field(
        default=None, description="Required for loss_spike_restart."
    )
    proposed_checkpoint: CheckpointRef | None = Field(
        default=None, description="Required for loss_spike_restart: where a restart resumes."
    )
    deadline_at: datetime | None = Field(
        default=None,
        description="v0.5, required for deadline_extension: the run's wall-clock deadline now.",
    )
    proposed_deadline_at: datetime | None = Field(
        default=None,
        description="v0.5, required for deadline_extension: the later deadline proposed. "
        "Approved, the run goes on until then; rejected, it stops at `deadline_at`.",
    )
    proposed_at: datetime
    held_since: datetime | None = Field(
        default=None,
        description="When the backend began holding the run for this decision, in real "
        "wall-clock time (absent from older backends).",
    )
    hold_usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="What holding the run costs per hour, in US dollars: the booking's "
        "GPUs held idle while nobody decides (absent from older backends).",
    )
    decide_url: str | None = Field(
        default=None,
        description="v0.5: the backend's own page where a signed-in person decides this action "
        "(the device-login pattern, as a quote's `confirm_url`). Absent from older backends.",
    )
    user_code: str | None = Field(
        default=None,
        description="v0.5: the short code a person checks on (or types into) the decide page.",
    )

    @model_validator(mode="after")
    def _kind_context(self) -> Self:
        missing = [name for name in CONTEXT.get(self.kind, ()) if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind.value} needs {', '.join(missing)}")
        return self


class DecisionRecord(_Model):
    """A decision the backend recorded: who decided, as it authenticated them, and why.

    v0.5: ``principal`` is the person who decided (``user:…``): on the decide page, or with a
    token of their own. ``decided_by`` is only a note they typed, if any.
    """

    action_id: str
    decision: DecisionChoice
    decided_by: str | None = Field(
        default=None,
        description="A note the person typed beside their decision, such as their name; only a "
        "note: `principal` is who decided (before v0.5, the name a client relayed).",
    )
    reason: str
    decided_at: datetime
    principal: Principal | None = Field(
        default=None,
        description="Who decided, as the backend authenticated them: v0.5, always a person "
        "(`user:…`); before, the principal whose token relayed the decision (absent before "
        "v0.2).",
    )


class ConfirmationRecord(_Model):
    """Who allowed a run's spend, and how, as the backend authenticated and recorded it (v0.4).

    ``confirmed_by`` is a principal the backend authenticated — the person who confirmed the
    quote at the backend, or who created the standing authorization — never a name a client
    wrote; a person's note is kept beside it.
    """

    quote_id: str
    confirmed_by: Principal = Field(
        description="v0.4: the person's principal (`user:…`): who confirmed the quote at the "
        "backend, or who created the standing authorization that covered it."
    )
    via: str = Field(
        description="`person` or `standing_authorization` (a client keeps a value it does not "
        "know as it is)."
    )
    authorization: str | None = Field(
        default=None, description="The standing authorization's id, when `via` says so."
    )
    confirmed_at: datetime = Field(
        description="When the person confirmed the quote, or the authorization covered it."
    )
    note: str | None = Field(default=None, description="The person's note, if they left one.")
    carried_from: str | None = Field(
        default=None,
        description="v0.4: the quote of the same manifest the person confirmed, when their "
        "confirmation carried to this run's quote, however many carry-overs since (see "
        "`TrainingQuote.carried_from`).",
    )
    submitted_by: Principal | None = Field(
        default=None,
        description="v0.4: the principal whose token submitted the run (a workload's, often).",
    )


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
    progress: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The share of the run's planned work behind it, as the backend reckons it "
        "(by its plan's hours): 0 at the start, 1 when every stage is done; it goes back when a "
        "restart redoes work. Absent from older backends.",
    )


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
    confirmation: ConfirmationRecord | None = Field(
        default=None,
        description="Contract v0.3: who allowed the spend, and how; v0.4: as the backend "
        "authenticated and recorded it (absent from older runs).",
    )
    client_reference: str | None = Field(
        default=None,
        description="Contract v0.3: the submission's `client_reference`, kept for as long as "
        "the run exists (null when the submission carried none; absent from older backends).",
    )
    terminal: bool | None = Field(
        default=None,
        description="Whether the run has ended (contract v0.1; absent from v0 backends). A "
        "client that does not know `state` goes by this: a run is over only when it says true.",
    )

    @property
    def finished(self) -> bool:
        """Tell whether the run has ended.

        By its state when prefect-ito knows the state; for a state it does not know, only when
        the backend says ``terminal: true``. Otherwise the run is treated as unfinished and
        supervision goes on.
        """
        if self.state.known:
            return self.state.terminal
        return self.terminal is True


class Submission(_Model):
    """The answer to a submission: the run, and whether it is a replay of an earlier one."""

    run: TrainingRun
    replayed: bool


_NEXT = (
    "The cursor of the next page: pass it as `cursor` (with the same filters) to read on. "
    "Null on the last page. Opaque: clients never build or change one."
)


class TrainingRunList(_Model):
    """A page of runs, oldest first."""

    runs: list[TrainingRun]
    next: str | None = Field(default=None, description=_NEXT)


class EventType(OpenEnum):
    """What happened; prefect-ito relays the types it knows and skips the others."""

    RUN_ACCEPTED = "run_accepted"
    STAGE_STARTED = "stage_started"
    STAGE_PASSED = "stage_passed"
    STAGE_FAILED = "stage_failed"
    STAGE_REFUSED = "stage_refused"
    CHECKPOINT_SAVED = "checkpoint_saved"
    INTERRUPTION_DETECTED = "interruption_detected"
    RESUMED = "resumed"
    LOSS_SPIKE_DETECTED = "loss_spike_detected"
    DEADLINE_EXTENSION_PROPOSED = "deadline_extension_proposed"
    """v0.5: the run will miss its wall-clock deadline; a later one waits for a person."""
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
    """A page of a run's event log, in ``seq`` order."""

    events: list[RunEvent]
    last_seq: int = Field(
        ge=0,
        description="The last `seq` in this page (or `after` when it is empty): pass it as "
        "`after` to read on later, when the log has grown.",
    )
    next: str | None = Field(
        default=None,
        description="Set when more events are already there: pass it as `cursor` for the "
        "next page. Null when this page reaches the end of the log.",
    )
