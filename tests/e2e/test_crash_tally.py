"""How the crash trials count suspensions and resumes from a flow run's state history, and when
they strike a trial as relaying and lose the machine."""

from __future__ import annotations

import random
from types import SimpleNamespace
from uuid import uuid4

from crash_tally import _resumes
from crash_trials import Conductor, Snapshot, Strike, Trial, due, note_sightings


def history(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=name) for name in names]


def test_every_suspension_resumed_once_is_nothing_lost():
    states = history("Running", "Suspended", "Resuming", "Running", "Completed")
    assert _resumes(states) == (0, 0)


def test_a_suspension_left_waiting_is_a_lost_resume():
    states = history("Running", "Suspended", "Resuming", "Running", "Suspended")
    assert _resumes(states) == (1, 0)


def test_a_suspension_resumed_twice_is_counted():
    states = history("Suspended", "Resuming", "Resuming", "Running", "Completed")
    assert _resumes(states) == (0, 1)


def test_a_formless_suspension_the_watcher_re_entered_is_asked_again_not_lost():
    # Seen in a crash trial: the machine was lost between suspending and saving the form; the
    # watcher re-entered the run, which asked again and was resumed.
    states = history(
        "Running", "Suspended", "Recovering", "Pending", "Running",
        "Suspended", "Resuming", "Running", "Completed",
    )  # fmt: skip
    assert _resumes(states) == (0, 0)


def test_a_re_asked_question_left_waiting_is_still_lost():
    states = history("Running", "Suspended", "Recovering", "Running", "Suspended")
    assert _resumes(states) == (1, 0)


# --- how a relaying trial is struck and labelled -------------------------------------------------


def relaying_look(at: float, state: str, pids: list[int]) -> tuple[Trial, Snapshot]:
    """Return a relaying trial a person answered at 0 s, and a look at ``at`` s: its flow run in
    ``state`` (``Suspended`` waits for the person), ``pids`` its flow processes."""
    trial = Trial(4, "relaying", 0.0, after_relay=False, flow_run_id=uuid4(), answered_at=0.0)
    paused = state == "Suspended"
    flow_run = SimpleNamespace(
        state=SimpleNamespace(
            is_paused=lambda: paused,
            state_details=SimpleNamespace(pause_key="restart-act-1" if paused else None),
        )
    )
    run = SimpleNamespace(run=SimpleNamespace(decisions=["approve"]))
    snap = Snapshot(
        at,
        {trial.flow_run_id: flow_run},  # type: ignore[dict-item]
        {trial.booking: run},  # type: ignore[dict-item]
        {str(trial.flow_run_id): pids},
    )
    return trial, snap


def test_the_suspended_process_on_its_way_out_is_not_struck_as_relaying():
    trial, snap = relaying_look(1.0, "Suspended", [101])
    note_sightings(trial, snap)
    assert snap.phase(trial) == "awaiting-person" and not due(trial, snap)


def test_the_process_after_a_slow_resume_is_struck_as_relaying():
    # Seen in a crash trial on a loaded machine: the watcher's resume and the worker's pick-up
    # took over 30 s after the answer; the process that then read the decision was relaying.
    trial, snap = relaying_look(40.0, "Pending", [202])
    note_sightings(trial, snap)
    assert snap.phase(trial) == "relaying" and due(trial, snap)
    later = Snapshot(75.0, snap.flow_runs, snap.backend, snap.processes)
    assert later.phase(trial) == "mid-gate"


def test_the_machine_is_lost_only_once_a_watcher_was_killed_while_a_trial_deferred():
    # Seen in a crash trial: the loss caught both deferred trials running, their backend runs
    # ended during the recovery, they never deferred, and no watcher was ever killed.
    trials = [
        Trial(0, "awaiting-person", 0.0, False, flow_run_id=uuid4()),
        Trial(1, "deferred", 0.0, False, flow_run_id=uuid4()),
        Trial(2, "before-submit", 0.0, False, flow_run_id=uuid4()),
    ]
    trials[2].strikes.append(Strike(1.0, "flow-process", "before-submit", 1))
    suspended = SimpleNamespace(
        is_paused=lambda: True, state_details=SimpleNamespace(pause_key="restart-act-1")
    )
    flow_runs = {trials[0].flow_run_id: SimpleNamespace(state=suspended)}
    snap = Snapshot(10.0, flow_runs, {}, {})  # type: ignore[arg-type]
    conductor = Conductor(None, trials, random.Random(1), started_at=0.0)  # type: ignore[arg-type]
    assert not conductor._machine_loss_due(snap)
    conductor.watcher_kills = 1
    assert conductor._machine_loss_due(snap)
