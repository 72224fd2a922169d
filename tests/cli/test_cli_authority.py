"""``prefect-ito simulator --login-scopes``: device logins that grant limited tokens."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from cli_helpers import prefect_ito
from device_login import approve_in_browser

from prefect_ito.exceptions import ExitCode


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=20)


def _wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(120):
        assert process.poll() is None, "the simulator exited"
        try:
            httpx.get(f"{url}/v0/capabilities", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.5)
    raise AssertionError("the simulator did not answer")


def _device_login(url: str) -> dict[str, str]:
    device = httpx.post(f"{url}/v0/auth/device").json()["data"]
    approve_in_browser(device["verification_uri_complete"], device["user_code"], "ada")
    time.sleep(device["interval"])
    grant: dict[str, str] = httpx.post(
        f"{url}/v0/auth/token", json={"device_code": device["device_code"]}
    ).json()["data"]
    return grant


@pytest.mark.slow
def test_a_device_login_at_a_limited_simulator_grants_only_those_scopes() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "simulator", "--port", str(port),
         "--login-scopes", "training:read", "--login-scopes", "training:cancel"],
        env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_until_up(url, process)
        grant = _device_login(url)
    finally:
        _stop(process)

    assert grant["scope"] == "training:read training:cancel"


@pytest.mark.slow
def test_an_unknown_scope_is_one_line_naming_the_option() -> None:
    result = prefect_ito("simulator", "--login-scopes", "training:write", env=dict(os.environ))

    assert result.returncode == ExitCode.INVALID_INPUT
    assert result.stderr.strip().splitlines() == [
        "error: --login-scopes: 'training:write' is not a scope; give any of training:read, "
        "training:submit, training:decide, training:cancel, spend:confirm, spend:authorize"
    ]
