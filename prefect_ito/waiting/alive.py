"""The flow process's alive beat: sent by the training flows, read by recovery.

Prefect's own flow-run heartbeat comes at most every 30 s (its least
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``), and a run only counts as lost once it missed three of
them, so a run whose machine was lost is found after 90 s at best. A prefect-ito flow process
also says it is alive every :data:`ALIVE_SECONDS`, as an event of its flow run that names its
interval, for as long as it holds the run ``Running``; recovery
(:mod:`prefect_ito.waiting.recovery`) finds such a run lost three of these beats after the last.

Anyone who can write to Prefect can send such an event: it can only keep a run looking alive
(as a forged Prefect heartbeat can), never submit, decide or resume anything; the interval it
names is only believed between :data:`ALIVE_SECONDS` and Prefect's least heartbeat interval.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from datetime import datetime
from typing import Final, NamedTuple

from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.events import Event, emit_event

__all__ = ["ALIVE_EVENT", "ALIVE_SECONDS", "Alive", "alive_of", "beat_while_running"]

logger = logging.getLogger(__name__)

ALIVE_EVENT: Final = "prefect-ito.flow-run.alive"
"""The beat's event; its resource is the flow run's (``prefect.flow-run.<id>``)."""
ALIVE_SECONDS: Final = 10.0
"""How often a flow process beats, and the shortest interval a beat is believed to name."""
_LONGEST_SECONDS: Final = 30.0
"""The longest interval a beat is believed to name: Prefect's least heartbeat interval, which
judges the run where the alive beat would not do better."""
_INTERVAL: Final = "interval_seconds"
_TICK = 1.0
"""How soon the beat stops once the run is no longer ``Running`` here."""


class Alive(NamedTuple):
    """A flow process's latest alive beat: when it occurred, and the interval it named."""

    at: datetime
    interval: float


def alive_of(event: Event) -> Alive:
    """Read an alive beat, believing its interval only within the bounds a flow process uses:
    a forged beat may keep a run looking alive, never make one look lost sooner."""
    named = event.payload.get(_INTERVAL)
    interval = float(named) if isinstance(named, int | float) else _LONGEST_SECONDS
    if interval != interval:  # nan names no interval
        interval = _LONGEST_SECONDS
    return Alive(event.occurred, min(max(interval, ALIVE_SECONDS), _LONGEST_SECONDS))


def beat_while_running() -> None:
    """Beat for the flow run this code runs in, from a thread, while this process holds it
    ``Running``.

    A thread, as Prefect's heartbeat is: it beats while the event loop is busy. It stops once
    the state this process holds is another (completed, failed, suspended) or the process ends;
    it goes on past the flow function's return until the engine recorded how the run ended,
    which on a busy server may take a while. Outside a flow run it does nothing.
    """
    context = FlowRunContext.get()
    flow_run = context.flow_run if context else None
    if flow_run is None:
        return
    # The thread sees this context's settings (its PREFECT_API_URL), as Prefect's heartbeat does.
    beats = contextvars.copy_context()
    thread = threading.Thread(
        target=beats.run, args=(_beat, flow_run), name="prefect-ito-alive", daemon=True
    )
    thread.start()


def _beat(flow_run: FlowRun) -> None:
    """Send a beat every :data:`ALIVE_SECONDS` while ``flow_run`` (the engine's own record,
    which it updates as it sets states) reads ``Running``."""
    while _running(flow_run):
        try:
            emit_event(
                event=ALIVE_EVENT,
                resource={"prefect.resource.id": f"prefect.flow-run.{flow_run.id}"},
                payload={_INTERVAL: ALIVE_SECONDS},
            )
        except Exception:  # a beat lost is a beat missed: never the flow's failure
            logger.debug("An alive beat was not sent", exc_info=True)
        for _ in range(int(ALIVE_SECONDS / _TICK)):
            time.sleep(_TICK)
            if not _running(flow_run):
                return


def _running(flow_run: FlowRun) -> bool:
    return flow_run.state is not None and flow_run.state.is_running()
