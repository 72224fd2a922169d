"""A flow run that waits for a person's spend says what it waits for, on the session's Prefect
server: the Suspended state's message names the estimate and the deadline, the log names the
estimate and the ceiling, and the quote is already on the run's cards.

The flow run comes from a deployment (only those may suspend) and runs in this process, as a
worker would run it; nobody answers, so the run ends its process suspended.
"""

from __future__ import annotations

import logging
import re

import pytest
from flow_helpers import logs_until, parameters, training_deployment
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)
from prefect.exceptions import Pause
from prefect.flow_engine import run_flow_async

from prefect_ito.flows import ito_training

ESTIMATE = r"\$[\d.,]+[kM]?(–\$[\d.,]+[kM]?)?"
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"


async def test_a_spend_wait_says_what_it_asks_by_when_and_shows_the_quote(start_simulator):
    simulator = start_simulator("default")
    params = parameters(simulator, authorization=None)
    deployment = await training_deployment("spend-wait-tests")
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": params["training"]}
        )

    with pytest.raises(Pause) as suspended:  # the end of the process, as under a worker
        await run_flow_async(ito_training, flow_run=flow_run, parameters=params)

    assert suspended.value.state.name == "Suspended"
    async with get_client() as client:
        stored = (await client.read_flow_run(flow_run.id)).state
        cards = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
        )
    assert stored.state_details.pause_key.startswith("spend-")
    assert re.fullmatch(
        f"Waiting for a person: confirm the spend of {ESTIMATE} on booking bk-h200-2x8-ib "
        f"by {WHEN}",
        stored.message,
    ), stored.message
    estimate = re.search(ESTIMATE, stored.message).group(0)
    (quote,) = [card for card in cards if card.key.startswith("ito-quote-")]
    assert f"{estimate} estimated" in quote.data and "$250,000 at most" in quote.data
    logs = await logs_until(flow_run.id, "Finished in state Suspended")
    asked = [log.message for log in logs if log.message.startswith("Waiting for a person")]
    assert len(asked) == 1 and f"{estimate} estimated ($250,000.00 at most)" in asked[0]
    assert [log.message for log in logs if log.level >= logging.ERROR] == []
