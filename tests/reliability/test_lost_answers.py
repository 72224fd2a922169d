"""Lost answers: a write the backend committed, whose answer the client never saw.

Fifty logical writes of each kind (twenty in an everyday run, see ``trial_counts.py``) lose their
answer after the backend committed them, and as many time out after sending: the backend holds
each keyed write in flight longer than the client waits, so the client's retry meets
``409 IDEMPOTENCY_KEY_IN_FLIGHT`` first. Submissions time out on the client's own short timeout
(and are then found by their key); a decision or cancel is given up on by a tap after its first
send, since the simulator holds every keyed write, replays too, for the whole delay. Each logical
submission must make exactly one backend run, using the spend confirmation it carries once, and
each decision and cancel must be recorded exactly once — counted from the simulator's runs and
request log. Each logical write is its own supervisor, with a retry budget of its own, as separate
flow runs would be.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from reliability_kit import Backend, completed_bookings, request_for
from transports import Tap
from trial_counts import count

from prefect_ito.backend import desk
from prefect_ito.backend._retry import RetryBudget
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import DecisionChoice, DecisionRequest, RunState, TrainingRun
from prefect_ito.simulator import Faults, RequestLogEntry

TRIALS = count(full=50, everyday=20)
COMMIT_DELAY = 0.6
"""Seconds the simulator holds a keyed write in flight before it commits."""
SHORT = httpx.Timeout(0.25, connect=5.0)
"""The client's timeout in the submission timeout trials: shorter than the commit delay."""
KINDS = ["answer lost after commit", "timeout after sending"]


def faults(kind: str, *, submissions: bool) -> Faults:
    """The simulator's faults for a trial (only submissions are dropped by the simulator)."""
    if kind == "timeout after sending":
        return Faults(commit_delay_seconds=COMMIT_DELAY)
    return Faults(drop_response_after_commit=TRIALS if submissions else 0)


def client_for(target: Backend, tap: Tap, timeout: httpx.Timeout | None = None) -> Any:
    """A client of its own for one logical write, as each supervisor has."""
    timeout = timeout or httpx.Timeout(10.0)
    return target.client(transport=tap, retry_budget=RetryBudget(), timeout=timeout)


def tap_for(kind: str, path: str) -> Tap:
    """A tap that loses, or gives up on, the first answer to each keyed POST to ``path``."""
    if kind == "answer lost after commit":
        return Tap(lose_first=path)
    return Tap(time_out_first=path)


def faults_injected(taps: list[Tap]) -> int:
    """Return how many answers the taps lost after commit or timed out on, in all."""
    seen = sum((tap.outcomes for tap in taps), Counter())
    return seen["answer lost after commit"] + seen["timed out after sending"]


def record_once(ledger: Any, what: str, kind: str, taps: list[Tap], recorded: Counter) -> int:
    """Put in the ledger how many of the ``TRIALS`` answers, each of ``what`` and lost as
    ``kind`` says, the backend recorded once by what it ``recorded`` of each; check every first
    answer was lost, and return how many were recorded more than once."""
    injected = faults_injected(taps)
    duplicates = sum(count - 1 for count in recorded.values() if count)
    ledger.record(
        "lost-answers",
        trials=TRIALS,
        faults={f"{what}: {kind}": injected},
        outcomes={f"{what} recorded once": sum(1 for c in recorded.values() if c == 1)},
        duplicates=duplicates,
    )
    assert injected >= TRIALS
    return duplicates


def keys_by_path(log: list[RequestLogEntry], method: str = "POST") -> dict[str, set[str | None]]:
    """Return the idempotency keys each path was sent with."""
    keys: dict[str, set[str | None]] = {}
    for entry in log:
        if entry.method == method:
            keys.setdefault(entry.path, set()).add(entry.idempotency_key)
    return keys


@pytest.mark.parametrize("kind", KINDS)
async def test_each_lost_submission_makes_exactly_one_run(kind, backend, submit, ledger):
    target = backend(bookings=completed_bookings(TRIALS), faults=faults(kind, submissions=True))
    bookings = [f"bk-rel-{index:03d}" for index in range(TRIALS)]
    taps = [Tap() for _ in bookings]

    async def one(booking: str, tap: Tap) -> TrainingRun:
        timeout = SHORT if kind == "timeout after sending" else None
        async with client_for(target, tap, timeout) as client:
            return await submit(client, request_for(booking), f"rel-submit-{booking}")

    runs = await asyncio.gather(
        *(one(booking, tap) for booking, tap in zip(bookings, taps, strict=True))
    )

    backend_runs = target.sim.runs()
    per_booking = Counter(admin.run.booking_id for admin in backend_runs)
    duplicates = sum(count - 1 for count in per_booking.values())
    # A submission carries its spend confirmation: each resend relays it again, and the backend
    # must use it once, for the one run (a second use would be a second spend confirmed).
    quotes = Counter(a.run.confirmation.quote_id for a in backend_runs if a.run.confirmation)
    log = target.requests()
    seen = sum((tap.outcomes for tap in taps), Counter())
    injected = (
        sum(entry.dropped for entry in log)
        if kind == "answer lost after commit"
        else seen["ReadTimeout"]
    )
    ledger.record(
        "lost-answers",
        trials=TRIALS,
        faults={f"submission: {kind}": injected},
        outcomes={
            "submission attached to its own run": sum(1 for _ in runs),
            "spend confirmation used by its run once": sum(1 for n in quotes.values() if n == 1),
        },
        duplicates=duplicates + sum(n - 1 for n in quotes.values()),
    )
    assert injected >= TRIALS  # every logical submission lost its first answer
    assert duplicates == 0 and set(per_booking) == set(bookings)
    assert len(quotes) == TRIALS and set(quotes.values()) == {1}
    mine = {admin.run.booking_id: admin.run.run_id for admin in backend_runs}
    assert [run.run_id for run in runs] == [mine[booking] for booking in bookings]
    # Every resend carried the key of its logical submission: no key was ever made up.
    posted = {e.idempotency_key for e in log if (e.method, e.path) == ("POST", "/v0/training-runs")}
    assert posted == {f"rel-submit-{booking}" for booking in bookings}


async def runs_waiting(
    target: Backend, submit: Any, count: int, ready: Callable[[TrainingRun], bool]
) -> list[TrainingRun]:
    """Submit ``count`` runs on their own bookings and return them once ``ready``."""

    async def one(index: int) -> TrainingRun:
        booking = f"bk-rel-{index:03d}"
        async with target.client(retry_budget=RetryBudget()) as client:
            run = await submit(client, request_for(booking), f"rel-setup-{booking}")
            for _ in range(60):
                if ready(run):
                    return run
                run = await client.get_training_run(run.run_id, after_version=run.version, wait=1)
        raise AssertionError(f"run {run.run_id} never got ready: {run.state.value}")

    return list(await asyncio.gather(*(one(index) for index in range(count))))


@pytest.mark.parametrize("kind", KINDS)
async def test_each_lost_decision_is_recorded_exactly_once(kind, backend, submit, ledger, sweep):
    target = backend(
        "loss-spike", bookings=completed_bookings(TRIALS), faults=faults(kind, submissions=False)
    )
    waiting = await runs_waiting(
        target, submit, TRIALS, lambda run: run.state is RunState.AWAITING_DECISION
    )
    taps = [tap_for(kind, r"/decision$") for _ in waiting]
    decision = DecisionRequest(decision=DecisionChoice.APPROVE, decided_by="Ada", reason="ok")

    async def one(run: TrainingRun, tap: Tap) -> TrainingRun:
        assert run.pending_action is not None
        async with client_for(target, tap) as client:
            return await desk.decide_action(client, run, run.pending_action.action_id, decision)

    relayed = await asyncio.gather(*(one(run, tap) for run, tap in zip(waiting, taps, strict=True)))

    recorded = Counter(
        (admin.run.run_id, d.action_id) for admin in target.sim.runs() for d in admin.run.decisions
    )
    duplicates = record_once(ledger, "decision", kind, taps, recorded)
    expected = {(run.run_id, run.pending_action.action_id) for run in waiting if run.pending_action}
    assert set(recorded) == expected and duplicates == 0
    assert all(run.pending_action is None for run in relayed)
    decisions = keys_by_path(target.requests())
    assert all(len(keys) == 1 for path, keys in decisions.items() if path.endswith("/decision"))


@pytest.mark.parametrize("kind", KINDS)
async def test_each_lost_cancel_is_recorded_exactly_once(kind, backend, submit, ledger):
    # A stalled run never ends by itself, so only the cancel can end it.
    target = backend(
        "stall", bookings=completed_bookings(TRIALS), faults=faults(kind, submissions=False)
    )
    running = await runs_waiting(target, submit, TRIALS, lambda run: run.state is RunState.RUNNING)
    taps = [tap_for(kind, r"/cancel$") for _ in running]

    async def one(run: TrainingRun, tap: Tap) -> TrainingRun:
        async with client_for(target, tap) as client:
            return await desk.cancel_training_workload(client, run.run_id, reason="a person asked")

    cancelled = await asyncio.gather(
        *(one(run, tap) for run, tap in zip(running, taps, strict=True))
    )

    requested = Counter()
    async with target.client() as client:
        for run in running:
            page = await client.list_events(run.run_id)
            requested[run.run_id] = sum(1 for e in page.events if e.type == "cancel_requested")
    record_once(ledger, "cancel", kind, taps, requested)
    assert set(requested.values()) == {1}
    assert {run.state for run in cancelled} == {RunState.CANCELLED}
    cancels = keys_by_path(target.requests())
    assert all(len(keys) == 1 for path, keys in cancels.items() if path.endswith("/cancel"))


FLOWS = 2
"""Flow runs per kind of fault; both kinds run at once, each flow on its own booking."""


async def test_flows_whose_submission_answer_is_lost_attach_to_their_own_runs(
    backend, run_training, ledger
):
    targets = {
        kind: backend(bookings=completed_bookings(FLOWS), faults=faults(kind, submissions=True))
        for kind in KINDS
    }
    bookings = [f"bk-rel-{index:03d}" for index in range(FLOWS)]

    def credentials(kind: str) -> ItoCredentials:
        # The timeout trials wait less than the backend takes to commit each submission.
        timeout = 0.25 if kind == "timeout after sending" else None
        return ItoCredentials(api_url=targets[kind].url, timeout_seconds=timeout)

    trainings = await asyncio.gather(
        *(
            run_training(targets[kind], booking=booking, credentials=credentials(kind))
            for kind in KINDS
            for booking in bookings
        )
    )

    for index, kind in enumerate(KINDS):
        mine = trainings[index * FLOWS : (index + 1) * FLOWS]
        await check_flows_attached_to_their_own_runs(kind, targets[kind], bookings, mine, ledger)


async def check_flows_attached_to_their_own_runs(
    kind: str, target: Backend, bookings: list[str], trainings: list[Any], ledger: Any
) -> None:
    backend_runs = {admin.run.booking_id: admin.run for admin in target.sim.runs()}
    per_booking = Counter(admin.run.booking_id for admin in target.sim.runs())
    log = target.requests()
    submissions = [e for e in log if (e.method, e.path) == ("POST", "/v0/training-runs")]
    posts_per_key = Counter(e.idempotency_key for e in submissions)
    injected = (
        sum(entry.dropped for entry in log)
        if kind == "answer lost after commit"
        # A timed-out submission is sent again with its key once the lookup found nothing.
        else sum(1 for count in posts_per_key.values() if count > 1)
    )
    ledger.record(
        "lost-answers",
        trials=len(trainings),
        faults={f"flow submission: {kind}": injected},
        outcomes={"flow Completed on its own run": sum(t.state.is_completed() for t in trainings)},
        duplicates=sum(count - 1 for count in per_booking.values()),
    )
    assert all(training.state.is_completed() for training in trainings), kind
    summaries = [await training.state.aresult() for training in trainings]
    assert [summary.run_id for summary in summaries] == [backend_runs[b].run_id for b in bookings]
    assert sorted(per_booking.values()) == [1] * len(bookings)
    assert injected >= len(bookings)
    assert len(posts_per_key) == len(bookings)  # one key per flow run, resent unchanged
    if kind == "answer lost after commit":
        assert len(submissions) == len(bookings)  # found by its key: never sent again
