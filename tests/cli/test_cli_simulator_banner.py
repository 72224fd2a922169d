"""``prefect-ito simulator`` tells a new user how to get a token for it, and never prints one."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from device_login import approve_in_browser
from keyrings.alt.file import PlaintextKeyring


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _banner(process: subprocess.Popen[bytes]) -> list[str]:
    """Read the simulator's first lines, up to the command that logs in (or a minute's worth)."""
    assert process.stdout is not None
    seen, deadline = b"", time.monotonic() + 60  # a bound on a hang, not a speed assertion
    while b"prefect-ito login\n" not in seen and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if select.select([process.stdout], [], [], 1)[0]:
            seen += os.read(process.stdout.fileno(), 65536)
    lines = seen.decode().splitlines()
    assert "  prefect-ito login" in lines, f"the simulator did not say how to log in: {lines}"
    return lines


def _login_as_told(env: dict[str, str]) -> tuple[int, str]:
    """Run ``prefect-ito login`` in ``env`` and approve it as a person would in a browser."""
    login = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "login"],
        env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert login.stdout is not None
        for line in login.stdout:
            if "enter the code" in line:
                words = line.split()
                approve_in_browser(words[words.index("open") + 1], words[-1])
                break
        output, _ = login.communicate(timeout=60)
    finally:
        if login.poll() is None:
            os.kill(login.pid, signal.SIGTERM)
            login.wait(timeout=30)
    return login.returncode, output


@pytest.mark.slow
def test_the_banner_says_how_to_get_a_token_and_following_it_logs_in(tmp_path: Path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("ITO_COMPUTE")}
    env.update(XDG_DATA_HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    simulator = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "simulator", "--port", str(port)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        banner = _banner(simulator)
        # What the banner says to type, taken from the banner itself.
        exported = next(line.strip() for line in banner if "export ITO_COMPUTE_API_URL=" in line)
        told = {**env, "ITO_COMPUTE_API_URL": exported.split("=", 1)[1]}
        code, output = _login_as_told(told)
    finally:
        if simulator.poll() is None:
            os.kill(simulator.pid, signal.SIGTERM)
            simulator.wait(timeout=30)

    assert banner[0] == f"Itô desk simulator (default) on {url}; contract under /v0"
    assert "To get a token for it" in banner[1] and "device login" in banner[1]
    assert exported == f"export ITO_COMPUTE_API_URL={url}"
    assert len(banner) <= 4
    assert code == 0, output
    keyring = PlaintextKeyring()
    keyring.file_path = str(tmp_path / "python_keyring" / "keyring_pass.cfg")
    token = keyring.get_password("prefect-ito", url)
    assert token
    assert token not in "\n".join(banner)
    assert "itosim_" not in "\n".join(banner)


@pytest.mark.slow
def test_port_0_is_served_on_the_port_the_banner_names():
    # The banner named the port asked for, :0, which no client can reach.
    simulator = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "simulator", "--port", "0"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        banner = _banner(simulator)
        url = banner[0].split(" on ", 1)[1].split(";", 1)[0]
        answer = httpx.get(f"{url}/v0/capabilities", timeout=30)
    finally:
        if simulator.poll() is None:
            os.kill(simulator.pid, signal.SIGTERM)
            simulator.wait(timeout=30)

    assert not url.endswith(":0")
    assert answer.json()["ok"] is False  # the simulator's own envelope: no token was sent


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_no_banner():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "prefect_ito.cli", "simulator", "--port", str(port)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: port: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
