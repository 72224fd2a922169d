"""A standing authorization the backend refuses is an outcome, not a crash, and the quote's card
ends in what happened.

A person who named a standing authorization for a nightly run and then revoked it (or whose run
outgrew it) reads, in the flow run, a Completed ``submit_training_run`` task, no traceback, and
everywhere they are asked — the form, the notice, the inbox's record, the logs — which
authorization did not cover the run and why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flow_helpers import Person, parameters
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import TaskRun
from rich.console import Console
from spend_helpers import covering_authorization, revoke
from test_flow_spend import Confirmer

from prefect_ito.backend.refusals import Uncovered
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.terminal import run_training
from prefect_ito.exceptions import ConfirmationRequired
from prefect_ito.flows import ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.waiting.keys import QUESTION_RECORD_PREFIX
from prefect_ito.waiting.waits import QuoteWait, latest_wait


async def run_named(simulator: Any, person: Confirmer, authorization: str) -> Any:
    return await run_training(
        ito_training,
        parameters(simulator, authorization=authorization),
        Person(approve=True),
        Console(quiet=True),
        confirmer=person,
        poll=0.3,
    )


async def task_runs(flow_run_id: Any) -> list[TaskRun]:
    async with get_client() as client:
        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )


async def log_text(flow_run_id: Any) -> str:
    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
    return "\n".join(log.message for log in logs)


async def test_a_revoked_authorization_asks_a_person_saying_which_and_why_and_fails_no_task(
    start_simulator,
):
    # Before: submit_training_run ended Failed (red) with AuthorizationDoesNotCover's traceback
    # in the logs, and the form and the notice said nothing of why a nightly run needed a person.
    simulator = start_simulator("default")
    named = covering_authorization(simulator)
    await named.asave("nightly-spend", overwrite=True)
    revoke(simulator, named.authorization_id)
    person = Confirmer(simulator, "confirm")

    state = await run_named(simulator, person, "nightly-spend")

    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    submits = [t for t in await task_runs(flow_run_id) if t.name.startswith("submit_training_run")]
    assert len(submits) == 2  # refused under the authorization, then made on the confirmation
    assert all(t.state is not None and t.state.is_completed() for t in submits), submits
    logs = await log_text(flow_run_id)
    assert "Traceback" not in logs
    which = f"the standing authorization nightly-spend ({named.authorization_id})"
    assert f"{which} does not cover this run: the authorization is revoked" in logs
    # The form says it, right under the cost.
    (asked,) = person.asked
    shown = asked.description.replace("\\", "")  # as markdown shows it: no escapes
    assert f"Why you are asked:** {which} does not cover this run" in shown
    assert "the authorization is revoked" in shown
    # So does the question the notice and the inbox carry.
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(flow_run_id, QUESTION_RECORD_PREFIX, 10, set())
    (record,) = inputs
    why = json.loads(record.value)["why"]
    assert which in why and "revoked" in why
    # And the quote's record, from which a watcher tells people again, names it and the reason.
    kept = await latest_wait(flow_run_id, QuoteWait)
    assert kept is not None and kept.named_authorization is True
    assert kept.refused == Uncovered(
        authorization_id=named.authorization_id, reason="the authorization is revoked"
    )


async def test_the_quote_card_of_a_completed_run_says_it_was_submitted_not_waiting(
    start_simulator,
):
    # Before: the ito-quote-spend-… card still read "Waiting for a person" on a Completed run.
    simulator = start_simulator("default")
    outgrown = covering_authorization(simulator, max_budget_usd=1_000)
    await outgrown.asave("small-spend", overwrite=True)
    person = Confirmer(simulator, "confirm")

    state = await run_named(simulator, person, "small-spend")

    assert state.is_completed(), state.message
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    (card,) = [a for a in artifacts if (a.key or "").startswith("ito-quote-")]
    (run,) = simulator.runs()
    assert card.description == f"Submitted, confirmed by user:ada: backend run {run.run.run_id}."
    assert "Confirmed at the backend by" in str(card.data)
    assert "Why you are asked" not in str(card.data)


async def test_the_quote_card_of_a_declined_spend_says_nothing_was_submitted(start_simulator):
    simulator = start_simulator("default")
    person = Confirmer(simulator, "decline")

    state = await run_training(
        ito_training,
        parameters(simulator, authorization=None),
        Person(approve=True),
        Console(quiet=True),
        confirmer=person,
        poll=0.3,
    )

    assert state.name == "Declined", state.message
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    (card,) = [a for a in artifacts if (a.key or "").startswith("ito-quote-")]
    assert card.description is not None
    assert card.description.startswith("Not submitted: the spend on booking")
    assert "declined" in card.description


async def test_a_job_outside_a_flow_run_says_which_authorization_does_not_cover_it_and_why(
    start_simulator,
):
    # Before: "needs a person's confirmation at the backend", and not that the job's own
    # authorization was revoked.
    simulator = start_simulator("default")
    named = covering_authorization(simulator)
    revoke(simulator, named.authorization_id)
    training = TrainingParameters(**parameters(simulator)["training"])
    job = ItoTrainingJob(
        credentials=ItoCredentials(api_url=simulator.url), training=training, authorization=named
    )

    with pytest.raises(ConfirmationRequired) as raised:
        await job.trigger()

    assert (
        f"the standing authorization {named.authorization_id} does not cover this run: the "
        "authorization is revoked" in str(raised.value)
    )
    assert simulator.runs() == []
