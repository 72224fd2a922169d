"""The simulator's mutable record of one training run, and its contract snapshot.

Contract models are frozen, so the record keeps the moving parts and :meth:`RunRecord.snapshot`
builds a :class:`~prefect_ito.contract.TrainingRun` on demand. Time is kept as simulated seconds
since the scenario loaded; ``at()`` turns it into a timestamp from the run's ``epoch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prefect_ito.contract import (
    Checkpoint,
    ConfirmationRecord,
    DecisionChoice,
    DecisionRecord,
    EventType,
    FaultTolerance,
    Interruption,
    LossPoint,
    PendingAction,
    RunEvent,
    RunOutcome,
    RunState,
    Stage,
    StageStatus,
    Telemetry,
    TrainingRun,
    TrainingRunRequest,
)
from prefect_ito.simulator.scenario import RunScript, SimBooking

LOSS_HISTORY_POINTS = 64
"""Loss history is downsampled to at most this many points."""
DECIDED = {DecisionChoice.APPROVE: "approved", DecisionChoice.REJECT: "rejected"}
"""A decision as a sentence says it was made."""


@dataclass
class Counters:
    """Exact running totals; published into telemetry only when the run's version changes."""

    spend_usd: float = 0.0
    busy_seconds: float = 0.0
    down_seconds: float = 0.0
    step: int = 0
    loss: float | None = None
    progress: float = 0.0
    """The share of the planned hours behind the run (see ``pipeline``)."""


@dataclass
class RunRecord:
    """One run's state, driven by the engine and the pipeline script."""

    run_id: str
    account: str
    idempotency_key: str
    request: TrainingRunRequest
    booking: SimBooking
    script: RunScript
    epoch: datetime
    created: float
    stages: list[Stage]
    state: RunState = RunState.ACCEPTED
    version: int = 1
    updated: float = 0.0
    clock: float = 0.0
    lag: float = 0.0
    """Simulated seconds the run's clock is behind the engine's: its waits for people."""
    held_at: float | None = None
    """The run's clock when it began to wait for a person; None when it does not wait."""
    heartbeat: float = 0.0
    current_stage: str | None = None
    pending_action: PendingAction | None = None
    decisions: list[DecisionRecord] = field(default_factory=list)
    base_url: str | None = None
    """Where the simulator was reached when the run was submitted: its decide page's origin."""
    interruptions: list[Interruption] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    loss_history: list[LossPoint] = field(default_factory=list)
    telemetry: Telemetry | None = None
    outcome: RunOutcome | None = None
    recovering: bool = False
    stalled: bool = False
    cancel_reason: str | None = None
    confirmation: ConfirmationRecord | None = None
    client_reference: str | None = None

    def __post_init__(self) -> None:
        self.clock = self.updated = self.heartbeat = self.created
        self.telemetry = self._telemetry()

    # --- time ------------------------------------------------------------------------------

    def at(self, seconds: float | None = None) -> datetime:
        """Return the timestamp of a simulated instant (default: the run's own clock)."""
        return self.epoch + timedelta(seconds=self.clock if seconds is None else seconds)

    @property
    def cost_per_second(self) -> float:
        """Return the spend rate of the booking's GPUs, in US dollars per simulated second."""
        return self.script.gpu_hour_usd * self.booking.gpus / 3600

    # --- changes ---------------------------------------------------------------------------

    def touch(self) -> None:
        """Record a change: bump the version and publish the telemetry as of now."""
        self.version += 1
        self.updated = self.clock
        self.telemetry = self._telemetry()

    def emit(self, kind: EventType, message: str, stage: str | None = None, **data: Any) -> None:
        """Append an event to the log (a change of the run)."""
        event = RunEvent(
            seq=len(self.events) + 1,
            run_id=self.run_id,
            type=kind,
            at=self.at(),
            stage=stage,
            message=message,
            data=data,
        )
        self.events.append(event)
        self.touch()

    def set_stage(self, name: str, status: StageStatus, **changes: Any) -> None:
        """Replace a stage of the plan with an updated copy."""
        index = next(i for i, stage in enumerate(self.stages) if stage.name == name)
        stage = self.stages[index]
        if status is StageStatus.RUNNING:
            changes.setdefault("started_at", self.at())
        elif status is not StageStatus.PENDING:
            changes.setdefault("finished_at", self.at())
        self.stages[index] = stage.model_copy(update={"status": status, **changes})

    def record_loss(self, step: int, loss: float) -> None:
        """Move to a step and loss, keeping a downsampled history."""
        self.counters.step = step
        self.counters.loss = loss
        self.loss_history.append(LossPoint(step=step, loss=round(loss, 4)))
        if len(self.loss_history) > LOSS_HISTORY_POINTS:
            # Halve the resolution but keep the newest point, so the history stays bounded.
            self.loss_history = self.loss_history[-1::-2][::-1]

    def finish(self, state: RunState, code: str, message: str) -> None:
        """End the run; every state but ``succeeded`` carries an outcome naming the stage."""
        stage = self.current_stage
        self.state = state
        self.pending_action = None
        self.stalled = False
        if state is not RunState.SUCCEEDED:
            self.outcome = RunOutcome(code=code, message=message, stage=stage)
        self.heartbeat = self.clock
        self.emit(EventType.RUN_FINISHED, message, stage, state=state.value, code=code)

    def decision_for(self, action_id: str) -> DecisionChoice | None:
        """Return the decision recorded for an action, if any."""
        found = (d.decision for d in self.decisions if d.action_id == action_id)
        return next(found, None)

    # --- snapshots -------------------------------------------------------------------------

    def _telemetry(self) -> Telemetry:
        counters = self.counters
        elapsed = counters.busy_seconds + counters.down_seconds
        goodput = counters.busy_seconds / elapsed if elapsed else 1.0
        days = elapsed / 86_400
        sizes = sum(c.size_gb for c in self.checkpoints)
        durations = sum(c.duration_seconds for c in self.checkpoints)
        return Telemetry(
            goodput=round(goodput, 4),
            interruption_rate_per_day=round(len(self.interruptions) / days, 4) if days else 0.0,
            checkpoint_bandwidth_gbps=round(sizes * 8 / durations, 2) if durations else 0.0,
            spend_usd=round(min(counters.spend_usd, self.request.budget_usd), 2),
            budget_usd=self.request.budget_usd,
            tokens_processed=counters.step * self.script.tokens_per_step,
            step=counters.step,
            loss=counters.loss,
            loss_history=list(self.loss_history),
            progress=round(counters.progress, 6),
        )

    def snapshot(self) -> TrainingRun:
        """Return the run as the contract shows it."""
        assert self.telemetry is not None
        return TrainingRun(
            run_id=self.run_id,
            version=self.version,
            state=self.state,
            booking_id=self.request.booking_id,
            manifest_digest=self.request.manifest_digest,
            request=self.request,
            created_at=self.at(self.created),
            updated_at=self.at(self.updated),
            heartbeat_at=self.at(self.heartbeat),
            stages=list(self.stages),
            current_stage=self.current_stage,
            pending_action=self.pending_action,
            decisions=list(self.decisions),
            fault_tolerance=FaultTolerance(
                interruptions=list(self.interruptions), checkpoints=list(self.checkpoints)
            ),
            telemetry=self.telemetry,
            outcome=self.outcome,
            confirmation=self.confirmation,
            client_reference=self.client_reference,
            terminal=self.state.terminal,
        )
