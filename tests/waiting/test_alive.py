"""The flow process's alive beat: sent every 10 s while it holds its run ``Running``, so that a
run lost with its machine is found within a minute rather than after three of Prefect's 30 s
heartbeats; and what a beat anyone could forge is believed to say."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from flow_helpers import parameters
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events import Event
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventResourceFilter,
)
from prefect.events.worker import EventsWorker
from prefect.states import Completed, Running

from prefect_ito.flows import ito_training
from prefect_ito.simulator import builtin_scenario
from prefect_ito.waiting import alive
from prefect_ito.waiting.alive import ALIVE_EVENT, ALIVE_SECONDS, alive_of


def _beat_of(payload: dict[str, Any]) -> Event:
    resource = {"prefect.resource.id": f"prefect.flow-run.{uuid4()}"}
    return Event(event=ALIVE_EVENT, resource=resource, payload=payload, id=uuid4())


@pytest.mark.parametrize(
    ("payload", "interval"),
    [
        ({"interval_seconds": 10}, 10.0),  # what a flow process names
        ({"interval_seconds": 20.0}, 20.0),
        ({"interval_seconds": 1}, ALIVE_SECONDS),  # forged: no live run looks lost sooner
        ({"interval_seconds": 3600}, 30.0),  # beyond Prefect's least heartbeat: that judges
        ({"interval_seconds": float("nan")}, 30.0),
        ({"interval_seconds": "10"}, 30.0),
        ({}, 30.0),
    ],
)
def test_a_beat_s_interval_is_believed_only_within_what_a_flow_process_sends(
    payload: dict[str, Any], interval: float
):
    assert alive_of(_beat_of(payload)).interval == interval


def test_a_flow_process_beats_while_its_run_runs_and_stops_once_it_does_not(
    monkeypatch: pytest.MonkeyPatch,
):
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(alive, "emit_event", lambda **event: sent.append(event))
    monkeypatch.setattr(alive, "ALIVE_SECONDS", 0.01)
    monkeypatch.setattr(alive, "_TICK", 0.001)
    flow_run = FlowRun(id=uuid4(), name="beating", flow_id=uuid4(), state=Running())
    beating = threading.Thread(target=alive._beat, args=(flow_run,), daemon=True)
    beating.start()
    while len(sent) < 3:
        threading.Event().wait(0.01)

    flow_run.state = Completed()
    beating.join(timeout=60)

    assert not beating.is_alive()
    assert {event["event"] for event in sent} == {ALIVE_EVENT}
    assert {event["resource"]["prefect.resource.id"] for event in sent} == {
        f"prefect.flow-run.{flow_run.id}"
    }
    assert sent[0]["payload"] == {"interval_seconds": alive.ALIVE_SECONDS}


def test_outside_a_flow_run_nothing_beats(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(alive, "emit_event", lambda **event: pytest.fail(f"sent {event}"))
    before = threading.active_count()

    alive.beat_while_running()

    assert threading.active_count() == before


async def test_a_training_flow_run_says_it_is_alive_while_it_runs(prefect_server, start_simulator):
    simulator = start_simulator(builtin_scenario("default"))

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed()
    resource = f"prefect.flow-run.{state.state_details.flow_run_id}"
    await asyncio.to_thread(EventsWorker.drain_all)
    async with asyncio.timeout(60), get_client() as client:
        while not (page := await client.read_events(filter=_beats_of(resource), limit=1)).events:
            await asyncio.sleep(0.5)  # events are stored a moment after they arrive
    beat = alive_of(page.events[0])
    assert beat.interval == ALIVE_SECONDS
    assert beat.at > datetime.now(UTC) - timedelta(minutes=5)


def _beats_of(resource: str) -> EventFilter:
    return EventFilter(
        event=EventNameFilter(name=[ALIVE_EVENT]), resource=EventResourceFilter(id=[resource])
    )
