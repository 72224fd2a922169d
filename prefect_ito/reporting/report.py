"""What a person sees in Prefect: one artifact card per concern, and events with stable ids.

Each backend run has four cards — progress, gates, telemetry and decisions
(:mod:`prefect_ito.reporting.cards` says what they say) — keyed by the backend run id and kept as
one artifact each on the flow run, updated in place (:mod:`prefect_ito.reporting.publishing`).
Every Prefect event gets a UUID5 of the backend run id and the backend event's sequence number, so
Prefect drops the duplicates a re-entered flow sends. Nothing here ever sees a token.
"""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from prefect.events import emit_event
from pydantic import BaseModel, ConfigDict

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.provenance import Provenance
from prefect_ito.contract import (
    EventType,
    PendingAction,
    RunEvent,
    RunOutcome,
    RunState,
    StageStatus,
    Telemetry,
    TrainingRun,
)
from prefect_ito.reporting.cards import (
    decisions_markdown,
    gate_rows,
    gates_description,
    progress_description,
    progress_percent,
    telemetry_markdown,
)
from prefect_ito.reporting.decisions import Actions, DecisionSummary, decisions, headline
from prefect_ito.reporting.forecast import forecast
from prefect_ito.reporting.publishing import Card, Publisher
from prefect_ito.reporting.run_view import RunView
from prefect_ito.waiting.deferral import PARKED
from prefect_ito.waiting.flow_run import current_flow_run_id

_EVENT_NAMESPACE = uuid.UUID("0f6a3c2e-2b7d-4a51-9a43-6c1d2f7e8b90")

EVENT_NAMES: dict[EventType, str] = {
    EventType.RUN_ACCEPTED: "ito.training.submitted",
    EventType.STAGE_PASSED: "ito.training.gate.passed",
    EventType.STAGE_FAILED: "ito.training.gate.failed",
    EventType.STAGE_REFUSED: "ito.training.stage.refused",
    EventType.LOSS_SPIKE_DETECTED: "ito.training.restart.proposed",
    EventType.DEADLINE_EXTENSION_PROPOSED: "ito.training.deadline.proposed",
    EventType.DECISION_RECORDED: "ito.training.restart.decided",
    EventType.RUN_FINISHED: "ito.training.finished",
}
"""The backend events prefect-ito relays to Prefect, and the Prefect event names they get."""
BUDGET_AT_RISK = "ito.training.budget.at_risk"
"""The event prefect-ito emits, once per backend run, when the forecast passes the ceiling."""
PARKED_LINE = f"Parked: {PARKED[:1].lower()}{PARKED[1:]}"
"""The progress card's first words while its flow run is parked for the watcher."""


class StageSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    status: StageStatus
    gate: str | None = None


class TrainingSummary(BaseModel):
    """What a training run came to: what ran, every gate result, every decision, and telemetry.

    The result of a completed training flow; the terminal prints the same for any ending.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    booking_id: str
    state: RunState
    manifest_digest: str
    stages: list[StageSummary]
    gates: list[dict[str, Any]]
    decisions: list[DecisionSummary]
    telemetry: Telemetry
    outcome: RunOutcome | None = None
    api_url: str | None = None
    live_api_contacted: bool | None = None
    """Whether a live production backend answered; None when unknown."""
    notice: str | None = None
    """The backend's own note about its answers, e.g. that it is the reference simulator."""

    @classmethod
    def of(
        cls,
        run: TrainingRun,
        provenance: Provenance | None = None,
        actions: Actions | None = None,
    ) -> TrainingSummary:
        """Return the summary of ``run``, with where the backend's answers came from.

        Args:
            run: The backend run.
            provenance: What the backend said of its answers (live or not, its notice).
            actions: Pending actions seen on it; default: those this process saw
                (:data:`SEEN`), which name each decided restart's checkpoint.
        """
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
            decisions=decisions(run, SEEN.actions(run.run_id) if actions is None else actions),
            telemetry=run.telemetry,
            outcome=run.outcome,
        )


SEEN_LIMIT = 256
"""How many runs and flow runs this process remembers (long-lived workers stay bounded)."""


class Seen:
    """What supervision in this process saw: each run's pending actions, each flow run's run.

    A decided action leaves the backend run, so where its restart started from is known only
    from having seen it pending; and the terminal that ran a flow prints what the flow saw last,
    however the flow ended. Bounded, for long-lived worker processes.
    """

    def __init__(self, limit: int = SEEN_LIMIT) -> None:
        self._limit = limit
        self._actions: OrderedDict[str, dict[str, PendingAction]] = OrderedDict()
        self._latest: OrderedDict[UUID, TrainingRun] = OrderedDict()

    def note(self, run: TrainingRun) -> None:
        """Remember ``run``'s pending action, and ``run`` as the current flow run's latest."""
        if run.pending_action is not None:
            actions = self._actions.setdefault(run.run_id, {})
            actions[run.pending_action.action_id] = run.pending_action
            _bound(self._actions, run.run_id, self._limit)
        flow_run_id = current_flow_run_id()
        if flow_run_id is not None:
            self._latest[flow_run_id] = run
            _bound(self._latest, flow_run_id, self._limit)

    def note_action(self, run_id: str, action: PendingAction) -> None:
        """Remember an action asked about in an earlier process of this flow run (its record)."""
        self._actions.setdefault(run_id, {}).setdefault(action.action_id, action)
        _bound(self._actions, run_id, self._limit)

    def actions(self, run_id: str) -> dict[str, PendingAction]:
        """Return the pending actions seen on the run ``run_id``, by id."""
        return dict(self._actions.get(run_id, {}))

    def latest(self, flow_run_id: UUID) -> TrainingRun | None:
        """Return the last backend run the flow run ``flow_run_id`` reported here, if any."""
        return self._latest.get(flow_run_id)


def _bound(items: OrderedDict[Any, Any], key: Any, limit: int) -> None:
    items.move_to_end(key)
    while len(items) > limit:
        items.popitem(last=False)


SEEN = Seen()
"""This process's memory of what supervision saw."""
PUBLISHER = Publisher()
"""This process's artifact cards, one per key and flow run."""


def artifact_key(run_id: str, kind: str) -> str:
    """Return an artifact key for a run: lowercase letters, digits and dashes only."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    return f"ito-{kind}-{slug}"


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


def cards(run: TrainingRun, actions: Actions | None = None, *, parked: bool = False) -> list[Card]:
    """Return the run's cards: progress, gates (once a gate has results), telemetry, decisions.

    With ``parked``, the progress card opens on :data:`PARKED_LINE`: the flow run is about to
    suspend for the watcher, and whoever looks has nothing to do.
    """
    where = progress_description(run)
    result = [
        Card(
            key=artifact_key(run.run_id, "progress"),
            type="progress",
            data=progress_percent(run),
            description=f"{PARKED_LINE} {where}" if parked else where,
            metadata=status_facts(run),
        )
    ]
    rows = gate_rows(run)
    if rows:
        result.append(
            Card(
                key=artifact_key(run.run_id, "gates"),
                type="table",
                data=rows,
                description=gates_description(run),
            )
        )
    result += [
        Card(
            key=artifact_key(run.run_id, "telemetry"),
            type="markdown",
            data=telemetry_markdown(run, actions),
            description=f"${run.telemetry.spend_usd:,.0f} spent "
            f"({run.telemetry.spend_usd / run.telemetry.budget_usd:.0%}); the loss chart, "
            "goodput and interruptions.",
        ),
        Card(
            key=artifact_key(run.run_id, "decisions"),
            type="markdown",
            data=decisions_markdown(run, actions),
            description=headline(decisions(run, actions), run),
        ),
    ]
    return result


def status_facts(run: TrainingRun) -> dict[str, str]:
    """Return the progress card's metadata: what ``prefect-ito status`` shows of the run
    (:meth:`~prefect_ito.reporting.run_view.RunView.card_metadata`)."""
    return RunView.of(run).card_metadata()


async def publish(run: TrainingRun, *, parked: bool = False) -> None:
    """Publish the run's cards on the current flow run (see
    :mod:`prefect_ito.reporting.publishing`); ``parked`` as in :func:`cards`.

    The next publish without ``parked`` (the resumed flow's first report) replaces the line.
    """
    SEEN.note(run)
    warn_if_at_risk(run)
    await PUBLISHER.publish(cards(run, SEEN.actions(run.run_id), parked=parked))


_warned: OrderedDict[str, None] = OrderedDict()
"""The backend runs this process emitted :data:`BUDGET_AT_RISK` for (bounded)."""


def warn_if_at_risk(run: TrainingRun) -> bool:
    """Emit :data:`BUDGET_AT_RISK` the first time the run's forecast passes its ceiling.

    Once per run: its id is the same on every re-entry, so Prefect keeps one however often a
    re-entered flow sends it, and this process sends it once. Returns whether it was sent now.
    """
    found = forecast(run)
    if found is None or not found.at_risk or run.run_id in _warned:
        return False
    _warned[run.run_id] = None
    _bound(_warned, run.run_id, SEEN_LIMIT)
    _emit(
        run,
        BUDGET_AT_RISK,
        {
            **found.payload(),
            "stage": run.current_stage,
            "message": f"Run {run.run_id}: {found.sentence()}.",
            "backend_at": run.updated_at.isoformat(),
        },
        uuid.uuid5(_EVENT_NAMESPACE, f"{run.run_id}:{BUDGET_AT_RISK}"),
    )
    return True


COPIES = 3
"""How many copies of one backend event may be issued, each under an id of its own.

A Prefect server refuses, for five minutes, an event whose id it has received, even one it
then failed to write (its in-memory de-duplication, `deduplicate_by="id"`, runs before its
event persister, which drops a batch after five failed writes). Sending the same id again
cannot mend that, so :mod:`~prefect_ito.reporting.event_relay` issues a later copy instead.
"""


def event_id(run_id: str, seq: int, copy: int = 0) -> uuid.UUID:
    """Return the Prefect event id of a backend event's ``copy``: the same on every re-entry."""
    if not 0 <= copy < COPIES:
        raise ValueError(f"an event has copies 0 to {COPIES - 1}, not {copy}")
    name = f"{run_id}:{seq}" if copy == 0 else f"{run_id}:{seq}:copy-{copy}"
    return uuid.uuid5(_EVENT_NAMESPACE, name)


def relay_events(
    run: TrainingRun, events: list[RunEvent], copies: Mapping[int, int] | None = None
) -> int:
    """Emit the Prefect events for ``events``, each as the copy ``copies`` names by seq (the
    first, by default); return the last sequence number seen."""
    copies = copies or {}
    last = 0
    for event in events:
        last = max(last, event.seq)
        name = EVENT_NAMES.get(event.type)
        if name is None:
            continue
        # Prefect stamps the relay time; the backend's own time travels in the payload.
        _emit(
            run,
            name,
            {
                "stage": event.stage,
                "message": event.message,
                "backend_at": event.at.isoformat(),
                **event.data,
                # Names the backend event whichever copy of it this is.
                "backend_seq": event.seq,
            },
            event_id(run.run_id, event.seq, copies.get(event.seq, 0)),
        )
    return last


def _emit(run: TrainingRun, name: str, payload: dict[str, Any], event_uuid: uuid.UUID) -> None:
    """Emit the Prefect event ``name`` about the backend run, related to its booking."""
    emit_event(
        event=name, resource=_resource(run), related=_related(run), payload=payload, id=event_uuid
    )


def _resource(run: TrainingRun) -> dict[str, str]:
    """Return the Prefect resource every event of a backend run is about."""
    return {
        "prefect.resource.id": f"ito.training-run.{run.run_id}",
        "prefect.resource.name": run.run_id,
        "ito.booking.id": run.booking_id,
    }


def _related(run: TrainingRun) -> list[dict[str, str]]:
    return [
        {"prefect.resource.id": f"ito.booking.{run.booking_id}", "prefect.resource.role": "booking"}
    ]


async def relay(client: ItoClient, run: TrainingRun, after_seq: int) -> int:
    """Relay the run's events after ``after_seq`` to Prefect; return the last seq."""
    page = await client.list_events(run.run_id, after=after_seq)
    relay_events(run, page.events)
    return max(after_seq, page.last_seq)


async def report(client: ItoClient, run: TrainingRun, after_seq: int) -> int:
    """Relay the run's events after ``after_seq``, refresh its cards; return the last seq."""
    seq = await relay(client, run, after_seq)
    await publish(run)
    return seq
