"""Follow and cancel attempts through Prefect records: seeded, judged by the simulator's own runs.

A colleague's training flow run made a backend run that is still training: a real submission,
quoted and submitted under the colleague's key with the colleague's flow run id as its client
reference. An attacker with Prefect API access (and at most the worker's token) writes what
Prefect lets anyone write, and lets prefect-ito act on it. A seeded generator builds, for each
attempt, a decoy flow run naming the colleague's run:

- cancel attempts (most built in memory as ``FlowRun`` objects, and cancelled with
  ``cancel_supervised_run``): a ``run_id`` parameter naming the colleague's run, a ``training``
  parameter that is the colleague's exact request, another on the same booking or one on another
  booking, or none at all (shaped as an ``ito-attach-training`` flow run), the colleague's
  idempotency key copied into it or not, and credentials inline pointing at the simulator;
- cancel attempts through the real ``ito-cancel-training`` flow, on a real Prefect server: decoy
  flow runs with the same parameters and a forged ``ito-backend-run`` record naming the
  colleague's run, held by Prefect as ``Cancelled`` or ``Cancelling``, or left ``Running`` while
  the flow is run for them as a forged ``prefect.flow-run.Cancelled`` event would have it run;
- follow attempts (``ownership.find_attachable_run``, what a training flow run asks before it
  quotes): a record naming the colleague's run on the colleague's booking, a record naming it
  from a request on another booking, a record naming a made-up run, and no record on the booking
  the colleague's unfinished run of the same request keeps busy; with no key, the decoy's own
  derived key, or the colleague's key copied.

The judge is the simulator: its request log must hold no cancel of any run the decoy's own
submission did not make, the colleague's run must still be training, and no follow attempt may
return the colleague's run (``BookingBusy``, a refusal, nothing, or the decoy's own run are all
fine). Decoys have ids of their own: Prefect's server assigns flow run ids, so nobody makes a
flow run with the colleague's id.

Controls, not attacks: a decoy whose own submission made a run has that run cancelled (in memory
and through the flow) and followed. A decoy that copies the colleague's idempotency key *and* the
colleague's exact request is the same submission (the same command run again after a crash): it
follows the colleague's run by design, and is counted as the control "same key and request".
Its cancel still stops nothing, since a cancel goes by the client reference alone, so in the
cancel sweeps it is an attack like any other.

The backend keeps client references (contract v0.3). On one that does not, a request can only be
matched by its key and the booking's unfinished run, and is followed as before v0.3.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled, Cancelling, Running
from reliability_kit import Backend, Submit, completed_bookings, training_fields
from trial_counts import count

from prefect_ito.backend import ownership
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import RunState, TrainingRequest, TrainingRun
from prefect_ito.exceptions import ItoError
from prefect_ito.flows import ito_attach_training, ito_cancel_training, ito_training
from prefect_ito.parameters import TrainingParameters, resolve_booking, submission_key
from prefect_ito.waiting.cancellation import cancel_supervised_run
from prefect_ito.waiting.keys import BACKEND_RUN_KEY

SEED = 20_261_203
CANCEL_ATTEMPTS = count(full=240, everyday=48)
CANCEL_CONTROLS = count(full=8, everyday=2)
FLOW_ATTEMPTS = count(full=24, everyday=6)
FLOW_CONTROLS = count(full=3, everyday=1)
FOLLOW_ATTEMPTS = count(full=240, everyday=48)
SAME_SUBMISSIONS = count(full=8, everyday=2)
OWN_RUNS = count(full=8, everyday=2)
REAL_TIME = 1.0
"""The simulator's time scale: runs train for hours of real time, so the colleague's is unfinished
throughout (and a decoy's own run too, until it is cancelled)."""
FREE_BOOKINGS = 3
"""Bookings nobody trains on, for decoy requests on another booking."""
CATEGORY = "follow-cancel-attempts"
TOUCHED = "other runs touched"

EXACT = "the colleague's exact request"
SAME_BOOKING = "another request on the colleague's booking"
OTHER_BOOKING = "a request on another booking"
NO_TRAINING = "no training (shaped as an attach flow run)"
TRAININGS = [EXACT, SAME_BOOKING, OTHER_BOOKING, NO_TRAINING]
CHANGES: list[dict[str, Any]] = [
    {"budget_usd": 50_000.0},
    {"model_size": "1B"},
    {"target": "chat assistant"},
    {"data": ["catalog://fineweb-edu"]},
]
"""What makes another request on the colleague's booking."""


@dataclass
class Colleague:
    """The colleague's flow run and the backend run its own submission made."""

    flow_run_id: uuid.UUID
    key: str
    run_id: str


@dataclass(frozen=True)
class Decoy:
    """What one decoy flow run's parameters say."""

    training: str
    """One of :data:`TRAININGS`."""
    copies_key: bool
    """The colleague's idempotency key copied into its ``training`` parameter."""
    names_run: bool
    """A ``run_id`` parameter naming the colleague's run."""

    def faults(self) -> list[str]:
        """Return what this decoy injects, one entry per dimension it uses."""
        said = [f"training: {self.training}"]
        said += ["the colleague's idempotency key copied"] * self.copies_key
        said += ["run_id names the colleague's run"] * self.names_run
        return said


def seeded_id(rng: random.Random) -> uuid.UUID:
    """Return a flow run id drawn from the seeded generator."""
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def draw(rng: random.Random) -> Decoy:
    """Return a decoy of seeded random parts."""
    training = rng.choice(TRAININGS)
    if training == NO_TRAINING:  # an attach flow run names its run by ``run_id`` alone
        return Decoy(training, copies_key=False, names_run=True)
    return Decoy(training, copies_key=rng.random() < 0.5, names_run=rng.random() < 0.6)


def decoy_training(
    decoy: Decoy, colleague: Colleague, rng: random.Random, free: list[str]
) -> dict[str, Any]:
    """Return the decoy's ``training`` parameter, as fields."""
    fields = training_fields()
    if decoy.training == SAME_BOOKING:
        fields.update(rng.choice(CHANGES))
    elif decoy.training == OTHER_BOOKING:
        fields["booking"] = rng.choice(free)
    if decoy.copies_key:
        fields["idempotency_key"] = colleague.key
    return fields


def decoy_parameters(
    decoy: Decoy, colleague: Colleague, target: Backend, rng: random.Random, free: list[str]
) -> dict[str, Any]:
    """Return a decoy flow run's parameters: credentials inline, and what ``decoy`` names."""
    parameters: dict[str, Any] = {"credentials": {"api_url": target.url}}
    if decoy.names_run:
        parameters["run_id"] = colleague.run_id
    if decoy.training != NO_TRAINING:
        parameters["training"] = decoy_training(decoy, colleague, rng, free)
    return parameters


async def request_of(training: dict[str, Any]) -> TrainingRequest:
    """Return the backend request a ``training`` parameter makes."""
    parsed = TrainingParameters.parse(training)
    return parsed.to_request(await resolve_booking(parsed))


async def key_of(training: dict[str, Any], flow_run_id: uuid.UUID) -> str:
    """Return the idempotency key the flow run ``flow_run_id`` submits ``training`` under."""
    parsed = TrainingParameters.parse(training)
    return submission_key(parsed, await request_of(training), flow_run_id)


async def own_submission(
    target: Backend, submit: Submit, training: dict[str, Any], flow_run_id: uuid.UUID
) -> TrainingRun:
    """Submit ``training`` as the flow run ``flow_run_id``'s own submission does: under the key
    it derives and with its id as the client reference; return the run."""
    request, key = await request_of(training), await key_of(training, flow_run_id)
    async with target.client() as client:
        run = await submit(client, request, key, client_reference=str(flow_run_id))
    assert run.client_reference == str(flow_run_id), run
    return run


async def colleague_of(target: Backend, submit: Submit, rng: random.Random) -> Colleague:
    """Make the colleague's backend run, as the colleague's flow run's own submission does."""
    flow_run_id = seeded_id(rng)
    run = await own_submission(target, submit, training_fields(), flow_run_id)
    key = await key_of(training_fields(), flow_run_id)
    return Colleague(flow_run_id=flow_run_id, key=key, run_id=run.run_id)


def start(backend: Any, controls: int, prefix: str) -> tuple[Backend, list[str], list[str]]:
    """Start a simulator with a booking for each control and :data:`FREE_BOOKINGS` free ones;
    return it, the controls' bookings and the free ones."""
    bookings = completed_bookings(controls + FREE_BOOKINGS, prefix=prefix)
    target: Backend = backend(bookings=bookings, time_scale=REAL_TIME)
    ids = [b.booking_id for b in bookings]
    return target, ids[:controls], ids[controls:]


def cancels_of_others(target: Backend, own: set[str]) -> list[str]:
    """Return the runs the simulator was asked to cancel that no decoy's own submission made."""
    asked = [
        r.path.removeprefix("/v0/training-runs/").removesuffix("/cancel")
        for r in target.requests()
        if r.method == "POST" and r.path.endswith("/cancel")
    ]
    return [run_id for run_id in asked if run_id not in own]


def state_of(target: Backend, run_id: str) -> RunState:
    """Return the state of ``run_id`` as the simulator holds it."""
    (admin,) = [a for a in target.sim.runs() if a.run.run_id == run_id]
    return admin.run.state


def judge_cancels(target: Backend, colleague: Colleague, own: set[str]) -> list[str]:
    """Return the runs cancel requests touched that were not the decoys' own; the colleague's
    run must still be training."""
    others = cancels_of_others(target, own)
    state = state_of(target, colleague.run_id)
    assert not state.terminal and state is not RunState.CANCELLING, state
    return others


# --- cancel attempts, in memory ------------------------------------------------------------------


FLOW_ID = uuid.UUID(int=0x1705, version=4)
"""The flow the in-memory decoy flow runs say they are runs of (nothing reads it)."""


def in_memory(flow_run_id: uuid.UUID, parameters: dict[str, Any]) -> FlowRun:
    """Return a cancelled flow run built in memory, as any code can build one."""
    return FlowRun(
        id=flow_run_id, flow_id=FLOW_ID, name="decoy", parameters=parameters, state=Cancelled()
    )


async def test_no_cancel_attempt_stops_another_flow_run_s_run(backend, submit, ledger):
    rng = random.Random(SEED)
    target, control_bookings, free = start(backend, CANCEL_CONTROLS, "bk-cancel")
    colleague = await colleague_of(target, submit, rng)
    plan = [draw(rng) for _ in range(CANCEL_ATTEMPTS)] + [None] * CANCEL_CONTROLS
    rng.shuffle(plan)  # the controls among the attempts
    faults, outcomes, own = Counter[str](), Counter[str](), set[str]()
    async with target.client() as client:
        for decoy in plan:
            flow_run_id = seeded_id(rng)
            if decoy is None:
                training = training_fields(booking=control_bookings.pop())
                own.add((await own_submission(target, submit, training, flow_run_id)).run_id)
                # Its own run, with a ``run_id`` parameter naming the colleague's.
                parameters = {"training": training, "run_id": colleague.run_id}
                outcome = await cancel_supervised_run(client, in_memory(flow_run_id, parameters))
                outcomes[_said(outcome.run, outcome.cancelled_now, own)] += 1
                continue
            faults.update(decoy.faults())
            parameters = decoy_parameters(decoy, colleague, target, rng, free)
            outcome = await cancel_supervised_run(client, in_memory(flow_run_id, parameters))
            outcomes[_said(outcome.run, outcome.cancelled_now, own)] += 1
    others = judge_cancels(target, colleague, own)

    ledger.record(
        CATEGORY,
        trials=CANCEL_ATTEMPTS,
        faults={f"cancel: {fault}": n for fault, n in faults.items()},
        outcomes={TOUCHED: len(others), **outcomes},
        measures={"seed": str(SEED)},
    )
    assert others == []
    assert outcomes["cancel: stopped nothing (no run of its own)"] == CANCEL_ATTEMPTS, outcomes
    assert outcomes["control (its own submission's run): cancelled"] == CANCEL_CONTROLS, outcomes


def _said(run: TrainingRun | None, cancelled_now: bool, own: set[str]) -> str:
    """Name what one cancel did, for the ledger."""
    if run is None:
        return "cancel: stopped nothing (no run of its own)"
    if run.run_id in own and cancelled_now:
        return "control (its own submission's run): cancelled"
    return f"cancel: run {run.run_id}, not its own, cancelled_now={cancelled_now}"


# --- cancel attempts through the ito-cancel-training flow ----------------------------------------


HELD = ["Cancelled", "Cancelling", "Running (a forged Cancelled event)"]


async def test_no_cancel_through_the_cancel_flow_stops_another_flow_run_s_run(
    prefect_server, backend, submit, sweep, ledger
):
    rng = random.Random(SEED + 1)
    target, control_bookings, free = start(backend, FLOW_CONTROLS, "bk-cancel-flow")
    colleague = await colleague_of(target, submit, rng)
    plan: list[Decoy | None] = [draw(rng) for _ in range(FLOW_ATTEMPTS)]
    plan += [None] * FLOW_CONTROLS
    rng.shuffle(plan)
    faults, outcomes, own = Counter[str](), Counter[str](), set[str]()
    for decoy in plan:
        if decoy is None:
            training = training_fields(booking=control_bookings.pop())
            parameters = {"training": training, "credentials": {"api_url": target.url}}
            flow_run = await _forged(ito_training, parameters, colleague, "Cancelled")
            own.add((await own_submission(target, submit, training, flow_run.id)).run_id)
        else:
            held = rng.choice(HELD)
            faults.update([*decoy.faults(), f"held by Prefect as {held}"])
            parameters = decoy_parameters(decoy, colleague, target, rng, free)
            flow = ito_attach_training if decoy.training == NO_TRAINING else ito_training
            flow_run = await _forged(flow, parameters, colleague, held)
        said = await ito_cancel_training(str(flow_run.id))
        sweep.text("follow attempts: the cancel flow said", said)
        outcomes[_flow_said(said, own, control=decoy is None)] += 1
    others = judge_cancels(target, colleague, own)

    ledger.record(
        CATEGORY,
        trials=FLOW_ATTEMPTS,
        faults={
            f"cancel flow: {fault}": n
            for fault, n in [*faults.items(), ("forged ito-backend-run record", FLOW_ATTEMPTS)]
        },
        outcomes={TOUCHED: len(others), **outcomes},
    )
    assert others == []
    assert sum(n for said, n in outcomes.items() if said.startswith("cancel flow: ")) == (
        FLOW_ATTEMPTS
    ), outcomes
    assert not [said for said in outcomes if "not its own" in said], outcomes
    left_running = faults[f"held by Prefect as {HELD[-1]}"]
    assert outcomes["cancel flow: not cancelled in Prefect, nothing done"] == left_running
    assert outcomes["control (its own submission's run): cancelled by the flow"] == FLOW_CONTROLS


async def _forged(flow: Any, parameters: dict[str, Any], colleague: Colleague, held: str) -> Any:
    """Create a decoy flow run with a record naming the colleague's run, held as ``held``."""
    state = {"Cancelled": Cancelled, "Cancelling": Cancelling}.get(held, Running)()
    async with get_client() as client:
        flow_run = await client.create_flow_run(flow, parameters=parameters)
        await client.create_flow_run_input(flow_run.id, BACKEND_RUN_KEY, colleague.run_id)
        await client.set_flow_run_state(flow_run.id, state, force=True)
    return flow_run


def _flow_said(said: str, own: set[str], *, control: bool) -> str:
    """Name what the ``ito-cancel-training`` flow said it did, for the ledger."""
    if "not cancelled, in Prefect" in said:
        return "cancel flow: not cancelled in Prefect, nothing done"
    if "has no backend run" in said:
        return "cancel flow: stopped nothing (no run of its own)"
    cancelled = said.removeprefix("Cancelled backend run ").split(" ", 1)[0]
    if control and said.startswith("Cancelled backend run ") and cancelled in own:
        return "control (its own submission's run): cancelled by the flow"
    return f"cancel flow: {said} (not its own)"


# --- follow attempts ------------------------------------------------------------------------------


RECORD_ON_ITS_BOOKING = "record naming the colleague's run, request on its booking"
RECORD_FROM_ANOTHER_BOOKING = "record naming the colleague's run, request on another booking"
MADE_UP_RECORD = "record naming a made-up run"
BUSY = "no record, booking busy with the colleague's run of the same request"
SHAPES = [RECORD_ON_ITS_BOOKING, RECORD_FROM_ANOTHER_BOOKING, MADE_UP_RECORD, BUSY]
NO_KEY, OWN_KEY, COPIED_KEY = "no key", "its own derived key", "the colleague's key copied"
SAME_SUBMISSION = "control (same key and request: the same submission, followed by design)"
OWN_RUN = "control (its own submission's run, a record naming the colleague's): its own followed"
IGNORED = "follow attempts whose Prefect record was ignored, with a warning"


@dataclass(frozen=True)
class Follow:
    """One follow attempt: its shape, its training parameter and key, and the record it names."""

    shape: str
    training: dict[str, Any]
    key: str
    recorded: str | None


def draw_follow(rng: random.Random, colleague: Colleague, free: list[str]) -> Follow:
    """Return a follow attempt of seeded random parts; never the same key and the same request."""
    shape = rng.choice(SHAPES)
    training = training_fields()
    if shape == RECORD_FROM_ANOTHER_BOOKING or (shape == MADE_UP_RECORD and rng.random() < 0.5):
        training["booking"] = rng.choice(free)
    elif shape == RECORD_ON_ITS_BOOKING and rng.random() < 0.6:
        training.update(rng.choice(CHANGES))
    exact = training == training_fields()
    key = rng.choice([NO_KEY, OWN_KEY] if exact else [NO_KEY, OWN_KEY, COPIED_KEY])
    recorded = {
        MADE_UP_RECORD: f"run_{rng.getrandbits(64):016x}",
        BUSY: None,
    }.get(shape, colleague.run_id)
    return Follow(shape, training, key, recorded)


async def test_no_follow_attempt_follows_another_flow_run_s_run(backend, submit, ledger):
    rng = random.Random(SEED + 2)
    target, control_bookings, free = start(backend, OWN_RUNS, "bk-follow")
    colleague = await colleague_of(target, submit, rng)
    made_by_decoys: dict[uuid.UUID, tuple[dict[str, Any], TrainingRun]] = {}
    for booking in control_bookings:
        flow_run_id = seeded_id(rng)
        training = training_fields(booking=booking)
        run = await own_submission(target, submit, training, flow_run_id)
        made_by_decoys[flow_run_id] = (training, run)
    plan: list[Any] = [draw_follow(rng, colleague, free) for _ in range(FOLLOW_ATTEMPTS)]
    plan += [SAME_SUBMISSION] * SAME_SUBMISSIONS + list(made_by_decoys)
    rng.shuffle(plan)
    warnings = _Warnings()
    logger = logging.getLogger("tests.follow_attempts")
    logger.addHandler(warnings)
    faults, outcomes = Counter[str](), Counter[str]()
    try:
        async with target.client() as client:
            for attempt in plan:
                flow_run_id = seeded_id(rng)
                if attempt == SAME_SUBMISSION:
                    recorded = rng.choice([colleague.run_id, None])
                    follow = Follow(SAME_SUBMISSION, training_fields(), COPIED_KEY, recorded)
                    own = colleague.run_id
                elif isinstance(attempt, uuid.UUID):
                    training, run = made_by_decoys[attempt]
                    follow = Follow(OWN_RUN, training, OWN_KEY, colleague.run_id)
                    flow_run_id, own = attempt, run.run_id
                else:
                    follow, own = attempt, ""
                    faults.update([follow.shape, follow.key])
                found = await _follow(client, follow, colleague, flow_run_id, logger)
                outcomes[_followed(found, own, follow.shape)] += 1
    finally:
        logger.removeHandler(warnings)
    touched = sum(n for said, n in outcomes.items() if said.startswith("followed run "))
    others = judge_cancels(target, colleague, set())
    runs = {a.run.run_id for a in target.sim.runs()}
    made = {colleague.run_id} | {run.run_id for _, run in made_by_decoys.values()}

    ledger.record(
        CATEGORY,
        trials=FOLLOW_ATTEMPTS,
        faults={f"follow: {fault}": n for fault, n in faults.items()},
        outcomes={TOUCHED: touched + len(others), **outcomes},
        measures={IGNORED: str(warnings.ignored)},
    )
    assert touched == 0, outcomes
    assert others == []
    assert runs == made  # a follow attempt makes nothing either
    assert outcomes[SAME_SUBMISSION] == SAME_SUBMISSIONS, outcomes
    assert outcomes[OWN_RUN] == OWN_RUNS, outcomes


async def _follow(
    client: ItoClient,
    follow: Follow,
    colleague: Colleague,
    flow_run_id: uuid.UUID,
    logger: logging.Logger,
) -> TrainingRun | ItoError | None:
    """Ask which run this decoy's request made, as a training flow run does before it quotes."""
    training = dict(follow.training)
    if follow.key == COPIED_KEY:
        training["idempotency_key"] = colleague.key
    key = None if follow.key == NO_KEY else await key_of(training, flow_run_id)
    try:
        return await ownership.find_attachable_run(
            client,
            await request_of(training),
            key,
            str(flow_run_id),
            logger,
            recorded=follow.recorded,
        )
    except ItoError as error:
        return error


def _followed(found: TrainingRun | ItoError | None, own: str, shape: str) -> str:
    """Name what one follow attempt found, for the ledger."""
    if isinstance(found, ItoError):
        return f"follow: ended {type(found).__name__}"
    if found is None:
        return "follow: nothing to follow (a new submission would be quoted)"
    if found.run_id == own and shape in (SAME_SUBMISSION, OWN_RUN):
        return shape
    return f"followed run {found.run_id}, not its own"


class _Warnings(logging.Handler):
    """Counts the warnings that a Prefect record was ignored."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.ignored = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "the record is ignored" in record.getMessage():
            self.ignored += 1
