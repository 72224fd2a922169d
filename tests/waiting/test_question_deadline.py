"""When a question a paused flow run asks expires, as ``inbox``, the watcher and a telling again
say it: a suspension's Prefect deadline comes a grace after the question's, so that the watcher
resumes the run at the question's and the flow ends it itself; an in-process pause's is Prefect's.
"""

from __future__ import annotations

from datetime import timedelta

from prefect.states import Paused, Suspended

from prefect_ito.waiting.waits import DEADLINE_GRACE_SECONDS, question_deadline


def test_a_suspended_question_expires_a_grace_before_prefect_fails_its_run():
    suspended = Suspended(timeout_seconds=3_600, pause_key="spend-x")
    prefect_deadline = suspended.state_details.pause_timeout

    assert question_deadline(suspended) == prefect_deadline - timedelta(
        seconds=DEADLINE_GRACE_SECONDS
    )


def test_a_question_paused_in_process_expires_at_prefect_s_deadline():
    paused = Paused(timeout_seconds=3_600, pause_key="spend-x")

    assert question_deadline(paused) == paused.state_details.pause_timeout
