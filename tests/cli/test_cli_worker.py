"""``prefect-ito worker``: what it refuses before it starts, in one line and no traceback.

What it refuses before it asks Prefect anything runs in this process; the rest in a child.

Its flow runs are the end-to-end tests' (``tests/e2e/test_worker_routes.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from capture_server import CaptureServer
from cli_helpers import in_process, prefect_ito

from prefect_ito.exceptions import ExitCode
from prefect_ito.worker import FLOWS_VARIABLE, PULL_STEPS_VARIABLE

SHIPPED_MANIFEST = (
    Path(__file__).resolve().parents[2] / "deployments" / "kubernetes-job-manifest.yaml"
)


def _env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (FLOWS_VARIABLE, PULL_STEPS_VARIABLE)
    }
    return {**env, **extra}


def test_a_flow_that_is_no_module_path_stops_it_naming_the_option(prefect_server):
    result = in_process(
        "worker", "--flow", "/tmp/theirs.py:harvest", env=_env(PREFECT_API_URL=prefect_server)
    )

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    assert "--flow: '/tmp/theirs.py:harvest' names no flow by module path" in result.stderr


def test_a_flow_that_does_not_import_stops_it(prefect_server):
    result = in_process(
        "worker", env=_env(PREFECT_API_URL=prefect_server, **{FLOWS_VARIABLE: "prefect_ito.nope.x"})
    )

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    assert "--flow:" in result.stderr and "prefect_ito.nope" in result.stderr


def test_without_a_prefect_server_it_says_so():
    env = {key: value for key, value in _env().items() if key != "PREFECT_API_URL"}

    result = in_process("worker", env=env)

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert "`prefect-ito worker` needs a real Prefect server" in result.stderr


@pytest.mark.slow
def test_a_prefect_api_that_refuses_its_credentials_is_one_line():
    # A server behind PREFECT_SERVER_API_AUTH_STRING answers 401 to a worker without the string.
    env = {k: v for k, v in _env().items() if k != "PREFECT_API_AUTH_STRING"}
    with CaptureServer() as refusing:
        result = prefect_ito("worker", env={**env, "PREFECT_API_URL": f"{refusing.url}/api"})

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert "Traceback" not in result.stderr
    assert f"error: the Prefect API at {refusing.url}/api refused this client (401)" in (
        result.stderr
    )
    assert "set PREFECT_API_AUTH_STRING to the server's" in result.stderr


@pytest.mark.slow
def test_a_wrong_auth_string_is_told_apart_from_none_and_never_shown():
    with CaptureServer() as refusing:
        result = prefect_ito(
            "worker",
            env=_env(PREFECT_API_URL=f"{refusing.url}/api", PREFECT_API_AUTH_STRING="admin:typo-7"),
        )

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert "PREFECT_API_AUTH_STRING is set but is not the server's" in result.stderr
    assert "typo-7" not in result.stderr and "Traceback" not in result.stderr


def test_a_pull_step_allowed_with_any_repository_stops_it_naming_the_option(prefect_server):
    result = prefect_ito(
        "worker",
        "--allow-pull-step",
        "prefect.deployments.steps.git_clone",
        env=_env(PREFECT_API_URL=prefect_server),
    )

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        "--allow-pull-step: prefect.deployments.steps.git_clone needs the repository it may use"
    ) in result.stderr


def test_a_job_manifest_with_the_token_s_value_stops_the_kubernetes_worker(
    prefect_server, tmp_path: Path
):
    manifest = yaml.safe_load(SHIPPED_MANIFEST.read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "ITO_COMPUTE_TOKEN", "value": "canary-7d1e"}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))

    result = prefect_ito(
        "worker",
        "--kubernetes",
        "--job-manifest",
        str(path),
        env=_env(PREFECT_API_URL=prefect_server),
    )

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert "Traceback" not in result.stderr
    assert f"--job-manifest: {path}: ITO_COMPUTE_TOKEN must come from a Secret" in result.stderr
    assert "canary-7d1e" not in result.stderr + result.stdout


def test_without_prefect_kubernetes_the_kubernetes_worker_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
):
    # As if prefect-kubernetes were not installed: Python finds no such module.
    monkeypatch.setitem(sys.modules, "prefect_kubernetes", None)

    result = in_process("worker", "--kubernetes", env=_env())

    assert result.returncode == ExitCode.INVALID_INPUT, result.stderr
    assert result.stderr.strip() == (
        "error: --kubernetes: the Kubernetes worker needs prefect-kubernetes, which is not "
        "installed here (pip install prefect-kubernetes)"
    )
