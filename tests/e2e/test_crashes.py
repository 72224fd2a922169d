"""Crashes and lost machines, as trials on one real stack: nothing runs, decides or resumes twice.

Training flow runs at once (22 for the reliability report; 6 in an everyday run, one a phase: the
plan deals the phases in turn before its seeded shuffle), all but two of them struck at a point a
seeded RNG chose (before submission, right after it, mid-gate, while deferred, while waiting for a
person, while a decision is relayed); the machine is lost once (worker and every flow process
SIGKILLed), the Prefect server restarted once, a watcher killed now and then while another runs
beside it. See ``crash_trials.py``. SQLite only: the stack is its own, and one database is enough
for the longest test of the suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_tally import Tally, record_figures
from crash_trials import plan, run_trials, trial_scenario
from trial_counts import count
from trial_stack import TrialStack, trial_stack

from prefect_ito.simulator import SimulatorServer

pytestmark = pytest.mark.e2e

TRIALS = count(full=22, everyday=6)
AT_LEAST_STRUCK = TRIALS - 2
"""A run may end or move on before its fault lands: two spare trials."""
SEED = int(os.environ.get("PREFECT_ITO_TRIAL_SEED", "20261201"))
TIMEOUT = 600.0


@pytest.fixture(scope="module")
def trials_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrialStack]:
    scratch = Path(tmp_path_factory.mktemp("trials"))
    scenario = trial_scenario(plan(TRIALS, SEED))
    with SimulatorServer(scenario) as simulator, trial_stack(simulator, scratch) as stack:
        yield stack


async def test_crashes_and_a_lost_machine_never_run_decide_or_report_twice(
    trials_stack: TrialStack, ledger: Any
):
    tally = await run_trials(trials_stack, TRIALS, SEED, TIMEOUT)
    print(f"figures: {record_figures(tally)}: {tally}")
    record_in(ledger, tally)

    assert tally.struck >= AT_LEAST_STRUCK, tally.phases
    assert tally.machine_losses == 1 and tally.server_restarts == 1 and tally.watcher_kills >= 1
    # Every phase was caught at least once, by one fault or another.
    assert {"before-submit", "mid-gate", "deferred", "awaiting-person", "relaying"} <= set(
        tally.phases
    ), tally.phases
    assert tally.final_states == {"Completed": TRIALS}, tally.final_states
    assert tally.duplicate_runs == 0
    assert tally.decisions_relayed_twice == 0 and tally.duplicate_decisions == 0
    assert tally.events_missing == 0 and tally.events_doubled == 0, tally.missing_detail
    assert tally.resumes_lost == 0 and tally.resumes_doubled == 0
    assert tally.recover_s and None not in tally.recover_s  # every lost flow process ran again


def record_in(ledger: Any, tally: Tally) -> None:
    """Put the trials' figures in the reliability report: the crashes, and the watchers' faults."""
    figures = tally.figures()
    ledger.record(
        "crashes",
        trials=tally.trials,
        faults={
            **{f"struck {phase}": count for phase, count in sorted(tally.phases.items())},
            "machine lost (worker and every flow process)": tally.machine_losses,
        },
        outcomes=tally.final_states,
        duplicates=tally.duplicate_runs
        + tally.decisions_relayed_twice
        + tally.duplicate_decisions
        + tally.events_doubled,
        measures={
            "flow processes lost": f"{len(tally.recover_s)}",
            "lost flow process → its flow run running again": f"p50 {figures['p50_s']} s, "
            f"p95 {figures['p95_s']} s",
            "… of which, until re-entered (the loss noticed)": f"p50 {figures['notice_p50_s']} s, "
            f"p95 {figures['notice_p95_s']} s",
            "decisions relayed twice": str(tally.decisions_relayed_twice),
            "gate events missing in Prefect, by id": str(tally.events_missing),
            "trials' wall time": f"{tally.wall_s:.0f} s",
        },
    )
    ledger.record(
        "watcher",
        trials=tally.trials,
        faults={
            "watcher SIGKILLed while another ran": tally.watcher_kills,
            "Prefect server restarted": tally.server_restarts,
        },
        outcomes={"resumes lost": tally.resumes_lost},
        duplicates=tally.resumes_doubled,
        measures={"suspensions resumed twice": str(tally.resumes_doubled)},
    )
