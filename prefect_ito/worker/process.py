"""The prefect-ito process worker: Prefect's process worker, with what runs decided by itself.

Anyone who reaches the Prefect API can change what a stock process worker runs, with the
worker's environment and so its token: a work pool's base job template (its ``command``,
``env``, ``working_dir``), a deployment's pull steps (``run_shell_script``) or a deployment of
their own code. This worker takes none of that from Prefect:

- it runs a flow run only if its deployment's entrypoint is one of the flows it is configured
  for (:mod:`prefect_ito.worker.allowed`), and marks any other ``Failed`` (named ``Refused``),
  with a message that says why; nothing of that run starts;
- the flow process is ``<this worker's Python> -m prefect.engine``, in a fresh temporary
  directory, with the worker's own environment; the template's and the deployment's ``command``,
  ``env`` and ``working_dir`` are dropped before they are read;
- the flow process imports the allowed flow by its module path from the installed package
  (Prefect's ``PREFECT__FLOW_ENTRYPOINT``), so the deployment's storage and pull steps are never
  run, and the worker's own cancellation and crash hooks import it the same way.

It is started like any worker (``prefect worker start --pool ito-process --type prefect-ito``)
or with ``prefect-ito worker``.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from prefect.exceptions import Abort, ObjectNotFound

# The process worker's own parts: how it starts a flow process and supervises it (cancellation,
# crash hooks). They are private to Prefect; prefect.workers.process uses them the same way.
from prefect.runner._flow_run_executor import FlowRunExecutionResult, FlowRunExecutorContext
from prefect.runner._starter_engine import EngineCommandStarter
from prefect.states import Failed
from prefect.utilities.engine import propose_state
from prefect.workers.process import (
    ProcessJobConfiguration,
    ProcessWorker,
    ProcessWorkerResult,
)

from prefect_ito.worker.allowed import Admission, AllowedFlows

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.runner._process_manager import ProcessHandle

__all__ = ["WORKER_TYPE", "ItoProcessJobConfiguration", "ItoProcessWorker"]

WORKER_TYPE = "prefect-ito"
"""The worker type: ``prefect worker start --type prefect-ito``."""

IGNORED_VARIABLES = ("command", "env", "working_dir")
"""What a template or a job variable may not decide: the worker's own."""

REFUSED = "Refused"
"""The name of the Failed state a refused flow run ends in."""


class ItoProcessJobConfiguration(ProcessJobConfiguration):
    """A process job configuration without the template's command, environment or directory."""

    @classmethod
    async def from_template_and_values(
        cls,
        base_job_template: dict[str, Any],
        values: dict[str, Any],
        client: PrefectClient | None = None,
    ) -> ItoProcessJobConfiguration:
        """Read the template and job variables, without what decides what runs and where.

        Dropped before rendering, so that nothing of them is resolved (blocks, variables) or
        validated (a missing directory) either.
        """
        template = copy.deepcopy(base_job_template)
        for key in IGNORED_VARIABLES:
            template.get("job_configuration", {}).pop(key, None)
        kept = {
            key: value
            for key, value in values.items()
            if key.split(".", 1)[0] not in IGNORED_VARIABLES
        }
        configuration = await super().from_template_and_values(template, kept, client=client)
        assert isinstance(configuration, ItoProcessJobConfiguration)
        return configuration


class ItoProcessWorker(ProcessWorker):
    """Runs the flows it is configured for as processes of its machine; refuses any other.

    Args:
        flows: The flows it runs, by module path (see :mod:`prefect_ito.worker.allowed` for
            the default and the environment variable).
        *args: As for Prefect's process worker (``work_pool_name``, ``name``, ``limit``, ...).
        **kwargs: As for Prefect's process worker.
    """

    type = WORKER_TYPE
    job_configuration = ItoProcessJobConfiguration
    _description = (
        "Runs prefect-ito's flows as processes of the worker's machine. What runs is the "
        "worker's own configuration: the template's and deployments' command, environment, "
        "working directory and pull steps are ignored, and a deployment of any other flow is "
        "refused."
    )
    _display_name = "prefect-ito process"
    _documentation_url = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/deployments.md"

    @classmethod
    def get_default_base_job_template(cls) -> dict[str, Any]:
        """Prefect's process template, without the variables this worker ignores."""
        template = super().get_default_base_job_template()
        for key in IGNORED_VARIABLES:
            template["job_configuration"].pop(key, None)
            template["variables"]["properties"].pop(key, None)
        return template

    def __init__(self, *args: Any, flows: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allowed: AllowedFlows = AllowedFlows.configured(flows)
        # A flow that does not import stops the worker now, not each flow run it takes later.
        self.allowed.check_importable()
        self._admitted: dict[UUID, Admission] = {}

    async def _submit_run(self, flow_run: FlowRun) -> None:
        """Judge the flow run by the worker's own list before Prefect's submission starts it."""
        try:
            verdict = await self._judge(flow_run)
        except ObjectNotFound:
            verdict = None  # its deployment is gone: Prefect's own submission says so
        except Exception:
            self._logger.exception("Could not judge flow run %s; it stays scheduled", flow_run.id)
            self._forget(flow_run)  # still Scheduled: the next poll judges it again
            return
        if verdict is None or isinstance(verdict, Admission):
            if verdict is not None:
                self._admitted[flow_run.id] = verdict
            try:
                await super()._submit_run(flow_run)
            finally:
                self._admitted.pop(flow_run.id, None)
            return
        try:
            if await self._propose_pending_state(flow_run):
                await self._refuse(flow_run, verdict)
        finally:
            self._forget(flow_run)

    async def _judge(self, flow_run: FlowRun) -> Admission | str:
        deployment: DeploymentResponse | None = None
        if flow_run.deployment_id is not None:
            deployment = await self.client.read_deployment(flow_run.deployment_id)
        flow = await self.client.read_flow(flow_run.flow_id)
        return self.allowed.judge(deployment, flow.name)

    async def _refuse(self, flow_run: FlowRun, message: str) -> None:
        # Failed, not Crashed: nothing broke, and a crashed training run is one the watcher
        # re-enters. Not Cancelled either: that reads as a person's choice.
        self.get_flow_run_logger(flow_run).warning(message)
        with contextlib.suppress(Abort):  # already final
            await propose_state(
                self.client, Failed(name=REFUSED, message=message), flow_run_id=flow_run.id
            )

    def _forget(self, flow_run: FlowRun) -> None:
        """Release what the poll took for a flow run that is not started (as Prefect does)."""
        self._release_limit_slot(flow_run.id)
        self._submitting_flow_run_ids.discard(flow_run.id)
        if self._cancelling_observer is not None:
            self._cancelling_observer.remove_in_flight_flow_run_id(flow_run.id)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        """Start the allowed flow in a process of this machine and wait for it to end."""
        admission = self._admitted.get(flow_run.id)
        if admission is None:
            raise RuntimeError(f"flow run {flow_run.id} was not admitted by this worker")
        if admission.ignored_pull_steps:
            self.get_flow_run_logger(flow_run).info(
                "The prefect-ito worker runs the installed %s; the deployment's pull steps (%s) "
                "are not run.",
                admission.entrypoint,
                ", ".join(admission.ignored_pull_steps),
            )
        status = task_status if task_status is not None else anyio.TASK_STATUS_IGNORED
        with tempfile.TemporaryDirectory(suffix="prefect-ito") as workspace:
            execution = await self._execute(flow_run, admission, configuration, workspace, status)
        if execution is None or execution.status_code is None:
            raise RuntimeError("Failed to start flow run process.")
        return ProcessWorkerResult(
            status_code=execution.status_code, identifier=str(execution.handle.pid)
        )

    async def _execute(
        self,
        flow_run: FlowRun,
        admission: Admission,
        configuration: ProcessJobConfiguration,
        workspace: str,
        task_status: anyio.abc.TaskStatus[int],
    ) -> FlowRunExecutionResult | None:
        """Run ``python -m prefect.engine`` on the allowed entrypoint, as Prefect's worker does."""
        allowed = self.allowed.flow(admission.entrypoint)

        async def resolve_flow(_: FlowRun) -> Any:
            return allowed  # for the hooks the worker runs: never the deployment's code

        execution: FlowRunExecutionResult | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            async with FlowRunExecutorContext() as ctx:
                starter = EngineCommandStarter(
                    command=None,  # this interpreter's `-m prefect.engine`
                    entrypoint=admission.entrypoint,
                    cwd=Path(workspace),
                    env=configuration.env,
                    stream_output=configuration.stream_output,
                    control_channel=ctx.control_channel,
                )
                executor = ctx.create_executor(
                    flow_run, starter, resolve_flow=resolve_flow, propose_submitting=False
                )

                async def execute(
                    *, task_status: anyio.abc.TaskStatus[ProcessHandle] = anyio.TASK_STATUS_IGNORED
                ) -> None:
                    nonlocal execution
                    execution = await executor.submit(task_status=task_status)

                async with anyio.create_task_group() as group:
                    handle = await group.start(execute)
                    if handle.pid is None:
                        raise RuntimeError("Flow run process has no PID")
                    task_status.started(handle.pid)
        return execution
