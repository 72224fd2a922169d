"""A cancel that takes time: ``cancelling`` is not an end, so the cancel wait goes on."""

from __future__ import annotations

import logging
from typing import Any

from ito_fakes import Script, mock_client, ok, sample_run

from prefect_ito.backend.desk import cancel_training_workload
from prefect_ito.contract import RunState, TrainingRun
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.plain import ClientSteps


def run_in(state: str, version: int, **changes: Any) -> TrainingRun:
    data = sample_run().model_dump(mode="json") | {"state": state, "version": version}
    return TrainingRun.model_validate(data | changes)


def test_cancelling_is_a_known_state_that_is_not_an_end() -> None:
    state = RunState("cancelling")

    assert state is RunState.CANCELLING and state.known
    assert not state.terminal
    assert not run_in("cancelling", 2).finished


async def test_the_cancel_wait_goes_on_through_cancelling() -> None:
    script = Script(
        ok(run_in("cancelling", 5)),
        ok(run_in("cancelling", 6)),
        ok(run_in("cancelled", 7, outcome={"code": "CANCELLED", "message": "by request"})),
    )
    async with mock_client(script) as client:
        final = await cancel_training_workload(client, "run-1", reason="by request", wait=0.01)

    assert final.state is RunState.CANCELLED
    assert script.calls == [
        "POST /v0/training-runs/run-1/cancel",
        "GET /v0/training-runs/run-1",
        "GET /v0/training-runs/run-1",
    ]
    assert script.requests[1].url.params["after_version"] == "5"


async def test_a_cancel_still_cancelling_at_the_limit_is_reported_unconfirmed() -> None:
    script = Script(ok(run_in("cancelling", 5)))

    async with mock_client(script) as client:
        steps = ClientSteps(client, SupervisionParameters(), logging.getLogger("test.cancel"))
        steps.cancel_confirm_seconds = 0.05
        final, message = await supervision.stop_for_cancel(steps, run_in("running", 4))

    assert final.state is RunState.CANCELLING
    assert "unconfirmed" in message and "cancelling" in message
