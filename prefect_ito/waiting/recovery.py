"""Recovery without a person: re-enter training flow runs whose flow process was lost.

A flow run is lost when the worker marked it ``Crashed`` (its process died), when it reads
``Running`` but missed three of its own beats (the machine and its worker are gone: Prefect
marks nothing crashed by itself; see :func:`_missed_beats`): the alive beats a prefect-ito flow
process sends every 10 s (:mod:`prefect_ito.waiting.alive`), or, for a flow process that sends
none, Prefect's flow-run heartbeats; when it was left starting (``Pending``) by a worker that is
gone (see :func:`_abandoned`), or when its process went silent between suspending for a person
and saving the form the person answers on (see :meth:`Recovery._formless`). A lost run is
rescheduled as it is (state ``Recovering``), so a worker runs it again from the top and it
re-attaches to the backend run it recorded: recovery never submits. A crash that ends a cancel
someone asked for since the run last started is no loss: that run is marked ``Cancelled``, as it
was asked (see :func:`_cancel_asked`).

Past ~400 lines on purpose: each way a run is lost, and what it takes from Prefect's heartbeats
and workers to tell, kept together so that no rule of loss is read without the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Final, Literal, NamedTuple
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun, StateType, Worker
from prefect.events import ReceivedEvent
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Scheduled
from prefect.utilities.slugify import slugify

from prefect_ito.waiting.alive import ALIVE_EVENT, ALIVE_SECONDS, Alive, alive_of
from prefect_ito.waiting.claims import claim_turn, read_claims
from prefect_ito.waiting.keys import RECOVERY_PREFIX
from prefect_ito.waiting.watched import in_state, watched_flow_runs

__all__ = [
    "AUTO",
    "DEFAULT_HEARTBEAT_SECONDS",
    "JUDGED",
    "MAX_RECOVERIES",
    "Recovery",
    "heartbeat_interval",
    "may_hold_a_process",
]

logger = logging.getLogger("prefect_ito.waiting.watcher")

JUDGED: Final = (StateType.CRASHED, StateType.RUNNING, StateType.PAUSED, StateType.PENDING)
"""The states of the flow runs recovery judges: crashed, running, suspended, starting."""

MAX_RECOVERIES = 5
"""How often one flow run is re-entered after a loss before the watcher leaves it to a person."""

AUTO: Final = "auto"
"""Judge each running flow run by its own beats, whatever this process's settings say."""

DEFAULT_HEARTBEAT_SECONDS = 180.0
"""Prefect's flow-run heartbeat interval where the flow process is not told another."""

_CRASH_SETTLE_SECONDS = 15.0
_START_GRACE = 2
"""A run starting on a live worker is lost after this many times ``lost_after``."""
_BEATS_MISSED = 3
"""A running flow run is lost once it missed this many of its own heartbeats."""
_LEAST_HEARTBEAT_SECONDS = 30.0
"""Prefect's least flow-run heartbeat interval: its engine beats no more often than this."""
_BEATS_READ = 4
_AUTO_LOST_AFTER = _BEATS_MISSED * DEFAULT_HEARTBEAT_SECONDS
"""Under ``AUTO``, what stands for ``lost_after`` where no heartbeat can tell."""
_CLOCK_SLACK = timedelta(seconds=10)
"""How far apart the clocks of Prefect, a flow process and this watcher may be; also what an
alive beat is allowed to come late on top of three missed ones (a busy machine or server)."""
_WORKER_HEARTBEAT_SECONDS = 30.0
"""Prefect's worker heartbeat interval, for a worker that did not say its own."""
_WORKER_LABEL = "prefect.worker.name"
_POOL_LABEL = "prefect.work-pool.name"
_TYPE_LABEL = "prefect.worker.type"
_WORKER_STARTED = "prefect.worker.started"
_WORKER_BEATS_MISSED = 3
"""A worker is silent when it missed this many of its heartbeats (and an explicit ``lost_after``
passed): the count after which Prefect shows a worker ``OFFLINE``."""
_HEARTBEAT = "prefect.flow-run.heartbeat"
_BEAT_EVENTS = [_HEARTBEAT, ALIVE_EVENT]
_PAGE = 200


@dataclass
class Recovery:
    """Finds lost training flow runs and re-enters each once per loss, whoever else found it.

    Attributes:
        lost_after: ``AUTO`` (the default) counts a running flow run lost once it missed three of
            its own beats (alive beats, else Prefect heartbeats); seconds without a beat count one
            lost after that long, whatever its interval; None never counts one lost (crashed ones
            are still re-entered). A run left starting is lost once its worker is gone, whatever
            this says.
        recovered: The flow runs this recovery re-entered, in order.
    """

    lost_after: float | Literal["auto"] | None = AUTO
    recovered: list[UUID] = field(default_factory=list)
    _with_form: set[UUID] = field(default_factory=set)
    """Suspended states whose form Prefect was seen to hold (a form, once saved, stays)."""
    _alive_until: dict[UUID, datetime] = field(default_factory=dict)
    """Per running flow run, until when the beats already read keep it alive: it is not asked
    about again before then (a watcher may sweep each second; a run beats every 10-180 s)."""

    async def recover(self, seen: list[FlowRun] | None = None) -> None:
        """Re-enter the training flow runs from deployments whose process is gone.

        ``seen``: the watched flow runs in :data:`JUDGED` states, as one listing of a moment ago
        found them (a watcher's sweep shares its own); listed here when not given.
        """
        if seen is None:
            seen = await watched_flow_runs(*JUDGED)
        # A worker reports a crash twice (its runner, then itself): re-entering in between would
        # be undone by the second report, so a crash is left to settle first.
        settled = datetime.now(UTC) - timedelta(seconds=_CRASH_SETTLE_SECONDS)
        lost = [
            run
            for run in in_state(seen, StateType.CRASHED)
            if run.state and run.state.timestamp and run.state.timestamp < settled
        ]
        if self.lost_after is not None:
            running = in_state(seen, StateType.RUNNING)
            # A run suspended without its form had a process that stopped half-way: judged as a
            # running one whose process went silent (its suspension is when it last ran).
            running += await self._formless(in_state(seen, StateType.PAUSED))
            lost += await self._gone_silent(running, self.lost_after)
            lost += await _abandoned(in_state(seen, StateType.PENDING), self.lost_after)
        for flow_run in lost:
            await self.reenter(flow_run)

    async def _gone_silent(
        self, running: list[FlowRun], lost_after: float | Literal["auto"]
    ) -> list[FlowRun]:
        """Return the running runs whose process went silent, asking Prefect only about those
        that the beats read in earlier sweeps no longer keep alive.

        A beat read once stays true: a run that beat at ``t`` cannot count as lost before ``t``
        plus the silence that makes it lost, whatever its state did since (a run re-entered
        since is judged from its new start, which is later still).
        """
        now = datetime.now(UTC)
        self._alive_until = {run: until for run, until in self._alive_until.items() if until > now}
        unsure = [run for run in running if run.id not in self._alive_until]
        if isinstance(lost_after, str):
            judged = await _missed_beats(unsure)
        else:
            judged = await _silent(unsure, lost_after)
        self._alive_until |= judged.alive_until
        return judged.lost

    async def _formless(self, paused: list[FlowRun]) -> list[FlowRun]:
        """Return the suspended runs that wait for an answer on a form Prefect does not hold.

        A flow process can save a question's form only once Prefect accepted its suspension
        (the server deletes a pause's inputs as it begins). A process lost in between leaves a
        run that waits for a person nobody can answer: Prefect refuses every resume, the UI's
        included ("Run input schema not found"). Each suspended state is asked about until its
        form is seen.
        """
        asking = {run.state.id: (run, key) for run in paused if run.state and (key := _form(run))}
        self._with_form &= set(asking)  # forget the states that ended
        # Here and below, nothing to ask opens no client: a watcher sweeps as often as each
        # second while idle, and every Prefect client sets up TLS (tens of ms of CPU) to open.
        if not set(asking) - self._with_form:
            return []
        formless = []
        async with get_client() as client:
            for state_id, (run, schema) in asking.items():
                if state_id in self._with_form:
                    continue
                if await client.filter_flow_run_input(
                    run.id, key_prefix=schema, limit=1, exclude_keys=set()
                ):
                    self._with_form.add(state_id)
                else:
                    formless.append(run)
        return formless

    async def reenter(self, flow_run: FlowRun) -> None:
        """Reschedule a lost flow run, once for each loss, whoever else found the same loss.

        Two watchers — or one whose view is a moment old — may find the same loss. Each first
        claims the re-entry with a flow-run input keyed by the lost *state*
        (:mod:`prefect_ito.waiting.claims`), so only one watcher goes on, and a run that was
        re-entered
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
            claims = await read_claims(client, flow_run.id, RECOVERY_PREFIX)
            if len(claims) >= MAX_RECOVERIES:
                logger.warning(
                    "Flow run %s was lost %d times; left to a person.", flow_run.id, len(claims)
                )
                return
            prefix = f"{RECOVERY_PREFIX}{lost.id}-"
            on_this = [claim for claim in claims if claim.key.startswith(prefix)]
            if not await claim_turn(
                client, flow_run.id, prefix, on_this, flow_run.state_name or ""
            ):
                return  # another watcher re-enters it
            if await _cancel_asked(client, flow_run.id):
                await _finish_cancel(client, flow_run)
                return
            await client.set_flow_run_state(
                flow_run.id,
                Scheduled(name="Recovering", message="re-entered by prefect-ito watch"),
                force=True,
            )
        self.recovered.append(flow_run.id)
        was = flow_run.state_name
        if _form(flow_run):  # else "Suspended" reads as a person's question taken away
            was = f"{was}, with no form Prefect could take an answer on; it asks again"
        logger.info("Re-entered lost flow run %s (it was %s).", flow_run.id, was)


def _form(flow_run: FlowRun) -> str | None:
    """Return the key of the form a suspended run waits on, or None if it waits on none.

    Anyone with Prefect API access can write a state: a keyset without a form's key is no
    question Prefect can resume with an answer, and is left alone.
    """
    state = flow_run.state
    if state is None or not state.is_paused() or not state.state_details.pause_reschedule:
        return None
    return (state.state_details.run_input_keyset or {}).get("schema") or None


async def _cancel_asked(client: PrefectClient, flow_run_id: UUID) -> bool:
    """Return whether someone asked Prefect to cancel the flow run since it last started.

    Prefect 3.9.1 records a cancel as a crash when the worker's SIGTERM lands while the flow
    process is inside an AnyIO task group (a connection being opened, say): the engine meets a
    ``BaseExceptionGroup`` rather than its cancellation. The worker still runs the cancellation
    hooks (the backend workload is cancelled) but leaves the run ``Crashed``.
    """
    asked = False
    for state in await client.read_flow_run_states(flow_run_id):  # oldest first
        if state.type is StateType.RUNNING:
            asked = False
        elif state.type is StateType.CANCELLING:
            asked = True
    return asked


async def _finish_cancel(client: PrefectClient, flow_run: FlowRun) -> None:
    """End a flow run whose cancel Prefect recorded as a crash the way it was asked: Cancelled.

    Its ``Cancelled`` event is what the shipped ``cancel-on-cancelled`` deployment listens for,
    so the backend workload's cancel is made sure of there too.
    """
    await client.set_flow_run_state(
        flow_run.id,
        Cancelled(message="cancelled on request; Prefect had recorded the cancel as a crash"),
        force=True,
    )
    logger.info(
        "Flow run %s was cancelled, not lost (Prefect recorded its cancel as %s); marked "
        "Cancelled.",
        flow_run.id,
        flow_run.state_name,
    )


class _Judged(NamedTuple):
    """The running runs asked about: those lost, and until when each of the others is alive."""

    lost: list[FlowRun]
    alive_until: dict[UUID, datetime]


async def _silent(runs: list[FlowRun], seconds: float) -> _Judged:
    """Judge the flow runs: lost once in their state, and without a heartbeat, for ``seconds``."""
    now = datetime.now(UTC)
    since = now - timedelta(seconds=seconds)
    candidates = [
        run for run in runs if run.state and run.state.timestamp and run.state.timestamp < since
    ]
    if not candidates:
        return _Judged([], {})
    beats = await heartbeating({run.id for run in candidates}, since)
    return _Judged(
        [run for run in candidates if run.id not in beats],
        # A beat dated ahead (anyone may send one) vouches for no longer than one dated now.
        {run: min(beat, now) + timedelta(seconds=seconds) for run, beat in beats.items()},
    )


async def _missed_beats(runs: list[FlowRun]) -> _Judged:
    """Judge the running flow runs: lost once they missed three of their own beats.

    A prefect-ito flow process says it is alive every 10 s (:mod:`prefect_ito.waiting.alive`): a
    run that sent such a beat is lost three of its intervals after its latest beat of either
    kind, plus the clock slack (40 s). A run from a flow process that sends none (an older
    prefect-ito) is judged by Prefect's heartbeats alone: its interval is the flow process's
    setting, which the watcher's own environment need not share, read from the run's latest
    heartbeats (:func:`heartbeat_interval`). No run is asked about before it ran for 40 s.

    One heartbeat tells no interval, and Prefect's default (180 s) would leave such a run lost in
    its first minutes unsupervised for nine. So a run whose worker is gone (:func:`_gone_takers`)
    counts the least interval instead: its flow process lived under that worker, and either went
    with its machine or ends ``Crashed`` by itself once its worker's end breaks its output.
    Re-entering never submits, so a run that was only slow costs a second process, never a second
    backend run.
    """
    now = datetime.now(UTC)
    young = now - _BEATS_MISSED * timedelta(seconds=ALIVE_SECONDS) - _CLOCK_SLACK
    began = {run.id: _running_since(run) for run in runs}
    old_enough = [run for run in runs if (since := began[run.id]) is not None and since < young]
    if not old_enough:
        return _Judged([], {})
    orphaned = await _gone_takers(old_enough)
    judged = _Judged([], {})
    async with get_client() as client:
        for run in old_enough:
            since = began[run.id]
            if since is None:
                continue
            # The slack: the state's time and the beats' come from clocks that need not agree.
            beats = await _read_beats(client, run.id, since - _CLOCK_SLACK)
            if _lost_at(beats, since, run.id in orphaned) < now:
                judged.lost.append(run)
            else:  # not lost before this, even should its worker be found gone meanwhile
                judged.alive_until[run.id] = _lost_at(beats, since, orphaned=True)
    return judged


def _running_since(run: FlowRun) -> datetime | None:
    return run.state.timestamp if run.state else None


async def _gone_takers(runs: list[FlowRun]) -> set[UUID]:
    """Return those of the running ``runs`` whose worker is gone since it started them: silent
    for three of its heartbeats, unknown to Prefect, or started again under the same name."""
    takers = {run.id: taker for run in runs if (taker := _taker(run)) is not None}
    silent = await _silent_workers(set(takers.values()), 0.0)
    gone = set()
    for run in runs:
        taker, began = takers.get(run.id), _running_since(run)
        if taker is None or began is None:
            continue
        if taker in silent or await worker_started_since(taker.type, taker.name, began):
            gone.add(run.id)
    return gone


class _Beats(NamedTuple):
    """What a running flow run's process said of itself since the run's state began."""

    heartbeats: list[datetime]
    """Prefect's flow-run heartbeats, newest first."""
    alive: Alive | None
    """The latest alive beat (:mod:`prefect_ito.waiting.alive`): None from a flow process that
    sends none."""


def _lost_at(beats: _Beats, began: datetime, orphaned: bool) -> datetime:
    """Return when a run running since ``began`` misses its third beat.

    With an alive beat: three of the interval it named after the latest beat of either kind,
    plus the clock slack, so that a beat that reaches a busy server late is no loss. Without:
    three heartbeats of its own interval, or of the least when its worker is gone and its
    heartbeats tell none. A run that said nothing at all since it began, and whose worker is
    gone, is lost as one whose alive beats stopped as it began: every flow process beats as its
    flow function starts (Prefect's heartbeat at once, whatever its interval; prefect-ito's
    alive beat), so such silence is a start the loss cut short.
    """
    heartbeats, alive = beats
    latest = max([*heartbeats[:1], *([alive.at] if alive else [])], default=began)
    # A beat dated ahead (anyone may send one) vouches for no longer than one dated now.
    last = min(latest, datetime.now(UTC))
    if alive is not None:
        return last + timedelta(seconds=_BEATS_MISSED * alive.interval) + _CLOCK_SLACK
    if orphaned and not heartbeats:
        return began + timedelta(seconds=_BEATS_MISSED * ALIVE_SECONDS) + _CLOCK_SLACK
    interval = heartbeat_interval(heartbeats)
    if orphaned and len(heartbeats) < 2:
        interval = _LEAST_HEARTBEAT_SECONDS
    return last + timedelta(seconds=_BEATS_MISSED * interval)


async def may_hold_a_process(flow_run: FlowRun) -> bool:
    """Tell whether a flow process may still act on ``flow_run`` (and so end a cancel itself).

    None does for a run that ended or is suspended (it holds no process by design); nor for one that
    missed three of its own beats (:func:`_lost_at`) — its process was killed, or its terminal
    closed without a word — or, never having beaten since the day before, entered its state longer
    ago than three of Prefect's default intervals. A beat anyone may send only makes a run look held
    (the newest counts, and never one dated ahead), never one that is held look free.
    """
    state = flow_run.state
    if state is None or state.is_final():
        return False
    if state.is_paused() and state.state_details.pause_reschedule:
        return False
    since = datetime.now(UTC) - timedelta(days=1)
    async with get_client() as client:
        beats = await _read_beats(client, flow_run.id, since)
    return _lost_at(beats, state.timestamp, orphaned=False) >= datetime.now(UTC)


def heartbeat_interval(beats: list[datetime]) -> float:
    """Return a flow run's heartbeat interval as its latest beats show it (newest first).

    The longest gap, not the latest: a beat someone else sent for the run can only shorten a
    gap. Prefect's default until two beats show one (the first comes as the run starts running,
    the next an interval later); never below Prefect's least.
    """
    gaps = [(newer - older).total_seconds() for newer, older in pairwise(beats)]
    if not gaps:
        return DEFAULT_HEARTBEAT_SECONDS
    return max(_LEAST_HEARTBEAT_SECONDS, *gaps)


async def _read_beats(client: PrefectClient, run_id: UUID, since: datetime) -> _Beats:
    """Return the run's latest heartbeats and alive beat since ``since``."""
    return _Beats(
        await _latest_beats(client, run_id, since), await _latest_alive(client, run_id, since)
    )


async def _latest_alive(client: PrefectClient, run_id: UUID, since: datetime) -> Alive | None:
    """Return the run's latest alive beat since ``since``, if it sent one."""
    events = await _events(client, [ALIVE_EVENT], f"prefect.flow-run.{run_id}", since, limit=1)
    return alive_of(events[0]) if events else None


async def _latest_beats(client: PrefectClient, run_id: UUID, since: datetime) -> list[datetime]:
    """Return when the run's latest heartbeats since ``since`` occurred, newest first.

    ``since``: a beat of the process before a re-entry is no beat of this one.
    """
    resource = f"prefect.flow-run.{run_id}"
    events = await _events(client, [_HEARTBEAT], resource, since, limit=_BEATS_READ)
    return sorted((event.occurred for event in events), reverse=True)


async def _abandoned(starting: list[FlowRun], lost_after: float | Literal["auto"]) -> list[FlowRun]:
    """Return those of the ``starting`` runs that no flow process will ever run.

    A run whose worker died while starting it stays ``Pending`` (or ``Submitting``) for good: a
    flow run beats only once it runs, and nobody is left to report it crashed. A live worker does
    report a start that failed, so a run is abandoned as soon as the worker that took it is gone:
    silent (three of its own heartbeats missed, at the interval the worker reports, and an
    explicit ``lost_after`` passed), or started again since it took the run (a worker that comes
    back under the same name, as a systemd unit does, is not the one that was starting it). The
    worker names itself in the run's labels, but only a moment after it marked the run
    ``Pending``: a run lost in between could have been taken by any worker of its pool, so it is
    abandoned once every one of them is gone (a worker started since cannot be the one). A run
    whose worker may live on is only slow — a busy machine, an image pull — until it has been
    starting for twice ``lost_after`` (under ``AUTO``, twice three of Prefect's default heartbeat
    intervals).
    """
    explicit = 0.0 if isinstance(lost_after, str) else lost_after
    grace = _START_GRACE * (explicit or _AUTO_LOST_AFTER)
    long_ago = datetime.now(UTC) - timedelta(seconds=grace)
    takers = {run.id: [taker] for run in starting if (taker := _taker(run)) is not None}
    takers |= await _pool_workers([run for run in starting if run.id not in takers])
    silent = await _silent_workers({t for some in takers.values() for t in some}, explicit)
    return [run for run in starting if await _left(run, takers.get(run.id), silent, long_ago)]


async def _left(
    run: FlowRun, takers: list[_Taker] | None, silent: set[_Taker], long_ago: datetime
) -> bool:
    """Tell whether the starting run was left: long ago, or by every worker that could have
    taken it (None: no worker can be told), each gone since."""
    began = run.state.timestamp if run.state else None
    if began is None:
        return False
    if began < long_ago:
        return True
    if takers is None:
        return False
    for taker in takers:
        if taker not in silent and not await worker_started_since(taker.type, taker.name, began):
            return False
    return True


class _Taker(NamedTuple):
    """The worker that took a flow run to start it, as the labels it gave the run say."""

    pool: str
    name: str
    type: str


def _taker(flow_run: FlowRun) -> _Taker | None:
    """Return the worker that took the run, if it said."""
    labels = [flow_run.labels.get(key) for key in (_POOL_LABEL, _WORKER_LABEL, _TYPE_LABEL)]
    pool, name, kind = labels
    if isinstance(pool, str) and isinstance(name, str) and isinstance(kind, str):
        return _Taker(pool, name, kind)
    return None


async def _pool_workers(runs: list[FlowRun]) -> dict[UUID, list[_Taker]]:
    """Return, for each run that names no worker, every worker Prefect knows in its pool."""
    found: dict[str, list[_Taker]] = {}
    if not runs:
        return {}
    async with get_client() as client:
        for pool in {run.work_pool_name for run in runs if run.work_pool_name}:
            try:
                kind = (await client.read_work_pool(pool)).type
                found[pool] = [_Taker(pool, w.name, kind) for w in await _workers(client, pool)]
            except ObjectNotFound:
                found[pool] = []  # no pool, no worker: none will start the run
    return {run.id: found[run.work_pool_name] for run in runs if run.work_pool_name}


async def _silent_workers(takers: set[_Taker], lost_after: float) -> set[_Taker]:
    """Return those of the workers that sent no heartbeat for ``lost_after`` seconds and missed
    three of their own, or that Prefect no longer knows."""
    now = datetime.now(UTC)
    silent: set[_Taker] = set()
    if not takers:
        return silent
    async with get_client() as client:
        for pool in {taker.pool for taker in takers}:
            try:
                known = {worker.name: worker for worker in await _workers(client, pool)}
            except ObjectNotFound:
                known = {}
            for taker in (taker for taker in takers if taker.pool == pool):
                worker = known.get(taker.name)
                if worker is None or _quiet_since(worker, lost_after) < now:
                    silent.add(taker)
    return silent


def _quiet_since(worker: Worker, lost_after: float) -> datetime:
    """Return when the worker would have to beat again to count as alive."""
    if worker.last_heartbeat_time is None:
        return datetime.min.replace(tzinfo=UTC)
    interval = worker.heartbeat_interval_seconds or _WORKER_HEARTBEAT_SECONDS
    missed = _WORKER_BEATS_MISSED * interval
    return worker.last_heartbeat_time + timedelta(seconds=max(lost_after, missed))


async def worker_started_since(kind: str, name: str, since: datetime) -> bool:
    """Tell whether a worker of this type and name said it started after ``since``."""
    # The resource id a worker gives itself (``BaseWorker._event_resource``).
    resource = f"prefect.worker.{kind}.{slugify(name)}"
    async with get_client() as client:
        return await _latest_since(client, [_WORKER_STARTED], resource, since) is not None


async def _workers(client: PrefectClient, pool: str) -> list[Worker]:
    """Return every worker Prefect knows in the work pool, page by page."""
    found: list[Worker] = []
    while True:
        page = await client.read_workers_for_work_pool(pool, offset=len(found), limit=_PAGE)
        found += page
        if len(page) < _PAGE:
            return found


async def heartbeating(flow_run_ids: set[UUID], since: datetime) -> dict[UUID, datetime]:
    """Return those of ``flow_run_ids`` that sent a beat (a Prefect heartbeat, or an alive beat)
    after ``since``, with when their latest one occurred.

    One question per run (Prefect answers at most 50 events a page, and each run beats several
    times a window); only running flow runs older than the window are asked about.
    """
    beats: dict[UUID, datetime] = {}
    async with get_client() as client:
        for run_id in flow_run_ids:
            resource = f"prefect.flow-run.{run_id}"
            beat = await _latest_since(client, _BEAT_EVENTS, resource, since)
            if beat is not None:
                beats[run_id] = beat
    return beats


async def _latest_since(
    client: PrefectClient, events: list[str], resource: str, since: datetime
) -> datetime | None:
    """Return when the latest of ``events`` of ``resource`` Prefect holds after ``since``
    occurred, or None if it holds none."""
    latest = await _events(client, events, resource, since, limit=1)
    return latest[0].occurred if latest else None


async def _events(
    client: PrefectClient, names: list[str], resource: str, since: datetime, limit: int
) -> list[ReceivedEvent]:
    """Return the latest ``limit`` of the events named ``names`` of ``resource`` that occurred
    after ``since``, newest first: Prefect's order unless asked otherwise."""
    page = await client.read_events(
        filter=EventFilter(
            event=EventNameFilter(name=names),
            resource=EventResourceFilter(id=[resource]),
            occurred=EventOccurredFilter(since=since),
        ),
        limit=limit,
    )
    return page.events
