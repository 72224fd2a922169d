"""Nothing is submitted before the spend is confirmed: by a person, or a standing authorization."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flow_helpers import Person, answered_suspension, parameters
from prefect import flow
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito import spend
from prefect_ito.blocks import ItoCredentials
from prefect_ito.exceptions import ConfirmationRequired
from prefect_ito.flows import ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import builtin_scenario
from prefect_ito.spend import SpendDecision
from prefect_ito.terminal import SpendPause, run_training


class Confirmer:
    """A person answering the spend form through the resume API, as the UI does."""

    def __init__(self, decision: str = "confirm", digest: str | None = None) -> None:
        self.decision = decision
        self.digest = digest
        self.asked: list[SpendPause] = []

    async def __call__(self, pause: SpendPause) -> SpendDecision:
        self.asked.append(pause)
        return SpendDecision(
            decision=self.decision,
            confirmed_by="Grace",
            manifest_digest=self.digest or pause.manifest_digest or "",
            reason="looked at the estimate",
        )


async def run_with(simulator: Any, confirmer: Confirmer, **changes: Any) -> Any:
    changes.setdefault("authorization", None)
    return await run_training(
        ito_training,
        parameters(simulator, **changes),
        Person(approve=True),
        Console(quiet=True),
        confirmer=confirmer,
        poll=0.3,
    )


def submissions(simulator: Any) -> list[Any]:
    return [r for r in simulator.requests() if r.method == "POST" and r.path == "/v0/training-runs"]


async def test_a_person_confirms_the_form_and_the_backend_records_them(start_simulator):
    simulator = start_simulator("default")
    person = Confirmer()

    state = await run_with(simulator, person)

    assert state.is_completed(), state.message
    assert len(person.asked) == 1
    asked = person.asked[0]
    (run,) = [admin.run for admin in simulator.runs()]
    assert asked.manifest_digest == run.manifest_digest
    # What the person read: the manifest, its digest, the plan and the estimate.
    for shown in (
        run.booking_id,
        run.manifest_digest,
        "GPU hours",
        "data 8 × tensor 2",
        "$250,000",
    ):
        assert shown in asked.description, shown
    assert run.confirmation is not None
    assert (run.confirmation.confirmed_by, run.confirmation.via) == ("Grace", "person")
    assert run.confirmation.authorization is None
    # Beside the name the person typed, the backend keeps whose token submitted it.
    assert run.confirmation.principal == "user:flow-tests"
    assert len(submissions(simulator)) == 1


async def test_declining_ends_declined_and_submits_nothing(start_simulator):
    simulator = start_simulator("default")
    person = Confirmer(decision="decline")

    state = await run_with(simulator, person)

    assert state.is_failed() and state.name == "Declined", state.message
    assert "Grace declined" in state.message and "nothing was submitted" in state.message
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_an_answer_naming_another_manifest_is_refused(start_simulator):
    simulator = start_simulator("default")
    other = "sha256:" + "ab" * 32

    state = await run_with(simulator, Confirmer(digest=other))

    assert state.is_failed() and state.name == "NotConfirmed", state.message
    assert other in state.message
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_nobody_confirming_in_time_submits_nothing(start_simulator):
    simulator = start_simulator("default")

    state = await ito_training(
        **parameters(simulator, authorization=None, approval_timeout=7), return_state=True
    )

    assert state.is_failed() and state.name == "AwaitingConfirmation", state.message
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_a_saved_standing_authorization_confirms_on_its_creators_behalf(start_simulator):
    simulator = start_simulator("default")
    await covering_authorization(authorized_by="Ada").asave("nightly-spend", overwrite=True)
    person = Confirmer()

    state = await run_with(simulator, person, authorization="nightly-spend")

    assert state.is_completed(), state.message
    assert person.asked == []
    (admin,) = simulator.runs()
    confirmation = admin.run.confirmation
    assert confirmation is not None
    assert (confirmation.confirmed_by, confirmation.via) == ("Ada", "standing_authorization")
    assert confirmation.authorization == "nightly-spend"


PAST = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_budget_usd": 1_000}, "above its $1,000.00 per run"),
        ({"booking_ids": ["bk-h100-*"]}, "is not among its bookings"),
        ({"targets": ["chat"]}, "target 'code-assistant' is not among its targets"),
        ({"model_sizes": ["70B"]}, "model size 8B is not among its sizes"),
        ({"expires_at": PAST}, "it expired at"),
        ({}, "may outlast the booking's term"),
    ],
    ids=["budget", "booking", "target", "model-size", "expired", "term"],
)
async def test_outside_its_limits_a_person_is_asked(start_simulator, caplog, limits, reason):
    scenario = builtin_scenario("default")
    if not limits:  # the booking's term ends before the run could
        ended = scenario.bookings[0].model_copy(update={"term_end": PAST + timedelta(days=1)})
        scenario = scenario.model_copy(update={"bookings": [ended, *scenario.bookings[1:]]})
    simulator = start_simulator(scenario)
    person = Confirmer(decision="decline")

    state = await run_with(simulator, person, authorization=covering_authorization(**limits))

    assert len(person.asked) == 1
    assert state.name == "Declined", state.message
    assert reason in caplog.text
    assert simulator.runs() == []


async def test_a_backend_without_spend_confirmation_gets_nothing(start_simulator):
    scenario = builtin_scenario("default").model_copy(update={"spend_confirmation": False})
    simulator = start_simulator(scenario)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_failed() and state.name == "Unavailable", state.message
    assert "spend confirmations" in state.message
    assert [r.method for r in simulator.requests() if r.method == "POST"] == []


async def test_a_job_outside_a_flow_run_needs_an_authorization_that_covers_it(start_simulator):
    simulator = start_simulator("default")
    training = TrainingParameters(
        booking="bk-h200-2x8-ib", model_size="8B", data=["catalog://x"], target="chat",
        budget_usd=250_000,
    )  # fmt: skip
    job = ItoTrainingJob(credentials=ItoCredentials(api_url=simulator.url), training=training)

    with pytest.raises(ConfirmationRequired, match="needs a person's confirmation"):
        await job.trigger()
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_a_resumed_suspension_takes_the_stored_confirmation_and_asks_once(
    start_simulator, monkeypatch
):
    # A flow run from a deployment suspends for the spend; resumed, it runs from the top and
    # quotes again: the answer stored under the manifest's pause key confirms the new quote.
    from prefect_ito import asking, desk

    async def no_second_suspension(**_: Any) -> None:
        raise AssertionError("suspended again")

    monkeypatch.setattr(asking, "can_suspend", lambda: True)
    monkeypatch.setattr(asking, "asuspend_flow_run", no_second_suspension)
    simulator = start_simulator("default")
    request = TrainingParameters(**parameters(simulator)["training"]).to_request(
        await _claim("bk-h200-2x8-ib")
    )
    async with ItoCredentials(api_url=simulator.url).get_client() as client:
        first = await desk.quote(client, request)
        second = await desk.quote(client, request)  # after the resume: a new quote

    @flow
    async def resumed() -> Any:
        answer = {
            "decision": "confirm",
            "confirmed_by": "Grace",
            "manifest_digest": request.digest(),
        }
        await answered_suspension(spend.pause_key(first.manifest_digest), answer)
        return await spend.ask_person(second, request, timeout=60, poll_interval=1)

    confirmation = await resumed()

    assert (confirmation.quote_id, confirmation.confirmed_by) == (second.quote_id, "Grace")


async def _claim(booking_id: str) -> Any:
    from prefect_ito.parameters import BookingClaim

    return BookingClaim(booking_id=booking_id)


def test_the_form_asks_a_reason_as_plain_text_with_no_choice_made_for_the_person():
    schema = SpendDecision.model_json_schema()
    # An optional type would show in the Prefect UI as a str/None switch that starts on None.
    assert schema["properties"]["reason"]["type"] == "string"
    assert set(schema["required"]) == {"decision", "confirmed_by", "manifest_digest"}
