"""A flow run's relay of backend events into Prefect: sent until Prefect holds each one.

An emitted event can be lost on its way: Prefect's events client drops what it had not sent
when its process dies, and a Prefect server that stops keeps only what it had written (it writes
the events it receives every few seconds). A flow run stores how far it relayed (a deferral's
record) and ends when its backend run ends, so its cursor must never pass an event Prefect does
not hold: :func:`relay_held` reads the relayed events back by id, and the cursor stops before
the first one missing.

An event still missing a while after it was sent is sent again, under the same id
(:func:`~prefect_ito.reporting.report.event_id`), so Prefect keeps it once whatever arrives
twice. But a Prefect server that received an event and then failed to write it refuses that id
for five minutes (see :data:`~prefect_ito.reporting.report.COPIES`): an event sent twice and
still missing is issued again as its next copy, under an id of its own. Every copy names the
backend event (``backend_seq``), and any copy Prefect holds counts, whichever process sent it.
Prefect holds two copies of one event only if it wrote one more than twenty seconds late. A
Prefect that cannot say what it holds gets the same copy again, never a new one: it may hold it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from uuid import UUID

import httpx
from prefect import get_client
from prefect.events.filters import EventFilter, EventIDFilter, EventResourceFilter
from prefect.exceptions import PrefectHTTPStatusError

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import RunEvent, TrainingRun
from prefect_ito.reporting.report import COPIES, EVENT_NAMES, event_id, relay_events

__all__ = ["relay_held", "settle"]

logger = logging.getLogger("prefect_ito.reporting.event_relay")

RESEND_AFTER_SECONDS = 10.0
"""How long a sent event may be missing in Prefect before it is sent again: longer than Prefect
takes to write what it received."""
SENDINGS_PER_COPY = 2
"""How often one copy of an event is sent before the next copy is issued: the second sending
mends a loss on the way to Prefect; only a loss inside Prefect needs a new id."""
SETTLE_PAUSES = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 13.0, 13.0)
"""The pauses between the last reads of a finished run's events (about a minute in all, time
for an event first sent now to be sent twice and then issued as its second copy)."""
_PAGE = 50
"""Prefect answers at most 50 events a page."""


@dataclass(frozen=True)
class _Sent:
    """How this process last sent one event Prefect was not yet seen to hold."""

    at: float
    copy: int
    sendings: int


_sent: dict[str, dict[int, _Sent]] = {}
"""Per backend run and seq, the events this process sent that Prefect was not yet seen to hold."""


async def relay_held(client: ItoClient, run: TrainingRun, after_seq: int) -> int:
    """Relay the run's events after ``after_seq``; return the seq through which Prefect holds
    every relayed one."""
    held_through, _ = await _relay(client, run, after_seq)
    return held_through


async def settle(client: ItoClient, run: TrainingRun, after_seq: int) -> tuple[int, bool]:
    """Relay a finished run's events until Prefect holds all of them, or the pauses ran out.

    Returns:
        The seq through which Prefect holds every relayed event, and whether that is all.
    """
    after_seq, complete = await _relay(client, run, after_seq)
    for pause in SETTLE_PAUSES:
        if complete:
            break
        await asyncio.sleep(pause)
        after_seq, complete = await _relay(client, run, after_seq)
    return after_seq, complete


async def _relay(client: ItoClient, run: TrainingRun, after_seq: int) -> tuple[int, bool]:
    """Send the run's relayed events after ``after_seq`` that Prefect lacks and that are due;
    return the seq before the first one it lacks (or the page's end), and whether it lacks none."""
    page = await client.list_events(run.run_id, after=after_seq)
    relayed = sorted((e for e in page.events if e.type in EVENT_NAMES), key=lambda e: e.seq)
    copies = {e.seq: [event_id(run.run_id, e.seq, c) for c in range(COPIES)] for e in relayed}
    held = await _held_ids(run.run_id, [id_ for ids in copies.values() for id_ in ids])
    missing = [e for e in relayed if held is None or held.isdisjoint(copies[e.seq])]
    # Only Prefect saying it lacks an event justifies a new copy: one that cannot say may hold it.
    _send(run, missing, new_copies=held is not None)
    if missing:
        return max(after_seq, missing[0].seq - 1), False
    return max(after_seq, page.last_seq), True


def _send(run: TrainingRun, missing: list[RunEvent], *, new_copies: bool) -> None:
    """Send those of ``missing`` that are due, and forget the events Prefect now holds."""
    sent = _sent.get(run.run_id, {})
    now = time.monotonic()
    due = {
        e.seq: sending
        for e in missing
        if (sending := _next_sending(sent.get(e.seq), now, new_copies)) is not None
    }
    relay_events(run, [e for e in missing if e.seq in due], {s: d.copy for s, d in due.items()})
    if missing:
        _sent[run.run_id] = {e.seq: due.get(e.seq) or sent[e.seq] for e in missing}
    else:
        _sent.pop(run.run_id, None)


def _next_sending(last: _Sent | None, now: float, new_copies: bool = True) -> _Sent | None:
    """Return how to send an event now, given how it was last sent (``None``: not due yet)."""
    if last is None:
        return _Sent(at=now, copy=0, sendings=1)
    if now - last.at < RESEND_AFTER_SECONDS:
        return None
    if not new_copies:
        return replace(last, at=now)  # a sending that counts for nothing
    copy = min(last.sendings // SENDINGS_PER_COPY, COPIES - 1)
    return _Sent(at=now, copy=copy, sendings=last.sendings + 1)


async def _held_ids(run_id: str, ids: list[UUID]) -> set[UUID] | None:
    """Return which of ``ids`` Prefect holds for the backend run (``None``: it cannot say)."""
    held: set[UUID] = set()
    try:
        async with get_client() as client:
            for start in range(0, len(ids), _PAGE):
                page = await client.read_events(
                    filter=EventFilter(
                        id=EventIDFilter(id=ids[start : start + _PAGE]),
                        resource=EventResourceFilter(id=[f"ito.training-run.{run_id}"]),
                    ),
                    limit=_PAGE,
                )
                held |= {event.id for event in page.events}
    except (httpx.HTTPError, PrefectHTTPStatusError) as error:
        # Only a check: a Prefect that cannot answer now must never stop supervision. Nothing
        # counts as held, so the events are sent and checked again next time.
        logger.debug("Could not read back the events of run %s: %s", run_id, error)
        return None
    return held
