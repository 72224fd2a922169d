"""How the crash trials count suspensions and resumes from a flow run's state history."""

from __future__ import annotations

from types import SimpleNamespace

from crash_tally import _resumes


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
