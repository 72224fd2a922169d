"""Crashes and lost machines, as trials on one real stack: nothing runs, decides or resumes twice.

22 training flow runs at once, at least 20 of them struck at a point a seeded RNG chose (before
submission, right after it, mid-gate, while deferred, while waiting for a person, while a decision
is relayed); the
machine is lost once (worker and every flow process SIGKILLed), the Prefect server restarted once,
a watcher killed now and then while another runs beside it. See ``crash_trials.py``. SQLite only:
the stack is its own, and one database is enough for the longest test of the suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_tally import record_figures
from crash_trials import plan, run_trials, trial_scenario
from trial_stack import TrialStack, trial_stack

from prefect_ito.simulator import SimulatorServer

pytestmark = pytest.mark.e2e

TRIALS = 22
AT_LEAST_STRUCK = 20
"""A run may end or move on before its fault lands: two spare trials keep twenty struck."""
SEED = int(os.environ.get("PREFECT_ITO_TRIAL_SEED", "20261201"))
TIMEOUT = 600.0


@pytest.fixture(scope="module")
def trials_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialStack]:
    scratch = Path(tmp_path_factory.mktemp("trials"))
    scenario = trial_scenario(plan(TRIALS, SEED))
    with SimulatorServer(scenario) as simulator, trial_stack(simulator, scratch) as stack:
        yield stack


async def test_crashes_and_a_lost_machine_never_run_decide_or_report_twice(
    trials_stack: TrialStack,
):
    tally = await run_trials(trials_stack, TRIALS, SEED, TIMEOUT)
    print(f"figures: {record_figures(tally)}: {tally}")

    assert tally.struck >= AT_LEAST_STRUCK, tally.phases
    assert tally.machine_losses == 1 and tally.server_restarts == 1 and tally.watcher_kills >= 1
    # Every phase was caught at least once, by one fault or another.
    assert {"before-submit", "mid-gate", "deferred", "awaiting-person", "relaying"} <= set(
        tally.phases
    ), tally.phases
    assert tally.final_states == {"Completed": TRIALS}, tally.final_states
    assert tally.duplicate_runs == 0
    assert tally.decisions_relayed_twice == 0 and tally.duplicate_decisions == 0
    assert tally.events_missing == 0 and tally.events_doubled == 0
    assert tally.resumes_lost == 0 and tally.resumes_doubled == 0
    assert tally.recover_s and None not in tally.recover_s  # every lost flow process ran again
