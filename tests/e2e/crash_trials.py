"""Crash and machine-loss trials: many training flow runs on one stack, struck at seeded points.

One stack — its own ``prefect server start`` (so that it can be restarted on its port), a process
worker, two ``prefect-ito watch`` at once, the simulator — and N deployment runs of
``ito-training`` started together. A seeded RNG gives each run (a *trial*) the phase it is struck
in, and a delay within that phase:

- ``before-submit``, ``after-submit``, ``mid-gate`` (an in-process run, some seconds into a
  stage), ``relaying`` (a person decided at the backend; killed as its flow process reads the
  decision): its flow process is SIGKILLed; the worker reports the crash and a watcher re-enters
  it.
- ``deferred``: nothing holds a process, so the process that supervises it then — a watcher — is
  SIGKILLed, and started again after the delay.
- ``awaiting-person``: the person answers only after the machine was lost and the Prefect server
  restarted, so both happen while it waits.

Once every ``awaiting-person`` trial waits (half the others struck, a watcher killed), the machine
is lost: the worker and every flow process under it are SIGKILLed at once (the worker starts each
in a process group of its own, so each is killed by PID), and another worker starts; a run that
was running is noticed by its silence. Later the Prefect server is restarted. The trials end when
every flow run is final.

Nothing is counted from a client's view (``crash_tally.py``): backend runs and decisions from the
simulator's own records and request log, relayed events by id from Prefect's events, recovery
times from Prefect's state history. The stack is ``trial_stack.py``. Shared by ``test_crashes.py``
and ``benchmarks/supervision.py --only recovery``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import httpx
from crash_tally import Tally, tally
from e2e_stack import POOL, flow_processes, on_booking, start_training
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from processes import kill
from trial_stack import ACCOUNT, PERSON, TrialStack

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import DecisionChoice, DecisionRequest
from prefect_ito.simulator import AdminRun, Scenario, builtin_scenario

PHASES = ("before-submit", "after-submit", "mid-gate", "deferred", "awaiting-person", "relaying")
SPIKY = ("awaiting-person", "relaying")
"""Phases whose backend run hits a loss spike, so that a person must decide."""
RELAYING_WINDOW = 30.0
"""Seconds from the first flow process seen after a person's decision at the backend (the
suspension over) in which that process reads it."""
DELAYS = {"mid-gate": (3.5, 8.0), "deferred": (1.0, 5.0)}
"""Seeded seconds into a phase before the strike (for ``deferred``: how long a watcher is down)."""
STAGE_HOURS = 1_500
"""Two curriculum stages of this many simulated hours: about 13.5 s each at the default scale
(three times that for a deferred trial)."""
DEFER_AFTER = 2
BUDGET = 2_000_000
TERM_END = (datetime.now(UTC) + timedelta(days=3_650)).isoformat()
"""Ten years ahead: even a deferred trial's stages end well within the booking's term."""
POLL = 1.0


# --- the plan ------------------------------------------------------------------------------------


@dataclass
class Strike:
    """One fault that hit a trial: when (wall clock), what, and in which phase it caught it."""

    at: float
    what: str
    phase: str
    killed: int
    """Flow processes of this trial that were SIGKILLed (0: none held one)."""


@dataclass
class Trial:
    """One flow run, the phase it is to be struck in, and what happened to it."""

    index: int
    phase: str
    delay: float
    after_relay: bool
    flow_run_id: UUID | None = None
    run_seen_at: float | None = None
    answered_at: float | None = None
    relaying_from: float | None = None
    """When a flow process of it was first seen after the person's answer, its suspension over."""
    decided_at: float | None = None
    strikes: list[Strike] = field(default_factory=list)
    key: str = field(default_factory=lambda: uuid4().hex)

    @property
    def booking(self) -> str:
        return f"bk-trial-{self.index:02d}"

    @property
    def spiky(self) -> bool:
        return self.phase in SPIKY

    @property
    def struck(self) -> bool:
        """Whether the fault of its own phase hit it (the machine loss aside)."""
        return any(strike.what != "machine-loss" for strike in self.strikes)

    @property
    def hit(self) -> bool:
        """Whether any fault hit it while it had something to lose: a process, or a wait."""
        return any(s.killed or s.phase in ("deferred", "awaiting-person") for s in self.strikes)

    def parameters(self) -> dict[str, Any]:
        # Only the deferred trials defer: every resume starts a flow process, which costs two
        # cores seconds each. A person's answer is waited for suspended in any mode.
        mode = "auto" if self.phase == "deferred" else "in-process"
        # A budget well above what even a deferred trial's long stages spend.
        return on_booking(self.booking, mode=mode, defer_after=DEFER_AFTER, budget_usd=BUDGET)


def plan(n: int, seed: int) -> list[Trial]:
    """Return N trials, their phases spread evenly and shuffled, their delays drawn, by ``seed``."""
    rng = random.Random(seed)
    phases = [PHASES[i % len(PHASES)] for i in range(n)]
    rng.shuffle(phases)
    return [
        Trial(i, phase, rng.uniform(*DELAYS.get(phase, (0.0, 0.0))), rng.random() < 0.5)
        for i, phase in enumerate(phases)
    ]


def trial_scenario(trials: list[Trial]) -> Scenario:
    """Return the default scenario with one completed booking per trial, its stages long."""
    base = builtin_scenario("default")
    return Scenario.model_validate(
        {
            **base.model_dump(),
            # The trials' stages are long (simulated months): a term far ahead keeps every run
            # within it, so the standing authorization the deployments name covers them all.
            "bookings": [
                {"booking_id": t.booking, "status": "completed", "term_end": TERM_END}
                for t in trials
            ],
            "booking_overrides": {t.booking: _script(base, t) for t in trials},
        }
    )


def _script(base: Scenario, trial: Trial) -> dict[str, Any]:
    """Return a trial's run: two long stages, and a loss spike when a person must decide."""
    # A deferred trial's stages outlast a flow process's start on a busy machine (up to a
    # minute and a half here), or its run could end before it ever defers.
    hours = STAGE_HOURS * (3 if trial.phase == "deferred" else 1)
    stages = [{**s.model_dump(), "hours": hours} for s in base.run.curriculum[:2]]
    spike = [{"stage": "pretrain", "at_fraction": 0.5}] if trial.spiky else []
    return {"curriculum": stages, "post_training": [], "loss_spikes": spike}


# --- running the trials --------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What the parts' own records said at one instant: flow runs, backend runs, processes."""

    at: float
    flow_runs: dict[UUID, FlowRun]
    backend: dict[str, AdminRun]
    processes: dict[str, list[int]]

    def flow_run(self, trial: Trial) -> FlowRun | None:
        return self.flow_runs.get(trial.flow_run_id) if trial.flow_run_id else None

    def run(self, trial: Trial) -> AdminRun | None:
        return self.backend.get(trial.booking)

    def pids(self, trial: Trial) -> list[int]:
        return self.processes.get(str(trial.flow_run_id), [])

    def phase(self, trial: Trial) -> str:
        """Return the phase the trial is in now, from these records alone."""
        key = pause_key(self.flow_run(trial))
        if key.startswith("defer-"):
            return "deferred"
        if key.startswith("restart-"):
            return "awaiting-person"
        if not self.pids(trial):
            return "no-process"
        if self.run(trial) is None:
            return "before-submit"
        # A person decided at the backend: the first flow process since the run left its
        # suspension (resumed by a watcher, then started by the worker) reads the decision. Timed
        # from that process, not from the answer: on a busy machine the resume and the worker's
        # pick-up alone took over 30 s, and the process then read as mid-gate.
        relaying_from = trial.relaying_from
        if relaying_from is not None and self.at - relaying_from <= RELAYING_WINDOW:
            return "relaying"
        # First seen in this very look, or a moment ago: the submission's answer just came.
        seen = trial.run_seen_at
        return "after-submit" if seen is not None and self.at - seen <= 3 else "mid-gate"


def pause_key(flow_run: FlowRun | None) -> str:
    """Return the pause key of a paused flow run, else ''."""
    state = flow_run.state if flow_run else None
    if state is None or not state.is_paused():
        return ""
    return state.state_details.pause_key or ""


def note_sightings(trial: Trial, snap: Snapshot) -> None:
    """Note when the trial's backend run, its decision, and its first flow process after a
    person's answer (the suspension over) were first seen."""
    run, pids = snap.run(trial), snap.pids(trial)
    if run is not None and trial.run_seen_at is None:
        trial.run_seen_at = snap.at
    if run is not None and run.run.decisions and trial.decided_at is None:
        trial.decided_at = snap.at
    resumed = pids and not pause_key(snap.flow_run(trial))
    if trial.answered_at is not None and trial.relaying_from is None and resumed:
        trial.relaying_from = snap.at


def due(trial: Trial, snap: Snapshot) -> bool:
    """Tell whether the trial's flow process is to be struck now, in the trial's own phase."""
    seen = trial.run_seen_at
    if trial.phase == "before-submit":
        return True
    if trial.phase in ("after-submit", "mid-gate"):
        return seen is not None and snap.at >= seen + trial.delay
    if trial.phase == "relaying" and trial.relaying_from is not None:
        # Not the suspended process, still on its way out as the person answers: the one
        # started after the resume, which reads the decision.
        run = snap.run(trial)
        return not trial.after_relay or bool(run and run.run.decisions)
    return False


def finished(flow_run: FlowRun | None) -> bool:
    """Tell whether a flow run ended for good (a crashed one is re-entered by a watcher)."""
    state = flow_run.state if flow_run else None
    return state is not None and state.is_final() and not state.is_crashed()


@dataclass
class Conductor:
    """Strikes each trial in its phase, answers for the person, loses the machine, restarts."""

    stack: TrialStack
    trials: list[Trial]
    rng: random.Random
    started_at: float = field(default_factory=time.time)
    machine_lost_at: float | None = None
    server_restarted_at: float | None = None
    watcher_kills: int = 0
    watcher_restarts: list[tuple[float, int]] = field(default_factory=list)
    noted_at: float = 0.0
    last: Snapshot | None = None

    async def play(self, timeout: float) -> None:
        """Start every trial's flow run and conduct until all are final (or ``timeout``)."""
        for trial in self.trials:
            trial.flow_run_id = (await _create(trial)).id
        self.stack.start_worker()  # all at once: the worker finds every flow run waiting
        server_delay = self.rng.uniform(20, 40)
        try:
            # One try per look, as a person clicks again a moment later. Prefect's client backs
            # off instead (the suite allows it ten tries, 2, 4, … 64 s apart): once, a person's
            # answer was refused six times over two minutes ("database is locked": SQLite's
            # answer to a transaction that read before another one wrote), no other trial was
            # struck or answered meanwhile, and too few were struck.
            with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
                async with asyncio.timeout(timeout):
                    while not await self._tick(server_delay):
                        await asyncio.sleep(POLL)
        except TimeoutError:
            raise TimeoutError(
                f"trials still running after {timeout:g} s: {self._left()}"
            ) from None

    def _left(self) -> str:
        """Say which trials had not ended, and where they stood, from Prefect's last word."""
        snap = self.last
        left = [t for t in self.trials if snap is None or not finished(snap.flow_run(t))]
        return "; ".join(
            f"{t.booking} ({t.phase}): {getattr(snap and snap.flow_run(t), 'state_name', '?')}"
            for t in left
        )

    async def _tick(self, server_delay: float) -> bool:
        """Look once, and act on what was seen; tell whether every trial has ended."""
        try:
            snap = self.last = await snapshot(self.stack, self.trials)
            if all(finished(snap.flow_run(t)) for t in self.trials):
                return True
            self._note(snap)
            self.stack.check_worker()
            for trial in self.trials:
                self._strike(trial, snap)
                await self._answer(trial, snap)
        except (httpx.TransportError, PrefectHTTPStatusError) as error:
            # The server restarts, or is too busy to answer (SQLite's 503): as a person would,
            # look (and answer) again.
            if isinstance(error, PrefectHTTPStatusError) and error.response.status_code < 500:
                raise
            self._log(f"a look failed, the next in {POLL:g} s: {type(error).__name__}")
            return False
        self._restart_watchers(snap.at)
        if self.machine_lost_at is None and self._machine_loss_due(snap):
            self._lose_machine(snap)
            self._log("lost the machine: worker and flow processes SIGKILLed")
        elif self._server_restart_due(snap.at, server_delay) and await self._worker_ready():
            self._log("restarting the Prefect server")
            await asyncio.to_thread(self.stack.restart_server)
            self.server_restarted_at = time.time()
            self._log("the Prefect server is back")
        return False

    def _note(self, snap: Snapshot) -> None:
        """Note where the trials stand in ``trials.log``, every ten seconds or so."""
        if snap.at - self.noted_at < 10:
            return
        self.noted_at = snap.at
        phases = Counter(
            "finished" if finished(snap.flow_run(t)) else snap.phase(t) for t in self.trials
        )
        self._log(str(dict(sorted(phases.items()))))

    def _strike(self, trial: Trial, snap: Snapshot) -> None:
        note_sightings(trial, snap)
        pids = snap.pids(trial)
        if trial.struck or finished(snap.flow_run(trial)):
            return
        if trial.phase == "deferred":
            if snap.phase(trial) == "deferred":
                self._kill_a_watcher(trial, snap)
            return
        if pids and due(trial, snap):
            phase = snap.phase(trial)
            for pid in pids:
                kill(pid)
            trial.strikes.append(Strike(time.time(), "flow-process", phase, len(pids)))
            self._log(f"killed {trial.booking}'s flow process ({phase}): {pids}")

    def _kill_a_watcher(self, trial: Trial, snap: Snapshot) -> None:
        for index in (self.watcher_kills % 2, (self.watcher_kills + 1) % 2):
            if self.stack.kill_watcher(index):
                self.watcher_kills += 1
                self.watcher_restarts.append((snap.at + trial.delay, index))
                trial.strikes.append(Strike(time.time(), "watcher", "deferred", 0))
                self._log(f"killed watcher {index} while {trial.booking} was deferred")
                return

    def _log(self, message: str) -> None:
        with (self.stack.scratch / "trials.log").open("a") as log:
            log.write(f"{time.time() - self.started_at:6.1f}s {message}\n")

    def _restart_watchers(self, now: float) -> None:
        for due in [item for item in self.watcher_restarts if item[0] <= now]:
            self.watcher_restarts.remove(due)
            self.stack.start_watcher(due[1])

    async def _answer(self, trial: Trial, snap: Snapshot) -> None:
        """Decide a restart as a person does (contract v0.5): at the backend, as themselves; the
        watcher, or the flow waiting in its process, sees the decision and goes on."""
        if trial.answered_at is not None or snap.phase(trial) != "awaiting-person":
            return
        if trial.phase == "awaiting-person" and self.server_restarted_at is None:
            return  # this one waits through the machine loss and the server's restart
        run = snap.run(trial)
        action = run.run.pending_action if run is not None else None
        if run is None or action is None:
            return
        token = self.stack.simulator.mint_token(ACCOUNT, principal=PERSON)
        decision = DecisionRequest(decision=DecisionChoice.APPROVE, reason="a bad data shard")
        async with ItoClient(self.stack.simulator.url, token) as client:
            await client.decide(
                run.run.run_id,
                action.action_id,
                decision,
                idempotency_key=f"crash-trial-{action.action_id}",
            )
        trial.answered_at = time.time()

    def _machine_loss_due(self, snap: Snapshot) -> bool:
        waiting = all(
            snap.phase(t) == "awaiting-person" or finished(snap.flow_run(t))
            for t in self.trials
            if t.phase == "awaiting-person"
        )
        others = [t for t in self.trials if t.phase != "awaiting-person"]
        half_struck = 2 * sum(t.struck for t in others) >= len(others)
        # A deferred trial caught running by the loss may never defer after it (its backend run
        # ended meanwhile): once, no watcher was ever killed. So one watcher is killed first.
        deferred = self.watcher_kills > 0 or all(t.phase != "deferred" for t in self.trials)
        return (waiting and half_struck and deferred) or snap.at - self.started_at > 240

    def _lose_machine(self, snap: Snapshot) -> None:
        at = time.time()
        self.stack.lose_machine()
        self.machine_lost_at = at
        for trial in self.trials:
            if not finished(snap.flow_run(trial)):
                strike = Strike(at, "machine-loss", snap.phase(trial), len(snap.pids(trial)))
                trial.strikes.append(strike)

    def _server_restart_due(self, now: float, delay: float) -> bool:
        lost = self.machine_lost_at
        return self.server_restarted_at is None and lost is not None and now >= lost + delay

    async def _worker_ready(self) -> bool:
        """Tell whether the latest worker has reported to Prefect (it cannot start without it)."""
        try:
            async with get_client() as client:
                workers = await client.read_workers_for_work_pool(POOL)
        except (httpx.TransportError, PrefectHTTPStatusError):
            return False  # busy: ask again next time
        started = self.stack.worker_started_at
        return any(
            w.last_heartbeat_time and w.last_heartbeat_time.timestamp() > started for w in workers
        )


async def _create(trial: Trial) -> FlowRun:
    """Create the trial's flow run; a busy server's 503 is answered by asking again, once."""
    key = f"{trial.booking}-{trial.key}"  # Prefect creates one flow run per key
    for _ in range(10):
        try:
            return await start_training(trial.parameters(), idempotency_key=key)
        except PrefectHTTPStatusError as error:
            if error.response.status_code != 503:
                raise
            await asyncio.sleep(1)
    raise RuntimeError(f"Prefect answered 503 ten times to creating {trial.booking}'s flow run")


async def snapshot(stack: TrialStack, trials: list[Trial]) -> Snapshot:
    """Read the flow runs from Prefect, the backend runs from the simulator, the processes."""
    ids = [t.flow_run_id for t in trials if t.flow_run_id is not None]
    async with get_client() as client:
        flow_runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids)
        )
    backend = await asyncio.to_thread(stack.simulator.runs)
    processes = await asyncio.to_thread(flow_processes)
    return Snapshot(
        time.time(),
        {flow_run.id: flow_run for flow_run in flow_runs},
        {admin.run.booking_id: admin for admin in backend},
        processes,
    )


async def run_trials(stack: TrialStack, n: int, seed: int, timeout: float) -> Tally:
    """Play N trials on ``stack`` (its simulator loaded with :func:`trial_scenario`); count."""
    trials = plan(n, seed)
    conductor = Conductor(stack, trials, random.Random(seed + 1))
    await conductor.play(timeout)
    return await tally(stack, conductor)
