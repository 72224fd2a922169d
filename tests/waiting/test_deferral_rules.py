"""When a watcher resumes a deferred flow run: the pure rules, with pinned clocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_ito.contract import ActionKind, PendingAction, RunState, TrainingRun
from prefect_ito.waiting.deferral import Deferral, deferral_key
from prefect_ito.waiting.watcher import _must_resume

BEAT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def record(**changes) -> Deferral:
    fields = {
        "api_url": "http://127.0.0.1:9", "run_id": "run_1", "version": 5, "stage": "pretrain",
        "events_seen": 3, "heartbeat_at": BEAT, "heartbeat_seen_at": 1_000.0,
        "stall_timeout": 600.0, "deadline_at": None,
    }  # fmt: skip
    return Deferral(**{**fields, **changes})


def test_the_pause_key_names_the_version_and_only_letters_digits_dashes() -> None:
    run = TrainingRun.model_construct(run_id="run_ab_1", version=7)
    key = deferral_key(run)
    assert key.startswith("defer-7-") and key.replace("-", "").isalnum()
    assert deferral_key(TrainingRun.model_construct(run_id="run_ab_1", version=8)) != key


@pytest.mark.parametrize(
    ("now", "heartbeat", "stalled"),
    [(1_500.0, BEAT, False), (1_700.0, BEAT, True), (1_700.0, BEAT + timedelta(seconds=1), False)],
)
def test_a_run_is_stalled_when_its_heartbeat_stood_still_past_the_limit(now, heartbeat, stalled):
    assert record().stalled(heartbeat, now=now) is stalled
    assert record(stall_timeout=None).stalled(heartbeat, now=now) is False


def test_the_deadline_comes_due_on_the_wall_clock() -> None:
    assert record(deadline_at=2_000.0).past_deadline(now=1_999.0) is False
    assert record(deadline_at=2_000.0).past_deadline(now=2_000.0) is True
    assert record().past_deadline(now=10**12) is False


def _run(**fields) -> TrainingRun:
    base = {
        "run_id": "run_1", "version": 5, "state": RunState.RUNNING, "current_stage": "pretrain",
        "pending_action": None, "stages": [], "heartbeat_at": datetime.now(UTC),
    }  # fmt: skip
    return TrainingRun.model_construct(**{**base, **fields})


def test_a_watcher_resumes_only_for_what_the_flow_must_handle() -> None:
    waiting = record(heartbeat_seen_at=datetime.now(UTC).timestamp())
    assert not _must_resume(waiting, _run())  # nothing moved
    assert not _must_resume(waiting, _run(version=6))  # moved, same stage, no result yet
    assert _must_resume(waiting, _run(version=6, current_stage="mid_train"))  # a stage changed
    spike = PendingAction.model_construct(kind=ActionKind.LOSS_SPIKE_RESTART)
    assert _must_resume(waiting, _run(version=6, pending_action=spike))  # a person must decide
    assert _must_resume(waiting, _run(version=6, state=RunState.SUCCEEDED))  # it ended
