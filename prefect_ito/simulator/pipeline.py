"""The backend's stage pipeline for one run, written as a generator over simulated time.

:func:`run_pipeline` mutates a :class:`RunRecord` and yields how many simulated seconds pass
before its next change, or a :class:`Signal` (hold for a decision, or stall). The engine resumes it
as its clock advances, so every timestamp follows from the script alone and does not depend on how
often the engine ticks.

Just past ~400 lines: every stage of the backend's pipeline, from data prep to the last gate, in
the order a run meets them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from prefect_ito.contract import (
    Checkpoint,
    CheckpointRef,
    DataPrepDetails,
    DecisionChoice,
    EvalResult,
    EventType,
    Gate,
    GateStatus,
    Interruption,
    LadderVerdict,
    ParallelismPlan,
    PendingAction,
    PostTraining,
    RlvrDetails,
    RunState,
    Stage,
    StageDetails,
    StageStatus,
    TrainingRunRequest,
)
from prefect_ito.simulator.ids import mint
from prefect_ito.simulator.runs import RunRecord
from prefect_ito.simulator.scenario import (
    DeadlineSpec,
    InterruptionSpec,
    RunScript,
    SimBooking,
    SpikeSpec,
    StageSpec,
)

CATALOG_SCHEME = "catalog://"
"""Data under this scheme is the backend's vetted catalog; anything else is custom data."""
CHECKPOINT_BYTES_PER_PARAM = 14
"""bf16 weights plus fp32 master weights and Adam moments."""
_SIZE_UNITS = {"M": 1e6, "B": 1e9, "T": 1e12}
REFERENCE_MODEL_SIZE = "8B"
"""The model size a scenario's training-stage hours are written for.

Training compute is about 6 × parameters × tokens. The tokens are the script's (steps times
``tokens_per_step``) whatever the size, and the booking's GPUs are the same, so a training stage
of another size takes its hours times the ratio of parameter counts: a 70B model 8.75 times as
long as an 8B one, a 150M model under 2 % of it. Data preparation, the 150M ladder and planning
do not depend on the size.
"""


class Signal(Enum):
    """What a pipeline yields instead of a duration."""

    HOLD = "hold"
    STALL = "stall"


Step = float | Signal
Pipeline = Generator[Step, None, None]


@dataclass
class _Progress:
    """Where a run is in its plan, in planned hours, published as the telemetry's ``progress``.

    The plan is :func:`planned_hours`: a stage's hours count as it goes, a scripted
    interruption's detection and resumption as they pass, and a restart takes back the hours it
    redoes, so spend over progress is what the work actually cost per planned hour.
    """

    rec: RunRecord
    planned: float
    done: float = 0.0
    """Planned hours behind the run, not counting the stage under way."""
    into_stage: float = 0.0
    """Planned hours into the stage under way."""

    def complete(self, hours: float) -> None:
        """Count ``hours`` of the plan as done, and no stage as under way."""
        self.done += hours
        self.reach(0.0)

    def outage(self, seconds: float) -> None:
        """Count a scripted interruption's detection or resumption: the plan holds it."""
        self.done += seconds / 3600
        self.reach(self.into_stage)

    def reach(self, into_stage: float) -> None:
        """Publish progress at ``into_stage`` planned hours into the stage under way."""
        self.into_stage = into_stage
        self.rec.counters.progress = min(1.0, (self.done + into_stage) / self.planned)


@dataclass(frozen=True)
class _Mark:
    fraction: float
    kind: str
    item: SpikeSpec | InterruptionSpec | DeadlineSpec | None = None


def parameters(model_size: str) -> float:
    """Return the parameter count of a size such as ``150M`` or ``8B``."""
    match = re.fullmatch(r"([0-9.]+)([MBT])", model_size)
    assert match is not None, model_size
    return float(match.group(1)) * _SIZE_UNITS[match.group(2)]


def size_factor(model_size: str) -> float:
    """Return how many times longer than the script says a training stage of this size takes."""
    return parameters(model_size) / parameters(REFERENCE_MODEL_SIZE)


def is_custom_data(data_refs: list[str]) -> bool:
    """Return whether any data reference lies outside the vetted catalog."""
    return any(not ref.startswith(CATALOG_SCHEME) for ref in data_refs)


def training_specs(request: TrainingRunRequest, script: RunScript) -> list[StageSpec]:
    """Return the training stages the backend plans: the curriculum, then post-training."""
    depth = list(PostTraining).index(request.post_training) + 1 if request.post_training else 0
    return list(script.curriculum) + list(script.post_training[:depth])


def plan_stages(request: TrainingRunRequest, script: RunScript) -> list[Stage]:
    """Return the ordered stage plan, every stage pending."""
    specs = training_specs(request, script)
    stages = [Stage(name=name, status=StageStatus.PENDING) for name in ("data_prep", "parallelism")]
    for spec in specs:
        gate = Gate(battery=spec.gate.battery, status=GateStatus.PENDING) if spec.gate else None
        stages.append(Stage(name=spec.name, status=StageStatus.PENDING, gate=gate))
    return stages


def run_pipeline(rec: RunRecord) -> Pipeline:
    """Drive a run through its plan until it succeeds or stops."""
    progress = _Progress(rec, planned_hours(rec.request, rec.script))
    if not (yield from _data_prep(rec, progress)):
        return
    if not (yield from _parallelism(rec, progress)):
        return
    for spec in training_specs(rec.request, rec.script):
        if not (yield from _train(rec, spec, progress)):
            return
    rec.finish(RunState.SUCCEEDED, "SUCCEEDED", "every stage passed its gate")


def _start(rec: RunRecord, name: str, details: StageDetails | None = None) -> None:
    rec.state = RunState.RUNNING
    rec.current_stage = name
    rec.set_stage(name, StageStatus.RUNNING, **({"details": details} if details else {}))
    rec.emit(EventType.STAGE_STARTED, f"{name} started", name)


def _refuse(rec: RunRecord, name: str, code: str, reason: str, details: StageDetails) -> None:
    rec.set_stage(name, StageStatus.REFUSED, details=details)
    rec.emit(EventType.STAGE_REFUSED, reason, name)
    rec.finish(RunState.REFUSED, code, reason)


def _digest_number(rec: RunRecord) -> int:
    return int(hashlib.sha256(rec.request.manifest_digest.encode()).hexdigest()[:12], 16)


def _data_prep(rec: RunRecord, progress: _Progress) -> Generator[Step, None, bool]:
    _start(rec, "data_prep")
    yield rec.script.data_prep_hours * 3600
    progress.complete(rec.script.data_prep_hours)
    seed = _digest_number(rec)
    documents = len(rec.request.data_refs) * (2_000_000 + seed % 8_000_000)
    custom = is_custom_data(rec.request.data_refs)
    ladder = None
    if custom:
        yield rec.script.ladder_hours * 3600
        progress.complete(rec.script.ladder_hours)
        reason = rec.script.ladder_rejection
        ladder = LadderVerdict(accepted=reason is None, reason=reason)
    batteries = [s.gate.battery for s in rec.script.curriculum + rec.script.post_training if s.gate]
    details = StageDetails(
        data_prep=DataPrepDetails(
            manifest_digest=rec.request.manifest_digest,
            documents=documents,
            duplicates_removed=documents * (3 + seed % 9) // 100,
            contaminated_removed=documents // 20_000 + seed % 97,
            decontamination_suite=",".join(batteries),
            custom_data=custom,
            ladder=ladder,
        )
    )
    if ladder is not None and not ladder.accepted:
        _refuse(rec, "data_prep", "LADDER_REJECTED", ladder.reason or "rejected", details)
        return False
    rec.set_stage("data_prep", StageStatus.PASSED, details=details)
    rec.emit(EventType.STAGE_PASSED, "data_prep passed", "data_prep", documents=documents)
    return True


def choose_parallelism(rec: RunRecord) -> ParallelismPlan:
    """Return the plan the backend picks for the run's model size and its booking's GPUs."""
    return plan_parallelism(rec.request.model_size, rec.booking, rec.script)


def plan_parallelism(model_size: str, booking: SimBooking, script: RunScript) -> ParallelismPlan:
    """Return the plan the backend picks for a model size and a booking's GPUs."""
    params = parameters(model_size)
    per_node, nodes = booking.gpus_per_node, booking.node_count
    reason = script.parallelism_refusal
    if reason is not None:
        # The wasteful combination: every GPU split across tensor and pipeline, no data parallel.
        return ParallelismPlan(
            data=1, tensor=per_node, pipeline=nodes, expert=1, context=1,
            precision="fp32", refused=True, reason=reason,
        )  # fmt: skip
    tensor = min(per_node, 1 if params < 3e9 else 2 if params < 15e9 else 4 if params < 40e9 else 8)
    pipeline = min(nodes, 1 if params < 40e9 else 4)
    data = max(1, booking.gpus // (tensor * pipeline))
    return ParallelismPlan(
        data=data, tensor=tensor, pipeline=pipeline, expert=1, context=1, precision="bf16"
    )


def planned_hours(request: TrainingRunRequest, script: RunScript) -> float:
    """Return the simulated hours a run of ``request`` takes without restarts.

    Data preparation (and the ladder for custom data), planning, every training stage (for the
    request's model size, see :data:`REFERENCE_MODEL_SIZE`), and the detection and resumption of
    each scripted interruption.
    """
    ladder = script.ladder_hours if is_custom_data(request.data_refs) else 0.0
    hours = sum(spec.hours for spec in training_specs(request, script))
    stages = hours * size_factor(request.model_size)
    names = {spec.name for spec in training_specs(request, script)}
    outages = sum(
        (i.detect_seconds + i.resume_seconds) / 3600
        for i in script.interruptions
        if i.stage in names
    )
    return script.data_prep_hours + ladder + script.parallelism_hours + stages + outages


def _parallelism(rec: RunRecord, progress: _Progress) -> Generator[Step, None, bool]:
    _start(rec, "parallelism")
    yield rec.script.parallelism_hours * 3600
    progress.complete(rec.script.parallelism_hours)
    plan = choose_parallelism(rec)
    details = StageDetails(parallelism=plan)
    if plan.refused:
        _refuse(rec, "parallelism", "PARALLELISM_REFUSED", plan.reason or "refused", details)
        return False
    rec.set_stage("parallelism", StageStatus.PASSED, details=details)
    rec.emit(EventType.STAGE_PASSED, "parallelism planned", "parallelism")
    return True


def _marks(rec: RunRecord, spec: StageSpec) -> list[_Mark]:
    segments = rec.script.segments_per_stage
    marks = [_Mark((k + 1) / segments, "segment") for k in range(segments)]
    marks += [
        _Mark(s.at_fraction, "spike", s) for s in rec.script.loss_spikes if s.stage == spec.name
    ]
    marks += [
        _Mark(d.at_fraction, "deadline", d)
        for d in rec.script.deadline_extensions
        if d.stage == spec.name
    ]
    marks += [
        _Mark(i.at_fraction, "interruption", i)
        for i in rec.script.interruptions
        if i.stage == spec.name
    ]
    stall = rec.script.stall
    if stall is not None and stall.stage == spec.name:
        marks.append(_Mark(stall.at_fraction, "stall"))
    return sorted(marks, key=lambda mark: mark.fraction)


def _train(rec: RunRecord, spec: StageSpec, progress: _Progress) -> Generator[Step, None, bool]:
    rlvr = RlvrDetails(staleness_bound_steps=rec.script.rlvr_staleness_bound_steps)
    _start(rec, spec.name, StageDetails(rlvr=rlvr) if spec.name.endswith("rlvr") else None)
    base_step = rec.counters.step
    seconds = spec.hours * 3600 * size_factor(rec.request.model_size)
    marks, position, index = _marks(rec, spec), 0.0, 0
    saved: list[tuple[float, Checkpoint]] = []
    done: set[int] = set()
    while index < len(marks):
        mark, index = marks[index], index + 1
        if index in done:
            continue
        yield (mark.fraction - position) * seconds
        position = mark.fraction
        progress.reach(position * seconds / 3600)
        step = base_step + round(mark.fraction * spec.steps)
        loss = _loss_at(spec, mark.fraction)
        if mark.kind == "segment":
            rec.record_loss(step, loss)
            saved.append((mark.fraction, _checkpoint(rec, spec.name, step)))
        elif mark.kind == "stall":
            yield Signal.STALL
        elif isinstance(mark.item, InterruptionSpec):
            done.add(index)
            yield from _interruption(rec, spec.name, mark.item, progress)
        elif isinstance(mark.item, DeadlineSpec):
            done.add(index)
            if not (yield from _extension(rec, spec.name, step, mark.item)):
                message = (
                    f"{spec.name} stopped at its wall-clock deadline: the extension was rejected"
                )
                rec.finish(RunState.FAILED, "DEADLINE_REACHED", message)
                return False
        elif isinstance(mark.item, SpikeSpec):
            done.add(index)
            restart = yield from _spike(rec, spec.name, step, loss * mark.item.loss_factor, loss)
            if restart:
                position = saved[-1][0] if saved else 0.0
                progress.reach(position * seconds / 3600)
                index = sum(1 for m in marks if m.fraction <= position)
                rec.record_loss(base_step + round(position * spec.steps), _loss_at(spec, position))
                rec.emit(EventType.RESUMED, "restarted from checkpoint", spec.name)
    progress.complete(seconds / 3600)
    return _judge(rec, spec)


def _loss_at(spec: StageSpec, fraction: float) -> float:
    return spec.loss_start + (spec.loss_end - spec.loss_start) * fraction


def _checkpoint(rec: RunRecord, stage: str, step: int) -> Checkpoint:
    size = parameters(rec.request.model_size) * CHECKPOINT_BYTES_PER_PARAM / 1e9
    checkpoint = Checkpoint(
        checkpoint_id=f"ckpt-{stage}-{step}",
        stage=stage,
        step=step,
        size_gb=round(size, 2),
        duration_seconds=round(size * 8 / rec.script.checkpoint_bandwidth_gbps, 2),
        at=rec.at(),
    )
    rec.checkpoints.append(checkpoint)
    rec.emit(EventType.CHECKPOINT_SAVED, f"checkpoint at step {step}", stage, step=step)
    return checkpoint


def _interruption(
    rec: RunRecord, stage: str, spec: InterruptionSpec, progress: _Progress
) -> Generator[Step, None, None]:
    rec.recovering = True
    failed_at = rec.at()
    yield spec.detect_seconds
    progress.outage(spec.detect_seconds)
    index = len(rec.interruptions)
    rec.interruptions.append(
        Interruption(stage=stage, at=failed_at, detect_seconds=spec.detect_seconds)
    )
    rec.emit(EventType.INTERRUPTION_DETECTED, "node failure detected", stage)
    yield spec.resume_seconds
    progress.outage(spec.resume_seconds)
    rec.interruptions[index] = rec.interruptions[index].model_copy(
        update={"resume_seconds": spec.resume_seconds}
    )
    rec.recovering = False
    rec.emit(EventType.RESUMED, "resumed from the latest checkpoint", stage)


def _spike(
    rec: RunRecord, stage: str, step: int, loss: float, baseline: float
) -> Generator[Step, None, bool]:
    """Hold the run for a person's decision; return whether to restart from the checkpoint."""
    latest = rec.checkpoints[-1] if rec.checkpoints else None
    proposed = CheckpointRef(
        checkpoint_id=latest.checkpoint_id if latest else "ckpt-init",
        step=latest.step if latest else 0,
    )
    action = PendingAction(
        action_id=mint("act", 12),
        kind="loss_spike_restart",
        stage=stage,
        step=step,
        loss=round(loss, 4),
        baseline_loss=round(baseline, 4),
        proposed_checkpoint=proposed,
        proposed_at=rec.at(),
        # The booking's GPUs stay reserved, idle, while nobody decides.
        hold_usd_per_hour=round(rec.cost_per_second * 3600, 2),
        # The engine names the decide page and the code when it begins the hold.
    )
    rec.pending_action = action
    rec.state = RunState.AWAITING_DECISION
    rec.record_loss(step, loss)  # the bad reading is part of the history a person looks at
    rec.emit(EventType.LOSS_SPIKE_DETECTED, f"loss spike at step {step}", stage, step=step)
    yield Signal.HOLD
    return rec.decision_for(action.action_id) is DecisionChoice.APPROVE


def _extension(
    rec: RunRecord, stage: str, step: int, spec: DeadlineSpec
) -> Generator[Step, None, bool]:
    """Hold the run at its deadline for a person's decision; return whether it may go on."""
    deadline = rec.at()
    action = PendingAction(
        action_id=mint("act", 12),
        kind="deadline_extension",
        stage=stage,
        step=step,
        deadline_at=deadline,
        proposed_deadline_at=deadline + timedelta(hours=spec.extend_hours),
        proposed_at=deadline,
        hold_usd_per_hour=round(rec.cost_per_second * 3600, 2),
    )
    rec.pending_action = action
    rec.state = RunState.AWAITING_DECISION
    rec.emit(
        EventType.DEADLINE_EXTENSION_PROPOSED,
        f"deadline reached at step {step}; extension proposed",
        stage,
        step=step,
    )
    yield Signal.HOLD
    return rec.decision_for(action.action_id) is DecisionChoice.APPROVE


def _judge(rec: RunRecord, spec: StageSpec) -> bool:
    if spec.gate is None:
        rec.set_stage(spec.name, StageStatus.PASSED)
        rec.emit(EventType.STAGE_PASSED, f"{spec.name} passed", spec.name)
        return True
    results = [EvalResult(**e.model_dump(), passed=e.passed) for e in spec.gate.evals]
    passed = all(result.passed for result in results)
    gate = Gate(
        battery=spec.gate.battery,
        status=GateStatus.PASSED if passed else GateStatus.FAILED,
        evals=results,
    )
    rec.set_stage(spec.name, StageStatus.PASSED if passed else StageStatus.FAILED, gate=gate)
    if passed:
        rec.emit(EventType.STAGE_PASSED, f"{spec.name} passed {gate.battery}", spec.name)
        return True
    failing = ", ".join(r.name for r in results if not r.passed)
    message = f"{spec.name} failed its {gate.battery} gate ({failing})"
    rec.emit(EventType.STAGE_FAILED, message, spec.name)
    rec.finish(RunState.GATE_FAILED, "GATE_FAILED", message)
    return False
