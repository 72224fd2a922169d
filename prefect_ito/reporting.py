"""What a person sees in Prefect: artifacts that update in place, and events with stable ids.

Artifacts carry keys, so a re-entered flow updates them instead of adding more. Every Prefect
event gets a UUID5 of the backend run id and the backend event's sequence number, so Prefect drops
the duplicates a re-entered flow sends. Nothing here ever sees a token.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
)
from prefect.context import FlowRunContext, TaskRunContext
from prefect.events import emit_event
from pydantic import BaseModel, ConfigDict

from prefect_ito.client import ItoClient
from prefect_ito.contract import (
    DecisionRecord,
    EventType,
    RunEvent,
    RunState,
    StageStatus,
    Telemetry,
    TrainingRun,
)
from prefect_ito.provenance import Provenance

_EVENT_NAMESPACE = uuid.UUID("0f6a3c2e-2b7d-4a51-9a43-6c1d2f7e8b90")
_SPARKS = "▁▂▃▄▅▆▇█"

EVENT_NAMES: dict[EventType, str] = {
    EventType.RUN_ACCEPTED: "ito.training.submitted",
    EventType.STAGE_PASSED: "ito.training.gate.passed",
    EventType.STAGE_FAILED: "ito.training.gate.failed",
    EventType.STAGE_REFUSED: "ito.training.stage.refused",
    EventType.LOSS_SPIKE_DETECTED: "ito.training.restart.proposed",
    EventType.DECISION_RECORDED: "ito.training.restart.decided",
    EventType.RUN_FINISHED: "ito.training.finished",
}
"""The backend events prefect-ito relays to Prefect, and the Prefect event names they get."""


class StageSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    status: StageStatus
    gate: str | None = None


class TrainingSummary(BaseModel):
    """The result of a completed training flow: what ran, what every gate said, and telemetry."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    booking_id: str
    state: RunState
    manifest_digest: str
    stages: list[StageSummary]
    gates: list[dict[str, Any]]
    decisions: list[DecisionRecord]
    telemetry: Telemetry
    api_url: str | None = None
    live_api_contacted: bool | None = None
    """Whether a live production backend answered; None when unknown."""
    notice: str | None = None
    """The backend's own note about its answers, e.g. that it is the reference simulator."""

    @classmethod
    def of(cls, run: TrainingRun, provenance: Provenance | None = None) -> TrainingSummary:
        """Return the summary of ``run``, with where the backend's answers came from."""
        return cls(
            **(provenance.model_dump() if provenance else {}),
            run_id=run.run_id,
            booking_id=run.booking_id,
            state=run.state,
            manifest_digest=run.manifest_digest,
            stages=[
                StageSummary(
                    name=stage.name,
                    status=stage.status,
                    gate=stage.gate.status.value if stage.gate else None,
                )
                for stage in run.stages
            ],
            gates=gate_rows(run),
            decisions=run.decisions,
            telemetry=run.telemetry,
        )


def artifact_key(run_id: str, kind: str) -> str:
    """Return an artifact key for a run: lowercase letters, digits and dashes only."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    return f"ito-{kind}-{slug}"


def progress_percent(run: TrainingRun) -> float:
    """Return the share of the planned stages that are behind the run, as a percentage."""
    if not run.stages:
        return 0.0
    done = sum(stage.status.done for stage in run.stages)
    return 100.0 * done / len(run.stages)


def stage_changes(before: TrainingRun | None, after: TrainingRun) -> list[str]:
    """Return a plain sentence for every stage whose status changed between two reads."""
    seen = {stage.name: stage.status for stage in before.stages} if before else {}
    lines = []
    for stage in after.stages:
        if seen.get(stage.name, StageStatus.PENDING) == stage.status:
            continue
        gate = ""
        if stage.gate is not None and stage.gate.evals:
            gate = " — gate " + ", ".join(
                f"{result.name} {result.score:g} (bar {result.threshold:g})"
                for result in stage.gate.evals
            )
        lines.append(f"Stage {stage.name}: {stage.status.value}{gate}")
    return lines


def gate_rows(run: TrainingRun) -> list[dict[str, Any]]:
    """Return one table row per eval of every gate that has results."""
    return [
        {
            "stage": stage.name,
            "battery": stage.gate.battery,
            "eval": result.name,
            "metric": result.metric,
            "score": result.score,
            "threshold": result.threshold,
            "pass": result.passed,
        }
        for stage in run.stages
        if stage.gate is not None
        for result in stage.gate.evals
    ]


def sparkline(values: list[float]) -> str:
    """Return ``values`` as a Unicode sparkline."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(_SPARKS[round((value - low) / span * (len(_SPARKS) - 1))] for value in values)


def telemetry_markdown(run: TrainingRun) -> str:
    """Return the telemetry report: goodput, fault tolerance, spend and the loss curve."""
    t: Telemetry = run.telemetry
    ft = run.fault_tolerance
    lines = [
        f"## Itô training run `{run.run_id}` — {run.state.value}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| goodput | {t.goodput:.1%} |",
        f"| interruption rate | {t.interruption_rate_per_day:.2f} per day |",
        f"| checkpoint bandwidth | {t.checkpoint_bandwidth_gbps:.1f} GB/s |",
        f"| spend | ${t.spend_usd:,.2f} of ${t.budget_usd:,.2f} "
        f"({t.spend_usd / t.budget_usd:.0%} of the ceiling) |",
        f"| tokens processed | {t.tokens_processed:,} |",
        f"| step | {t.step:,} |",
    ]
    lines += _staleness_rows(run)
    lines += ["", "### Interruptions", ""]
    lines += _interruption_lines(run) or ["None so far."]
    lines += [
        "",
        f"Targets: detect < {ft.detect_target_seconds // 60} min, "
        f"resume < {ft.resume_target_seconds // 60} min. Checkpoints saved: {len(ft.checkpoints)}.",
    ]
    lines += ["", "### Loss", "", *_loss_lines(t)]
    return "\n".join(lines)


def _staleness_rows(run: TrainingRun) -> list[str]:
    return [
        f"| post-training staleness bound | {stage.details.rlvr.staleness_bound_steps} steps "
        f"({stage.details.rlvr.algorithm}) |"
        for stage in run.stages
        if stage.details.rlvr is not None
    ]


def _interruption_lines(run: TrainingRun) -> list[str]:
    ft = run.fault_tolerance
    lines = []
    for item in ft.interruptions:
        detect_ok = "✓" if item.detect_seconds < ft.detect_target_seconds else "✗"
        if item.resume_seconds is None:
            resumed = "recovering"
        else:
            resume_ok = "✓" if item.resume_seconds < ft.resume_target_seconds else "✗"
            resumed = f"resumed in {item.resume_seconds / 60:.1f} min {resume_ok}"
        lines.append(
            f"- `{item.stage}` at {item.at.isoformat()}: detected in "
            f"{item.detect_seconds / 60:.1f} min {detect_ok}, {resumed}"
        )
    return lines


def _loss_lines(t: Telemetry) -> list[str]:
    if not t.loss_history:
        return ["No loss reported yet."]
    losses = [point.loss for point in t.loss_history]
    return [
        f"`{sparkline(losses)}`",
        "",
        f"steps {t.loss_history[0].step:,} → {t.loss_history[-1].step:,}; "
        f"loss {losses[0]:.3f} → {losses[-1]:.3f} (min {min(losses):.3f}, max {max(losses):.3f})",
        "",
        "Points: " + ", ".join(f"{p.step}: {p.loss:.3f}" for p in t.loss_history),
    ]


async def publish_artifacts(run: TrainingRun) -> None:
    """Create or update the run's progress, gate table and telemetry artifacts."""
    await acreate_progress_artifact(
        progress=progress_percent(run),
        key=artifact_key(run.run_id, "progress"),
        description=f"Stages of Itô training run {run.run_id}: now {run.current_stage or '—'}",
    )
    rows = gate_rows(run)
    if rows:
        await acreate_table_artifact(
            table=rows,
            key=artifact_key(run.run_id, "gates"),
            description=f"Eval gates of Itô training run {run.run_id}",
        )
    await acreate_markdown_artifact(
        markdown=telemetry_markdown(run),
        key=artifact_key(run.run_id, "telemetry"),
        description=f"Telemetry of Itô training run {run.run_id}",
    )


def event_id(run_id: str, seq: int) -> uuid.UUID:
    """Return the Prefect event id for a backend event: the same on every re-entry."""
    return uuid.uuid5(_EVENT_NAMESPACE, f"{run_id}:{seq}")


def relay_events(run: TrainingRun, events: list[RunEvent]) -> int:
    """Emit the Prefect events for ``events``; return the last sequence number seen."""
    last = 0
    for event in events:
        last = max(last, event.seq)
        name = EVENT_NAMES.get(event.type)
        if name is None:
            continue
        emit_event(
            event=name,
            resource={
                "prefect.resource.id": f"ito.training-run.{run.run_id}",
                "prefect.resource.name": run.run_id,
                "ito.booking.id": run.booking_id,
            },
            related=[
                {
                    "prefect.resource.id": f"ito.booking.{run.booking_id}",
                    "prefect.resource.role": "booking",
                }
            ],
            # Prefect stamps the relay time; the backend's own time travels in the payload.
            payload={
                "stage": event.stage,
                "message": event.message,
                "backend_at": event.at.isoformat(),
                **event.data,
            },
            id=event_id(run.run_id, event.seq),
        )
    return last


async def report(client: ItoClient, run: TrainingRun, after_seq: int) -> int:
    """Relay the run's events after ``after_seq``, refresh its artifacts; return the last seq."""
    page = await client.list_events(run.run_id, after=after_seq)
    relay_events(run, page.events)
    if FlowRunContext.get() or TaskRunContext.get():  # Prefect keeps artifacts of runs only
        await publish_artifacts(run)
    return max(after_seq, page.last_seq)
