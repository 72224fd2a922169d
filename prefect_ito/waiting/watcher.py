"""``prefect-ito watch``: resume deferred training flow runs when their backend run changes, and
those waiting for a person (a spend to confirm, a restart to decide) once the backend says the
person answered there; re-enter flow runs whose process was lost
(:mod:`prefect_ito.waiting.recovery`).

The watcher keeps no state of its own. It lists the watched flow runs (every page of them) once
every ``list_every`` seconds, re-entering the lost ones, in a task of its own beside the sweeps
(:mod:`prefect_ito.waiting.listing`); meanwhile, and between listings, it works from an index of
the last one (which flow run waits on which backend run, :mod:`prefect_ito.waiting.waiters`), so
that a change costs the work of its own run and never waits for a listing, and lists sooner when a
change names a backend run no listing showed. Each sweep looks at
the ``ito-training`` flow runs that are suspended: deferred (under a
``defer-`` pause key, with a :class:`Deferral` record beside it), or asking a person (under a
``spend-`` or ``restart-`` pause key, with a :class:`~prefect_ito.waiting.waits.WaitRecord`). It
reads each deferred run's backend run once, resumes the flow runs whose run changed in a way the
flow must handle, then waits for the next change: on the backend's account-wide change feed when
the backend offers one, else on one long-poll per run, a bounded number at a time. It reads what
each run that asks a person waits on (its quote, or its backend run's pending action) every sweep,
and resumes the run once the backend says that question is settled, or once its deadline passed
unanswered (so that the flow ends it itself, its cards saying so). A restarted watcher loses
nothing (its first sweep reads everything again), and two watchers resume nothing twice (each
resume is claimed first, :mod:`prefect_ito.waiting.claims`; a claim whose holder died is taken over
once stale).

It never decides anything, never confirms or declines a spend, and never submits; it resumes a
question only with ``recheck`` (Prefect resumes a form's pause only with an answer), which
decides nothing: a resumed flow run reads its quote or its run at the backend itself, and asks
again while the question is open. A run that waits under any other key is never resumed.

Past ~400 lines: one sweep — deferred runs, questions, lost runs — and the rules for when it may
resume each are kept together so that no rule is read without the others; recovery's own rules live
in :mod:`prefect_ito.waiting.recovery`, and what settles each kind of question in
:mod:`prefect_ito.waiting.waits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

import httpx
from prefect import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.context import AsyncClientContext
from prefect.exceptions import (
    FlowPauseTimeout,
    NotPausedError,
    ObjectNotFound,
    PrefectHTTPStatusError,
)
from prefect.flow_runs import aresume_flow_run
from pydantic import ValidationError

from prefect_ito.backend import gates
from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import ItoError
from prefect_ito.waiting import claims, deferral
from prefect_ito.waiting.claims import claim_turn, read_claims
from prefect_ito.waiting.deferral import Deferral
from prefect_ito.waiting.keys import ACTION_PREFIXES, DEFER_PREFIX, RESUME_PREFIX, SPEND_PREFIX
from prefect_ito.waiting.listing import Asking, BackendKey, Listed, Listing, Relisting, by_backend
from prefect_ito.waiting.recovery import AUTO, JUDGED, Recovery
from prefect_ito.waiting.waiters import Waiters, Waiting
from prefect_ito.waiting.waits import (
    ActionWait,
    QuoteWait,
    WaitRecord,
    latest_wait,
    question_deadline,
    recheck_answer,
)
from prefect_ito.waiting.watched import in_state, watched_flow_runs

__all__ = ["Watcher"]

logger = logging.getLogger("prefect_ito.waiting.watcher")


_CHANGED_UNDER_US = (ObjectNotFound, NotPausedError, FlowPauseTimeout, RuntimeError)
"""What Prefect raises when a flow run was cancelled, resumed or deleted since the sweep read it."""

TELL_AGAIN_AFTER_SECONDS = 360.0
"""How long after a question was asked a watcher makes sure Prefect holds its ``person.needed``:
past the five minutes in which Prefect refuses an event id it has seen, so that a copy under the
question's own id is taken."""
LOOK_FOR_LOST_SECONDS = 10.0
"""Seconds between two looks for lost flow runs: a quarter of the 40 s after which a training
flow process that stopped beating counts as lost."""
_HOLD_A_PROCESS = tuple(state for state in JUDGED if state is not StateType.PAUSED)


RECORD_READS_AT_ONCE = 8
"""Deferral records read from Prefect at once: a watcher's first listing reads one per deferred
run, one request each (thousands after a restart)."""


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


TellAgain = Callable[[FlowRun, WaitRecord, ItoClient], Awaitable[bool]]
"""Says again that a flow run waits for a person; returns whether it said it."""

_ASKED: dict[str, type[WaitRecord]] = {
    SPEND_PREFIX: QuoteWait,
    **{prefix: ActionWait for prefix in ACTION_PREFIXES.values()},
}
"""The pause-key prefix of each question put to a person, and the record a flow writes beside it."""


@dataclass
class Watcher:
    """Resumes deferred flow runs on a change, and re-enters lost ones; see the module docstring.

    What it holds in memory is only a cache of what Prefect and the backends say (records, which
    never change under their key, the last version and heartbeat seen of each run, and the last
    listing of flow runs), so that an idle sweep costs one change-feed request per backend,
    whatever the number of deferred runs (and one read per run that asks a person), and a change
    costs the reads of its run and its resume, not a new listing of every flow run.

    Attributes:
        wait: Seconds one long-poll (and so one idle sweep) may wait for a change.
        max_concurrency: Per-run long-polls at once, for a backend without a change feed.
        lost_after: When a running flow run counts as lost: ``"auto"`` once it missed three of
            its own heartbeats, seconds without one, or None never (crashed ones are still
            re-entered); see :class:`~prefect_ito.waiting.recovery.Recovery`.
    """

    wait: float = 30.0
    max_concurrency: int = 32
    lost_after: float | Literal["auto"] | None = AUTO
    resumed: list[UUID] = field(default_factory=list)
    recovery: Recovery = field(init=False)
    _backends: dict[BackendKey, _Backend] = field(default_factory=dict)
    _records: dict[tuple[UUID, str], Deferral] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _unread: set[str] = field(default_factory=set)
    _look_again_at: dict[str, float] = field(default_factory=dict)
    _refused: set[BackendKey] = field(default_factory=set)
    _unreadable: set[tuple[UUID, str]] = field(default_factory=set)
    _waits: dict[UUID, tuple[UUID, WaitRecord | None]] = field(default_factory=dict)
    """Per flow run asking a person: its suspended state, and the record read beside it."""
    tell_again: TellAgain | None = None
    """Says again that a flow run waits for a person if Prefect lost the saying
    (:func:`prefect_ito.people.notices.tell_again`); None: questions are only read."""
    tell_again_after: float = TELL_AGAIN_AFTER_SECONDS
    """Seconds after a question was asked, and between two checks of one question, before it is
    checked whether Prefect holds the saying."""
    list_every: float | None = None
    """Seconds between two listings of the flow runs Prefect holds (None: every ``wait``), unless
    a change names a backend run no listing showed, or a flow run was suspending as it was
    listed. Between listings, and while one is under way, the watcher waits on the backends with
    what it last listed, so a change is acted on in the time of one backend read, however many
    flow runs there are."""
    _told_at: dict[tuple[UUID, str], float] = field(default_factory=dict)
    _resumed_from: dict[UUID, UUID] = field(default_factory=dict)
    _listing: Listing | None = None
    _relisting: Relisting = field(init=False)
    """When the next listing is due, and the one under way beside the sweeps."""
    _named_unknown: set[str] = field(default_factory=set)
    """Backend runs a change named that no listing showed: each asks for one listing, once."""
    look_for_lost_every: float = LOOK_FOR_LOST_SECONDS
    """Seconds between two looks at the flow runs that hold a process (running, starting,
    crashed) for lost ones, beside the sweeps and the listings."""

    def __post_init__(self) -> None:
        self.recovery = Recovery(self.lost_after)
        self._relisting = Relisting(self.wait if self.list_every is None else self.list_every)

    @property
    def recovered(self) -> list[UUID]:
        """The lost flow runs this watcher re-entered, in order."""
        return self.recovery.recovered

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep until ``stop`` is set; a failed sweep is logged and the next one comes."""
        looking = asyncio.ensure_future(self._look_for_lost(stop))
        try:
            while not stop.is_set():
                await self._sweep_once()
        finally:
            looking.cancel()
            await asyncio.wait([looking])
            await self.close()

    async def _look_for_lost(self, stop: asyncio.Event) -> None:
        """Re-enter lost flow runs every ``look_for_lost_every`` seconds, whatever the sweeps do.

        A listing of every watched flow run comes every ``list_every`` (30 s by default, longer
        for thousands of deferred runs), and a sweep may wait that long on a backend: a run
        whose alive beats stopped would be found up to that much later than its 40 s. The runs
        that hold a process are few, whatever the number of deferred ones: listing only them is
        cheap enough to do every 10 s. Suspended runs (a form lost half-way) are still judged
        by the full listing.
        """
        while not stop.is_set():
            await asyncio.sleep(self.look_for_lost_every)
            try:
                async with _one_prefect_client():
                    await self.recovery.recover(await watched_flow_runs(*_HOLD_A_PROCESS))
            except (httpx.TransportError, PrefectHTTPStatusError, _PrefectRefused) as error:
                logger.warning("A look for lost flow runs failed (%s); the next one comes", error)
            except Exception:  # a long-running service outlives any one look's failure
                logger.exception("A look for lost flow runs failed; the next one comes")

    async def _sweep_once(self) -> None:
        """Sweep; log a failed sweep and wait before the next."""
        try:
            async with _one_prefect_client():
                await self.sweep()
        except (httpx.TransportError, PrefectHTTPStatusError, _PrefectRefused, ItoError) as error:
            # Prefect or a backend did not answer, or refused: expected now and then, one line.
            logger.warning("A sweep failed (%s); the next one in %g s", error, self.wait)
            await asyncio.sleep(self.wait)
        except Exception:  # a long-running service outlives any one sweep's failure
            logger.exception("A sweep failed; the next one starts in %g s", self.wait)
            await asyncio.sleep(self.wait)

    async def close(self) -> None:
        """Stop the listing under way; close the backend clients."""
        await self._relisting.stop()
        for backend in self._backends.values():
            await backend.client.__aexit__(None, None, None)
        self._backends.clear()

    async def sweep(self) -> None:
        """Re-enter lost runs; resume suspended runs whose run or quote changed, then wait for
        one change."""
        listing = await self._listed()
        waited = False
        for api_url, entry in dict.fromkeys([*listing.deferred, *listing.asking]):
            backend = await self._backend(api_url, entry)
            if backend is None:
                continue
            waiters = listing.deferred.get((api_url, entry)) or Waiters()
            quotes = listing.asking.get((api_url, entry), [])
            # Read a run only when first seen or when a watchdog limit comes due; else wait.
            await self._read_and_judge(backend, self._due(waiters))
            # Questions every sweep: a quote's expiry comes on no feed, and the backend's clock
            # may not be ours; few runs wait for a person at a time.
            await self._read_questions(backend, quotes)
            asked = [item for item in quotes if item[0].id not in self.resumed]
            if waiters.by_run or asked:
                await self._wait_for_change(backend, waiters, asked)
                waited = True
        if not waited:  # nothing to wait on, or only on backends refused: no busy loop
            self._relisting.ask()  # a listing of nothing to wait on costs next to nothing
            await asyncio.sleep(min(self.wait, 5.0))

    async def _listed(self) -> Listing:
        """Return what the suspended flow runs wait on, as last listed, less the runs resumed
        since: take in what a listing found once it ended, and start the next one when due.

        A listing runs as a task of its own (:mod:`prefect_ito.waiting.listing`), so a change
        that comes meanwhile is handled from the last one. Only the first is waited for: before
        it, nothing is known to wait on.
        """
        listed = self._relisting.take()
        if listed is not None:
            self._install(listed)
        self._relisting.start_if_due(self._list)
        if self._listing is None:
            self._install(await self._relisting.wait())
        assert self._listing is not None
        return self._listing

    async def _list(self) -> Listed:
        """List the watched flow runs, every page of them; re-enter the lost ones; read the
        records of the suspended ones not read before.

        It runs beside the sweeps, with a Prefect client of its own (the sweep that started it
        closes its own as it ends). Recovery re-entering a run as a sweep resumes it is the race
        two watchers run anyway: each claims its action on the state it saw, and recovery reads
        the state again before it acts.
        """
        if AsyncClientContext.get() is None:  # sweeps outside run(): a client per request
            return await self._list_here()
        AsyncClientContext.__var__.set(None)  # type: ignore[arg-type]  # this task's copy only
        async with _one_prefect_client():
            return await self._list_here()

    async def _list_here(self) -> Listed:
        # One listing for recovery and for the waits: it is the cost that grows with the number
        # of flow runs, every page of them from Prefect.
        seen = await watched_flow_runs(*JUDGED)
        before = len(self.recovery.recovered)
        await self.recovery.recover(seen)
        # Left out of the waits: the runs just re-entered (no longer suspended as listed). One
        # re-entered earlier that suspended again since is waited on as any other.
        re_entered = set(self.recovery.recovered[before:])
        paused = [run for run in in_state(seen, StateType.PAUSED) if run.id not in re_entered]
        return Listed(paused, await self._deferred(paused), await self._asking(paused))

    def _install(self, listed: Listed) -> None:
        """Replace the last listing with ``listed``, between two steps of a sweep (no await).

        A run resumed while it was listed may show suspended still, under the state it was
        resumed from: it stays resumed, and is not waited on again (nor resumed twice).
        """
        self._forget_resumed(listed.paused)
        listing = Listing(asking=by_backend(listed.asking))
        for item in listed.deferred:
            if item[0].id in self.resumed:
                listing.known.add(item[1].run_id)
            else:
                listing.add_deferred(item)
        self._forget_unlisted(listed.paused, listing.known)
        for waiters in listing.deferred.values():
            for run_id in waiters.by_run:
                self._reschedule(waiters, run_id)
        self._listing = listing

    def _forget_unlisted(self, paused: list[FlowRun], known: set[str]) -> None:
        """Forget what was kept of flow runs and backend runs the listing no longer shows
        (resumed, finished, deleted), so that what a watcher holds follows what waits now, not
        every run it ever saw."""
        listed = {run.id for run in paused}
        self._records = {k: v for k, v in self._records.items() if k[0] in listed}
        self._unreadable = {k for k in self._unreadable if k[0] in listed}
        self._told_at = {k: v for k, v in self._told_at.items() if k[0] in listed}
        self._seen = {k: v for k, v in self._seen.items() if k in known}
        self._look_again_at = {k: v for k, v in self._look_again_at.items() if k in known}
        self._unread &= known

    def _list_for(self, run_ids: set[str]) -> None:
        """List again at the next sweep if a change named a backend run no listing showed (a
        deferral written since); each such run asks for it once, so runs of the account that no
        flow run waits on do not make every change a listing."""
        known = self._listing.known if self._listing is not None else set()
        unknown = {run_id for run_id in run_ids if run_id not in known} - self._named_unknown
        if unknown:
            self._named_unknown |= unknown
            self._relisting.ask()

    def _forget_resumed(self, paused: list[FlowRun]) -> None:
        """Forget resumes of runs no longer suspended as they were: a run that suspended again
        since (a new state, perhaps under the same pause key) is to be resumed again."""
        still = {
            run.id
            for run in paused
            if run.state is not None and self._resumed_from.get(run.id) == run.state.id
        }
        self.resumed = [run_id for run_id in self.resumed if run_id in still]
        self._resumed_from = {k: v for k, v in self._resumed_from.items() if k in still}

    # --- deferred runs ----------------------------------------------------------------------

    async def _deferred(self, paused: list[FlowRun]) -> list[Waiting]:
        """Return every suspended training flow run that waits on a backend run, with its record."""
        limit = asyncio.Semaphore(RECORD_READS_AT_ONCE)

        async def read(flow_run: FlowRun) -> Waiting | None:
            key = flow_run.state.state_details.pause_key if flow_run.state else None
            if not key or not key.startswith(DEFER_PREFIX):
                return None  # waits for a person, or for something else: not a deferral
            async with limit:
                record = await self._record(flow_run, key)
            return None if record is None else (flow_run, record)

        found = await asyncio.gather(*(read(flow_run) for flow_run in paused))
        return [item for item in found if item is not None]

    async def _record(self, flow_run: FlowRun, key: str) -> Deferral | None:
        """Return the record of a deferred run, or None: not written yet, or not a record."""
        record = self._records.get((flow_run.id, key))
        if record is not None or (flow_run.id, key) in self._unreadable:
            return record
        try:
            record = await deferral.read_deferral(flow_run.id, key)
        except ValidationError:
            # Anyone with Prefect API access can write an input under a defer- key; one that is
            # no record is that flow run's problem, never the sweep's. Said once.
            self._unreadable.add((flow_run.id, key))
            logger.warning(
                "Flow run %s is suspended under %s beside a record that is not a deferral; "
                "it is not watched.",
                flow_run.id,
                key,
            )
            return None
        if record is None:
            self._relisting.ask()  # suspending right now: the record comes first, look again
            return None
        self._records[(flow_run.id, key)] = record
        # A new deferral is read once: its run may have moved before the feed's cursor.
        self._unread.add(record.run_id)
        return record

    def _due(self, waiters: Waiters) -> list[Waiting]:
        """Return the deferred runs to read without a change: first seen, or a watchdog limit
        (or a claim's staleness) come due; the work of those alone, however many wait."""
        fresh = [run_id for run_id in self._unread if run_id in waiters.by_run]
        self._unread.difference_update(fresh)
        now = deferral.wall_clock()
        due = []
        for run_id in waiters.pop_due(now):
            at = self._run_due_at(waiters, run_id)
            if at <= now:
                due.append(run_id)
                at = now + self.wait  # read again then if this read fails; judging sets it anew
            waiters.schedule(run_id, at)
        return waiters.waiting_on(dict.fromkeys([*fresh, *due]))

    def _reschedule(self, waiters: Waiters, run_id: str) -> None:
        waiters.schedule(run_id, self._run_due_at(waiters, run_id))

    def _run_due_at(self, waiters: Waiters, run_id: str) -> float:
        return min((self._due_at(record) for _, record in waiters.by_run.get(run_id, [])),
                   default=float("inf"))  # fmt: skip

    def _due_at(self, record: Deferral) -> float:
        """When (wall-clock seconds) the stall limit or the deadline of ``record`` comes due, or
        a resume another watcher claimed is to be looked at again."""
        seen = self._seen.get(record.run_id)
        due = [float("inf")]
        if record.run_id in self._look_again_at:
            due.append(self._look_again_at[record.run_id])
        if record.deadline_at is not None:
            due.append(record.deadline_at)
        if record.stall_timeout is not None:
            moved = seen.heartbeat_seen_at if seen else record.heartbeat_seen_at
            due.append(moved + record.stall_timeout)
        return min(due)

    def _waiters(self, record: Deferral) -> Waiters | None:
        """Return the flow runs still waited on at ``record``'s backend, as last listed."""
        return self._listing.waiters(record) if self._listing is not None else None

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
            with _unless_changed(flow_run):
                await self._judge(flow_run, record, run)

        await asyncio.gather(*(read(flow_run, record) for flow_run, record in items))

    async def _judge(self, flow_run: FlowRun, record: Deferral, run: TrainingRun) -> None:
        """Note what ``run`` shows, and resume the flow run if it must handle it."""
        self._look_again_at.pop(run.run_id, None)
        seen = self._observe(record, run)
        if _must_resume(record, run, seen):
            await self._resume(flow_run, record, run)
        waiters = self._waiters(record)
        if waiters is not None:
            self._reschedule(waiters, record.run_id)

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

    async def _wait_for_change(
        self, backend: _Backend, waiters: Waiters, asked: list[Asking]
    ) -> None:
        wait = max(0.0, min(self.wait, waiters.next_at() - deferral.wall_clock()))
        if backend.feed:
            await self._wait_on_feed(backend, waiters, asked, wait)
        elif waiters.by_run:
            await self._wait_per_run(backend, waiters.every(), wait)
        else:
            await asyncio.sleep(wait)  # a question has no long-poll: the next sweep reads it again

    async def _wait_on_feed(
        self, backend: _Backend, waiters: Waiters, asked: list[Asking], wait: float
    ) -> None:
        # A listing asked for (a change named a run no listing showed) is taken as it ends, not
        # after the long-poll: the cursor stays where it was, and the next one asks again.
        polling = backend.client.list_changes(after=backend.cursor, wait=wait)
        page = await self._relisting.unless_asked_ends(polling)
        if page is None:
            return
        backend.cursor = page.cursor
        moved = {change.run_id for change in page.changes}
        self._list_for(moved)
        await self._read_and_judge(backend, waiters.waiting_on(moved))
        await self._read_questions(backend, [item for item in asked if item[1].woken_by(page)])

    async def _wait_per_run(self, backend: _Backend, pending: list[Waiting], wait: float) -> None:
        await self._read_and_judge(backend, pending, wait=wait)

    async def _resume(self, flow_run: FlowRun, record: Deferral, run: TrainingRun) -> None:
        """Resume a deferred flow run, once for its suspension, whoever else saw the change."""
        why = f"backend run {record.run_id} is at version {run.version} ({run.state.value})"
        held_until = await self._resume_once(flow_run, why)
        if held_until is not None:
            # Another watcher resumes it — unless it died first: look again once its claim is
            # stale (by the claim's own time: this watcher may have seen it late), as the
            # backend run may never change again to bring it back.
            self._look_again_at[record.run_id] = held_until
            return
        waiters = self._waiters(record)
        if waiters is not None:  # resumed, or cancelled or deleted meanwhile: done with it
            waiters.drop(flow_run.id, record.run_id)

    async def _resume_once(
        self, flow_run: FlowRun, why: str, answer: dict[str, Any] | None = None
    ) -> float | None:
        """Resume a suspended flow run (with ``answer`` for a pause that waits for a form).

        Return None when done with it, or, if another watcher claimed the resume, when that
        claim goes stale (:func:`~prefect_ito.waiting.claims.held_until`).

        Watchers that follow the same feed see the same change at once. Prefect checks that a run
        is paused before resuming it, but not in the same write, so two resumes that race may
        both go through (on PostgreSQL, a suspension was seen resumed twice). Each watcher first
        claims the resume with a flow-run input keyed by the suspended *state*, as re-entries
        are claimed: only the watcher that stored it resumes.
        """
        suspended = flow_run.state
        if flow_run.id in self.resumed or suspended is None:
            return None
        prefix = f"{RESUME_PREFIX}{suspended.id}-"
        async with get_client() as client:
            held = await read_claims(client, flow_run.id, prefix)
            if not await claim_turn(client, flow_run.id, prefix, held, ""):
                return claims.held_until(held)
        try:
            await self._resume_past_junk(flow_run, answer)
        except _CHANGED_UNDER_US as error:  # resumed, cancelled or deleted meanwhile
            logger.info("Flow run %s was not resumed: %s", flow_run.id, error)
            return None
        self.resumed.append(flow_run.id)
        self._resumed_from[flow_run.id] = suspended.id
        logger.info("Resumed flow run %s: %s.", flow_run.id, why)
        return None

    async def _resume_past_junk(self, flow_run: FlowRun, answer: dict[str, Any] | None) -> None:
        """Resume ``flow_run``; first remove an answer that stands under its form's key but
        resumed nothing (anyone with Prefect API access can write one, and Prefect then refuses
        every resume with ``409``, so a person's answer at the backend would never take effect).
        """
        try:
            await aresume_flow_run(flow_run.id, run_input=answer)
        except PrefectHTTPStatusError as error:
            if answer is None or error.response.status_code != 409:
                raise
            if not await self._remove_stale_answer(flow_run):
                raise
            await aresume_flow_run(flow_run.id, run_input=answer)

    async def _remove_stale_answer(self, flow_run: FlowRun) -> bool:
        """Delete the answer under a still-paused run's form key; tell whether there was one.

        Prefect's server stores a Resume's answer in the same transaction as the state it
        resumes to, so an answer beside a pause that still holds was never a resume: it was
        written through the API, by hand.
        """
        async with get_client() as client:
            now = await client.read_flow_run(flow_run.id)
            state = now.state
            keyset = state.state_details.run_input_keyset if state and state.is_paused() else None
            if not keyset:
                return False
            try:
                await client.delete_flow_run_input(flow_run.id, keyset["response"])
            except ObjectNotFound:
                return False
        logger.warning(
            "Flow run %s is paused with an answer under its form key that resumed nothing "
            "(written through Prefect's API): removed, so that it can be resumed.",
            flow_run.id,
        )
        return True

    # --- runs that ask a person ----------------------------------------------------------------

    async def _asking(self, paused: list[FlowRun]) -> list[Asking]:
        """Return every suspended training flow run that asks a person, with its record."""
        found = []
        for flow_run in paused:
            state = flow_run.state
            key = state.state_details.pause_key if state else None
            kind = next((k for p, k in _ASKED.items() if key and key.startswith(p)), None)
            if state is None or not key or kind is None:
                continue
            record = await self._wait_record(flow_run, state.id, key, kind)
            if record is not None:
                found.append((flow_run, record))
        current = {flow_run.id for flow_run in paused}
        self._waits = {k: v for k, v in self._waits.items() if k in current}
        return found

    async def _wait_record(
        self, flow_run: FlowRun, state_id: UUID, key: str, kind: type[WaitRecord]
    ) -> WaitRecord | None:
        """Return the record of what a suspended run asks, read once per suspension."""
        cached = self._waits.get(flow_run.id)
        if cached is not None and cached[0] == state_id:
            return cached[1]
        # The flow writes its record before it suspends: none readable now means none at all
        # (an older flow, or an input someone wrote by hand). Said once per suspension.
        record = await latest_wait(flow_run.id, kind)
        self._waits[flow_run.id] = (state_id, record)
        if record is None:
            logger.warning(
                "Flow run %s is suspended under %s without a record of what it asks; it is not "
                "watched.",
                flow_run.id,
                key,
            )
        return record

    async def _read_questions(self, backend: _Backend, items: list[Asking]) -> None:
        """Read each question at the backend, and resume its flow run once it is settled.

        Nothing in a record is trusted, and nothing needs to be: the backend is read with this
        watcher's own token, the resume is a ``recheck`` that decides nothing, and the resumed
        flow reads its own quote or run at the backend again itself.
        """
        limit = asyncio.Semaphore(self.max_concurrency)

        async def read(flow_run: FlowRun, record: WaitRecord) -> None:
            async with limit:
                try:
                    why = await record.settled(backend.client)
                except ItoError as error:
                    logger.warning("Could not read %s: %s", record.names(), error)
                    return
            if why is None and _past_deadline(flow_run):
                why = "the question's deadline passed unanswered"  # the flow ends it itself
            if why is None:
                await self._tell_again(flow_run, record, backend.client)
                return
            with _unless_changed(flow_run):
                await self._resume_once(flow_run, why, recheck_answer(why))

        await asyncio.gather(*(read(flow_run, record) for flow_run, record in items))

    async def _tell_again(self, flow_run: FlowRun, record: WaitRecord, client: ItoClient) -> None:
        """Make sure people were told of a question still open, once it is old enough for
        Prefect to take its saying again; then again at most every ``tell_again_after``."""
        state = flow_run.state
        if self.tell_again is None or state is None:
            return
        now, key = time.monotonic(), (flow_run.id, record.key())
        age = (datetime.now(UTC) - state.timestamp).total_seconds()
        last = self._told_at.get(key)
        if age < self.tell_again_after or (last and now - last < self.tell_again_after):
            return
        self._told_at[key] = now
        try:
            if await self.tell_again(flow_run, record, client):
                logger.info("Told people again that flow run %s waits for them.", flow_run.id)
        except ItoError as error:
            logger.warning("Could not tell again of %s: %s", record.names(), error)

    async def _backend(self, api_url: str, entry: str | None) -> _Backend | None:
        """Return the backend for a record, with a client whose token this process resolves."""
        known = self._backends.get((api_url, entry))
        if known is not None or (api_url, entry) in self._refused:
            return known
        try:
            # The record is what anyone with Prefect API access may write: the block admits
            # only an origin this watcher is configured for, before any request.
            client = ItoCredentials(api_url=api_url, keyring_entry=entry).get_client()
        except (ItoError, ValidationError) as error:
            self._refused.add((api_url, entry))  # said once, not every sweep
            logger.warning("Not watching runs recorded for %s: %s", api_url, _first_line(error))
            return None
        try:
            await client.__aenter__()
            feed = (await client.get_capabilities()).change_feed
            # The cursor before the first reads: a change in between would be seen by neither.
            cursor = (await client.list_changes()).cursor if feed else None
        except ItoError as error:
            await client.__aexit__(None, None, None)
            logger.warning("Cannot watch runs on %s: %s", api_url, error)
            return None
        backend = _Backend(client, feed, cursor)
        self._backends[(api_url, entry)] = backend
        return backend


class _PrefectRefused(Exception):
    """Prefect's client would not work with the server (another major version, say)."""


@contextlib.asynccontextmanager
async def _one_prefect_client() -> AsyncIterator[None]:
    """Make every ``get_client()`` within share one Prefect client.

    A new client loads the CA bundle into a TLS context (about 25 ms of CPU), and a sweep asked
    for several, as often as each second. Prefect's client checks its server's version as the
    context opens, and says a server that did not answer, or one of another major version, with
    a ``RuntimeError``: raised here as the transport failure it wraps, or as
    :class:`_PrefectRefused`, so that it is a failed sweep like any other.
    """
    opened = False
    try:
        async with AsyncClientContext.get_or_create():
            opened = True
            yield
    except RuntimeError as error:
        if opened:
            raise
        if isinstance(error.__cause__, httpx.TransportError):
            raise error.__cause__ from None
        raise _PrefectRefused(str(error)) from None


def _must_resume(record: Deferral, run: TrainingRun, seen: _Seen | None = None) -> bool:
    """Tell whether the flow must handle what became of ``run`` since it deferred.

    ``seen`` carries when the heartbeat last moved, as this watcher saw it; without it, the
    record's own heartbeat is the reference.
    """
    if run.version > record.version and gates.gate_settled(run, record.stage):
        return True
    if seen is not None and record.stall_timeout is not None:
        if deferral.wall_clock() - seen.heartbeat_seen_at > record.stall_timeout:
            return True
    elif record.stalled(run.heartbeat_at):
        return True
    return record.past_deadline()


def _past_deadline(flow_run: FlowRun) -> bool:
    """Tell whether the question a suspended flow run asks is past its deadline (Prefect's own
    comes later, see :func:`~prefect_ito.waiting.waits.question_deadline`). A run paused
    in-process is its own process's to end."""
    state = flow_run.state
    if state is None or not state.state_details.pause_reschedule:
        return False
    deadline = question_deadline(state)
    return deadline is not None and datetime.now(UTC) >= deadline


@contextlib.contextmanager
def _unless_changed(flow_run: FlowRun) -> Iterator[None]:
    """Skip a flow run that was cancelled, resumed or deleted since the sweep read it: it costs
    only itself, never the sweep."""
    try:
        yield
    except _CHANGED_UNDER_US as error:
        logger.info("Flow run %s changed meanwhile; skipped: %s", flow_run.id, error)
    except PrefectHTTPStatusError as error:
        if error.response.status_code not in (404, 409):
            raise
        logger.info("Flow run %s changed meanwhile; skipped: %s", flow_run.id, error)


def _first_line(error: Exception) -> str:
    # A pydantic error spans lines; a log line says what was refused, once.
    if isinstance(error, ValidationError):
        return "; ".join(str(detail["msg"]) for detail in error.errors())
    return str(error)
