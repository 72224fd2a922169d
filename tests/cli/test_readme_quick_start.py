"""The README's quick start runs as written, top to bottom, against the simulator.

Its commands are read from the README's "Quick start" section (its ``sh`` blocks, lines joined
and comments dropped), never copied here, and run in order as a new user runs them: on a fresh
``PREFECT_HOME`` with no Prefect server (each command starts its own, as Prefect does), a
temporary keyring, and the simulator standing for the backend, as the README's next paragraph
says. What needs a person is done as a person does it: the device login is approved on the
simulator's page, and ``train`` is answered at a pseudo-terminal. Each command must end as the
README says: successfully.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ALLOW_PLAINTEXT, converse
from device_login import approve_in_browser
from simulator_fixture import FAST

from prefect_ito.simulator import SimulatorServer, builtin_scenario

README = Path(__file__).resolve().parents[2] / "README.md"
PREFECT_ITO = str(Path(sys.executable).with_name("prefect-ito"))
"""The command ``uv run prefect-ito`` runs: the environment's own script."""
USER_CODE = re.compile(r"enter the code ([A-Z]{4}-[A-Z]{4})")
SIMULATOR_URL = re.compile(r"`ITO_COMPUTE_API_URL=(http://127\.0\.0\.1:\d+)`")


def quick_start() -> str:
    """Return the README's quick start section."""
    found = re.search(r"^## Quick start[^\n]*\n(.*?)^## ", README.read_text(), re.M | re.S)
    assert found, "the README has no Quick start section"
    return found.group(1)


def quick_start_commands() -> list[list[str]]:
    """Return the commands of the quick start's shell blocks, in order, as argument lists."""
    blocks = re.findall(r"^```sh\n(.*?)^```", quick_start(), re.M | re.S)
    assert blocks, "the quick start shows no shell commands"
    lines = "\n".join(re.sub(r"\\\n", " ", block) for block in blocks).splitlines()
    return [words for line in lines if (words := shlex.split(line, comments=True))]


def test_the_quick_start_reads_its_commands_from_the_readme():
    commands = quick_start_commands()

    assert [c[:3] for c in commands if c[:2] == ["uv", "run"]] == [
        ["uv", "run", "prefect-ito"]
    ] * len([c for c in commands if c[:2] == ["uv", "run"]])
    assert any(c[:1] == ["export"] for c in commands)
    # The paragraph after it names the simulator's address, which these commands then use.
    assert SIMULATOR_URL.search(quick_start())


@pytest.mark.slow  # the commands are processes, each starting a temporary Prefect server
def test_the_quick_start_runs_as_written_against_the_simulator(tmp_path):
    home = tmp_path / "prefect-home"
    home.mkdir()  # as Prefect needs it: it does not make the folder itself
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ITO_COMPUTE_", "PREFECT_"))},
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # A machine without an OS keyring, as the README says: a file keyring of its own.
        "PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        ALLOW_PLAINTEXT: "true",
        "COLUMNS": "200",
    }
    with SimulatorServer(builtin_scenario("default"), time_scale=FAST) as simulator:
        ran = []
        for command in quick_start_commands():
            ran.append(run_as_written(command, env, simulator))

    assert [words[:3] for words in ran] == [c[:3] for c in quick_start_commands()]


def run_as_written(
    command: list[str], env: dict[str, str], simulator: SimulatorServer
) -> list[str]:
    """Run one of the quick start's commands as the README says, and check it ended so."""
    if command[:2] == ["uv", "add"]:
        # Installing: this checkout's environment has it (a test reaches no package index).
        assert command[2:] == ["prefect-ito"], command
        assert importlib.metadata.version("prefect-ito")
        return command
    if command[0] == "export":
        name, _, _ = command[1].partition("=")
        assert name == "ITO_COMPUTE_API_URL", command
        env[name] = simulator.url  # the README: the simulator's address instead
        return command
    assert command[:3] == ["uv", "run", "prefect-ito"], f"a quick start step not known: {command}"
    args = command[3:]
    if args[0] == "login":
        log_in(args, env)
    elif args[0] == "train":
        train_at_a_terminal(args, env)
    else:
        done = subprocess.run(
            [PREFECT_ITO, *args], env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stdout + done.stderr)
        assert "Traceback" not in done.stdout + done.stderr
    return command


def log_in(args: list[str], env: dict[str, str]) -> None:
    """Run the device login; approve it on the backend's page as its person does."""
    login = subprocess.Popen(
        [PREFECT_ITO, *args], env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert login.stdout is not None
        said = ""
        for line in login.stdout:
            said += line
            if found := USER_CODE.search(line):
                uri = line.split("open ", 1)[1].split(" and enter", 1)[0]
                approve_in_browser(uri, found.group(1))
                break
        rest, _ = login.communicate(timeout=120)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait(timeout=30)
    assert login.returncode == 0, said + rest
    assert "Traceback" not in said + rest


def train_at_a_terminal(args: list[str], env: dict[str, str]) -> None:
    """Run ``train`` at a pseudo-terminal, as the README says ("at a terminal: asks you"): the
    person confirms the spend there, and the training runs to its end."""
    code, output = converse(
        [PREFECT_ITO, *args],
        env,
        [("[confirm/decline]", "confirm\n"), ("(optional): ", "\n")],
        wait=240,  # the first command on a fresh home: Prefect migrates its database first
    )
    assert code == 0, output
    assert "succeeded" in output, output
