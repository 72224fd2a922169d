"""``prefect-ito watch``: resume deferred training flow runs when their backend run changes, and
re-enter flow runs whose process was lost.

The watcher keeps no state of its own. Each sweep it asks Prefect which ``ito-training`` flow
runs are deferred (suspended under a ``defer-`` pause key, with a :class:`Deferral` record beside
it) and which were lost (a run from a deployment that crashed, or stopped sending heartbeats). It
reads each deferred run's backend run once, resumes the flow runs whose run changed in a way the
flow must handle, then waits for the next change: on the backend's account-wide change feed when
the backend offers one, else on one long-poll per run, a bounded number at a time. A restarted
watcher loses nothing (its first sweep reads everything again), and two watchers resume nothing
twice (Prefect refuses to resume a run that is no longer paused).

It never resumes a run that waits for a person (those pause under other keys), never decides
anything, and never submits: a re-entered flow run re-attaches to the run it recorded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

import httpx
from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, FlowRunInput, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.flow_runs import aresume_flow_run
from prefect.states import Scheduled

from prefect_ito import deferral, desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.client import ItoClient
from prefect_ito.contract import TrainingRun
from prefect_ito.deferral import DEFER_PREFIX, Deferral
from prefect_ito.exceptions import ItoError

__all__ = ["FLOW_NAMES", "MAX_RECOVERIES", "Watcher"]

logger = logging.getLogger("prefect_ito.watcher")

FLOW_NAMES = ("ito-training", "ito-attach-training")
"""The flows whose runs a watcher looks after."""

MAX_RECOVERIES = 5
"""How often one flow run is re-entered after a loss before the watcher leaves it to a person."""

_RECOVERY_PREFIX = "ito-recovery-"
_RESUME_PREFIX = "ito-resume-"
_CRASH_SETTLE_SECONDS = 15.0
_START_GRACE = 2
"""A starting (Pending) run is lost after this many times ``lost_after`` without a heartbeat."""
_CLAIM_STALE_SECONDS = 300.0
"""Longer than a claim's holder can take to reschedule, Prefect's own retries included."""
_PAGE = 200
_HEARTBEAT = "prefect.flow-run.heartbeat"


@dataclass
class _Backend:
    """One backend the deferred runs wait on: a client, and where its change feed stands."""

    client: ItoClient
    feed: bool
    cursor: int | None = None


@dataclass
class _Seen:
    """What the watcher last saw of a backend run: its version, and when its heartbeat moved."""

    version: int
    heartbeat_at: datetime
    heartbeat_seen_at: float


Waiting = tuple[FlowRun, Deferral]


@dataclass
class Watcher:
    """Resumes deferred flow runs on a change, and re-enters lost ones; see the module docstring.

    What it holds in memory is only a cache of what Prefect and the backends say (records, which
    never change under their key, and the last version and heartbeat seen of each run), so that
    an idle sweep costs one change-feed request per backend, whatever the number of runs.

    Attributes:
        wait: Seconds one long-poll (and so one idle sweep) may wait for a change.
        max_concurrency: Per-run long-polls at once, for a backend without a change feed.
        lost_after: Seconds without a heartbeat after which a running (or starting) flow run
            counts as lost; None never counts one lost (crashed ones are still re-entered).
    """

    wait: float = 30.0
    max_concurrency: int = 32
    lost_after: float | None = 540.0
    resumed: list[UUID] = field(default_factory=list)
    recovered: list[UUID] = field(default_factory=list)
    _backends: dict[tuple[str, str | None], _Backend] = field(default_factory=dict)
    _records: dict[tuple[UUID, str], Deferral] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _unread: set[str] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep until ``stop`` is set; a failed sweep is logged and the next one comes."""
        try:
            while not stop.is_set():
                try:
                    await self.sweep()
                except (httpx.TransportError, PrefectHTTPStatusError, ItoError) as error:
                    # Prefect or a backend did not answer: expected now and then, one line.
                    logger.warning("A sweep failed (%s); the next one in %g s", error, self.wait)
                    await asyncio.sleep(self.wait)
                except Exception:  # a long-running service outlives any one sweep's failure
                    logger.exception("A sweep failed; the next one starts in %g s", self.wait)
                    await asyncio.sleep(self.wait)
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the backend clients."""
        for backend in self._backends.values():
            await backend.client.__aexit__(None, None, None)
        self._backends.clear()

    async def sweep(self) -> None:
        """Re-enter lost runs; resume deferred runs that changed, then wait for one change."""
        await self._recover_lost()
        waiting = await self._deferred()
        for (api_url, entry), group in _by_backend(waiting).items():
            backend = await self._backend(api_url, entry)
            if backend is None:
                continue
            # Read a run only when first seen or when a watchdog limit comes due; else wait.
            due = [item for item in group if self._needs_reading(item[1])]
            await self._read_and_judge(backend, due)
            pending = [item for item in group if item[0].id not in self.resumed]
            if pending:
                await self._wait_for_change(backend, pending)
        if not waiting:
            await asyncio.sleep(min(self.wait, 5.0))

    # --- deferred runs ----------------------------------------------------------------------

    async def _deferred(self) -> list[Waiting]:
        """Return every suspended training flow run that waits on a backend run, with its record."""
        found = []
        for flow_run in await _flow_runs(StateType.PAUSED):
            key = flow_run.state.state_details.pause_key if flow_run.state else None
            if not key or not key.startswith(DEFER_PREFIX):
                continue  # waits for a person, or for something else: never ours to resume
            record = self._records.get((flow_run.id, key))
            if record is None:
                record = await deferral.read_deferral(flow_run.id, key)
                if record is None:
                    continue  # suspending right now: the record comes first, look again soon
                self._records[(flow_run.id, key)] = record
                # A new deferral is read once: its run may have moved before the feed's cursor.
                self._unread.add(record.run_id)
            found.append((flow_run, record))
        self.resumed = [run_id for run_id in self.resumed if run_id in {f.id for f, _ in found}]
        return found

    def _needs_reading(self, record: Deferral) -> bool:
        if record.run_id in self._unread:
            self._unread.discard(record.run_id)
            return True
        return self._due_in(record, self._seen.get(record.run_id)) <= 0

    def _due_in(self, record: Deferral, seen: _Seen | None) -> float:
        """Seconds until the stall limit or the deadline of ``record`` comes due."""
        now = deferral.wall_clock()
        due = [float("inf")]
        if record.deadline_at is not None:
            due.append(record.deadline_at - now)
        if record.stall_timeout is not None:
            moved = seen.heartbeat_seen_at if seen else record.heartbeat_seen_at
            due.append(moved + record.stall_timeout - now)
        return min(due)

    async def _read_and_judge(
        self, backend: _Backend, items: list[Waiting], *, wait: float | None = None
    ) -> None:
        """Read each run — with ``wait``, long-poll it past the version seen — and judge it."""
        limit = asyncio.Semaphore(self.max_concurrency)

        async def read(flow_run: FlowRun, record: Deferral) -> None:
            seen = self._seen.get(record.run_id)
            after = None if wait is None else (seen.version if seen else record.version)
            async with limit:
                try:
                    run = await backend.client.get_training_run(
                        record.run_id, after_version=after, wait=wait
                    )
                except ItoError as error:
                    logger.warning("Could not read backend run %s: %s", record.run_id, error)
                    return
            await self._judge(flow_run, record, run)

        await asyncio.gather(*(read(flow_run, record) for flow_run, record in items))

    async def _judge(self, flow_run: FlowRun, record: Deferral, run: TrainingRun) -> None:
        """Note what ``run`` shows, and resume the flow run if it must handle it."""
        seen = self._observe(record, run)
        if _must_resume(record, run, seen):
            await self._resume(flow_run, record, run)

    def _observe(self, record: Deferral, run: TrainingRun) -> _Seen:
        before = self._seen.get(run.run_id)
        if before is None and run.heartbeat_at == record.heartbeat_at:
            moved = record.heartbeat_seen_at
        elif before is not None and run.heartbeat_at == before.heartbeat_at:
            moved = before.heartbeat_seen_at
        else:
            moved = deferral.wall_clock()
        seen = _Seen(max(run.version, record.version), run.heartbeat_at, moved)
        self._seen[run.run_id] = seen
        return seen

    async def _wait_for_change(self, backend: _Backend, pending: list[Waiting]) -> None:
        wait = max(
            0.0, min([self.wait] + [self._due_in(r, self._seen.get(r.run_id)) for _, r in pending])
        )
        if backend.feed:
            await self._wait_on_feed(backend, pending, wait)
        else:
            await self._wait_per_run(backend, pending, wait)

    async def _wait_on_feed(self, backend: _Backend, pending: list[Waiting], wait: float) -> None:
        if backend.cursor is None:
            backend.cursor = (await backend.client.list_changes()).cursor
        page = await backend.client.list_changes(after=backend.cursor, wait=wait)
        backend.cursor = page.cursor
        moved = {change.run_id for change in page.changes}
        await self._read_and_judge(backend, [item for item in pending if item[1].run_id in moved])

    async def _wait_per_run(self, backend: _Backend, pending: list[Waiting], wait: float) -> None:
        await self._read_and_judge(backend, pending, wait=wait)

    async def _resume(self, flow_run: FlowRun, record: Deferral, run: TrainingRun) -> None:
        """Resume a deferred flow run, once for its suspension, whoever else saw the change.

        Watchers that follow the same feed see the same change at once. Prefect checks that a run
        is paused before resuming it, but not in the same write, so two resumes that race may
        both go through (on PostgreSQL, a suspension was seen resumed twice). Each watcher first
        claims the resume with a flow-run input keyed by the suspended *state*, as re-entries
        are claimed: only the watcher that stored it resumes.
        """
        suspended = flow_run.state
        if flow_run.id in self.resumed or suspended is None:
            return
        prefix = f"{_RESUME_PREFIX}{suspended.id}-"
        async with get_client() as client:
            claims = await _inputs(client, flow_run.id, prefix)
            if not await _claim_turn(client, flow_run.id, prefix, claims, ""):
                return  # another watcher resumes it
        try:
            await aresume_flow_run(flow_run.id)
        except (RuntimeError, ObjectNotFound) as error:  # resumed or cancelled meanwhile
            logger.debug("Flow run %s was not resumed: %s", flow_run.id, error)
            return
        self.resumed.append(flow_run.id)
        logger.info(
            "Resumed flow run %s: backend run %s is at version %d (%s).",
            flow_run.id,
            record.run_id,
            run.version,
            run.state.value,
        )

    async def _backend(self, api_url: str, entry: str | None) -> _Backend | None:
        """Return the backend for a record, with a client whose token this process resolves."""
        known = self._backends.get((api_url, entry))
        if known is not None:
            return known
        try:
            client = ItoCredentials(api_url=api_url, keyring_entry=entry).get_client()
            await client.__aenter__()
            feed = (await client.get_capabilities()).change_feed
        except ItoError as error:
            logger.warning("Cannot watch runs on %s: %s", api_url, error)
            return None
        backend = _Backend(client, feed)
        self._backends[(api_url, entry)] = backend
        return backend

    # --- lost runs --------------------------------------------------------------------------

    async def _recover_lost(self) -> None:
        """Re-enter the training flow runs from deployments whose process is gone."""
        # A worker reports a crash twice (its runner, then itself): re-entering in between would
        # be undone by the second report, so a crash is left to settle first.
        settled = datetime.now(UTC) - timedelta(seconds=_CRASH_SETTLE_SECONDS)
        lost = [
            run
            for run in await _flow_runs(StateType.CRASHED)
            if run.state and run.state.timestamp and run.state.timestamp < settled
        ]
        if self.lost_after is not None:
            lost += await self._silent(await _flow_runs(StateType.RUNNING), self.lost_after)
            # A run whose worker died while starting it stays Pending (or Submitting) for good:
            # it never beats, and nobody is left to report it crashed. A start on a busy machine
            # may take longer than a heartbeat interval, so it gets twice the time.
            starting = await _flow_runs(StateType.PENDING)
            lost += await self._silent(starting, _START_GRACE * self.lost_after)
        for flow_run in lost:
            await self._reenter(flow_run)

    async def _silent(self, runs: list[FlowRun], seconds: float) -> list[FlowRun]:
        """Return the flow runs in their state, and without a heartbeat, for ``seconds``."""
        since = datetime.now(UTC) - timedelta(seconds=seconds)
        candidates = [
            run for run in runs if run.state and run.state.timestamp and run.state.timestamp < since
        ]
        if not candidates:
            return []
        alive = await _heartbeating({run.id for run in candidates}, since)
        return [run for run in candidates if run.id not in alive]

    async def _reenter(self, flow_run: FlowRun) -> None:
        """Reschedule a lost flow run, once for each loss, whoever else found the same loss.

        Two watchers — or one whose view is a moment old — may find the same loss. Each first
        claims the re-entry with a flow-run input keyed by the lost *state*; Prefect stores one
        input per key, so only one watcher goes on, and a run that was re-entered already (its
        lost state is past) is never rescheduled under its new process. A claim whose run still
        shows the same lost state after :data:`_CLAIM_STALE_SECONDS` belonged to a watcher that
        died before rescheduling; a new claim on that state is then made.
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
            claims = await _inputs(client, flow_run.id, _RECOVERY_PREFIX)
            if len(claims) >= MAX_RECOVERIES:
                logger.warning(
                    "Flow run %s was lost %d times; left to a person.", flow_run.id, len(claims)
                )
                return
            prefix = f"{_RECOVERY_PREFIX}{lost.id}-"
            on_this = [claim for claim in claims if claim.key.startswith(prefix)]
            if not await _claim_turn(
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


async def _inputs(client: PrefectClient, flow_run_id: UUID, prefix: str) -> list[FlowRunInput]:
    """Return the flow run's inputs whose keys start with ``prefix``."""
    return await client.filter_flow_run_input(
        flow_run_id, key_prefix=prefix, limit=100, exclude_keys=set()
    )


async def _claim_turn(
    client: PrefectClient, flow_run_id: UUID, prefix: str, claims: list[FlowRunInput], value: str
) -> bool:
    """Claim the one action on one state of a flow run (its inputs keyed ``prefix`` + a number).

    ``claims`` are the inputs already under ``prefix``. Tell whether this call holds the claim:
    none is held, or the newest is stale (its holder died before acting, see
    :data:`_CLAIM_STALE_SECONDS`), and this call stored the next one.
    """
    if claims and not _stale(claims):
        return False
    return await _claim(client, flow_run_id, f"{prefix}{len(claims) + 1}", value)


async def _claim(client: PrefectClient, flow_run_id: UUID, key: str, value: str) -> bool:
    """Store the input ``key`` on the flow run; tell whether this call stored it (not another)."""
    try:
        await client.create_flow_run_input(flow_run_id, key, value)
    except PrefectHTTPStatusError as error:
        if error.response.status_code != 409:
            raise
        return False
    return True


def _stale(claims: list[FlowRunInput]) -> bool:
    """Tell whether the newest of these claims is older than :data:`_CLAIM_STALE_SECONDS`."""
    newest = max((claim.created for claim in claims if claim.created), default=None)
    cutoff = datetime.now(UTC) - timedelta(seconds=_CLAIM_STALE_SECONDS)
    return newest is not None and newest < cutoff


def _must_resume(record: Deferral, run: TrainingRun, seen: _Seen | None = None) -> bool:
    """Tell whether the flow must handle what became of ``run`` since it deferred.

    ``seen`` carries when the heartbeat last moved, as this watcher saw it; without it, the
    record's own heartbeat is the reference.
    """
    if run.version > record.version and desk.gate_settled(run, record.stage):
        return True
    if seen is not None and record.stall_timeout is not None:
        if deferral.wall_clock() - seen.heartbeat_seen_at > record.stall_timeout:
            return True
    elif record.stalled(run.heartbeat_at):
        return True
    return record.past_deadline()


def _by_backend(
    waiting: list[tuple[FlowRun, Deferral]],
) -> dict[tuple[str, str | None], list[tuple[FlowRun, Deferral]]]:
    groups: dict[tuple[str, str | None], list[tuple[FlowRun, Deferral]]] = {}
    for flow_run, record in waiting:
        groups.setdefault((record.api_url, record.keyring_entry), []).append((flow_run, record))
    return groups


async def _flow_runs(state: StateType) -> list[FlowRun]:
    """Return the training flow runs from deployments in ``state``, every page of them.

    Prefect's server answers at most a page (200 by default) per request, whatever is asked.
    """
    found: list[FlowRun] = []
    async with get_client() as client:
        while True:
            page = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOW_NAMES))),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[state])),
                    # Only a run from a deployment suspends, and only a worker re-enters one.
                    deployment_id=FlowRunFilterDeploymentId(is_null_=False),
                ),
                sort=FlowRunSort.ID_DESC,
                offset=len(found),
                limit=_PAGE,
            )
            found += page
            if len(page) < _PAGE:
                return found


async def _heartbeating(flow_run_ids: set[UUID], since: datetime) -> set[UUID]:
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
