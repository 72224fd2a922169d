"""Counting what the crash trials came to, each figure from the records of the part it is about.

Backend runs and decisions from the simulator's own runs and request log; relayed events by id
from Prefect's events; suspensions, resumes and recovery times from Prefect's state history.
Never from a client's view. See ``crash_trials.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from e2e_stack import CHECKOUT
from prefect import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from pydantic import SecretStr
from trial_stack import TrialStack

from prefect_ito.backend.client import ItoClient
from prefect_ito.reporting.report import COPIES, EVENT_NAMES, event_id
from prefect_ito.simulator import AdminRun

if TYPE_CHECKING:
    from crash_trials import Conductor, Trial


@dataclass
class Tally:
    """What the trials came to, each figure counted from the records of the part it is about."""

    trials: int
    struck: int
    """Trials a fault hit while they had something to lose: a flow process, or a wait."""
    completed: int
    duplicate_runs: int
    """Backend runs beyond one per booking (the simulator's runs)."""
    decisions_relayed_twice: int
    """Decisions the backend accepted beyond one per action (the simulator's request log)."""
    duplicate_decisions: int
    """Decisions on record beyond one per action (the simulator's runs)."""
    events_missing: int
    events_doubled: int
    """Backend events Prefect holds no copy of, or more than one (Prefect's events, by id)."""
    missing_detail: list[str]
    """Each missing event, its trial's strikes and its flow run's states: what to look into."""
    resumes_lost: int
    resumes_doubled: int
    """Suspensions never resumed, or resumed twice (Prefect's state history); a suspension left
    without a form, which the watcher re-entered to ask again, is not one to resume."""
    recover_s: list[float | None]
    """Per lost flow process: seconds until its flow run ran again, None if it never did
    (Prefect's state history)."""
    notice_s: list[float]
    """Per lost flow process that ran again: seconds until it was re-entered (the watcher's
    ``Recovering`` state, or Prefect's own rescheduling), the first part of ``recover_s``."""
    losses: list[str]
    """Per lost flow process: its trial, the fault and phase, and when it was noticed and ran."""
    phases: dict[str, int]
    final_states: dict[str, int]
    watcher_kills: int
    machine_losses: int
    server_restarts: int
    wall_s: float

    @property
    def duplicates(self) -> int:
        return (
            self.duplicate_runs
            + self.decisions_relayed_twice
            + self.duplicate_decisions
            + self.events_doubled
            + self.resumes_doubled
        )

    def figures(self) -> dict[str, float]:
        """Return the ``recovery`` figures of ``benchmarks/results.json``."""
        ordered = sorted(s if s is not None else float("inf") for s in self.recover_s)
        ordered = ordered or [float("nan")]
        return {
            "trials": float(self.struck),
            "completed": float(self.completed),
            "duplicates": float(self.duplicates),
            "p50_s": round(statistics.median(ordered), 1),
            "p95_s": _p95(ordered),
            "notice_p50_s": round(statistics.median(self.notice_s or [float("nan")]), 1),
            "notice_p95_s": _p95(sorted(self.notice_s) or [float("nan")]),
            "lost_processes": float(len(self.recover_s)),
            "wall_s": round(self.wall_s, 1),
        }


def _p95(ordered: list[float]) -> float:
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1)


async def tally(stack: TrialStack, conductor: Conductor) -> Tally:
    """Count what the trials came to; see :class:`Tally`."""
    trials = conductor.trials
    admin_runs = await asyncio.to_thread(stack.simulator.runs)
    requests = await asyncio.to_thread(stack.simulator.requests)
    per_booking = Counter(admin.run.booking_id for admin in admin_runs)
    relayed = Counter(
        r.path
        for r in requests
        if r.method == "POST" and r.path.endswith("/decision") and r.status < 300
    )
    on_record = [
        count
        for admin in admin_runs
        for count in Counter(d.action_id for d in admin.run.decisions).values()
    ]
    missing, doubled = await _events(stack, admin_runs)
    histories = await _histories(trials)
    by_booking = {t.booking: t for t in trials}
    finals = Counter(histories[t.flow_run_id][-1].name for t in trials if t.flow_run_id)
    return Tally(
        trials=len(trials),
        struck=sum(t.hit for t in trials),
        completed=finals.get("Completed", 0),
        duplicate_runs=sum(count - 1 for count in per_booking.values()),
        decisions_relayed_twice=sum(count - 1 for count in relayed.values()),
        duplicate_decisions=sum(count - 1 for count in on_record),
        events_missing=len(missing),
        events_doubled=doubled,
        missing_detail=[
            _describe(admin, seq, kind, by_booking.get(admin.run.booking_id), histories, conductor)
            for admin, seq, kind in missing
        ],
        resumes_lost=sum(_resumes(h)[0] for h in histories.values()),
        resumes_doubled=sum(_resumes(h)[1] for h in histories.values()),
        recover_s=[
            _ran_again(histories[t.flow_run_id], strike.at)
            for t in trials
            for strike in t.strikes
            if strike.killed
        ],
        notice_s=[
            noticed
            for t in trials
            for strike in t.strikes
            if strike.killed
            and (noticed := _re_entered(histories[t.flow_run_id], strike.at)) is not None
        ],
        losses=[
            _loss(t, strike, histories[t.flow_run_id])
            for t in trials
            for strike in t.strikes
            if strike.killed
        ],
        phases=dict(Counter(s.phase for t in trials for s in t.strikes)),
        final_states=dict(finals),
        watcher_kills=conductor.watcher_kills,
        machine_losses=int(conductor.machine_lost_at is not None),
        server_restarts=int(conductor.server_restarted_at is not None),
        wall_s=time.time() - conductor.started_at,
    )


async def _histories(trials: list[Trial]) -> dict[Any, list[Any]]:
    async with get_client() as client:
        return {
            t.flow_run_id: sorted(
                await client.read_flow_run_states(t.flow_run_id), key=lambda s: s.timestamp
            )
            for t in trials
            if t.flow_run_id is not None
        }


def _resumes(history: list[Any]) -> tuple[int, int]:
    """Return (suspensions never resumed, resumes beyond one per suspension) of a history.

    A suspension the watcher re-entered (``Recovering``) had no form anyone could answer on: its
    flow process was lost between suspending and saving the form (``waiting/recovery.py``), and
    the run asks again in a suspension of its own. That one is not lost; the next one must be
    resumed.
    """
    names = [state.name for state in history]
    suspended = names.count("Suspended")
    resumed = names.count("Resuming")
    re_asked = sum(1 for was, now in pairwise(names) if (was, now) == ("Suspended", "Recovering"))
    return max(0, suspended - re_asked - resumed), max(0, resumed - (suspended - re_asked))


def _loss(trial: Trial, strike: Any, history: list[Any]) -> str:
    """Say which flow process was lost, and when its run was noticed and ran again."""
    noticed, ran = _re_entered(history, strike.at), _ran_again(history, strike.at)
    before = [s.name for s in history if s.timestamp.timestamp() <= strike.at][-1:]
    after = [s.name for s in history if s.timestamp.timestamp() > strike.at][:3]
    return (
        f"trial {trial.index} {strike.what}/{strike.phase}: noticed "
        f"{'never' if noticed is None else f'{noticed:.1f} s'}, running "
        f"{'never' if ran is None else f'{ran:.1f} s'}; states {before} | {after}"
    )


def _re_entered(history: list[Any], since: float) -> float | None:
    """Return the seconds from ``since`` until the flow run was next scheduled to run again.

    That is the time to notice the loss; what follows, until ``Running``, is the worker's
    pick-up and a flow process's start.
    """
    for state in history:
        if state.is_scheduled() and state.timestamp.timestamp() > since:
            return float(state.timestamp.timestamp() - since)
    return None


def _ran_again(history: list[Any], since: float) -> float | None:
    """Return the seconds from ``since`` until the flow run next entered Running."""
    for state in history:
        if state.is_running() and state.timestamp.timestamp() > since:
            return float(state.timestamp.timestamp() - since)
    return None


async def _events(
    stack: TrialStack, admin_runs: list[AdminRun]
) -> tuple[list[tuple[AdminRun, int, str]], int]:
    """Return (backend events of which Prefect holds no copy, by run and seq; Prefect events
    beyond one per backend event), by id: any copy of an event
    (:data:`~prefect_ito.reporting.report.COPIES`) counts, and a second one is a double.

    Prefect persists events a little after they arrive, so this waits (up to a minute) for the
    last ones.
    """
    token = SecretStr(stack.env["ITO_COMPUTE_TOKEN"])
    async with ItoClient(stack.simulator.url, token) as backend:
        expected = {
            admin.run.run_id: (
                admin,
                {
                    event_id(admin.run.run_id, e.seq, copy): (e.seq, str(e.type))
                    for e in (await backend.list_events(admin.run.run_id)).events
                    if e.type in EVENT_NAMES
                    for copy in range(COPIES)
                },
            )
            for admin in admin_runs
        }
    deadline = time.monotonic() + 60
    while True:
        held = {run_id: set(await _prefect_events(run_id)) for run_id in expected}
        per_seq = {
            run_id: Counter(ids[id_] for id_ in held[run_id] if id_ in ids)
            for run_id, (_, ids) in expected.items()
        }
        missing = [
            (admin, seq, kind)
            for run_id, (admin, ids) in expected.items()
            for seq, kind in sorted(set(ids.values()))
            if (seq, kind) not in per_seq[run_id]
        ]
        if not missing or time.monotonic() > deadline:
            extra = sum(
                len(held[run_id] - set(ids)) + sum(n - 1 for n in per_seq[run_id].values())
                for run_id, (_, ids) in expected.items()
            )
            return missing, extra
        await asyncio.sleep(1)


def _describe(
    admin: AdminRun,
    seq: int,
    kind: str,
    trial: Trial | None,
    histories: dict[Any, list[Any]],
    conductor: Conductor,
) -> str:
    """Say which event is missing, how its trial was struck, and its flow run's states."""
    what = f"{admin.run.run_id} seq {seq} ({kind})"
    if trial is None:
        return what
    start = conductor.started_at
    strikes = ", ".join(f"{s.what}/{s.phase} at {s.at - start:.1f} s" for s in trial.strikes)
    states = ", ".join(
        f"{state.name} {state.timestamp.timestamp() - start:.1f}"
        for state in histories.get(trial.flow_run_id, [])
    )
    return f"{what}: trial {trial.index} {trial.phase}; strikes {strikes}; states {states}"


async def _prefect_events(run_id: str) -> list[UUID]:
    """Return the ids of every ``ito.training.*`` event Prefect holds for a backend run."""
    ids: list[UUID] = []
    async with get_client() as client:
        page = await client.read_events(
            filter=EventFilter(
                event=EventNameFilter(prefix=["ito.training."]),
                resource=EventResourceFilter(id=[f"ito.training-run.{run_id}"]),
            ),
            limit=50,
        )
        ids += [event.id for event in page.events]
        while page.next_page:
            page = await client.read_events_page(page.next_page)
            ids += [event.id for event in page.events]
    return ids


def record_figures(tally: Tally, name: str = "recovery") -> Path:
    """Write the trials' figures and tally as JSON beside the other test output; return the path.

    ``test-output/`` in the checkout (ignored by git), or ``$PREFECT_ITO_TEST_OUTPUT``.
    """
    root = Path(os.environ.get("PREFECT_ITO_TEST_OUTPUT") or CHECKOUT / "test-output")
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.json"
    body = {"figures": tally.figures(), "tally": {**tally.__dict__, "recover_s": tally.recover_s}}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    return path
