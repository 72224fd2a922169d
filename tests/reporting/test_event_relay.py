"""Every backend event the flow relays is in Prefect when the flow run ends, even one lost.

An event can be lost on its way: Prefect's events client drops what it had not sent when its
process dies, and a Prefect server that stops keeps only what it had written. The crash trials
saw a run's last two events lost so, after its flow run had completed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from flow_helpers import backend_events, parameters
from prefect import get_client

from prefect_ito.flows import ito_training
from prefect_ito.reporting import event_relay
from prefect_ito.reporting import report as reporting


async def held_events(resource_id: str, ids: set[str], timeout: float = 20) -> set[str]:
    """Return which of ``ids`` Prefect holds for ``resource_id``, waiting a while for the flush."""
    body = {"filter": {"resource": {"id": [resource_id]}}, "limit": 50}
    held: set[str] = set()
    async with get_client() as client:
        deadline = asyncio.get_running_loop().time() + timeout
        while not ids <= held and asyncio.get_running_loop().time() < deadline:
            response = await client._client.post("/events/filter", json=body)
            response.raise_for_status()
            held = {event["id"] for event in response.json()["events"]}
            await asyncio.sleep(1)
    return held & ids


@pytest.mark.parametrize("lost", ["ito.training.submitted", "ito.training.finished"])
async def test_an_event_lost_on_its_way_is_sent_again_before_the_flow_run_ends(
    start_simulator, monkeypatch, lost
):
    simulator = start_simulator("default")
    dropped: list[Any] = []
    send = reporting.emit_event

    def lossy(**event: Any) -> Any:
        if event["event"] == lost and not dropped:
            dropped.append(event["id"])  # the first sending of this event never arrives
            return None
        return send(**event)

    monkeypatch.setattr(reporting, "emit_event", lossy)
    # The suite's servers write what they receive every half second (tests/conftest.py), not
    # every five: two seconds missing is long enough to send an event again here.
    monkeypatch.setattr(event_relay, "RESEND_AFTER_SECONDS", 2.0)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    run_id = simulator.runs()[0].run.run_id
    expected = set(await backend_events(simulator, run_id))
    assert dropped and str(dropped[0]) in expected
    assert await held_events(f"ito.training-run.{run_id}", expected) == expected


async def test_a_prefect_that_cannot_say_what_it_holds_never_stops_the_flow_run(
    start_simulator, monkeypatch
):
    # Reading the events back is a check: when Prefect's events API fails, nothing counts as
    # held, the events are sent again, and the flow run carries on to its end.
    from prefect.client.orchestration import PrefectClient

    simulator = start_simulator("default")

    async def unavailable(self: Any, **_: Any) -> Any:
        raise httpx.ConnectError("events API down")

    monkeypatch.setattr(PrefectClient, "read_events", unavailable)
    monkeypatch.setattr(event_relay, "SETTLE_PAUSES", (0.1, 0.1))

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
