"""Recovery without a person: re-enter training flow runs whose flow process was lost.

A flow run is lost when the worker marked it ``Crashed`` (its process died), when it reads
``Running`` but sent no flow-run heartbeat for ``lost_after`` seconds (the machine and its worker
are gone: Prefect marks nothing crashed by itself), or when it was left starting (``Pending``) by
a worker that died. A lost run is rescheduled as it is (state ``Recovering``), so a worker runs
it again from the top and it re-attaches to the backend run it recorded: recovery never submits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.states import Scheduled

from prefect_ito.claims import claim_turn, read_claims
from prefect_ito.watched import watched_flow_runs

__all__ = ["MAX_RECOVERIES", "Recovery"]

logger = logging.getLogger("prefect_ito.watcher")

MAX_RECOVERIES = 5
"""How often one flow run is re-entered after a loss before the watcher leaves it to a person."""

_RECOVERY_PREFIX = "ito-recovery-"
_CRASH_SETTLE_SECONDS = 15.0
_START_GRACE = 2
"""A starting (Pending) run is lost after this many times ``lost_after`` without a heartbeat."""
_HEARTBEAT = "prefect.flow-run.heartbeat"


@dataclass
class Recovery:
    """Finds lost training flow runs and re-enters each once per loss, whoever else found it.

    Attributes:
        lost_after: Seconds without a heartbeat after which a running (or starting) flow run
            counts as lost; None never counts one lost (crashed ones are still re-entered).
        recovered: The flow runs this recovery re-entered, in order.
    """

    lost_after: float | None = 540.0
    recovered: list[UUID] = field(default_factory=list)

    async def recover(self) -> None:
        """Re-enter the training flow runs from deployments whose process is gone."""
        # A worker reports a crash twice (its runner, then itself): re-entering in between would
        # be undone by the second report, so a crash is left to settle first.
        settled = datetime.now(UTC) - timedelta(seconds=_CRASH_SETTLE_SECONDS)
        lost = [
            run
            for run in await watched_flow_runs(StateType.CRASHED)
            if run.state and run.state.timestamp and run.state.timestamp < settled
        ]
        if self.lost_after is not None:
            lost += await _silent(await watched_flow_runs(StateType.RUNNING), self.lost_after)
            # A run whose worker died while starting it stays Pending (or Submitting) for good:
            # it never beats, and nobody is left to report it crashed. A start on a busy machine
            # may take longer than a heartbeat interval, so it gets twice the time.
            starting = await watched_flow_runs(StateType.PENDING)
            lost += await _silent(starting, _START_GRACE * self.lost_after)
        for flow_run in lost:
            await self.reenter(flow_run)

    async def reenter(self, flow_run: FlowRun) -> None:
        """Reschedule a lost flow run, once for each loss, whoever else found the same loss.

        Two watchers — or one whose view is a moment old — may find the same loss. Each first
        claims the re-entry with a flow-run input keyed by the lost *state*
        (:mod:`prefect_ito.claims`), so only one watcher goes on, and a run that was re-entered
        already (its lost state is past) is never rescheduled under its new process.
        """
        lost = flow_run.state
        if lost is None:
            return
        async with get_client() as client:
            # What was seen may be a while old (a sweep on a busy server is slow): a run that has
            # moved on since — started, beaten, resumed — is no longer lost.
            now = (await client.read_flow_run(flow_run.id)).state
            if now is None or now.id != lost.id:
                return
            claims = await read_claims(client, flow_run.id, _RECOVERY_PREFIX)
            if len(claims) >= MAX_RECOVERIES:
                logger.warning(
                    "Flow run %s was lost %d times; left to a person.", flow_run.id, len(claims)
                )
                return
            prefix = f"{_RECOVERY_PREFIX}{lost.id}-"
            on_this = [claim for claim in claims if claim.key.startswith(prefix)]
            if not await claim_turn(
                client, flow_run.id, prefix, on_this, flow_run.state_name or ""
            ):
                return  # another watcher re-enters it
            await client.set_flow_run_state(
                flow_run.id,
                Scheduled(name="Recovering", message="re-entered by prefect-ito watch"),
                force=True,
            )
        self.recovered.append(flow_run.id)
        logger.info("Re-entered lost flow run %s (it was %s).", flow_run.id, flow_run.state_name)


async def _silent(runs: list[FlowRun], seconds: float) -> list[FlowRun]:
    """Return the flow runs in their state, and without a heartbeat, for ``seconds``."""
    since = datetime.now(UTC) - timedelta(seconds=seconds)
    candidates = [
        run for run in runs if run.state and run.state.timestamp and run.state.timestamp < since
    ]
    if not candidates:
        return []
    alive = await heartbeating({run.id for run in candidates}, since)
    return [run for run in candidates if run.id not in alive]


async def heartbeating(flow_run_ids: set[UUID], since: datetime) -> set[UUID]:
    """Return those of ``flow_run_ids`` that sent a heartbeat after ``since``.

    One question per run (Prefect answers at most 50 events a page, and each run beats several
    times a window); only running flow runs older than the window are asked about.
    """
    alive = set()
    async with get_client() as client:
        for run_id in flow_run_ids:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(name=[_HEARTBEAT]),
                    resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
                    occurred=EventOccurredFilter(since=since),
                ),
                limit=1,
            )
            if page.events:
                alive.add(run_id)
    return alive
