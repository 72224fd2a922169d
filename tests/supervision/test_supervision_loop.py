"""The one supervision loop: what no caller of it may lose, against the simulator."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from flow_helpers import BOOKING, REQUEST, Person, parameters
from prefect.client.orchestration import PrefectClient
from prefect.exceptions import PrefectHTTPStatusError
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.terminal import run_training
from prefect_ito.contract import RunState, TrainingRun
from prefect_ito.exceptions import RateLimited
from prefect_ito.flows import ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import builtin_scenario
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.plain import ClientSteps


async def test_a_run_the_backend_cancelled_ends_cancelled(start_simulator):
    # Before, a run cancelled at the backend (not through Prefect) ended as plain Failed, exit 1.
    simulator = start_simulator(builtin_scenario("default").with_options(time_scale=2_000))
    flow = asyncio.ensure_future(ito_training(**parameters(simulator), return_state=True))
    while not simulator.runs():
        await asyncio.sleep(0.2)
    run_id = simulator.runs()[0].run.run_id
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        await client.cancel_training_run(run_id, reason="a person at the desk", idempotency_key="k")

    state = await asyncio.wait_for(flow, timeout=120)

    assert state.is_cancelled(), state
    assert "Cancelled" in (state.message or "")
    assert simulator.runs()[0].run.state is RunState.CANCELLED


class FlakyReports(ClientSteps):
    """Steps whose first reports fail as a storm of 429s would make them fail."""

    def __init__(self, *args: Any, failures: int) -> None:
        super().__init__(*args)
        self.failures = failures
        self.reported: list[int] = []

    async def report(self, run: TrainingRun, after_seq: int) -> int:
        if self.failures:
            self.failures -= 1
            raise RateLimited("too many requests", retry_after=1)
        seen = await super().report(run, after_seq)
        self.reported.append(seen)
        return seen


async def test_a_failing_report_never_stops_supervision(start_simulator):
    simulator = start_simulator("default")
    training = TrainingParameters(**{**REQUEST, "booking": BOOKING})
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url),
        training=training,
        authorization=covering_authorization(simulator),
    )
    handle = await job.trigger()
    async with job.credentials.get_client() as client:
        steps = FlakyReports(client, training, logging.getLogger("test"), failures=3)
        final = await supervision.supervise(steps, handle.run)

    assert final.state is RunState.SUCCEEDED
    assert steps.failures == 0 and steps.reported  # it went on reporting after the storm
    assert steps.reported[-1] >= max(steps.reported)  # no event was skipped past


async def test_a_pause_form_not_stored_yet_is_looked_at_again(start_simulator, monkeypatch):
    # Prefect stores the pause's form just after the Paused state; reading it in between answers
    # 404 as PrefectHTTPStatusError, which once crashed `train` and the demo.
    simulator = start_simulator("loss-spike")
    original = PrefectClient.read_flow_run_input
    misses: list[str] = []

    async def not_stored_yet(self: PrefectClient, flow_run_id: Any, key: str) -> str:
        if not misses:
            misses.append(key)
            response = _Response404()
            raise PrefectHTTPStatusError("404", request=None, response=response)  # type: ignore[arg-type]
        return await original(self, flow_run_id, key)

    monkeypatch.setattr(PrefectClient, "read_flow_run_input", not_stored_yet)
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert misses and len(person.asked) == 1
    assert state.is_completed(), state.message


class _Response404:
    status_code = 404


async def test_a_new_submission_lists_the_booking_s_active_runs_once(start_simulator):
    # Re-attach, verify, check and delegate happen in one place; the flow listed them twice.
    # Three listings now, each once: the run the flow run's client reference made, the booking's
    # active runs, and the run the key made.
    simulator = start_simulator("default")
    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_completed(), state.message
    listings = [r for r in simulator.requests() if (r.method, r.path) == ("GET", LIST_RUNS)]
    assert len(listings) == 3
    submissions = [r for r in simulator.requests() if (r.method, r.path) == ("POST", LIST_RUNS)]
    assert len(submissions) == 1


LIST_RUNS = "/v0/training-runs"


async def test_running_a_finished_flow_run_again_re_attaches_and_submits_nothing(start_simulator):
    # The flow run recorded its backend run: run again (as the watcher re-enters a lost one),
    # it re-attaches to that run even though it finished, and sends no submission at all.
    from prefect import get_client
    from prefect.flow_engine import run_flow_async

    simulator = start_simulator("default")
    params = parameters(simulator)
    async with get_client() as client:
        flow_run = await client.create_flow_run(ito_training, parameters=params)
    first = await run_flow_async(
        ito_training, flow_run=flow_run, parameters=params, return_type="state"
    )
    assert first.is_completed(), first.message
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run.id)

    again = await run_flow_async(
        ito_training, flow_run=flow_run, parameters=params, return_type="state"
    )

    assert again.is_completed(), again.message
    submissions = [r for r in simulator.requests() if (r.method, r.path) == ("POST", LIST_RUNS)]
    assert len(submissions) == 1
    assert len(simulator.runs()) == 1


async def test_a_finished_run_made_under_the_key_is_attached_without_asking_for_spend(
    start_simulator,
):
    # A run was made under this key (a flow run whose record of it was lost, or a person
    # running `train --idempotency-key` again) and has finished. Before, the flow quoted it
    # again and asked for the spend to be confirmed, though nothing new could be spent; with
    # nobody to ask, it ended NotConfirmed instead of with the run's outcome.
    simulator = start_simulator("default")
    first = await ito_training(**parameters(simulator, idempotency_key="nightly-1"))
    assert first.state is RunState.SUCCEEDED
    asked_before = len(simulator.requests())

    again = await ito_training(
        **parameters(
            simulator, idempotency_key="nightly-1", authorization=None, approval_timeout=5
        ),
        return_state=True,
    )

    assert again.is_completed(), again.message
    assert (await again.result()).run_id == first.run_id
    since = [(r.method, r.path) for r in simulator.requests()[asked_before:]]
    assert ("POST", LIST_RUNS) not in since and ("POST", "/v0/training-quotes") not in since
    assert len(simulator.runs()) == 1


async def test_a_key_used_for_another_manifest_is_refused_before_any_quote(start_simulator):
    simulator = start_simulator("default")
    await ito_training(**parameters(simulator, idempotency_key="nightly-2"))
    asked_before = len(simulator.requests())

    other = await ito_training(
        **parameters(simulator, idempotency_key="nightly-2", budget_usd=123_456),
        return_state=True,
    )

    assert other.name == "IdempotencyKeyReused", other
    since = [(r.method, r.path) for r in simulator.requests()[asked_before:]]
    assert ("POST", "/v0/training-quotes") not in since
    assert len(simulator.runs()) == 1
