"""Under pytest-xdist, the sweep still finds a canary that leaked in another worker.

A run of its own, with two workers: ``sweep_probe.py`` leaks a canary it minted into its captured
output, and the sweep's search runs in the other worker (each takes one of the two modules). Were
the sweep to look only at the session it runs in, that run would pass. Only the search runs of
``test_sweep.py``: its other tests add canaries of their own, which this question does not need.

The same run, in a temporary directory of its own, shows what a run of the suite leaves behind.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CHECKOUT = HERE.parents[1]
PROBE = "tests/reliability/sweep_probe.py"
SWEEP = "tests/reliability/test_sweep.py"
LEAK = "test_a_canary_leaks_into_the_captured_output"
SEARCH = "test_no_token_appears_anywhere_the_suite_can_read"
RUN_VARIABLES = ("PYTEST_XDIST_", "PREFECT_ITO_TEST_RUN", "PREFECT_ITO_POSTGRES_URL")
"""What this run's own workers inherit: the other run starts afresh (its own run, no cluster)."""
pytestmark = pytest.mark.slow  # a run of the suite of its own

OUTCOME = re.compile(r"^\[(gw\d+)\] \[ *\d+%\] (PASSED|FAILED|ERROR) (\S+) *$", re.MULTILINE)


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the probe and the sweep's search in two workers; return the run and its TMPDIR."""
    temporary = tmp_path_factory.mktemp("other-run-tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(RUN_VARIABLES)}
    env["TMPDIR"] = str(temporary)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-v",
         "--show-capture=no", PROBE, f"{SWEEP}::{SEARCH}"],
        cwd=CHECKOUT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    return result, temporary


def test_a_canary_leaked_in_another_worker_fails_the_sweep(other_run):
    result, _ = other_run
    report = result.stdout[-4000:] + result.stderr[-2000:]
    outcomes = {test: (worker, outcome) for worker, outcome, test in OUTCOME.findall(result.stdout)}
    probe_worker, probe = outcomes.get(f"{PROBE}::{LEAK}", ("", "not run"))
    sweep_worker, sweep = outcomes.get(f"{SWEEP}::{SEARCH}", ("", "not run"))

    assert probe == "PASSED", report
    assert sweep_worker != probe_worker, report
    assert sweep == "FAILED", report
    # Found in the other worker's captured output (as a canary of its own, and by its shape).
    assert f"'{probe_worker}: test output, logs and exception texts': " in result.stdout, report
    assert len(outcomes) == 2 and result.returncode == 1, report


def test_a_run_leaves_nothing_in_the_temporary_directory_but_pytest_s_own(other_run):
    """Each session's Prefect home (its server's database, its keyring file) went with the run.

    They were left in the temporary directory, 20-40 MB a session, three sessions a run.
    """
    result, temporary = other_run
    left = sorted(path.name for path in temporary.iterdir())

    assert left == [f"pytest-of-{getpass.getuser()}"], (left, result.stdout[-2000:])
