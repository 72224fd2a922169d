"""Every backend event the flow relays is in Prefect when the flow run ends, even one lost.

An event can be lost on its way: Prefect's events client drops what it had not sent when its
process dies, and a Prefect server that stops keeps only what it had written. The crash trials
saw a run's last two events lost so, after its flow run had completed; and later three events
a Prefect server had received and not written, which it then refused to take again by their ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import UUID

import httpx
import pytest
from flow_helpers import backend_events, parameters, prefect_events, relayed_events

from prefect_ito.blocks import ItoCredentials
from prefect_ito.flows import ito_training
from prefect_ito.reporting import event_relay
from prefect_ito.reporting import report as reporting


class Emitted:
    """Stands in for ``emit_event`` in the relay: records every sending as (name, id), and lets
    through to Prefect only those ``arrives`` allows (given the sendings so far, this one last)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        arrives: Callable[[list[tuple[str, UUID]]], bool] = lambda _: True,
    ) -> None:
        self.sendings: list[tuple[str, UUID]] = []
        self._send = reporting.emit_event
        self._arrives = arrives
        monkeypatch.setattr(reporting, "emit_event", self)

    def __call__(self, **event: Any) -> Any:
        self.sendings.append((event["event"], event["id"]))
        return self._send(**event) if self._arrives(self.sendings) else None

    def ids(self, name: str | None = None) -> list[UUID]:
        """Return the ids sent, in order (of events named ``name`` only, if given)."""
        return [id_ for sent, id_ in self.sendings if name in (None, sent)]


def ids_of(events: list[dict[str, Any]]) -> set[str]:
    return {event["id"] for event in events}


def copies(events: list[dict[str, Any]]) -> Counter[int]:
    """Count the copies of each backend event (by seq) among Prefect's events."""
    return Counter(e["payload"]["backend_seq"] for e in events if "backend_seq" in e["payload"])


@pytest.mark.parametrize("lost", ["ito.training.submitted", "ito.training.finished"])
async def test_an_event_lost_on_its_way_is_sent_again_before_the_flow_run_ends(
    start_simulator, monkeypatch, lost
):
    simulator = start_simulator("default")

    def after_the_first(sendings: list[tuple[str, UUID]]) -> bool:
        name, _ = sendings[-1]  # the first sending of this event never arrives
        return name != lost or [sent for sent, _ in sendings].count(lost) > 1

    emitted = Emitted(monkeypatch, after_the_first)
    # The suite's servers write what they receive every half second (tests/conftest.py), not
    # every five: two seconds missing is long enough to send an event again here.
    monkeypatch.setattr(event_relay, "RESEND_AFTER_SECONDS", 2.0)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    run_id = simulator.runs()[0].run.run_id
    expected = set(await backend_events(simulator, run_id))
    assert str(emitted.ids(lost)[0]) in expected
    events = await prefect_events(run_id, lambda events: expected <= ids_of(events), timeout=20)
    assert ids_of(events) & expected == expected


def test_an_event_is_sent_twice_as_each_copy_and_at_most_every_ten_seconds():
    wait = event_relay.RESEND_AFTER_SECONDS
    sent = event_relay._next_sending(None, 0.0)
    assert sent is not None
    copies = [sent.copy]
    for sending in range(1, 8):
        assert event_relay._next_sending(sent, sending * wait - 0.1) is None  # not due yet
        sent = event_relay._next_sending(sent, sending * wait)
        assert sent is not None
        copies.append(sent.copy)
    assert copies == [0, 0, 1, 1, 2, 2, 2, 2]  # the last of the three copies is sent again

    # Sendings while Prefect could not say what it holds count for nothing.
    first = event_relay._next_sending(None, 0.0)
    assert first is not None
    blind = event_relay._next_sending(first, wait, new_copies=False)
    assert blind is not None and (blind.copy, blind.sendings) == (0, 1)
    after = event_relay._next_sending(blind, 2 * wait)
    assert after is not None and (after.copy, after.sendings) == (0, 2)


async def test_an_event_prefect_received_and_lost_is_issued_again_under_an_id_of_its_own(
    start_simulator, monkeypatch
):
    # A Prefect server that received an event and failed to write it refuses its id for five
    # minutes (its in-memory de-duplication runs before its writer): modelled here by dropping
    # every sending of that event's first id, however often it is sent.
    simulator = start_simulator("default")
    finished = "ito.training.finished"

    def refused_by_id(sendings: list[tuple[str, UUID]]) -> bool:
        name, id_ = sendings[-1]
        return name != finished or id_ != next(i for sent, i in sendings if sent == finished)

    emitted = Emitted(monkeypatch, refused_by_id)
    monkeypatch.setattr(event_relay, "RESEND_AFTER_SECONDS", 2.0)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    run = simulator.runs()[0].run
    relayed, last_seq = await relayed_events(simulator, run.run_id)
    seqs = {e.seq for e in relayed}
    events = await prefect_events(run.run_id, lambda events: seqs <= set(copies(events)), 20)
    assert copies(events) == Counter(dict.fromkeys(seqs, 1))  # once each, the lost one a copy
    lost, *later = emitted.ids(finished)
    assert later[0] == lost and lost not in later[1:]  # sent twice, then as a copy

    # A process that relays the run again (its flow run re-entered) counts the copy Prefect
    # holds: it sends nothing, so Prefect never holds the event twice.
    event_relay._sent.clear()
    emitted.sendings.clear()
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        held_through = await event_relay.relay_held(client, run, 0)
    assert held_through == last_seq
    assert emitted.sendings == []


async def test_a_prefect_that_cannot_say_what_it_holds_never_stops_the_flow_run(
    start_simulator, monkeypatch
):
    # Reading the events back is a check: when Prefect's events API fails, nothing counts as
    # held, the events are sent again, and the flow run carries on to its end. Never as a new
    # copy, though: a Prefect that cannot say may hold the event, and would then hold it twice.
    from prefect.client.orchestration import PrefectClient

    simulator = start_simulator("default")
    emitted = Emitted(monkeypatch)

    async def unavailable(self: Any, **_: Any) -> Any:
        raise httpx.ConnectError("events API down")

    monkeypatch.setattr(PrefectClient, "read_events", unavailable)
    monkeypatch.setattr(event_relay, "RESEND_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(event_relay, "SETTLE_PAUSES", (0.1,) * 6)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    run_id = simulator.runs()[0].run.run_id
    first_copies = {UUID(id_) for id_ in await backend_events(simulator, run_id)}
    assert len(emitted.sendings) > 2 * len(first_copies)  # sent again and again
    assert set(emitted.ids()) == first_copies


async def test_events_a_colleague_writes_under_the_relay_s_ids_change_nothing_the_flow_decides(
    start_simulator, monkeypatch
):
    # A colleague with Prefect API access (no Itô token) writes events of their own under the
    # ids the relay would use for later copies of the run's events, as soon as the run has an id.
    # Prefect keeps the first event of an id, and the relay counts any copy held, so theirs
    # stands in Prefect's feed for those events: the relay reads nothing else from them. The
    # run's outcome, stages and gates come from the backend alone.
    from prefect import get_client as prefect_client

    simulator = start_simulator("default")
    forged: set[str] = set()

    def forge_once(sendings: list[tuple[str, UUID]]) -> bool:
        if not forged:
            run_id = simulator.runs()[0].run.run_id
            events = [
                {
                    "id": str(reporting.event_id(run_id, seq, 1)),
                    "occurred": "2026-12-04T00:00:00Z",
                    "event": "ito.training.finished",
                    "resource": {"prefect.resource.id": f"ito.training-run.{run_id}"},
                    "payload": {"message": "forged: the run failed", "backend_seq": seq},
                }
                for seq in range(2, 60)
            ]
            with prefect_client(sync_client=True) as client:
                client._client.post("/events", json=events).raise_for_status()
            forged.update(event["id"] for event in events)
        return True

    Emitted(monkeypatch, forge_once)

    state = await ito_training(**parameters(simulator, post_training="rlvr"), return_state=True)

    assert state.is_completed(), state.message
    summary = await state.aresult()
    run = simulator.runs()[0].run
    assert summary.run_id == run.run_id and summary.state is run.state
    assert [stage.name for stage in summary.stages] == [stage.name for stage in run.stages]
    assert summary.gates and all(row["pass"] for row in summary.gates)
    assert forged  # they did write, under ids the relay counts
