"""The shipped deployment files: valid for Prefect, and no token anywhere in them.

The work-pool templates are rendered here with the real workers' code (Prefect's process worker,
prefect-kubernetes), as a worker does for each flow run, without a server or a cluster.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_stack import (
    CHECKOUT,
    INSTALLED_YAML,
    PROCESS_TEMPLATE,
    SHIPPED_YAML,
)
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import Flow as APIFlow
from prefect.client.schemas.objects import FlowRun, WorkPool
from prefect.client.schemas.responses import DeploymentResponse
from prefect.flows import Flow, load_flow_from_entrypoint
from prefect.utilities.processutils import command_to_string, get_sys_executable
from prefect.workers.base import BaseJobConfiguration
from prefect.workers.process import ProcessJobConfiguration, ProcessWorker
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

DEPLOYMENTS = CHECKOUT / "deployments"
K8S_TEMPLATE = DEPLOYMENTS / "kubernetes-base-job-template.json"
DOCS = CHECKOUT / "docs" / "deployments.md"
CANARY = "ito-canary-token-3f9a"
"""A token in the worker's environment while a template is rendered."""
HOSTILE = {
    "command": "sh -c 'env > /tmp/ito-stolen'",
    "env": {"ITO_COMPUTE_TOKEN": "planted", "LD_PRELOAD": "/tmp/planted.so"},
    "env.PYTHONPATH": "/tmp/planted",  # Prefect also reads dotted keys into `env`
    "image": "planted.example/steal:1",
    "working_dir": "/tmp/planted",
    "namespace": "planted",
    "service_account_name": "planted",
    "cluster_config": {"config": {}, "context_name": "planted"},
}
"""Job variables a person with access to the Prefect API could set on a deployment or a run."""
DECIDES_WHAT_RUNS = {key.split(".")[0] for key in HOSTILE}


@pytest.mark.parametrize("shipped", [SHIPPED_YAML, INSTALLED_YAML], ids=lambda p: p.name)
def test_the_shipped_prefect_yaml_names_no_secret(shipped: Path):
    config = yaml.safe_load(shipped.read_text())
    names = {d["name"] for d in config["deployments"]}

    assert names == {"nightly", "after-booking", "cancel-on-cancelled"}
    for deployment in config["deployments"]:
        assert "job_variables" not in deployment["work_pool"]
        assert not [key for key in deployment.get("parameters") or {} if "token" in key.lower()]


def test_the_installed_package_file_differs_from_the_checkout_file_only_in_where_code_is():
    """Both routes deploy the same thing; only the entrypoints and the pull steps differ."""
    checkout = yaml.safe_load(SHIPPED_YAML.read_text())
    installed = yaml.safe_load(INSTALLED_YAML.read_text())

    # `pull: []`, not a missing or null `pull`: for those, `prefect deploy` adds a step that
    # changes into the directory it ran in.
    assert installed["pull"] == [] and checkout["pull"]
    assert _without_code_location(installed) == _without_code_location(checkout)
    for file_route, module_route in zip(
        checkout["deployments"], installed["deployments"], strict=True
    ):
        path, function = file_route["entrypoint"].split(":")
        module = path.removesuffix(".py").replace("/", ".")
        assert module_route["entrypoint"] == f"{module}.{function}"


@pytest.mark.parametrize(
    "deployment", yaml.safe_load(INSTALLED_YAML.read_text())["deployments"], ids=lambda d: d["name"]
)
def test_module_entrypoints_name_flows_prefect_can_import(deployment: dict[str, Any]):
    entrypoint = deployment["entrypoint"]

    assert ":" not in entrypoint  # how Prefect tells a module path from a file path
    assert isinstance(load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False), Flow)


def _without_code_location(config: dict[str, Any]) -> dict[str, Any]:
    """Return a deployment file without the parts that say where the code comes from."""
    deployments = [{k: v for k, v in d.items() if k != "entrypoint"} for d in config["deployments"]]
    return {**{k: v for k, v in config.items() if k != "pull"}, "deployments": deployments}


def test_the_kubernetes_job_template_takes_the_token_from_a_secret():
    template = json.loads(K8S_TEMPLATE.read_text())
    WorkPoolCreate(name="ito-k8s", type="kubernetes", base_job_template=template)  # validates it

    manifest = template["job_configuration"]["job_manifest"]
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    token = next(e for e in container["env"] if e["name"] == "ITO_COMPUTE_TOKEN")
    assert set(token) == {"name", "valueFrom"} and "secretKeyRef" in token["valueFrom"]
    assert not [v for v in template["variables"]["properties"] if "token" in v.lower()]


@pytest.mark.parametrize("template", [PROCESS_TEMPLATE, K8S_TEMPLATE], ids=lambda p: p.name)
def test_no_job_variable_of_the_shipped_templates_decides_what_runs(template: Path):
    base_job_template = json.loads(template.read_text())
    pool_type = "process" if template == PROCESS_TEMPLATE else "kubernetes"
    WorkPoolCreate(name="ito", type=pool_type, base_job_template=base_job_template)  # validates it

    variables = base_job_template["variables"]
    assert not DECIDES_WHAT_RUNS & set(variables["properties"])
    assert not [v for v in variables["properties"] if "token" in v.lower()]
    # The server refuses other job variables on a deployment or a run (422); the rendering
    # below shows they would change nothing either.
    assert variables["additionalProperties"] is False


async def test_prefects_default_process_template_lets_a_run_choose_the_command(
    monkeypatch: pytest.MonkeyPatch,
):
    """Why the shipped template exists: with Prefect's own, a run's command gets the token."""
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", CANARY)
    template = ProcessWorker.get_default_base_job_template()

    configuration = await _render(ProcessJobConfiguration, template, run_variables=HOSTILE)

    assert configuration.command == HOSTILE["command"]
    assert configuration.env["ITO_COMPUTE_TOKEN"] == "planted"
    assert str(configuration.working_dir) == HOSTILE["working_dir"]


async def test_a_fixed_env_in_a_template_still_takes_a_runs_env():
    """Why the shipped templates have no `env` at all: Prefect merges a run's `env` into a
    fixed one too, whether or not the variables declare `env`."""
    template: dict[str, Any] = {
        "job_configuration": {"command": None, "env": {"FIXED": "1"}},
        "variables": {"type": "object", "properties": {}},
    }

    configuration = await _render(ProcessJobConfiguration, template, run_variables=HOSTILE)

    assert configuration.env["LD_PRELOAD"] == "/tmp/planted.so"


@pytest.mark.parametrize("level", ["deployment", "flow run"])
async def test_the_process_template_keeps_the_workers_command_and_environment(
    monkeypatch: pytest.MonkeyPatch, level: str
):
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", CANARY)
    template = json.loads(PROCESS_TEMPLATE.read_text())
    by_level = {"deployment_variables" if level == "deployment" else "run_variables": HOSTILE}

    configuration = await _render(ProcessJobConfiguration, template, **by_level)

    # Prefect's own choice when no command is configured: this interpreter, -m prefect.engine.
    assert configuration.command == command_to_string(
        [get_sys_executable(), "-m", "prefect.engine"]
    )
    assert not configuration._command_configured
    assert configuration.working_dir is None  # a fresh temporary directory
    assert configuration.env["ITO_COMPUTE_TOKEN"] == CANARY  # the worker's own environment
    for name in ("LD_PRELOAD", "PYTHONPATH"):  # the worker's own, if it has one; never the run's
        assert configuration.env.get(name) == os.environ.get(name)
    assert "planted" not in json.dumps(configuration.model_dump(mode="json"))


@pytest.mark.parametrize("level", ["deployment", "flow run"])
async def test_the_kubernetes_template_renders_a_job_without_a_token_or_a_runs_choices(
    monkeypatch: pytest.MonkeyPatch, level: str
):
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", CANARY)
    template = json.loads(K8S_TEMPLATE.read_text())
    by_level = {"deployment_variables" if level == "deployment" else "run_variables": HOSTILE}

    configuration = await _render(KubernetesWorkerJobConfiguration, template, **by_level)

    manifest = configuration.job_manifest
    rendered = json.dumps(manifest)
    assert CANARY not in rendered and "planted" not in rendered
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    fixed = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert container["image"] == fixed["containers"][0]["image"]
    assert container["args"] == BaseJobConfiguration._base_flow_run_command().split()
    assert manifest["metadata"]["namespace"] == configuration.namespace == "prefect"
    assert configuration.cluster_config is None  # in-cluster
    env = {e["name"]: e for e in container["env"]}
    assert env["ITO_COMPUTE_TOKEN"] == {
        "name": "ITO_COMPUTE_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "ito-compute-token", "key": "token"}},
    }
    assert env["ITO_COMPUTE_API_URL"]["valueFrom"]["configMapKeyRef"]["name"] == "ito-compute"
    assert {"PREFECT__FLOW_RUN_ID", "PREFECT__DEPLOYMENT_NAME"} <= set(env)  # Prefect's own


@pytest.mark.parametrize("level", ["deployment", "flow run"])
async def test_kubernetes_flow_runs_beat_every_30_s_whatever_a_run_says(
    monkeypatch: pytest.MonkeyPatch, level: str
):
    """A lost pod is found after three missed beats: 90 s, not Prefect's default 9 minutes."""
    monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    template = json.loads(K8S_TEMPLATE.read_text())
    slower = {**HOSTILE, "env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "3600"}}
    by_level = {"deployment_variables" if level == "deployment" else "run_variables": slower}

    configuration = await _render(KubernetesWorkerJobConfiguration, template, **by_level)

    (container,) = configuration.job_manifest["spec"]["template"]["spec"]["containers"]
    beats = [e for e in container["env"] if e["name"] == "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]
    assert beats == [{"name": "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "value": "30"}]


async def test_the_process_template_leaves_the_heartbeat_to_the_workers_environment(
    monkeypatch: pytest.MonkeyPatch,
):
    """The process template fixes no env (a fixed one would take a run's too, see above): the
    flow process beats as its worker's environment says, and the watcher reads each run's
    interval from its beats."""
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "45")
    template = json.loads(PROCESS_TEMPLATE.read_text())
    slower = {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "3600"}}

    configuration = await _render(ProcessJobConfiguration, template, run_variables=slower)

    assert "env" not in template["job_configuration"]
    assert configuration.env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "45"


@pytest.mark.parametrize("text", [SHIPPED_YAML, INSTALLED_YAML, DOCS], ids=lambda p: p.name)
def test_every_work_pool_the_files_create_uses_a_shipped_template(text: Path):
    """Each `prefect work-pool create` or `update` names the hardened template of its type; a
    pool of the prefect-ito Kubernetes worker needs none (its worker reads no template)."""
    joined = re.sub(r"\\\n[#\s]*", " ", text.read_text())  # continued lines, also in comments
    commands = [line for line in joined.splitlines() if "prefect work-pool " in line]

    assert [c for c in commands if "work-pool create" in c]
    for command in commands:
        pool_type = re.search(r"--type ([\w-]+)", command)
        if pool_type and pool_type[1] == "prefect-ito-kubernetes":
            continue
        template = f"{pool_type[1] if pool_type else '(process|kubernetes)'}-base-job-template"
        assert re.search(rf"--base-job-template \S*{template}\.json", command), command


class _FlowReader:
    """The one call a worker makes to render a flow run's job: read its flow."""

    def __init__(self, flow: APIFlow) -> None:
        self.flow = flow

    async def read_flow(self, flow_id: uuid.UUID) -> APIFlow:
        return self.flow


async def _render(
    configuration: type[BaseJobConfiguration],
    base_job_template: dict[str, Any],
    deployment_variables: dict[str, Any] | None = None,
    run_variables: dict[str, Any] | None = None,
) -> Any:
    """Render a flow run's job from ``base_job_template`` as a worker does before it starts it."""
    flow = APIFlow(id=uuid.uuid4(), name="ito-training")
    deployment = DeploymentResponse(
        id=uuid.uuid4(), name="nightly", flow_id=flow.id, job_variables=deployment_variables or {}
    )
    flow_run = FlowRun(
        id=uuid.uuid4(), name="brave-otter", flow_id=flow.id, deployment_id=deployment.id,
        job_variables=run_variables or {},
    )  # fmt: skip
    pool_type = "kubernetes" if configuration is KubernetesWorkerJobConfiguration else "process"
    return await configuration.resolve_for_flow_run(
        flow_run,
        client=_FlowReader(flow),  # type: ignore[arg-type]
        work_pool=WorkPool(name="ito", type=pool_type, base_job_template=base_job_template),
        worker_name="ito-worker",
        deployment=deployment,
    )
