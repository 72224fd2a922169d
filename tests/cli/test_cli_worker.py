"""``prefect-ito worker``: what it refuses before it starts, in one line and no traceback.

What it refuses before it asks Prefect anything runs in this process; the rest in a child.

Its flow runs are the end-to-end tests' (``tests/e2e/test_worker_routes.py``).
"""

from __future__ import annotations

import os

import pytest
from capture_server import CaptureServer
from cli_helpers import in_process, prefect_ito

from prefect_ito.exceptions import ExitCode
from prefect_ito.worker import FLOWS_VARIABLE


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != FLOWS_VARIABLE}
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
    with CaptureServer() as refusing:
        result = prefect_ito("worker", env=_env(PREFECT_API_URL=f"{refusing.url}/api"))

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert "Traceback" not in result.stderr
    assert f"error: the Prefect API at {refusing.url}/api refused this client (401)" in (
        result.stderr
    )
    assert "PREFECT_API_AUTH_STRING" in result.stderr
