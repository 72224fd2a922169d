"""``prefect-ito login | logout | whoami`` as a person runs them, where the keyring matters.

keyring picks its backend once per process, from the environment, its config file and every
backend class defined by then. So these tests run the CLI in child processes whose environment
they set themselves: the session's conftest chooses a plaintext file keyring and allows it, which
is exactly what a user's machine does not do.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from keyrings.alt.file import PlaintextKeyring

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer

FAIL = "keyring.backends.fail.Keyring"
NULL = "keyring.backends.null.Keyring"
PLAINTEXT = "keyrings.alt.file.PlaintextKeyring"
ALLOW = "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING"
WAY_OUT = ("ITO_COMPUTE_TOKEN", f"{ALLOW}=true")
UNUSABLE = pytest.mark.parametrize(
    "backend", [FAIL, NULL, PLAINTEXT], ids=["no-keyring", "null-keyring", "plaintext-not-allowed"]
)

# A child process that sees only keyring's own fallbacks and whatever backends the package
# defines: a headless machine with neither an OS keyring nor keyrings.alt installed.
HEADLESS_LOGIN = """
import sys
import keyring.core
from prefect_ito.cli import app
import prefect_ito.cli.demo

keyring.core.init_backend(
    limit=lambda backend: not type(backend).__module__.startswith(("keyring.", "keyrings."))
)
print("keyring backend:", type(keyring.get_keyring()).__name__, flush=True)
app(["login", "--api-url", sys.argv[1]])
"""

# Does importing the package change which backend keyring chooses, or what it chains?
IMPORT_PROBE = """
import keyring.backend
import keyring.core

def chosen():
    keyring.core.init_backend()
    backend = keyring.get_keyring()
    members = getattr(backend, "backends", [])
    keyring.backend.get_all_keyring.reset()  # keyring looks for backends once; look again later
    return [type(backend).__qualname__, *sorted(type(m).__qualname__ for m in members)]

before = chosen()
import prefect_ito
import prefect_ito.cli
import prefect_ito.cli.demo
after = chosen()
ours = [
    cls.__qualname__
    for cls in keyring.backend.KeyringBackend.get_viable_backends()
    if cls.__module__.startswith("prefect_ito")
]
print(before, after, ours)
assert before == after and not ours, (before, after, ours)
"""


def clean_env(home: Path, **settings: str) -> dict[str, str]:
    """Return this process's environment with no token, no keyring choice and empty keyring dirs."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in (
            "ITO_COMPUTE_TOKEN",
            "ITO_COMPUTE_API_URL",
            "ITO_COMPUTE_ALLOWED_ORIGINS",
            "PYTHON_KEYRING_BACKEND",
            ALLOW,
        )
        and not key.startswith("KEYRING_PROPERTY_")
    }
    env.update(
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        PREFECT_INTEGRATIONS_ITO_MAX_RETRIES="0",
    )
    env.update(settings)
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    """Run a Python child with no terminal; a login still waiting for approval fails the test."""
    try:
        return subprocess.run(
            [sys.executable, *args],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"still running after {timeout} s (waiting for a login approval?): {expired}")


def prefect_ito(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(["-m", "prefect_ito.cli", *args], env)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """Return the error line, checking it is the only thing the command complained with."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.slow
def test_importing_the_package_registers_no_keyring_backend(tmp_path: Path) -> None:
    result = run(["-c", IMPORT_PROBE], clean_env(tmp_path))

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_login_without_any_keyring_fails_before_the_device_flow(
    simulator: SimulatorServer, tmp_path: Path
) -> None:
    result = run(["-c", HEADLESS_LOGIN, simulator.url], clean_env(tmp_path))

    assert result.returncode == ExitCode.AUTHENTICATION, result.stdout + result.stderr
    assert "keyring backend: Keyring" in result.stdout  # keyring's fail backend
    assert "Logged in" not in result.stdout
    assert all(hint in one_line_error(result) for hint in WAY_OUT)
    assert simulator.requests() == []


@pytest.mark.slow
@UNUSABLE
def test_login_with_an_unusable_keyring_fails_before_the_device_flow(
    backend: str, simulator: SimulatorServer, tmp_path: Path
) -> None:
    env = clean_env(tmp_path, PYTHON_KEYRING_BACKEND=backend)
    result = prefect_ito("login", "--api-url", simulator.url, env=env)

    assert result.returncode == ExitCode.AUTHENTICATION, result.stdout + result.stderr
    assert all(hint in one_line_error(result) for hint in WAY_OUT)
    assert "To log in, open" not in result.stdout
    assert simulator.requests() == []


@pytest.mark.slow
@UNUSABLE
def test_whoami_with_an_unusable_keyring_is_not_logged_in(
    backend: str, simulator: SimulatorServer, tmp_path: Path
) -> None:
    env = clean_env(tmp_path, PYTHON_KEYRING_BACKEND=backend)
    if backend == PLAINTEXT:
        # A token in the plaintext file that was not allowed must not be read either.
        stored = PlaintextKeyring()
        stored.file_path = str(tmp_path / "data" / "python_keyring" / "keyring_pass.cfg")
        stored.set_password("prefect-ito", simulator.url, simulator.mint_token().get_secret_value())

    result = prefect_ito("whoami", "--api-url", simulator.url, env=env)

    assert result.returncode == ExitCode.AUTHENTICATION, result.stdout + result.stderr
    error = one_line_error(result)
    assert error.startswith(f"error: not logged in to {simulator.url}")
    assert f"prefect-ito login --api-url {simulator.url}" in error
    assert "keyring was not used" in error
    assert simulator.requests() == []


@pytest.mark.slow
def test_whoami_on_a_revoked_token_exits_with_the_authentication_code(
    simulator: SimulatorServer, tmp_path: Path
) -> None:
    token = simulator.mint_token().get_secret_value()
    revoked = httpx.post(
        f"{simulator.url}/v0/auth/revoke", headers={"Authorization": f"Bearer {token}"}
    )
    assert revoked.json()["data"] == {"revoked": True}

    env = clean_env(
        tmp_path,
        PYTHON_KEYRING_BACKEND=FAIL,
        ITO_COMPUTE_API_URL=simulator.url,
        ITO_COMPUTE_TOKEN=token,
    )
    result = prefect_ito("whoami", "--api-url", simulator.url, env=env)

    assert result.returncode == ExitCode.AUTHENTICATION, result.stdout + result.stderr
    assert "TOKEN_REVOKED" in one_line_error(result)
    assert token not in result.stdout + result.stderr


@pytest.mark.slow
def test_an_unreachable_backend_is_one_line_naming_its_url(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens while it is bound
        env = clean_env(tmp_path, PYTHON_KEYRING_BACKEND=PLAINTEXT, **{ALLOW: "true"})
        login = prefect_ito("login", "--api-url", url, env=env)
        with_token = {**env, "ITO_COMPUTE_API_URL": url, "ITO_COMPUTE_TOKEN": "t"}
        whoami = prefect_ito("whoami", "--api-url", url, env=with_token)
        results = [login, whoami]

    for result in results:
        assert result.returncode == ExitCode.ERROR, result.stdout + result.stderr
        assert f"talking to the Itô backend at {url}" in one_line_error(result)


@pytest.mark.slow
def test_a_bad_url_is_one_line(tmp_path: Path) -> None:
    result = prefect_ito("whoami", "--api-url", "desk.example", env=clean_env(tmp_path))

    assert result.returncode == ExitCode.ERROR
    assert "not an http(s) URL" in one_line_error(result)


def test_an_unknown_credentials_block_is_one_line(prefect_server: str, tmp_path: Path) -> None:
    env = clean_env(tmp_path, PREFECT_API_URL=prefect_server)
    result = prefect_ito("whoami", "--credentials", "no-such-desk", env=env)

    assert result.returncode == ExitCode.INVALID_INPUT, result.stdout + result.stderr
    assert "no ItoCredentials block named 'no-such-desk'" in one_line_error(result)
