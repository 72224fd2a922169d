"""The shipped deployment files: valid for Prefect, and no token anywhere in them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_stack import CHECKOUT, INSTALLED_YAML, SHIPPED_YAML
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.flows import Flow, load_flow_from_entrypoint

K8S_TEMPLATE = CHECKOUT / "deployments" / "kubernetes-base-job-template.json"


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
