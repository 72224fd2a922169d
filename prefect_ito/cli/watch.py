"""``prefect-ito watch``: the watcher, started like ``prefect worker start``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Annotated

from cyclopts import Parameter

from prefect_ito.cli.errors import exit_with, require_positive, run_command
from prefect_ito.cli.terminal import has_real_server
from prefect_ito.exceptions import PrefectServerRequired
from prefect_ito.people import notices
from prefect_ito.waiting.recovery import AUTO
from prefect_ito.waiting.watcher import Watcher

__all__ = ["watch"]


def watch(
    *,
    wait: Annotated[
        float, Parameter(help="Seconds one long-poll may wait for a change (above 0).")
    ] = 30,
    max_concurrency: Annotated[
        int, Parameter(help="Long-polls at once on a backend without a change feed (1 or more).")
    ] = 32,
    list_every: Annotated[
        float | None,
        Parameter(
            help="Seconds between two listings of the flow runs Prefect holds (above 0; default: "
            "--wait). A listing runs beside the waiting; between listings and during one, a "
            "change is acted on from the last listing, however many "
            "flow runs wait; a change that names a backend run no listing showed lists at once. "
            "Longer: fewer requests to a Prefect server holding thousands of waiting runs. "
            "Lost runs are looked for every 10 s apart from it."
        ),
    ] = None,
    lost_after: Annotated[
        float | None,
        Parameter(
            help="Seconds without a beat (an alive beat or a Prefect heartbeat) before a running "
            "flow run counts as lost and is re-entered, above 0. Default: each run is judged by "
            "its own beats: lost 40 s after its last alive beat (a training flow process sends "
            "one every 10 s: three missed, and 10 s for a late one); a run whose process sends "
            "none (an earlier prefect-ito) once it missed three Prefect heartbeats (the interval "
            "read from the gaps between its latest ones, Prefect's 180 s until it has beaten "
            "twice), whatever this process's PREFECT_FLOWS_HEARTBEAT_FREQUENCY says. Below 40, a "
            "live run whose beat reaches a busy Prefect server late is re-entered. A run left "
            "starting is re-entered once the worker that took it is gone (silent, or started "
            "again), whatever this option says."
        ),
    ] = None,
) -> None:
    """Resume deferred ito-training flow runs when their backend run changes; re-enter lost ones.

    It also resumes a flow run that waits for a person to confirm a spend once the backend says
    its quote is no longer pending (confirmed, declined, expired, used, superseded or gone): the
    flow then reads the quote at the backend itself. It never confirms or declines anything, and
    never resumes a run that waits for a person's decision at a gate.

    Run one (or two, for availability) beside your workers, with the same PREFECT_API_URL and
    ITO_COMPUTE_API_URL, and the backend's token in its own environment (ITO_COMPUTE_TOKEN) or
    keyring, never in Prefect. It follows only runs on that backend's origin, or on one listed in
    ITO_COMPUTE_ALLOWED_ORIGINS. It keeps no state: stop and start it at will.
    """
    # Options first, each by name: nan and inf would pass a plain comparison, then fail every
    # sweep (or never wait) once the watcher runs.
    require_positive("wait", wait)
    require_positive("max_concurrency", max_concurrency, at_least=1)
    if lost_after is not None:
        require_positive("lost_after", lost_after)
    if list_every is not None:
        require_positive("list_every", list_every)
    if not has_real_server():
        exit_with(
            PrefectServerRequired(
                "`prefect-ito watch` needs a real Prefect server: set PREFECT_API_URL"
            )
        )
    # Not this process's heartbeat setting: the flow processes' is their workers', and each
    # run's own beats tell it.
    watcher = Watcher(
        wait=wait,
        max_concurrency=max_concurrency,
        list_every=list_every,
        lost_after=lost_after if lost_after is not None else AUTO,
        # A question whose saying Prefect lost is said again (from the backend's facts).
        tell_again=notices.tell_again,
    )
    logging.getLogger("prefect_ito").setLevel(logging.INFO)
    run_command(_watch(watcher))


async def _watch(watcher: Watcher) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("prefect_ito.waiting.watcher").info(
        "Watching deferred, spend-waiting and lost ito-training flow runs (long-polls of %g s).",
        watcher.wait,
    )
    task = asyncio.ensure_future(watcher.run(stop))
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
