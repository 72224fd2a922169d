"""Cancelling a training flow run stops its own backend run, and nobody else's.

A flow run that recorded no backend run (cancelled while it was queued or asking a person, or
killed between its submission and the record) is matched to the run its own submission made:
its client reference, or its idempotency key. A run of the same request that another flow run
made on the booking is not its to stop.
"""

from __future__ import annotations

from typing import Any

from prefect import get_client
from spend_helpers import covering_authorization

from prefect_ito.backend import desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.contract import RunState
from prefect_ito.flows import ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters, derive_idempotency_key, resolve_booking
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.cancellation import cancel_workload_of

TRAINING = TrainingParameters(
    booking="bk-h200-2x8-ib", model_size="8B", data=["catalog://ito/web-2026-10"],
    target="code-assistant", budget_usd=250_000,
)  # fmt: skip
SLOW = 1_000
"""A time scale at which the backend run is still training when the test cancels."""


async def flow_run_of(simulator: SimulatorServer, training: TrainingParameters) -> Any:
    """Create a training flow run that never ran: it recorded no backend run."""
    parameters = {
        "training": training.model_dump(mode="json", exclude_none=True),
        "credentials": {"api_url": simulator.url},
    }
    async with get_client() as client:
        return await client.create_flow_run(ito_training, parameters=parameters)


async def submit(
    simulator: SimulatorServer, training: TrainingParameters, client_reference: str | None = None
) -> str:
    """Submit a backend run of ``training`` (under the flow run ``client_reference`` names, as
    that flow run's own submission would); return its id."""
    if client_reference is None:
        job = ItoTrainingJob(
            credentials=ItoCredentials(api_url=simulator.url),
            training=training,
            authorization=covering_authorization(simulator),
        )
        return (await job.trigger()).run_id
    request = training.to_request(await resolve_booking(training))
    authorization = covering_authorization(simulator).authorization_id
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        quote = await desk.quote_training_run(client, request)
        key = derive_idempotency_key(request, client_reference)
        run = await desk.submit_training_run(
            client, request, quote.quote_id, authorization, key, client_reference
        )
    return run.run_id


async def test_a_flow_run_that_never_submitted_stops_nobody_elses_run(start_simulator):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    theirs = await submit(simulator, TRAINING)  # another flow run's, of the same request
    never_submitted = await flow_run_of(simulator, TRAINING)

    outcome = await cancel_workload_of(never_submitted)

    # Before, it found the booking's unfinished run of the same request and cancelled it.
    assert (outcome.run, outcome.cancelled_now) == (None, False)
    (record,) = simulator.runs()
    assert record.run.run_id == theirs and record.run.state is not RunState.CANCELLED


async def test_a_flow_run_killed_before_it_recorded_its_run_has_that_run_cancelled(
    start_simulator,
):
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=SLOW))
    flow_run = await flow_run_of(simulator, TRAINING)
    # Its submission went out under its client reference (its id); then it was killed.
    ours = await submit(simulator, TRAINING, client_reference=str(flow_run.id))

    outcome = await cancel_workload_of(flow_run)

    assert outcome.cancelled_now and outcome.run is not None and outcome.run.run_id == ours
    (record,) = simulator.runs()
    assert record.run.state in (RunState.CANCELLED, RunState.CANCELLING)
