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

from prefect_ito.cards import gate_rows, progress_percent, telemetry_markdown
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

_EVENT_NAMESPACE = uuid.UUID("0f6a3c2e-2b7d-4a51-9a43-6c1d2f7e8b90")

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

    @classmethod
    def of(cls, run: TrainingRun) -> TrainingSummary:
        """Return the summary of ``run``."""
        return cls(
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


def stage_changes(before: TrainingRun | None, after: TrainingRun) -> list[str]:
    """Return a plain sentence for every stage whose status changed between two reads."""
    seen = {stage.name: stage.status for stage in before.stages} if before else {}
    lines = []
    for stage in after.stages:
        if seen.get(stage.name, StageStatus.PENDING) is stage.status:
            continue
        gate = ""
        if stage.gate is not None and stage.gate.evals:
            gate = " — gate " + ", ".join(
                f"{result.name} {result.score:g} (bar {result.threshold:g})"
                for result in stage.gate.evals
            )
        lines.append(f"Stage {stage.name}: {stage.status.value}{gate}")
    return lines


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
