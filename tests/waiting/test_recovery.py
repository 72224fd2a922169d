"""When recovery finds a running flow run lost, and how often it asks Prefect about one: once a
beat is read, not again until that beat could lapse (a watcher sweeps as often as each second; a
run beats every 10-180 s, and each question is an events query on the team's Prefect server)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import pytest
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events import Event, emit_event
from prefect.events.filters import EventFilter
from prefect.events.worker import EventsWorker
from prefect.states import Running

from prefect_ito.waiting import recovery
from prefect_ito.waiting.alive import ALIVE_EVENT
from prefect_ito.waiting.recovery import (
    AUTO,
    DEFAULT_HEARTBEAT_SECONDS,
    Recovery,
    _Beats,
    _lost_at,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BEGAN = NOW - timedelta(seconds=600)


def _ago(*seconds: float) -> list[datetime]:
    return [NOW - timedelta(seconds=s) for s in seconds]


@pytest.mark.parametrize(
    ("beats", "orphaned", "silent_for"),
    [
        (_ago(10, 40), False, 3 * 30.0),  # its own interval
        (_ago(10, 40), True, 3 * 30.0),  # two beats tell it, whatever became of its worker
        (_ago(10), False, 3 * DEFAULT_HEARTBEAT_SECONDS),  # one beat tells none: the default
        (_ago(10), True, 3 * 30.0),  # ... or the least, once its worker is gone
    ],
)
def test_a_run_is_lost_three_of_its_intervals_after_its_last_beat(
    beats: list[datetime], orphaned: bool, silent_for: float
):
    lost_at = _lost_at(_Beats(beats, None), BEGAN, orphaned)

    assert lost_at == beats[0] + timedelta(seconds=silent_for)


def test_a_beat_dated_ahead_keeps_a_run_alive_no_longer_than_one_dated_now():
    ahead = _Beats([datetime.now(UTC) + timedelta(days=365)], None)

    assert _lost_at(ahead, BEGAN, True) < datetime.now(UTC) + timedelta(seconds=3 * 30.0 + 5)


class _Prefect:
    """Prefect's events API as recovery asks it, over events held in memory."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    async def __aenter__(self) -> _Prefect:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read_workers_for_work_pool(self, pool: str, **page: int) -> list[Any]:
        return []  # no worker: whichever took a run is gone

    async def read_events(self, filter: EventFilter, limit: int = 100) -> SimpleNamespace:
        held = sorted(
            (event for event in self.events if filter.includes(event)),
            key=lambda event: event.occurred,
            reverse=True,  # newest first, as Prefect answers
        )
        return SimpleNamespace(events=held[:limit])  # a page: what recovery reads of one


def _beat(run: FlowRun, seconds_ago: float, name: str, **payload: Any) -> Event:
    return Event(
        event=name,
        resource={"prefect.resource.id": f"prefect.flow-run.{run.id}"},
        occurred=datetime.now(UTC) - timedelta(seconds=seconds_ago),
        payload=payload,
        id=uuid4(),
    )


def _heartbeats(run: FlowRun, *seconds_ago: float) -> list[Event]:
    return [_beat(run, ago, "prefect.flow-run.heartbeat") for ago in seconds_ago]


def _alive(run: FlowRun, *seconds_ago: float, interval: float = 10.0) -> list[Event]:
    return [_beat(run, ago, ALIVE_EVENT, interval_seconds=interval) for ago in seconds_ago]


async def _lost(monkeypatch: pytest.MonkeyPatch, runs: list[FlowRun], events: list[Event]):
    """Return the runs a watcher under ``AUTO`` finds lost, Prefect holding ``events``."""
    monkeypatch.setattr(recovery, "get_client", lambda: _Prefect(events))
    return await Recovery(AUTO)._gone_silent(runs, AUTO)


async def test_a_run_whose_alive_beats_stopped_is_lost_three_of_them_later(monkeypatch):
    # Before: judged by Prefect's heartbeats alone, each of these was alive for a minute more.
    lost, beating = _running_since(300), _running_since(300)
    events = [
        *_heartbeats(lost, 50, 80),  # every 30 s: alive for 40 s more by those alone
        *_alive(lost, 45, 55, 65),
        *_heartbeats(beating, 50, 80),
        *_alive(beating, 5, 15, 25),
    ]

    assert await _lost(monkeypatch, [lost, beating], events) == [lost]


async def test_a_run_lost_in_its_first_seconds_is_lost_by_its_one_alive_beat(monkeypatch):
    # Before: one heartbeat tells no interval: Prefect's default, 540 s after it.
    run = _running_since(50)
    events = [*_heartbeats(run, 48), *_alive(run, 48)]

    assert await _lost(monkeypatch, [run], events) == [run]


async def test_a_run_silent_since_it_began_whose_worker_is_gone_is_lost_as_soon(monkeypatch):
    # Before: three of Prefect's least heartbeat interval after it began (90 s): a machine lost
    # before the flow function's first beat left the run unsupervised half as long again.
    run, beating = _running_since(45, worker="lost"), _running_since(45, worker="lost")
    events = _alive(beating, 5)

    assert await _lost(monkeypatch, [run, beating], events) == [run]


async def test_an_alive_beat_late_on_a_busy_server_is_no_loss(monkeypatch):
    run = _running_since(300)
    # Three beats missed, but the fourth may be on its way: the clock slack.
    events = [*_heartbeats(run, 50, 80), *_alive(run, 35)]

    assert await _lost(monkeypatch, [run], events) == []


async def test_a_forged_short_interval_makes_no_live_run_look_lost_sooner(monkeypatch):
    run = _running_since(300)
    events = [*_heartbeats(run, 50, 80), *_alive(run, 25, interval=1)]

    assert await _lost(monkeypatch, [run], events) == []


@pytest.mark.parametrize(("beats", "lost"), [((50, 80), False), ((100, 130), True)])
async def test_a_run_that_sends_no_alive_beat_is_judged_by_its_heartbeats(
    monkeypatch, beats: tuple[float, ...], lost: bool
):
    run = _running_since(300)  # from a flow process of an older prefect-ito

    assert await _lost(monkeypatch, [run], _heartbeats(run, *beats)) == ([run] if lost else [])


def _running_since(seconds: float, worker: str | None = None) -> FlowRun:
    """A flow run running for ``seconds``, started by ``worker`` (named as Prefect labels it)."""
    state = Running()
    state.timestamp = datetime.now(UTC) - timedelta(seconds=seconds)
    labels = {}
    if worker is not None:
        labels = {
            "prefect.work-pool.name": "ito-process",
            "prefect.worker.name": worker,
            "prefect.worker.type": "process",
        }
    return FlowRun(id=uuid4(), name="beating", flow_id=uuid4(), state=state, labels=labels)


async def _beats(run_id: UUID, *seconds_ago: float) -> None:
    """Send the run's heartbeats, and wait until Prefect holds them."""
    for ago in seconds_ago:
        emit_event(
            event="prefect.flow-run.heartbeat",
            resource={"prefect.resource.id": f"prefect.flow-run.{run_id}"},
            occurred=datetime.now(UTC) - timedelta(seconds=ago),
        )
    await asyncio.to_thread(EventsWorker.drain_all)
    since = datetime.now(UTC) - timedelta(seconds=max(seconds_ago) + 60)
    async with asyncio.timeout(60), get_client() as client:
        while len(await recovery._latest_beats(client, run_id, since)) < len(seconds_ago):
            await asyncio.sleep(0.5)  # events are stored a moment after they arrive


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Count the calls of one of recovery's questions to Prefect."""
    calls: list[Any] = []
    asked = getattr(recovery, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await asked(*args, **kwargs)

    monkeypatch.setattr(recovery, name, counted)
    return calls


async def test_by_default_a_run_s_beats_are_read_once_until_they_could_lapse(
    prefect_server, monkeypatch
):
    run = _running_since(130)
    await _beats(run.id, 40, 10)  # every 30 s: alive until 80 s from now
    reads = _count(monkeypatch, "_latest_beats")
    watching = Recovery(AUTO)

    for _ in range(3):
        assert await watching._gone_silent([run], AUTO) == []

    assert len(reads) == 1


async def test_a_run_is_asked_about_again_once_its_last_beat_lapsed_and_found_lost(
    prefect_server, monkeypatch
):
    lost_after = 4.0
    run = _running_since(60)
    await _beats(run.id, 0)
    reads = _count(monkeypatch, "_latest_since")
    watching = Recovery(lost_after)

    assert await watching._gone_silent([run], lost_after) == []
    assert await watching._gone_silent([run], lost_after) == []
    assert len(reads) == 1  # the beat read first keeps it alive for lost_after
    await asyncio.sleep(lost_after + 0.5)

    assert await watching._gone_silent([run], lost_after) == [run]
    assert len(reads) == 2
