"""The commands that never run or read a flow never import Prefect (about two seconds of start-up).

Each runs in a fresh interpreter, as ``prefect-ito`` does, against the simulator on loopback;
what it imported is read when it ends. Timings are the benchmark's (benchmarks/cli.py); this
holds the behaviour that makes them.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator
from importlib import import_module

import pytest
from cli_helpers import REQUEST, confirming_env, quote_for_train

from prefect_ito.simulator import SimulatorServer, builtin_scenario

RUN_AND_REPORT = """
import sys
sys.argv = ["prefect-ito", *sys.argv[1:]]
from prefect_ito.cli import main
try:
    main()
except SystemExit as ended:
    code = ended.code
else:
    code = 0
print("IMPORTED-PREFECT" if "prefect" in sys.modules else "NO-PREFECT", code, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(builtin_scenario("default")) as server:
        yield server


def run(simulator: SimulatorServer, *args: str) -> tuple[str, str]:
    """Run ``prefect-ito ARGS``; return whether it imported Prefect, and everything it printed."""
    env = {**confirming_env(simulator, ""), "PREFECT_API_URL": ""}
    result = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT, *args],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    verdict = result.stderr.strip().splitlines()[-1]
    return verdict.split()[0], output


BOOKING = REQUEST.booking_id


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["whoami"],
        ["whoami", "--json"],
        ["capabilities", "--json"],
        ["runs", "show", "--booking", BOOKING],
        ["runs", "show", "run_nobody_made", "--json"],
        ["login", "--help"],
        ["logout", "--help"],
        ["authorizations", "list", "--json"],
        ["confirm", "--help"],
    ],
    ids=" ".join,
)
@pytest.mark.slow
def test_a_command_that_runs_no_flow_never_imports_prefect(simulator, args):
    verdict, output = run(simulator, *args)
    assert verdict == "NO-PREFECT", output


@pytest.mark.slow
def test_confirming_a_quote_never_imports_prefect(simulator):
    quote_id = quote_for_train(simulator)
    verdict, output = run(simulator, "confirm", quote_id, "--yes", "--json")
    assert '"ok":true' in output.replace(" ", ""), output
    assert verdict == "NO-PREFECT", output


@pytest.mark.slow
def test_quote_never_imports_prefect(simulator):
    args = ["quote", "--booking", BOOKING, "--model-size", "8B", "--target", "t"]
    verdict, output = run(
        simulator, *args, "--data", "s3://acme/x/", "--budget-usd", "9e4", "--json"
    )
    assert '"ok":true' in output.replace(" ", ""), output  # a quote was made, not an error
    assert verdict == "NO-PREFECT", output


@pytest.mark.slow
def test_a_flow_command_still_imports_prefect(simulator):
    verdict, output = run(simulator, "status", "--help")
    assert verdict == "IMPORTED-PREFECT", output  # the check above can tell the two apart


def test_each_command_s_line_in_the_list_is_its_docstring_s_first_line():
    from prefect_ito.cli import COMMANDS

    for name, (path, line) in COMMANDS.items():
        module, attribute = path.split(":")
        command = getattr(import_module(module), attribute)
        doc = command.help if hasattr(command, "help") else inspect.getdoc(command)
        first = " ".join(doc.split("\n\n")[0].split())
        assert line == first.replace("`", "") or line == first, (name, line, first)


def test_the_commands_check_ids_as_the_flows_do():
    from prefect_ito import parameters
    from prefect_ito.cli import local

    assert local.IDEMPOTENCY_KEY_PATTERN == parameters.IDEMPOTENCY_KEY_PATTERN
    for value in ["run_1", "", " x", "a/b", "x" * 129, "é", "a?b", "ok-1.2"]:
        outcomes = []
        for check in (local.check_id, parameters.check_id):
            try:
                outcomes.append(check(value, "id"))
            except Exception as error:  # the two must fail alike
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1], value
