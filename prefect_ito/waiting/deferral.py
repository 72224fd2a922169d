"""Deferred supervision: between gates, a flow run from a deployment holds no process at all.

A training run lasts days to weeks; a flow process waiting on it holds ~100 MB and a worker slot
the whole time, and dies with its machine. So a flow run from a deployment (not a subflow)
*suspends* whenever the backend run works and nobody needs to decide: before it does, it writes a
:class:`Deferral` — which backend run and version it waits on, where the backend is, its
watchdog limits — as an input of its own flow run, and suspends under the pause key
:func:`deferral_key` of that version. ``prefect-ito watch`` (:mod:`prefect_ito.waiting.watcher`)
reads
these records from Prefect, follows the backend runs, and resumes a flow run when its run changed
in a way the flow must handle. The flow then runs from the top: it re-attaches to the run it
recorded (:data:`BACKEND_RUN_KEY`, never a second submission), relays only the events after the
record's ``events_seen``, and defers again or finishes.

Everything lives in Prefect's database, so neither the flow nor the watcher keeps state of its
own: any watcher picks up any deferred run, after any restart.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from pydantic import BaseModel, ConfigDict

from prefect_ito.contract import TrainingRun
from prefect_ito.waiting.flow_run import fired_pause_keys, suspend
from prefect_ito.waiting.keys import BACKEND_RUN_KEY, DEFER_PREFIX

__all__ = [
    "PARKED",
    "BackendRecord",
    "Deferral",
    "deferral_key",
    "latest_deferral",
    "parked_message",
    "read_deferral",
    "read_recorded_run_id",
    "record_run_id",
    "suspend_until_changed",
]

_KEY_NAMESPACE = uuid.UUID("8f0e4b0a-2d7f-4a37-9f1e-5b6c3a9d2e41")

PARKED = (
    "Waiting for the backend; prefect-ito watch resumes this run when its backend run changes; "
    "nothing to do."
)
"""What a parked flow run logs as it suspends: a person reading its log has nothing to do."""


class BackendRecord(BaseModel):
    """Where a waiting flow run's backend is, as its record in Prefect says: no secret.

    Written in Prefect, so nothing here is trusted: a watcher follows ``api_url`` only to an
    origin it is configured for (:mod:`prefect_ito.backend.origins`).
    """

    model_config = ConfigDict(frozen=True)

    api_url: str
    keyring_entry: str | None = None


class Deferral(BackendRecord):
    """What a deferred flow run waits on: everything a watcher needs, and no secret."""

    run_id: str
    version: int
    stage: str | None
    events_seen: int
    heartbeat_at: datetime
    heartbeat_seen_at: float
    """Wall-clock seconds when this ``heartbeat_at`` was first seen (the stall clock's start)."""
    stall_timeout: float | None
    deadline_at: float | None
    """Wall-clock seconds when supervision reaches its deadline, or None."""

    def stalled(self, heartbeat_at: datetime, now: float | None = None) -> bool:
        """Tell whether the run shows no sign of life for ``stall_timeout`` since this record."""
        if self.stall_timeout is None or heartbeat_at != self.heartbeat_at:
            return False
        return (now or time.time()) - self.heartbeat_seen_at > self.stall_timeout

    def past_deadline(self, now: float | None = None) -> bool:
        """Tell whether supervision reached its deadline."""
        return self.deadline_at is not None and (now or time.time()) >= self.deadline_at


def deferral_key(run: TrainingRun) -> str:
    """Return the pause key for waiting on ``run`` at its version: letters, digits and dashes."""
    name = f"{run.run_id}|{run.version}"
    return f"{DEFER_PREFIX}{run.version}-{uuid.uuid5(_KEY_NAMESPACE, name).hex[:20]}"


async def suspend_until_changed(flow_run_id: UUID, run: TrainingRun, record: Deferral) -> None:
    """Write the record and suspend this flow run ("parked"); return only if Prefect refused.

    Suspending ends the flow's process (Prefect's ``Pause`` signal propagates). The Suspended
    state says that it waits for the backend, not for a person. A flow run resumed although
    nothing it waits on changed (Resume pressed by hand) finds this version's key fired: it
    says so and parks again under a key of its own. Should Prefect still refuse the
    suspension, this returns and the caller waits in its process for one change.
    """
    key = deferral_key(run)
    fired = await fired_pause_keys(flow_run_id)
    if key in fired:
        get_run_logger().info(
            "Resumed although backend run %s has not changed since this flow run parked on it "
            "(still version %d): nothing to do, a Resume by hand changes nothing here. Parking "
            "again.",
            run.run_id,
            run.version,
        )
        key = _unfired(key, fired)
    await _write(flow_run_id, key, record.model_dump_json())
    get_run_logger().info("%s", PARKED)
    await suspend(key, message=parked_message(run), timeout=None)


def parked_message(run: TrainingRun) -> str:
    """Return the state message of a flow run parked on ``run``: not waiting for a person."""
    stage = f", {run.current_stage}" if run.current_stage else ""
    return (
        f"Parked: waiting for the backend (run {run.run_id}{stage}). prefect-ito watch resumes "
        "this run when its backend run changes; nothing to do."
    )


def _unfired(key: str, fired: set[str]) -> str:
    """Return the first of ``key-2``, ``key-3``, … that Prefect has not suspended under."""
    return next(f"{key}-{n}" for n in range(2, len(fired) + 3) if f"{key}-{n}" not in fired)


async def read_deferral(flow_run_id: UUID, key: str) -> Deferral | None:
    """Return the record of the deferral under pause key ``key``, if it was written."""
    value = await _read(flow_run_id, key)
    return Deferral.model_validate_json(value) if value is not None else None


async def latest_deferral(flow_run_id: UUID, run_id: str) -> Deferral | None:
    """Return the newest record this flow run wrote while it waited on ``run_id``."""
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            flow_run_id, key_prefix=DEFER_PREFIX, limit=1000, exclude_keys=set()
        )
    records = [Deferral.model_validate_json(item.value) for item in inputs]
    mine = [record for record in records if record.run_id == run_id]
    return max(mine, key=lambda record: record.version, default=None)


async def record_run_id(flow_run_id: UUID, run_id: str) -> None:
    """Record, once, the backend run this flow run supervises."""
    if await _read(flow_run_id, BACKEND_RUN_KEY) is None:
        await _write(flow_run_id, BACKEND_RUN_KEY, run_id)


async def read_recorded_run_id(flow_run_id: UUID) -> str | None:
    """Return the backend run this flow run recorded, if it has one."""
    return await _read(flow_run_id, BACKEND_RUN_KEY)


def wall_clock() -> float:
    """Seconds since the epoch: deferred watchdogs must outlive any one process's clock."""
    return datetime.now(UTC).timestamp()


async def _read(flow_run_id: UUID, key: str) -> str | None:
    async with get_client() as client:
        try:
            return await client.read_flow_run_input(flow_run_id, key)
        except (ObjectNotFound, PrefectHTTPStatusError) as error:
            if getattr(getattr(error, "response", None), "status_code", 404) != 404:
                raise
            return None


async def _write(flow_run_id: UUID, key: str, value: str) -> None:
    async with get_client() as client:
        try:
            await client.create_flow_run_input(flow_run_id, key, value)
        except PrefectHTTPStatusError as error:
            if error.response.status_code != 409:  # written before, by this very flow run
                raise
