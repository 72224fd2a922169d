"""The prefect-ito Kubernetes worker: prefect-kubernetes' worker, with the Job from its own file.

Prefect's Kubernetes worker builds each flow run's Job from the work pool's base job template and
the deployment's and flow run's job variables: whoever reaches the Prefect API can change the
image, the command, the environment, or add a container or a volume, and so run code of theirs
in a pod that holds the token. This worker takes none of that from Prefect:

- its whole Job manifest is its own file (a path on its command line or in
  ``PREFECT_INTEGRATIONS_ITO_WORKER_JOB_MANIFEST``), read when it starts; the pool's template and
  every job variable are not read at all;
- the manifest is checked when the worker starts: a ``batch/v1`` Job whose container names its
  image and its command, the command being ``python -m prefect_ito.worker.engine`` (which runs
  only what the worker admitted), and ``ITO_COMPUTE_TOKEN`` only as a reference to a Secret
  (``valueFrom.secretKeyRef``), never a value;
- a flow run is judged as on the process worker (:mod:`prefect_ito.worker.admits`), and its pod
  is told the admitted flow (``PREFECT__FLOW_ENTRYPOINT``) and pull steps, so that a deployment
  changed after the worker judged it changes nothing there.

What the worker adds to the file's Job is Prefect's own: the flow run's id, the worker's Prefect
settings (``PREFECT_API_URL``, ...), labels, annotations and the Job's name.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import anyio.abc
import yaml
from prefect_kubernetes.worker import (
    KubernetesWorker,
    KubernetesWorkerJobConfiguration,
    KubernetesWorkerResult,
)

from prefect_ito.backend.origins import ENV_TOKEN
from prefect_ito.settings import ENV_PREFIX
from prefect_ito.worker.admits import Admits
from prefect_ito.worker.pull_steps import ADMITTED_VARIABLE, ENGINE_MODULE

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun

    from prefect_ito.worker.allowed import Admission

__all__ = [
    "KUBERNETES_WORKER_TYPE",
    "MANIFEST_VARIABLE",
    "ItoKubernetesJobConfiguration",
    "ItoKubernetesWorker",
    "admit",
    "read_manifest",
]

KUBERNETES_WORKER_TYPE = "prefect-ito-kubernetes"
"""The worker type: ``prefect worker start --type prefect-ito-kubernetes``."""

MANIFEST_VARIABLE = f"{ENV_PREFIX}WORKER_JOB_MANIFEST"
"""The environment variable naming the worker's Job manifest file."""


def read_manifest(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Read and check the worker's Job manifest: ``path``, else :data:`MANIFEST_VARIABLE`'s.

    Raises:
        ValueError: No file is named, it does not read as YAML, or the Job is not one this
            worker runs (the message says why).
    """
    named = path or os.environ.get(MANIFEST_VARIABLE)
    if not named:
        raise ValueError(f"no job manifest: name its file (or set {MANIFEST_VARIABLE})")
    try:
        manifest = yaml.safe_load(Path(named).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{named}: {error}") from None
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise ValueError(f"{named}: {problem}")
    # No `args` would get prefect-kubernetes' own (`prefect flow-run execute`) after the command.
    manifest["spec"]["template"]["spec"]["containers"][0].setdefault("args", [])
    return dict(manifest)


def _manifest_problem(manifest: Any) -> str | None:
    """Say what makes ``manifest`` a Job this worker does not run, or None."""
    if not isinstance(manifest, dict) or manifest.get("kind") != "Job":
        return "not a Kubernetes Job manifest (kind: Job)"
    try:
        containers = manifest["spec"]["template"]["spec"]["containers"]
    except (KeyError, TypeError):
        return "no spec.template.spec.containers"
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        return "no container"
    container = containers[0]
    if not container.get("image"):
        return "its container names no image"
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if ENGINE_MODULE not in command:
        return (
            f"its container's command does not run `python -m {ENGINE_MODULE}` (Prefect's own "
            "would read the deployment's code and pull steps from Prefect again)"
        )
    for entry in container.get("env") or []:
        if entry.get("name") == ENV_TOKEN and "secretKeyRef" not in (entry.get("valueFrom") or {}):
            return f"{ENV_TOKEN} must come from a Secret (valueFrom.secretKeyRef), not a value"
    return None


def admit(configuration: KubernetesWorkerJobConfiguration, admission: Admission) -> None:
    """Tell the Job's container what the worker admitted: the flow, and the pull steps."""
    container = configuration.job_manifest["spec"]["template"]["spec"]["containers"][0]
    decided = {"PREFECT__FLOW_ENTRYPOINT": admission.entrypoint}
    if admission.pull_steps:
        decided[ADMITTED_VARIABLE] = json.dumps(list(admission.pull_steps))
    env = [entry for entry in container.get("env") or [] if entry.get("name") not in decided]
    container["env"] = [*env, *({"name": k, "value": v} for k, v in decided.items())]


class ItoKubernetesJobConfiguration(KubernetesWorkerJobConfiguration):
    """A Kubernetes job configuration that is the worker's own manifest, whatever Prefect says.

    Each worker uses a subclass made by :meth:`of`, which holds its manifest.
    """

    own_manifest: ClassVar[dict[str, Any] | None] = None

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> type[ItoKubernetesJobConfiguration]:
        """Return the configuration class of a worker whose manifest is ``manifest``."""
        return type(cls.__name__, (cls,), {"own_manifest": copy.deepcopy(manifest)})

    @classmethod
    async def from_template_and_values(
        cls,
        base_job_template: dict[str, Any],
        values: dict[str, Any],
        client: PrefectClient | None = None,
    ) -> ItoKubernetesJobConfiguration:
        """Return the worker's own manifest; neither the template nor the values are read."""
        if cls.own_manifest is None:
            raise RuntimeError(
                "this configuration has no manifest: use ItoKubernetesJobConfiguration.of"
            )
        manifest = copy.deepcopy(cls.own_manifest)
        namespace = (manifest.get("metadata") or {}).get("namespace") or "default"
        return cls(job_manifest=manifest, namespace=namespace)


class ItoKubernetesWorker(Admits, KubernetesWorker):
    """Runs the flows it is configured for as Jobs made from its own manifest; refuses others.

    Args:
        job_manifest: The Job manifest file (default: :data:`MANIFEST_VARIABLE`'s).
        flows: The flows it runs, by module path (as the process worker).
        pull_steps: The pull steps it runs (as the process worker).
        *args: As for prefect-kubernetes' worker (``work_pool_name``, ``name``, ``limit``, ...).
        **kwargs: As for prefect-kubernetes' worker.
    """

    type = KUBERNETES_WORKER_TYPE
    job_configuration = ItoKubernetesJobConfiguration
    _description = (
        "Runs prefect-ito's flows as Kubernetes Jobs made from the worker's own manifest file: "
        "the pool's template and the job variables are not read, and a deployment of any "
        "other flow, or with a pull step the worker does not allow, is refused."
    )
    _display_name = "prefect-ito Kubernetes"
    _documentation_url = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/deployments.md"

    @classmethod
    def get_default_base_job_template(cls) -> dict[str, Any]:
        """A template with nothing to set: the worker reads none of it."""
        return {
            "job_configuration": {},
            "variables": {"type": "object", "properties": {}},
        }

    def __init__(
        self,
        *args: Any,
        job_manifest: str | os.PathLike[str] | None = None,
        flows: Sequence[str] | None = None,
        pull_steps: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        manifest = read_manifest(job_manifest)
        super().__init__(*args, **kwargs)
        # Per worker, not per class: Prefect builds every configuration through this attribute,
        # for a flow run's Job and for the Job it deletes when the run is cancelled.
        self.job_configuration = ItoKubernetesJobConfiguration.of(manifest)
        self._configure_admission(flows, pull_steps)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: KubernetesWorkerJobConfiguration,
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> KubernetesWorkerResult:
        """Create the flow run's Job from the worker's manifest, told what was admitted."""
        admission = self._admission(flow_run)
        admit(configuration, admission)
        # KubernetesWorker.run: mypy sees BaseWorker's abstract one (prefect-kubernetes is Any).
        return await super().run(flow_run, configuration, task_status)  # type: ignore[safe-super]
