"""A flow run's relay of backend events into Prefect: sent until Prefect holds each one.

An emitted event can be lost on its way: Prefect's events client drops what it had not sent
when its process dies, and a Prefect server that stops keeps only what it had written (it writes
the events it receives every few seconds). A flow run stores how far it relayed (a deferral's
record) and ends when its backend run ends, so its cursor must never pass an event Prefect does
not hold: :func:`relay_held` reads the relayed events back by id, and the cursor stops before
the first one missing. An event still missing a while after it was sent is sent again, under
the same id (:func:`~prefect_ito.reporting.report.event_id`), so Prefect keeps it once whatever
arrives twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from uuid import UUID

import httpx
from prefect import get_client
from prefect.events.filters import EventFilter, EventIDFilter, EventResourceFilter
from prefect.exceptions import PrefectHTTPStatusError

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import EventPage, TrainingRun
from prefect_ito.reporting.report import EVENT_NAMES, event_id, relay_events

__all__ = ["relay_held", "settle"]

logger = logging.getLogger("prefect_ito.reporting.event_relay")

RESEND_AFTER_SECONDS = 10.0
"""How long a sent event may be missing in Prefect before it is sent again: longer than Prefect
takes to write what it received."""
SETTLE_PAUSES = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0)
"""The pauses between the last reads of a finished run's events (about half a minute in all)."""
_PAGE = 50
"""Prefect answers at most 50 events a page."""

_sent: dict[str, dict[int, float]] = {}
"""Per backend run, when this process last sent each event Prefect was not yet seen to hold."""


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
    page = await client.list_events(run.run_id, after=after_seq)
    sent = _sent.setdefault(run.run_id, {})
    now = time.monotonic()
    due = [
        e
        for e in page.events
        if now - sent.get(e.seq, -RESEND_AFTER_SECONDS) >= RESEND_AFTER_SECONDS
    ]
    relay_events(run, due)
    sent.update({event.seq: now for event in due})
    held_through, complete = await _held_through(run.run_id, page, after_seq)
    for seq in [seq for seq in sent if seq <= held_through]:
        del sent[seq]
    return held_through, complete


async def _held_through(run_id: str, page: EventPage, after_seq: int) -> tuple[int, bool]:
    """Return the seq before the first relayed event of ``page`` Prefect does not hold (or the
    page's end), and whether it holds them all."""
    relayed = sorted((e for e in page.events if e.type in EVENT_NAMES), key=lambda e: e.seq)
    held = await _held_ids(run_id, [event_id(run_id, event.seq) for event in relayed])
    for event in relayed:
        if event_id(run_id, event.seq) not in held:
            return max(after_seq, event.seq - 1), False
    return max(after_seq, page.last_seq), True


async def _held_ids(run_id: str, ids: list[UUID]) -> set[UUID]:
    """Return which of ``ids`` Prefect holds for the backend run (none, if it cannot say)."""
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
        return set()
    return held
