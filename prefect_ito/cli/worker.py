"""``prefect-ito worker``: the prefect-ito worker, started like ``prefect worker start``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import Parameter

from prefect_ito.cli.errors import exit_with, require_positive, run_command
from prefect_ito.cli.terminal import has_real_server
from prefect_ito.exceptions import InvalidParameters, PrefectServerRequired

if TYPE_CHECKING:
    from prefect.workers.base import BaseWorker

    Worker = BaseWorker[Any, Any, Any]

__all__ = ["worker"]


def worker(
    *,
    pool: Annotated[
        str | None,
        Parameter(help="The work pool to take flow runs from (default: ito-process, ito-k8s)."),
    ] = None,
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
    allow_pull_step: Annotated[
        list[str] | None,
        Parameter(
            help="A deployment pull step this worker runs, by step function, with the one "
            "value it must have after `=` (git_clone's repository, required; "
            "set_working_directory's directory); repeat for more. Default: "
            "PREFECT_INTEGRATIONS_ITO_WORKER_PULL_STEPS (comma-separated), else none: a "
            "deployment with any pull step is refused."
        ),
    ] = None,
    kubernetes: Annotated[
        bool,
        Parameter(
            negative=(),
            help="Run flow runs as Kubernetes Jobs made from --job-manifest (needs "
            "prefect-kubernetes).",
        ),
    ] = False,
    job_manifest: Annotated[
        Path | None,
        Parameter(
            help="With --kubernetes: the Job manifest file every flow run's Job is made from. "
            "Default: PREFECT_INTEGRATIONS_ITO_WORKER_JOB_MANIFEST."
        ),
    ] = None,
    limit: Annotated[
        int | None, Parameter(help="The most flow runs at once (1 or more; default: no limit).")
    ] = None,
) -> None:
    """Run prefect-ito's flows from a work pool, refusing any other flow and ignoring what
    Prefect says to run.

    It runs a flow run only when its deployment's entrypoint is one of its flows and each of
    its pull steps is one it allows, and marks any other Failed ("Refused") with the reason.
    The work pool's template and the deployments cannot set its command, environment or working
    directory: the flow process is this Python's `-m prefect.engine` with this worker's
    environment (its ITO_COMPUTE_TOKEN included); same as
    `prefect worker start --pool ito-process --type prefect-ito`. With --kubernetes, each flow
    run is a Job made from the worker's own manifest file alone; same as
    `prefect worker start --pool ito-k8s --type prefect-ito-kubernetes`.
    """
    if limit is not None:
        require_positive("limit", limit, at_least=1)
    if job_manifest is not None and not kubernetes:
        exit_with(InvalidParameters("--job-manifest: only with --kubernetes"))
    from prefect_ito.worker import kubernetes_available

    if kubernetes and not kubernetes_available():
        exit_with(
            InvalidParameters(
                "--kubernetes: the Kubernetes worker needs prefect-kubernetes, which is not "
                "installed here (pip install prefect-kubernetes)"
            )
        )
    if not has_real_server():
        exit_with(
            PrefectServerRequired(
                "`prefect-ito worker` needs a real Prefect server: set PREFECT_API_URL"
            )
        )
    flows, steps = _lists(flow, allow_pull_step)
    options: dict[str, Any] = {"name": name, "limit": limit, "flows": flows, "pull_steps": steps}
    if kubernetes:
        run_command(_work(_kubernetes_worker(pool or "ito-k8s", job_manifest, options)))
    else:
        from prefect_ito.worker import ItoProcessWorker

        run_command(_work(ItoProcessWorker(work_pool_name=pool or "ito-process", **options)))


def _lists(
    flow: list[str] | None, allow_pull_step: list[str] | None
) -> tuple[list[str], list[str]]:
    """Read the worker's lists as it will (options, else environment), or end naming the option."""
    from prefect_ito.worker import AllowedFlows, AllowedPullSteps

    try:
        steps = AllowedPullSteps.configured(allow_pull_step)
    except ValueError as error:
        exit_with(InvalidParameters(f"--allow-pull-step: {error}"))
    try:
        allowed = AllowedFlows.configured(flow)
        allowed.check_importable()
    except (ValueError, ImportError) as error:
        exit_with(InvalidParameters(f"--flow: {error}"))
    return list(allowed.entrypoints), list(steps.entries)


def _kubernetes_worker(pool: str, job_manifest: Path | None, options: dict[str, Any]) -> Worker:
    from prefect_ito.worker.kubernetes import ItoKubernetesWorker, read_manifest

    try:
        read_manifest(job_manifest)
    except ValueError as error:
        exit_with(InvalidParameters(f"--job-manifest: {error}"))
    return ItoKubernetesWorker(work_pool_name=pool, job_manifest=job_manifest, **options)


async def _work(process: Worker) -> None:
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
