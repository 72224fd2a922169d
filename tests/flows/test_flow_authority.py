"""Authority in the flows: what a token may not do ends the flow clearly, and spends nothing."""

from __future__ import annotations

from typing import Any

import pytest
from flow_helpers import BOOKING, REQUEST, Person, parameters
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.backend.auth import store_token
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.cli.terminal import run_training
from prefect_ito.contract import RunState, Scope
from prefect_ito.exceptions import ExitCode
from prefect_ito.flows import ito_attach_training, ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import SimulatorServer
from prefect_ito.supervision.outcomes import exit_code


def posts(simulator: SimulatorServer) -> list[Any]:
    return [entry for entry in simulator.requests() if entry.method == "POST"]


def limited_credentials(simulator: SimulatorServer, *scopes: Scope) -> ItoCredentials:
    """Return credentials whose keyring entry holds a token with only ``scopes``."""
    entry = f"limited-{'-'.join(scope.name.lower() for scope in scopes) or 'none'}"
    token = simulator.mint_token("flow-tests", scopes=[scope.value for scope in scopes])
    store_token(simulator.url, token, keyring_entry=entry)
    return ItoCredentials(api_url=simulator.url, keyring_entry=entry)


async def test_a_read_only_token_attaches_but_a_decision_it_cannot_relay_stops_clearly(
    start_simulator,
):
    simulator = start_simulator("loss-spike")
    training = TrainingParameters(**REQUEST, booking=BOOKING)
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator),
    )
    run_id = (await job.trigger()).run_id
    person = Person(approve=True)

    state = await run_training(
        ito_attach_training,
        {"run_id": run_id, "credentials": limited_credentials(simulator, Scope.READ)},
        person,
        Console(quiet=True),
        poll=0.3,
    )

    assert state.is_failed() and state.name == "InsufficientScope", state.message
    assert exit_code(state) is ExitCode.FORBIDDEN
    assert "was not relayed" in state.message and Scope.DECIDE.value in state.message
    assert f"{run_id} still waits" in state.message
    assert len(person.asked) == 1  # asked once; the flow does not ask again and again
    decisions = [entry for entry in posts(simulator) if entry.path.endswith("/decision")]
    assert [entry.status for entry in decisions] == [403]
    run = simulator.runs()[0].run
    assert (run.state, run.decisions) == (RunState.AWAITING_DECISION, [])


async def test_a_token_that_may_not_submit_stops_before_any_submission(start_simulator):
    simulator = start_simulator("default")
    credentials = limited_credentials(simulator, Scope.READ, Scope.DECIDE, Scope.CANCEL)

    state = await ito_training(**parameters(simulator, credentials=credentials), return_state=True)

    assert state.is_failed() and state.name == "InsufficientScope", state.message
    assert Scope.SUBMIT.value in state.message and "nothing was submitted" in state.message
    assert posts(simulator) == []
    assert simulator.runs() == []


@pytest.mark.parametrize(
    ("field", "claimed"),
    [("gpus_per_node", 4), ("region", "us-east-1"), ("account", "someone-else")],
)
async def test_a_booking_unlike_the_handover_in_any_field_submits_nothing(
    start_simulator, field, claimed
):
    simulator = start_simulator("default")
    handover: dict[str, Any] = {
        "booking_id": BOOKING,
        "gpu_sku": "H200",
        "node_count": 2,
        "gpus_per_node": 8,
        "fabric": "InfiniBand",
        "region": "eu-north-1",
        "account": "flow-tests",
    }
    handover[field] = claimed

    state = await ito_training(
        **parameters(simulator, booking=ItoBooking(**handover)), return_state=True
    )

    assert state.name == "BookingNotEligible", state.message
    assert f"{field} is " in state.message and repr(claimed) in state.message
    assert posts(simulator) == []


async def test_the_whole_handover_matching_trains(start_simulator):
    simulator = start_simulator("default")
    handover = ItoBooking(
        booking_id=BOOKING,
        gpu_sku="H200",
        node_count=2,
        gpus_per_node=8,
        fabric="InfiniBand",
        region="eu-north-1",
        account="flow-tests",
    )

    state = await ito_training(**parameters(simulator, booking=handover), return_state=True)

    assert state.is_completed(), state.message
