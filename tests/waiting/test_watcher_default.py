"""The watcher's default for lost runs: each run judged by what it reports itself, never by the
watcher's own heartbeat setting (a watcher without ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30`` beside
workers with it waited 540 s for a run lost while its worker was starting it)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from flow_helpers import BOOKING, REQUEST, training_deployment
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events import emit_event
from prefect.events.worker import EventsWorker
from prefect.states import Pending, Running

from prefect_ito.parameters import TrainingParameters
from prefect_ito.waiting.recovery import (
    AUTO,
    DEFAULT_HEARTBEAT_SECONDS,
    _latest_beats,
    _missed_beats,
    heartbeat_interval,
    worker_started_since,
)
from prefect_ito.waiting.watcher import Watcher

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _ago(*seconds: float) -> list[datetime]:
    return [NOW - timedelta(seconds=s) for s in seconds]


@pytest.mark.parametrize(
    ("beats", "interval"),
    [
        ([], DEFAULT_HEARTBEAT_SECONDS),  # not beaten yet: Prefect's default
        (_ago(10), DEFAULT_HEARTBEAT_SECONDS),  # the first beat comes as it starts running
        (_ago(10, 40, 70), 30.0),  # a process told to beat every 30 s
        (_ago(10, 190), 180.0),
        (_ago(1, 2, 3, 183), 180.0),  # beats someone else sent shorten gaps: the longest counts
        (_ago(1, 2, 3), 30.0),  # never below Prefect's least
    ],
)
def test_a_runs_interval_is_read_from_its_own_beats(beats: list[datetime], interval: float):
    assert heartbeat_interval(beats) == interval


def test_the_default_judges_each_run_by_its_own_heartbeats(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "30")  # the watcher's: not asked

    assert Watcher().recovery.lost_after == AUTO


def _running_since(seconds: float) -> FlowRun:
    state = Running()
    state.timestamp = datetime.now(UTC) - timedelta(seconds=seconds)
    return FlowRun(id=uuid4(), name="lost-or-not", flow_id=uuid4(), state=state)


async def _beat(run_id: UUID, seconds_ago: float) -> None:
    emit_event(
        event="prefect.flow-run.heartbeat",
        resource={"prefect.resource.id": f"prefect.flow-run.{run_id}"},
        occurred=datetime.now(UTC) - timedelta(seconds=seconds_ago),
    )


async def test_a_running_run_is_lost_after_three_of_its_own_intervals(prefect_server):
    # Beats every 30 s, silent for 100 s: lost, although Prefect's default interval is 180 s.
    fast = _running_since(130)
    # Beats every 180 s, silent for 220 s: alive, although the other beats every 30 s.
    slow = _running_since(400)
    # One beat, 200 s ago: its interval is not known yet, so Prefect's default holds.
    young = _running_since(200)
    for run, beats in ((fast, (130, 100)), (slow, (400, 220)), (young, (200,))):
        for seconds_ago in beats:
            await _beat(run.id, seconds_ago)
    await asyncio.to_thread(EventsWorker.drain_all)
    async with asyncio.timeout(60), get_client() as client:
        since = datetime.now(UTC) - timedelta(seconds=500)
        while (
            len(await _latest_beats(client, young.id, since)) < 1
            or len(await _latest_beats(client, slow.id, since)) < 2
        ):
            await asyncio.sleep(0.5)  # events are stored a moment after they arrive

    assert (await _missed_beats([fast, slow, young])).lost == [fast]


def _taken_by(run: FlowRun, pool: str, worker: str) -> FlowRun:
    labels = {
        "prefect.worker.name": worker,
        "prefect.worker.type": "process",
        "prefect.work-pool.name": pool,
    }
    return run.model_copy(update={"labels": labels})


async def test_a_run_with_one_beat_whose_worker_is_gone_is_lost_after_three_of_the_least(
    prefect_server,
):
    # Found on the shipped defaults: a machine lost in a run's first seconds of running left it
    # unsupervised for nine minutes, since one beat tells no interval and Prefect's default is
    # 180 s. Its worker's silence says the process is gone with it.
    pool = "watcher-default-orphans"
    await training_deployment(pool)  # the pool, with a deployment in it
    async with get_client() as client:
        await client.send_worker_heartbeat(pool, "alive", heartbeat_interval_seconds=30)
    orphan = _taken_by(_running_since(120), pool, "gone-with-its-machine")
    kept = _taken_by(_running_since(120), pool, "alive")
    unnamed = _running_since(120)
    for run in (orphan, kept, unnamed):
        await _beat(run.id, 115)  # the beat as it starts running, then silence
    await asyncio.to_thread(EventsWorker.drain_all)
    async with asyncio.timeout(60), get_client() as client:
        since = datetime.now(UTC) - timedelta(seconds=500)
        for run in (orphan, kept, unnamed):
            while not await _latest_beats(client, run.id, since):
                await asyncio.sleep(0.5)  # events are stored a moment after they arrive

    assert (await _missed_beats([orphan, kept, unnamed])).lost == [orphan]


@pytest.mark.parametrize("named", [True, False], ids=["named", "not-named-yet"])
async def test_a_run_left_starting_by_a_worker_started_again_is_lost_at_once(
    prefect_server, named: bool
):
    # Found by a trial on the shipped defaults: a run the lost machine's worker was starting read
    # `Submitting` nine minutes later, although a worker came back under the same name at once.
    # A worker names itself on the run a moment after it marks it Pending: lost in between (seen
    # under load), the run names no worker, and its pool's only worker came back since.
    pool = f"watcher-default-{'named' if named else 'unnamed'}"
    deployment = await training_deployment(pool)
    async with get_client() as client:
        training = TrainingParameters(**{**REQUEST, "booking": BOOKING})
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": training.model_dump(mode="json")}
        )
        await client.send_worker_heartbeat(pool, "come-back", heartbeat_interval_seconds=30)
        await client.set_flow_run_state(flow_run.id, Pending(), force=True)
        if named:
            await client.update_flow_run_labels(
                flow_run.id,
                {
                    "prefect.worker.name": "come-back",
                    "prefect.worker.type": "process",
                    "prefect.work-pool.name": pool,
                },
            )
        starting = await client.read_flow_run(flow_run.id)
    emit_event(  # what a worker says when it starts
        event="prefect.worker.started",
        resource={
            "prefect.resource.id": "prefect.worker.process.come-back",
            "prefect.resource.name": "come-back",
        },
    )
    await asyncio.to_thread(EventsWorker.drain_all)
    assert starting.state is not None and starting.state.timestamp is not None
    async with asyncio.timeout(60):
        while not await worker_started_since("process", "come-back", starting.state.timestamp):
            await asyncio.sleep(0.5)
    async with get_client() as client:
        await client.send_worker_heartbeat(
            pool, "come-back", heartbeat_interval_seconds=30
        )  # alive, under the same name

    watcher = Watcher()

    await watcher.recovery.recover()

    async with get_client() as client:
        now = await client.read_flow_run(flow_run.id)
    assert flow_run.id in watcher.recovered and now.state_name == "Recovering"
