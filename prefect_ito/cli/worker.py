"""``prefect-ito worker``: the prefect-ito worker, started like ``prefect worker start``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING, Annotated

from cyclopts import Parameter

from prefect_ito.cli.errors import exit_with, require_positive, run_command
from prefect_ito.cli.terminal import has_real_server
from prefect_ito.exceptions import InvalidParameters, PrefectServerRequired

if TYPE_CHECKING:
    from prefect_ito.worker import ItoProcessWorker

__all__ = ["worker"]


def worker(
    *,
    pool: Annotated[str, Parameter(help="The work pool to take flow runs from.")] = "ito-process",
    name: Annotated[
        str | None, Parameter(help="The worker's name in Prefect (default: a new one).")
    ] = None,
    flow: Annotated[
        list[str] | None,
        Parameter(
            help="A flow this worker runs, by module path (repeat for more). Default: "
            "PREFECT_INTEGRATIONS_ITO_WORKER_FLOWS (comma-separated), else prefect-ito's "
            "training, attach and cancel flows."
        ),
    ] = None,
    limit: Annotated[
        int | None, Parameter(help="The most flow runs at once (1 or more; default: no limit).")
    ] = None,
) -> None:
    """Run prefect-ito's flows from a work pool, refusing any other flow and ignoring what
    Prefect says to run.

    It runs a flow run only when its deployment's entrypoint is one of its flows, imported from
    the installed prefect-ito, and marks any other Failed ("Refused") with the reason. The work
    pool's template and the deployments cannot set its command, environment, working directory
    or pull steps: the flow process is this Python's `-m prefect.engine`, with this worker's
    environment (its ITO_COMPUTE_TOKEN included). Same as
    `prefect worker start --pool ito-process --type prefect-ito`.
    """
    if limit is not None:
        require_positive("limit", limit, at_least=1)
    if not has_real_server():
        exit_with(
            PrefectServerRequired(
                "`prefect-ito worker` needs a real Prefect server: set PREFECT_API_URL"
            )
        )
    from prefect_ito.worker import AllowedFlows, ItoProcessWorker

    try:
        allowed = AllowedFlows.configured(flow)
        allowed.check_importable()
    except (ValueError, ImportError) as error:
        exit_with(InvalidParameters(f"--flow: {error}"))
    process = ItoProcessWorker(
        work_pool_name=pool, name=name, limit=limit, flows=list(allowed.entrypoints)
    )
    run_command(_work(process))


async def _work(process: ItoProcessWorker) -> None:
    """Run the worker until it ends or the process is asked to stop (SIGINT, SIGTERM)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(process.start())
    await asyncio.wait([task, asyncio.ensure_future(stop.wait())], return_when="FIRST_COMPLETED")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
