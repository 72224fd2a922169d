"""Following a backend run's stage gate: the long-poll, the watchdog, and when a gate settled.

The flow's ``await_stage_gate`` task, the job's plain call and the watcher's sweep all judge a
gate by these rules, so a run is never "settled" for one and "waiting" for another.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import GateStatus, PendingAction, Stage, TrainingRun
from prefect_ito.exceptions import DeadlineExceeded, RunStalled
from prefect_ito.settings import current_settings


@dataclass
class Watchdog:
    """Wall-clock limits on supervision, measured with ``clock`` (monotonic unless deferred).

    ``stall_timeout`` ends supervision when the backend's ``heartbeat_at`` has not advanced for
    that long; ``deadline`` when supervision as a whole has run that long. Neither touches the run.
    """

    stall_timeout: float | None = None
    deadline: float | None = None
    clock: Callable[[], float] = time.monotonic
    _started: float = field(init=False)
    _heartbeat: datetime | None = field(init=False, default=None)
    _heartbeat_seen: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self._heartbeat_seen = self.clock()

    def resume(
        self, *, started: float, heartbeat: datetime | None, heartbeat_seen: float | None
    ) -> Watchdog:
        """Carry the clocks on from an earlier process (times in this watchdog's ``clock``).

        A deferred flow run re-enters many times over weeks; its limits count from when
        supervision started and when the heartbeat last moved, not from this process's start.
        """
        self._started = started
        if heartbeat is not None and heartbeat_seen is not None:
            self._heartbeat, self._heartbeat_seen = heartbeat, heartbeat_seen
        return self

    @property
    def heartbeat_seen(self) -> float:
        """When (on ``clock``) the current heartbeat was first seen."""
        return self._heartbeat_seen

    @property
    def deadline_at(self) -> float | None:
        """When (on ``clock``) the deadline is reached, or None without one."""
        return None if self.deadline is None else self._started + self.deadline

    def observe(self, run: TrainingRun) -> None:
        """Record the run's heartbeat and raise when a limit is passed."""
        now = self.clock()
        if run.heartbeat_at != self._heartbeat:
            self._heartbeat, self._heartbeat_seen = run.heartbeat_at, now
        if self.stall_timeout is not None and now - self._heartbeat_seen > self.stall_timeout:
            raise RunStalled(
                f"run {run.run_id} shows no sign of life: heartbeat_at stayed at "
                f"{run.heartbeat_at.isoformat()} for over {self.stall_timeout:g} s"
            )
        if self.deadline is not None and now - self._started > self.deadline:
            raise DeadlineExceeded(
                f"supervision of run {run.run_id} reached its deadline of {self.deadline:g} s; "
                "the backend run goes on and running the flow again re-attaches"
            )

    def remaining(self) -> float | None:
        """Seconds until the nearest limit could be passed, or None without limits."""
        now = self.clock()
        limits = [
            limit - (now - since)
            for limit, since in (
                (self.stall_timeout, self._heartbeat_seen),
                (self.deadline, self._started),
            )
            if limit is not None
        ]
        return max(0.0, min(limits)) if limits else None


def current_stage(run: TrainingRun) -> Stage | None:
    """Return the stage the run is in, or None before the first and after the last."""
    return next((stage for stage in run.stages if stage.name == run.current_stage), None)


def decidable(action: PendingAction | None) -> bool:
    """Tell whether prefect-ito can put ``action`` to a person: a kind it knows how to show
    (every kind this version's contract defines has its question in :mod:`prefect_ito.questions`).

    An action of a kind added to the contract later is left to tools that know it; supervision
    reports it and goes on following the run.
    """
    return action is not None and action.kind.known


def gate_settled(run: TrainingRun, stage_name: str | None) -> bool:
    """Tell whether supervision of ``stage_name`` has something to report.

    True when the run finished, a person must decide, the run moved past the stage, or the
    stage's gate (or, for a stage without one, the stage itself) has a result. A status this
    prefect-ito does not know is no result: the wait goes on.
    """
    if run.finished or decidable(run.pending_action):
        return True
    if run.current_stage != stage_name:
        return True
    stage = current_stage(run)
    if stage is None:
        return False
    if stage.gate is not None:
        return stage.gate.status in (GateStatus.PASSED, GateStatus.FAILED)
    return stage.status.done


async def long_poll_gate(
    client: ItoClient,
    run: TrainingRun,
    *,
    wait: float,
    watchdog: Watchdog,
    interrupted: Callable[[], Awaitable[bool]] | None = None,
    check_every: float | None = None,
    patience: float | None = None,
) -> TrainingRun:
    """Long-poll the run until the current stage's gate settles (see :func:`gate_settled`).

    Every read is a fresh long-poll of up to ``wait`` seconds on the run's ``version``.
    ``interrupted`` (e.g. whether a person cancelled the flow run) is asked between polls and,
    with ``check_every``, that often during one; when true the wait ends early. With
    ``patience``, the wait also ends after that many seconds, the gate settled or not.

    Raises:
        RunStalled: the heartbeat stopped advancing for ``watchdog.stall_timeout``.
        DeadlineExceeded: supervision reached ``watchdog.deadline``.
    """
    stage = run.current_stage
    give_up = None if patience is None else time.monotonic() + patience
    while True:
        watchdog.observe(run)
        if gate_settled(run, stage) or (interrupted is not None and await interrupted()):
            return run
        limits = [wait]
        remaining = watchdog.remaining()
        if remaining is not None:
            limits.append(remaining)
        if give_up is not None:
            if give_up <= time.monotonic():
                return run
            limits.append(give_up - time.monotonic())
        poll = max(0.0, min(limits) + 0.01)
        read = client.get_training_run(run.run_id, after_version=run.version, wait=poll)
        if interrupted is None or check_every is None or check_every >= poll:
            run = await read
            continue
        answer = await _read_unless_interrupted(read, interrupted, check_every)
        if answer is None:
            return run
        run = answer


async def _read_unless_interrupted(
    read: Awaitable[TrainingRun], interrupted: Callable[[], Awaitable[bool]], every: float
) -> TrainingRun | None:
    """Await a long-poll, asking ``interrupted`` every ``every`` seconds meanwhile.

    Returns None, the read abandoned, once ``interrupted`` is true. A long-poll is a read, so
    abandoning it changes nothing at the backend. Racing the check beside one long wait, rather
    than cutting the wait to the check's interval, keeps an idle run to one request per
    ``poll_wait_seconds`` while a cancel is still heard within ``state_poll_seconds``.
    """
    poll = asyncio.ensure_future(read)
    try:
        while True:
            done, _ = await asyncio.wait({poll}, timeout=every)
            if done:
                return poll.result()
            if await interrupted():
                return None
    finally:
        if not poll.done():
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll


async def await_stage_gate(
    client: ItoClient,
    run: TrainingRun,
    watchdog: Watchdog,
    interrupted: Callable[[], Awaitable[bool]],
    patience: float | None = None,
) -> TrainingRun:
    """Wait for the current stage's gate with the configured long-poll, asking ``interrupted``.

    Each long-poll waits up to ``poll_wait_seconds``; beside it ``interrupted`` is asked every
    ``state_poll_seconds``, so a cancel or a detach is heard that soon.
    """
    settings = current_settings()
    return await long_poll_gate(
        client,
        run,
        wait=settings.poll_wait_seconds,
        watchdog=watchdog,
        interrupted=interrupted,
        check_every=settings.state_poll_seconds,
        patience=patience,
    )
