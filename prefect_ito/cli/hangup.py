"""A ``train`` or ``attach`` whose terminal goes away: the flow run ends, and says so.

A closed window or lost SSH session (SIGHUP) or a termination signal (SIGTERM) stops supervision
as a detach does (:func:`~prefect_ito.waiting.cancellation.request_stop_for_closed_terminal`),
and the flow run ends ``TerminalClosed``: never left paused for nobody, a question it asked left
to others (a spend is never declined), nothing submitted. A second signal ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

from prefect import State, get_client

from prefect_ito.exceptions import TerminalClosed
from prefect_ito.supervision.outcomes import outcome_state
from prefect_ito.waiting.cancellation import (
    closed_terminal_message,
    request_stop_for_closed_terminal,
)

__all__ = [
    "CLOSED_TERMINAL_GRACE_SECONDS",
    "end_without_terminal",
    "stop_when_closed",
    "terminal_went_away",
]


CLOSED_TERMINAL_GRACE_SECONDS = 10.0
"""How long a flow run whose terminal went away has to end by itself (its next check) before
it is stopped here; within the 10 s a container or service manager gives after SIGTERM."""


_SIGNALS_CHECK_SECONDS = 0.2
"""How often the handlers of a closed terminal are checked to still be this module's."""


@contextlib.contextmanager
def stop_when_closed(closed: asyncio.Event) -> Iterator[None]:
    """Turn the first SIGHUP or SIGTERM into a stop of the flow run; a second ends at once."""
    loop = asyncio.get_running_loop()
    caught = (signal.SIGHUP, signal.SIGTERM)

    def went_away(signum: signal.Signals) -> None:
        for each in caught:
            loop.remove_signal_handler(each)
        terminal_went_away(closed, signum.name)

    def handle() -> None:
        for each in caught:
            loop.add_signal_handler(each, went_away, each)

    try:
        handle()
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        yield
        return
    keeping = asyncio.ensure_future(_keep_handling(closed, handle))
    try:
        yield
    finally:
        keeping.cancel()
        for each in caught:
            loop.remove_signal_handler(each)


async def _keep_handling(closed: asyncio.Event, handle: Callable[[], None]) -> None:
    """Take SIGTERM back from Prefect's flow engine, which installs its own when a flow starts.

    Prefect's raises ``TerminationSignal`` in whatever runs when it comes: here, the event loop
    itself, which would end the command with a traceback and leave the flow run paused. Nothing
    but a runner uses that signal to cancel a flow run, and this flow run has none.
    """
    wakeup = signal.getsignal(signal.SIGHUP)  # asyncio's own, which it left in place
    while not closed.is_set():
        if signal.getsignal(signal.SIGTERM) is not wakeup:
            handle()
        await asyncio.sleep(_SIGNALS_CHECK_SECONDS)


def terminal_went_away(closed: asyncio.Event, how: str) -> None:
    request_stop_for_closed_terminal(how)
    closed.set()


async def end_without_terminal(running: asyncio.Future[Any], flow_run_id: UUID) -> State[Any]:
    """Return the flow run's final state once its terminal went away.

    The flow stops at its next check (between polls, while it waits for a person) and ends
    ``TerminalClosed``. One that does not within :data:`CLOSED_TERMINAL_GRACE_SECONDS` (a
    request under way) is stopped here, and its flow run set to the same state, so that nothing
    is left ``Paused`` or ``Running`` for nobody.
    """
    try:
        async with asyncio.timeout(CLOSED_TERMINAL_GRACE_SECONDS):
            state = await asyncio.shield(running)
    except TimeoutError:
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        state = outcome_state(TerminalClosed(closed_terminal_message()))
        async with get_client() as client:
            await client.set_flow_run_state(flow_run_id, state, force=True)
    assert isinstance(state, State)
    return state
