"""Asking a person through a Prefect pause or suspension, and reading the answer back.

A restart and a spend are both decided by people, through a typed :class:`~prefect.input.RunInput`
form the Prefect UI renders on the **Resume** button. The flow (never a subflow: Prefect cannot
suspend subflows) asks with :func:`ask`:

- A flow run from a deployment (and no subflow) **suspends**: it holds no process while a person
  thinks. Resuming runs the flow again from the top, where the stable pause key hands back the
  stored answer (:func:`stored_answer`) without asking, or logging that it waits, a second time.
- Any other flow run **pauses in-process**, watching for a cancellation, and gives up
  :data:`PAUSE_MARGIN_SECONDS` before Prefect's own deadline, after which the server would turn
  any final state into "never resumed".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from prefect.flow_runs import apause_flow_run, asuspend_flow_run
from prefect.input import RunInput
from prefect.input.actions import aread_flow_run_input
from prefect.input.run_input import keyset_from_base_key

from prefect_ito.cancellation import stop_requested
from prefect_ito.exceptions import ItoError
from prefect_ito.flow_run import can_suspend

__all__ = ["PAUSE_MARGIN_SECONDS", "ask", "stored_answer"]

PAUSE_MARGIN_SECONDS = 5.0
"""How long before Prefect's own pause deadline an in-process wait gives up by itself."""

F = TypeVar("F", bound=RunInput)


async def ask(
    form: type[F],
    *,
    key: str,
    description: str,
    timeout: float,
    poll_interval: float,
    waiting: Callable[[], None],
    timed_out: Callable[[], ItoError],
    initial: dict[str, Any] | None = None,
) -> F | None:
    """Wait for a person's answer on ``form``; None if the flow run was cancelled meanwhile.

    Args:
        form: The form a person fills in.
        key: The pause key: stable across re-entries, letters, digits and dashes.
        description: The markdown a person reads above the form.
        timeout: Seconds a person has to answer.
        poll_interval: Seconds between checks for an answer or a cancellation.
        waiting: Called once when the flow starts to wait (not again after a resumed
            suspension): says so in the flow's log.
        timed_out: Returns the error to raise when nobody answered in time.
        initial: Values the form shows filled in.

    Raises:
        ItoError: what ``timed_out`` returns, when nobody answered in time (in-process only; a
            suspended run is failed by Prefect's server at the deadline).
    """
    suspending = can_suspend()
    if suspending and (answer := await stored_answer(form, key)) is not None:
        return answer  # resumed: asking (and logging that it waits) again would mislead
    waiting()
    prefilled = form.with_initial_data(description=description, **(initial or {}))
    if suspending:
        return await asuspend_flow_run(wait_for_input=prefilled, timeout=int(timeout), key=key)
    pause = asyncio.ensure_future(
        apause_flow_run(
            wait_for_input=prefilled,
            timeout=int(timeout),
            poll_interval=max(1, int(poll_interval)),
            key=key,
        )
    )
    try:
        return await _first_of(pause, poll_interval, max(0.0, timeout - PAUSE_MARGIN_SECONDS))
    except TimeoutError:
        raise timed_out() from None
    finally:
        pause.cancel()


async def stored_answer(form: type[F], key: str) -> F | None:
    """Return the answer a person already gave to the suspension under ``key``, if any.

    A resumed suspension runs the flow again from the top. Prefect's own ``suspend_flow_run``
    would hand the stored answer back too, but only after logging "Suspending flow run" and
    proposing a suspension the server then refuses.
    """
    keyset = keyset_from_base_key(f"suspended-{key}")
    stored = await aread_flow_run_input(key=keyset["response"])
    return None if stored is None else form.model_validate(stored)


async def _first_of(
    pause: asyncio.Future[F], poll_interval: float, give_up_after: float
) -> F | None:
    async with asyncio.timeout(give_up_after):
        while True:
            done, _ = await asyncio.wait({pause}, timeout=poll_interval)
            if done:
                return pause.result()
            if await stop_requested(None):
                return None
