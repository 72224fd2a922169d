"""``prefect-ito cancel`` of a flow run no process holds ends it ``Cancelled`` itself.

A ``train`` whose process was killed, or whose terminal went away without a word, leaves its
flow run ``Paused`` (or ``Running``) with nobody to act on it; a suspended run holds no process by
design. Prefect ends a ``Cancelling`` run only through the process that holds it, so before this
``cancel`` left such a run ``Cancelling`` until Prefect timed it out. Now ``cancel`` cancels the
backend run the flow run made (the backend's answer: its client reference) and marks the flow
run ``Cancelled``; a run whose process still beats is left to that process, as before.

Against the session's real Prefect server and the simulator. A killed process is stood for by
its last heartbeats, dated ten minutes ago: waiting for three real ones to be missed would take
minutes.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_helpers import REQUEST, in_process, worker_env
from prefect import get_client
from prefect.events import emit_event
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.states import Cancelling, Paused, Running, State, Suspended
from spend_helpers import covering_authorization

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import RunState
from prefect_ito.exceptions import ExitCode
from prefect_ito.flows import ito_training
from prefect_ito.parameters import BookingClaim, TrainingParameters
from prefect_ito.simulator import SimulatorServer, builtin_scenario

TRAINING = {
    "booking": REQUEST.booking_id,
    "model_size": REQUEST.model_size,
    "data": REQUEST.data_refs,
    "target": REQUEST.target,
    "budget_usd": REQUEST.budget_usd,
}
HEARTBEAT = "prefect.flow-run.heartbeat"


async def left_by_train(simulator: SimulatorServer, state: State) -> tuple[str, str]:
    """Return a training flow run in ``state`` as ``train`` leaves one, and the backend run it
    submitted (naming the flow run as its client reference, as the flow's submissions do)."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters={"training": TRAINING})
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        await client.set_flow_run_state(flow_run.id, state, force=True)
    training = TrainingParameters(**TRAINING)
    request = training.to_request(BookingClaim(booking_id=training.booking))
    submission = request.to_submission().referenced(str(flow_run.id))
    allowed = covering_authorization(simulator, "cli")
    async with ItoClient(simulator.url, simulator.mint_token("cli")) as backend:
        quote = await backend.quote_training_run(submission)
        made = await backend.submit_training_run(
            submission.spending(quote.quote_id, allowed.authorization_id),
            idempotency_key=f"tests-{uuid.uuid4()}",
        )
    return str(flow_run.id), made.run.run_id


async def beat(flow_run_id: str, *ago: float) -> None:
    """Send the flow run's heartbeats, ``ago`` seconds ago each; return once Prefect holds them."""
    for seconds in ago:
        emit_event(
            event=HEARTBEAT,
            resource={"prefect.resource.id": f"prefect.flow-run.{flow_run_id}"},
            occurred=datetime.now(UTC) - timedelta(seconds=seconds),
        )
    filter_ = EventFilter(
        event=EventNameFilter(name=[HEARTBEAT]),
        resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
        occurred={"since": datetime.now(UTC) - timedelta(days=1)},
    )
    async with asyncio.timeout(30), get_client() as client:
        while len((await client.read_events(filter=filter_, limit=10)).events) < len(ago):
            await asyncio.sleep(0.3)


async def state_of(flow_run_id: str) -> Any:
    async with get_client() as client:
        return (await client.read_flow_run(uuid.UUID(flow_run_id))).state


def backend_state(simulator: SimulatorServer, run_id: str) -> RunState:
    (run,) = [admin.run for admin in simulator.runs() if admin.run.run_id == run_id]
    return run.state


KILLED = (600.0, 570.0)
"""The last two heartbeats of a process killed ten minutes ago, 30 s apart."""


@pytest.mark.parametrize(
    ("left", "beats"),
    [
        (Paused(pause_key="restart-action_1"), KILLED),  # a train killed at its prompt
        (Running(), KILLED),  # a train killed while it supervised
        (Cancelling(), KILLED),  # an earlier cancel of it, left Cancelling
        (Suspended(pause_key="restart-action_1"), ()),  # holds no process by design
    ],
    ids=["paused", "running", "cancelling", "suspended"],
)
async def test_cancel_ends_a_flow_run_no_process_holds_after_cancelling_its_backend_run(
    prefect_server, left, beats
):
    # Before: the flow run was left Cancelling (and a killed train's backend run left running),
    # with nobody to end either.
    with SimulatorServer(builtin_scenario("stall")) as simulator:  # a run that never ends
        env = worker_env(simulator, prefect_server)
        flow_run_id, run_id = await left_by_train(simulator, left)
        await beat(flow_run_id, *beats)

        cancelled = in_process("cancel", flow_run_id, "--json", env=env)

        assert cancelled.returncode == ExitCode.SUCCESS, cancelled.stdout + cancelled.stderr
        said = json.loads(cancelled.stdout)["data"]
        assert said["flow_run_cancelled_here"] is True, said
        assert said["backend_cancelled_here"] is True and said["left_to"] is None, said
        assert said["backend_run"]["run_id"] == run_id
        assert backend_state(simulator, run_id) is RunState.CANCELLED
        state = await state_of(flow_run_id)
        assert state.name == "Cancelled", state
        assert "no flow process held the run" in state.message


async def test_cancel_leaves_a_flow_run_whose_process_beats_to_that_process(prefect_server):
    with SimulatorServer(builtin_scenario("stall")) as simulator:
        env = worker_env(simulator, prefect_server)
        flow_run_id, run_id = await left_by_train(simulator, Paused(pause_key="restart-action_1"))
        await beat(flow_run_id, 20.0)  # a train at its prompt, alive

        cancelled = in_process("cancel", flow_run_id, env=env)

        assert cancelled.returncode == ExitCode.SUCCESS, cancelled.stdout + cancelled.stderr
        said = " ".join(cancelled.stdout.split())
        assert "cancellation requested in Prefect" in said
        assert "left to the process running the flow" in said
        assert (await state_of(flow_run_id)).name == "Cancelling"
        assert backend_state(simulator, run_id) is not RunState.CANCELLED  # its process's to do


async def test_cancel_says_in_words_that_it_ended_a_flow_run_no_process_held(prefect_server):
    with SimulatorServer(builtin_scenario("stall")) as simulator:
        env = worker_env(simulator, prefect_server)
        flow_run_id, run_id = await left_by_train(simulator, Paused(pause_key="restart-action_1"))
        await beat(flow_run_id, *KILLED)

        cancelled = in_process("cancel", flow_run_id, env=env)

        assert cancelled.returncode == ExitCode.SUCCESS, cancelled.stdout + cancelled.stderr
        assert (
            f"Flow run {flow_run_id} (Paused): no flow process held it, so it was marked "
            "Cancelled from here." in " ".join(cancelled.stdout.split())
        )
        assert f"Cancelled backend run {run_id} from here." in cancelled.stdout
