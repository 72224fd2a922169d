"""``Watcher`` between two listings, on fakes of Prefect's listing and of a backend's change feed:
a change costs the work of its own run however many flow runs wait, and what the watcher keeps
follows what the last listing showed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from ito_fakes import BASE_URL, sample_run
from prefect.client.schemas.objects import FlowRun
from prefect.states import Suspended

from prefect_ito.contract import ChangePage, RunChange, RunState, TrainingRun
from prefect_ito.waiting import deferral
from prefect_ito.waiting import watcher as watcher_module
from prefect_ito.waiting.deferral import Deferral, deferral_key
from prefect_ito.waiting.watcher import Watcher, _Backend


class FakeBackend:
    """A backend whose change feed names one run per long-poll, the next of ``changes``; every
    run it is asked for is as the record of its flow run left it (nothing to resume)."""

    def __init__(self, changes: Iterator[str]) -> None:
        self.changes = changes
        self.reads: list[str] = []

    async def list_changes(self, after: int | None = None, wait: float = 0.0) -> ChangePage:
        run_id = next(self.changes)
        change = RunChange(run_id=run_id, version=1, state=RunState.ACCEPTED, pending_action=False)
        return ChangePage(changes=[change], cursor=(after or 0) + 1)

    async def get_training_run(
        self, run_id: str, *, after_version: int | None = None, wait: float | None = None
    ) -> TrainingRun:
        self.reads.append(run_id)
        return sample_run(run_id)

    async def __aexit__(self, *exc_info: object) -> None:
        pass  # the watcher closes its backends as it stops


class FakePrefect:
    """What Prefect lists: suspended flow runs, each deferred on a run, with its record."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listed: list[FlowRun] = []
        self.records: dict[UUID, Deferral] = {}
        self.listings = 0
        monkeypatch.setattr(watcher_module, "watched_flow_runs", self.watched_flow_runs)
        monkeypatch.setattr(deferral, "read_deferral", self.read_deferral)

    def defer(self, run_id: str, **limits: float | None) -> FlowRun:
        run = sample_run(run_id)
        key = deferral_key(run)
        flow_run = FlowRun(id=uuid4(), flow_id=uuid4(), state=Suspended(pause_key=key))
        self.records[flow_run.id] = Deferral(
            api_url=BASE_URL, run_id=run_id, version=run.version, stage=None, events_seen=0,
            heartbeat_at=run.heartbeat_at, heartbeat_seen_at=time.time(),
            **{"stall_timeout": None, "deadline_at": None, **limits},
        )  # fmt: skip
        self.listed.append(flow_run)
        return flow_run

    async def watched_flow_runs(self, *states: object) -> list[FlowRun]:
        self.listings += 1
        return list(self.listed)

    async def read_deferral(self, flow_run_id: UUID, key: str) -> Deferral:
        return self.records[flow_run_id]


def watching(backend: FakeBackend, **options: float) -> Watcher:
    """Return a watcher that lists only when told to, following ``backend``'s feed."""
    watcher = Watcher(wait=1.0, lost_after=None, list_every=3600, **options)
    watcher._backends[(BASE_URL, None)] = _Backend(backend, feed=True, cursor=0)  # type: ignore[arg-type]
    return watcher


def clock_reads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Count the watcher's looks at deferred runs' limits: each reads the wall clock."""
    reads: list[float] = []
    wall_clock = deferral.wall_clock

    def counted() -> float:
        reads.append(now := wall_clock())
        return now

    monkeypatch.setattr(deferral, "wall_clock", counted)
    return reads


async def work_per_change(monkeypatch: pytest.MonkeyPatch, waiting: int) -> list[int]:
    """Defer ``waiting`` flow runs, list them once, then count the clock reads of each of three
    sweeps, each on one change of a run a flow run waits on."""
    prefect = FakePrefect(monkeypatch)
    for i in range(waiting):
        prefect.defer(f"run-{i}", stall_timeout=3600.0)
    backend = FakeBackend(iter(["run-0", "run-1", "run-2", "run-3"]))
    watcher = watching(backend)
    await watcher.sweep()  # lists, reads every run once (first sight), waits: run-0 changes
    reads = clock_reads(monkeypatch)
    counts = []
    for _ in range(3):
        before = len(reads)
        await watcher.sweep()
        counts.append(len(reads) - before)
    assert prefect.listings == 1 and backend.reads[-3:] == ["run-1", "run-2", "run-3"]
    return counts


async def test_a_change_costs_the_same_work_at_ten_and_at_a_thousand_deferred_runs(monkeypatch):
    # Between listings, each sweep looked at every deferred run: whether it was due to be read,
    # when the next one would be, which ones the change named. At 5,000 runs a change waited on
    # that work; now the flow runs waiting on each backend run are kept between listings.
    few = await work_per_change(monkeypatch, 10)
    many = await work_per_change(monkeypatch, 1000)

    assert many == few


async def test_a_run_whose_stall_limit_comes_due_is_read_without_a_change(monkeypatch):
    prefect = FakePrefect(monkeypatch)
    prefect.defer("run-quiet", stall_timeout=3600.0)
    stalled = prefect.defer("run-stalled", stall_timeout=0.5)
    backend = FakeBackend(iter(lambda: "run-other-account", None))
    resumed: list[UUID] = []

    async def resume_once(self: Watcher, flow_run: FlowRun, why: str) -> None:
        resumed.append(flow_run.id)
        self.resumed.append(flow_run.id)
        self._resumed_from[flow_run.id] = flow_run.state.id

    monkeypatch.setattr(Watcher, "_resume_once", resume_once)
    watcher = watching(backend)
    await watcher.sweep()  # first sight: both read, neither stalled yet
    time.sleep(0.6)
    await watcher.sweep()  # its limit is due: read again, and resumed
    await watcher.sweep()  # resumed: not read again

    assert resumed == [stalled.id]
    assert sorted(backend.reads) == ["run-quiet", "run-stalled", "run-stalled"]


async def test_a_watcher_forgets_the_runs_a_listing_no_longer_shows(monkeypatch):
    # What a watcher keeps follows what waits now: over months, a team defers many thousands of
    # runs, and a watcher kept each one's record and what it last saw of its backend run.
    prefect = FakePrefect(monkeypatch)
    kept = prefect.defer("run-kept")
    prefect.defer("run-gone")
    watcher = watching(FakeBackend(iter(lambda: "run-kept", None)))
    await watcher.sweep()
    prefect.listed = [kept]  # the other one resumed, finished, or was deleted
    watcher._relisting.ask()
    await watcher.sweep()  # lists again, beside this sweep
    await watcher._relisting.ended()
    await watcher.sweep()  # takes in what it found

    assert [flow_run_id for flow_run_id, _ in watcher._records] == [kept.id]
    assert set(watcher._seen) == {"run-kept"}


class ChangingBackend(FakeBackend):
    """A backend whose runs have all ended (cancelled) once ``ended`` is set: a change the flow
    must handle."""

    ended = False

    async def get_training_run(
        self, run_id: str, *, after_version: int | None = None, wait: float | None = None
    ) -> TrainingRun:
        run = await super().get_training_run(run_id)
        if not self.ended:
            return run
        return run.model_copy(update={"version": 2, "state": RunState.CANCELLED})


async def test_a_change_is_handled_while_a_slow_listing_is_under_way(monkeypatch):
    # At 5,000 deferred runs a listing takes Prefect's server 8-11 s, and a change that came
    # during one waited for it: the listing now runs beside the sweeps.
    prefect = FakePrefect(monkeypatch)
    known = prefect.defer("run-known")
    listed = prefect.watched_flow_runs
    released = asyncio.Event()

    async def slow(*states: object) -> list[FlowRun]:
        if prefect.listings:  # the first listing is quick; the next waits to be released
            await released.wait()
        return await listed(*states)

    monkeypatch.setattr(watcher_module, "watched_flow_runs", slow)
    resumed = record_resumes(monkeypatch)
    backend = ChangingBackend(iter(["run-unknown", "run-known"]))
    watcher = watching(backend)
    try:
        async with asyncio.timeout(30):  # a hang guard: before, the second sweep never ended
            await watcher.sweep()  # lists; the feed names a run no listing showed: list again
            await watcher.sweep()  # that listing is under way; run-known's change is handled
            backend.ended = True
            backend.changes = iter(["run-known"])
            await watcher.sweep()
        assert resumed == [known.id] and not released.is_set()
    finally:
        released.set()
        await watcher.close()


async def test_a_run_resumed_while_it_was_listed_is_not_waited_on_again(monkeypatch):
    # The listing read the run as suspended before the sweep resumed it: taking the listing in
    # must not undo the resume (nor wait on the run again, to resume it twice).
    prefect = FakePrefect(monkeypatch)
    known = prefect.defer("run-known")
    listed = prefect.watched_flow_runs
    released = asyncio.Event()
    read_pages: list[FlowRun] = []

    async def slow(*states: object) -> list[FlowRun]:
        page = await listed(*states)  # read before the resume: shows the run suspended
        if prefect.listings > 1:
            read_pages.extend(page)
            await released.wait()
        return page

    monkeypatch.setattr(watcher_module, "watched_flow_runs", slow)
    resumed = record_resumes(monkeypatch)
    backend = ChangingBackend(iter(["run-unknown"]))
    watcher = watching(backend)
    try:
        await watcher.sweep()
        backend.ended, backend.changes = True, iter(["run-known"])
        async with asyncio.timeout(30):  # a hang guard: before, this sweep waited on the listing
            await watcher.sweep()  # a listing starts, reads run-known suspended; the change
            # resumes it
        assert read_pages == [known] and resumed == [known.id]
        released.set()
        await watcher._relisting.ended()
        backend.changes = iter(lambda: "run-known", None)
        await watcher.sweep()  # takes the listing in; the run is named again
        await watcher.sweep()
    finally:
        released.set()
        await watcher.close()

    assert resumed == [known.id]
    assert watcher._listing is not None and "run-known" in watcher._listing.known
    assert not any(w.by_run for w in watcher._listing.deferred.values())


def record_resumes(monkeypatch: pytest.MonkeyPatch) -> list[UUID]:
    """Stand in for Prefect's resume: record each flow run resumed, as the watcher marks it."""
    resumed: list[UUID] = []

    async def resume_once(self: Watcher, flow_run: FlowRun, why: str) -> None:
        if flow_run.id in self.resumed:
            return  # as the real one: once for its suspension
        resumed.append(flow_run.id)
        self.resumed.append(flow_run.id)
        self._resumed_from[flow_run.id] = flow_run.state.id

    monkeypatch.setattr(Watcher, "_resume_once", resume_once)
    return resumed
