"""Authority in the flows: what a token may not do ends the flow clearly, and spends nothing."""

from __future__ import annotations

from typing import Any

import pytest
from flow_helpers import BOOKING, REQUEST, parameters
from pydantic import SecretStr
from rich.console import Console
from spend_helpers import PERSON, covering_authorization, person_token

from prefect_ito.backend.auth import store_token
from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.cli.terminal import RestartPause, run_training
from prefect_ito.contract import DecisionChoice, DecisionRequest, Scope
from prefect_ito.flows import ito_attach_training, ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import SimulatorServer


def posts(simulator: SimulatorServer) -> list[Any]:
    return [entry for entry in simulator.requests() if entry.method == "POST"]


def limited_credentials(simulator: SimulatorServer, *scopes: Scope) -> ItoCredentials:
    """Return credentials whose keyring entry holds a token with only ``scopes``."""
    entry = f"limited-{'-'.join(scope.name.lower() for scope in scopes) or 'none'}"
    token = simulator.mint_token("flow-tests", scopes=[scope.value for scope in scopes])
    store_token(simulator.url, token, keyring_entry=entry)
    return ItoCredentials(api_url=simulator.url, keyring_entry=entry)


async def test_a_read_only_token_attaches_and_waits_while_a_person_decides_at_the_backend(
    start_simulator,
):
    # Before v0.5 the flow relayed the decision with its own token (and stopped as
    # InsufficientScope with one that could not). Now it decides nothing: a read-only token
    # follows the run, and the person decides with their own.
    simulator = start_simulator("loss-spike")
    training = TrainingParameters(**REQUEST, booking=BOOKING)
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator),
    )
    run_id = (await job.trigger()).run_id
    asked: list[str] = []

    async def person(pause: RestartPause) -> None:
        asked.append(pause.description)
        assert pause.action is not None and pause.action.run_id == run_id
        async with ItoClient(simulator.url, SecretStr(person_token(simulator))) as client:
            await client.decide(
                run_id,
                pause.action.action_id,
                DecisionRequest(decision=DecisionChoice.APPROVE, reason="a blip"),
                idempotency_key="person-decides",
            )

    state = await run_training(
        ito_attach_training,
        {"run_id": run_id, "credentials": limited_credentials(simulator, Scope.READ)},
        person,
        Console(quiet=True),
        poll=0.3,
    )

    assert state.is_completed(), state.message
    assert len(asked) == 1
    decisions = [entry for entry in posts(simulator) if entry.path.endswith("/decision")]
    assert [entry.status for entry in decisions] == [200]  # the person's; none of the flow's
    run = simulator.runs()[0].run
    assert [(d.decision, d.principal) for d in run.decisions] == [(DecisionChoice.APPROVE, PERSON)]


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
