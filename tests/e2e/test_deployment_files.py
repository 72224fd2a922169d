"""The shipped deployment files: valid for Prefect, and no token anywhere in them."""

from __future__ import annotations

import json

import yaml
from e2e_stack import CHECKOUT, SHIPPED_YAML
from prefect.client.schemas.actions import WorkPoolCreate

K8S_TEMPLATE = CHECKOUT / "deployments" / "kubernetes-base-job-template.json"


def test_the_shipped_prefect_yaml_names_no_secret():
    config = yaml.safe_load(SHIPPED_YAML.read_text())
    names = {d["name"] for d in config["deployments"]}

    assert names == {"nightly", "after-booking", "cancel-on-cancelled"}
    for deployment in config["deployments"]:
        assert "job_variables" not in deployment["work_pool"]
        assert not [key for key in deployment.get("parameters") or {} if "token" in key.lower()]


def test_the_kubernetes_job_template_takes_the_token_from_a_secret():
    template = json.loads(K8S_TEMPLATE.read_text())
    WorkPoolCreate(name="ito-k8s", type="kubernetes", base_job_template=template)  # validates it

    manifest = template["job_configuration"]["job_manifest"]
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    token = next(e for e in container["env"] if e["name"] == "ITO_COMPUTE_TOKEN")
    assert set(token) == {"name", "valueFrom"} and "secretKeyRef" in token["valueFrom"]
    assert not [v for v in template["variables"]["properties"] if "token" in v.lower()]
