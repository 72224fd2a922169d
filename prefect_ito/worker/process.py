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
- the flow process imports the allowed flow by its module path (Prefect's
  ``PREFECT__FLOW_ENTRYPOINT``), so the deployment's storage is never read, and the worker's own
  cancellation and crash hooks import it the same way;
- a deployment's pull steps run only if the worker allows each
  (:mod:`prefect_ito.worker.pull_steps`; by default none, and a deployment with any is refused),
  as the worker judged them: the flow process is then ``-m prefect_ito.worker.engine``, which
  runs them before Prefect's engine.

It is started like any worker (``prefect worker start --pool ito-process --type prefect-ito``)
or with ``prefect-ito worker``.
"""

from __future__ import annotations

import copy
import json
import shlex
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

# The process worker's own parts: how it starts a flow process and supervises it (cancellation,
# crash hooks). They are private to Prefect; prefect.workers.process uses them the same way.
from prefect.runner._flow_run_executor import FlowRunExecutionResult, FlowRunExecutorContext
from prefect.runner._starter_engine import EngineCommandStarter
from prefect.utilities.processutils import get_sys_executable
from prefect.workers.process import (
    ProcessJobConfiguration,
    ProcessWorker,
    ProcessWorkerResult,
)

from prefect_ito.worker.admits import Admits
from prefect_ito.worker.allowed import Admission
from prefect_ito.worker.pull_steps import ADMITTED_VARIABLE, ENGINE_MODULE

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun
    from prefect.runner._process_manager import ProcessHandle

__all__ = ["WORKER_TYPE", "ItoProcessJobConfiguration", "ItoProcessWorker"]

WORKER_TYPE = "prefect-ito"
"""The worker type: ``prefect worker start --type prefect-ito``."""

IGNORED_VARIABLES = ("command", "env", "working_dir")
"""What a template or a job variable may not decide: the worker's own."""


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


class ItoProcessWorker(Admits, ProcessWorker):
    """Runs the flows it is configured for as processes of its machine; refuses any other.

    Args:
        flows: The flows it runs, by module path (see :mod:`prefect_ito.worker.allowed` for
            the default and the environment variable).
        pull_steps: The pull steps it runs (see :mod:`prefect_ito.worker.pull_steps`).
        *args: As for Prefect's process worker (``work_pool_name``, ``name``, ``limit``, ...).
        **kwargs: As for Prefect's process worker.
    """

    type = WORKER_TYPE
    job_configuration = ItoProcessJobConfiguration
    _description = (
        "Runs prefect-ito's flows as processes of the worker's machine. What runs is the "
        "worker's own configuration: the template's and deployments' command, environment "
        "and working directory are ignored, and a deployment of any other flow, or with a pull "
        "step the worker does not allow, is refused."
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

    def __init__(
        self,
        *args: Any,
        flows: Sequence[str] | None = None,
        pull_steps: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._configure_admission(flows, pull_steps)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ProcessJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        """Start the allowed flow in a process of this machine and wait for it to end."""
        admission = self._admission(flow_run)
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
        command, env = flow_process(admission, configuration.env)

        async def resolve_flow(_: FlowRun) -> Any:
            return allowed  # for the hooks the worker runs: never the deployment's code

        execution: FlowRunExecutionResult | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            async with FlowRunExecutorContext() as ctx:
                starter = EngineCommandStarter(
                    command=command,
                    entrypoint=admission.entrypoint,
                    cwd=Path(workspace),
                    env=env,
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


def flow_process(
    admission: Admission, env: dict[str, str | None]
) -> tuple[str | None, dict[str, str | None]]:
    """Return the flow process's command and environment for an admitted flow run.

    Without pull steps, this interpreter's ``-m prefect.engine`` (Prefect's own, ``None``);
    with them, ``-m prefect_ito.worker.engine``, given the steps as the worker judged them.
    """
    if not admission.pull_steps:
        return None, env
    command = shlex.join([get_sys_executable(), "-m", ENGINE_MODULE])
    return command, {**env, ADMITTED_VARIABLE: json.dumps(list(admission.pull_steps))}
