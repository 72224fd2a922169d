"""Nothing is submitted unless the backend says a person confirmed it, or an authorization may.

The person here does what a person does: confirms the quote at the backend with a token of their
own (the flow, paused in-process, reads the quote at every poll and goes on by itself), or
answers the Prefect form, which can only decline or ask the flow to read the backend again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flow_helpers import Person, parameters
from prefect import flow
from rich.console import Console
from spend_helpers import PERSON, confirm_at_backend, covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.terminal import SpendPause, run_training
from prefect_ito.exceptions import ConfirmationRequired
from prefect_ito.flows import ito_training
from prefect_ito.jobs import ItoTrainingJob
from prefect_ito.parameters import BookingClaim, SupervisionParameters, TrainingParameters
from prefect_ito.people.spend import SpendDecision, submit_with_consent
from prefect_ito.simulator import builtin_scenario
from prefect_ito.supervision.tasks import TaskSteps
from prefect_ito.waiting import waits


class Confirmer:
    """A person at the flow's spend question: confirms at the backend, or answers the form.

    ``answers`` are used in turn: ``confirm`` (at the backend, with the person's own token; the
    form is left alone), ``decline`` or ``recheck`` (the form's two answers).
    """

    def __init__(self, simulator: Any, *answers: str) -> None:
        self.simulator = simulator
        self.answers = list(answers or ["confirm"])
        self.asked: list[SpendPause] = []

    async def __call__(self, pause: SpendPause) -> SpendDecision | None:
        self.asked.append(pause)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "confirm":
            assert pause.quote is not None
            confirm_at_backend(self.simulator, pause.quote.quote_id)
            return None
        return SpendDecision(decision=answer, reason="looked at the estimate")


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


async def test_a_person_confirms_at_the_backend_and_the_backend_records_who(start_simulator):
    simulator = start_simulator("default")
    person = Confirmer(simulator, "confirm")

    state = await run_with(simulator, person)

    assert state.is_completed(), state.message
    assert len(person.asked) == 1
    asked = person.asked[0]
    (admin,) = simulator.runs()
    run = admin.run
    assert asked.quote is not None and asked.quote.quote_id == run.confirmation.quote_id
    # What the person read: the cost first, then where to confirm, then the manifest and plan.
    description = asked.description
    assert (
        description.index("$")
        < description.index("confirm page")
        < description.index(run.manifest_digest)
    )
    for shown in (run.booking_id, "GPU hours", "data 8 × tensor 2", "$250,000", "code"):
        assert shown in description, shown
    assert (run.confirmation.confirmed_by, run.confirmation.via) == (PERSON, "person")
    assert run.confirmation.submitted_by == "user:flow-tests"
    assert len(submissions(simulator)) == 1


async def test_after_a_confirmation_at_the_backend_the_flow_pauses_again_for_a_restart(
    start_simulator,
):
    # The flow, paused in-process for the spend, resumes itself once the quote is confirmed at
    # the backend. Before, it resumed without the answer Prefect's form needs, Prefect refused,
    # and the flow ran on while Prefect still held it paused: the restart question that followed
    # failed with "Cannot pause flows that are not currently running" (seen in the demo).
    simulator = start_simulator("loss-spike")
    person = Confirmer(simulator, "confirm")

    state = await run_with(simulator, person)

    assert state.is_completed(), state.message
    (admin,) = simulator.runs()
    assert admin.run.decisions and admin.run.decisions[0].decision.value == "approve"


async def test_declining_in_the_form_declines_at_the_backend_and_submits_nothing(start_simulator):
    simulator = start_simulator("default")
    person = Confirmer(simulator, "decline")

    state = await run_with(simulator, person)

    assert state.is_failed() and state.name == "Declined", state.message
    assert "declined" in state.message and "nothing was submitted" in state.message
    assert submissions(simulator) == [] and simulator.runs() == []
    declines = [r for r in simulator.requests() if r.path.endswith("/declines")]
    assert len(declines) == 1


async def test_an_answer_in_prefect_without_a_confirmation_at_the_backend_spends_nothing(
    start_simulator,
):
    # Before (v0.3), a "confirm" answer in the Prefect form was the confirmation: anyone who
    # could write a flow run input or press Resume could spend. Now the form cannot confirm.
    simulator = start_simulator("default")
    person = Confirmer(simulator, "recheck", "recheck", "decline")

    state = await run_with(simulator, person)

    assert len(person.asked) == 3
    assert state.name == "Declined", state.message
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_nobody_confirming_in_time_submits_nothing(start_simulator):
    simulator = start_simulator("default")

    state = await ito_training(
        **parameters(simulator, authorization=None, approval_timeout=7), return_state=True
    )

    assert state.is_failed() and state.name == "AwaitingConfirmation", state.message
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_a_saved_block_naming_a_backend_authorization_lets_the_run_go(start_simulator):
    simulator = start_simulator("default")
    named = covering_authorization(simulator)
    await named.asave("nightly-spend", overwrite=True)
    person = Confirmer(simulator, "decline")

    state = await run_with(simulator, person, authorization="nightly-spend")

    assert state.is_completed(), state.message
    assert person.asked == []
    (admin,) = simulator.runs()
    confirmation = admin.run.confirmation
    assert (confirmation.confirmed_by, confirmation.via) == (PERSON, "standing_authorization")
    assert confirmation.authorization == named.authorization_id


PAST = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_budget_usd": 1_000}, "above the authorization's $1,000.00 per run"),
        ({"booking_id_patterns": ["bk-h100-*"]}, "matches none of bk-h100-*"),
        ({"targets": ["chat"]}, "is not among the authorization's targets"),
        ({"model_sizes": ["70B"]}, "model size 8B is not among 70B"),
        ({}, "outlast the booking's term"),
    ],
    ids=["budget", "booking", "target", "model-size", "term"],
)
async def test_outside_its_limits_a_person_is_asked(start_simulator, caplog, limits, reason):
    scenario = builtin_scenario("default")
    if not limits:  # the booking's term ends before the run could
        ended = scenario.bookings[0].model_copy(
            update={"term_end": datetime.now(UTC) + timedelta(hours=1)}
        )
        scenario = scenario.model_copy(update={"bookings": [ended, *scenario.bookings[1:]]})
    simulator = start_simulator(scenario)
    person = Confirmer(simulator, "decline")
    authorization = covering_authorization(simulator, **limits)

    state = await run_with(simulator, person, authorization=authorization)

    assert len(person.asked) == 1
    assert state.name == "Declined", state.message
    assert reason in caplog.text
    assert simulator.runs() == []


async def test_an_inline_authorization_written_in_prefect_is_refused(start_simulator):
    # Before (v0.3): a flow run created with these parameters was submitted with no pause, the
    # backend recording "confirmed_by: Ada Lovelace, via: standing_authorization".
    simulator = start_simulator("default")
    inline = {
        "authorized_by": "Ada Lovelace", "max_budget_usd": 1e12, "booking_ids": ["*"],
        "expires_at": "2099-01-01T00:00:00Z",
    }  # fmt: skip

    state = await ito_training(
        **parameters(simulator, authorization=inline, budget_usd=5_000_000.0, model_size="70B"),
        return_state=True,
    )

    assert state.is_failed() and state.name == "InvalidParameters", state.message
    assert "prefect-ito authorizations create" in state.message
    assert [r for r in simulator.requests() if r.method == "POST"] == []


async def test_a_backend_without_spend_authority_gets_nothing(start_simulator):
    scenario = builtin_scenario("default").model_copy(update={"spend_confirmation": False})
    simulator = start_simulator(scenario)

    state = await ito_training(**parameters(simulator), return_state=True)

    assert state.is_failed() and state.name == "Unavailable", state.message
    assert "spend authority" in state.message
    assert [r.method for r in simulator.requests() if r.method == "POST"] == []


async def test_a_job_outside_a_flow_run_needs_a_confirmation_at_the_backend(start_simulator):
    simulator = start_simulator("default")
    training = TrainingParameters(
        booking="bk-h200-2x8-ib", model_size="8B", data=["catalog://x"], target="chat",
        budget_usd=250_000,
    )  # fmt: skip
    job = ItoTrainingJob(credentials=ItoCredentials(api_url=simulator.url), training=training)

    with pytest.raises(ConfirmationRequired, match="needs a person's confirmation at the backend"):
        await job.trigger()
    assert submissions(simulator) == [] and simulator.runs() == []


async def test_a_re_entered_flow_run_takes_up_the_quote_it_recorded(start_simulator, monkeypatch):
    # A suspended run resumed by the watcher runs from the top: it reads the quote it asked
    # about (confirmed meanwhile at the backend) and submits on it, asking nobody again.
    from prefect_ito.people import asking

    async def no_suspension(*_: Any, **__: Any) -> None:
        raise AssertionError("suspended again")

    monkeypatch.setattr(asking, "suspend", no_suspension)
    simulator = start_simulator("default")
    credentials = ItoCredentials(api_url=simulator.url)
    training = TrainingParameters(**parameters(simulator)["training"])
    request = training.to_request(BookingClaim(booking_id=training.booking))
    async with credentials.get_client() as client:
        quote = await client.quote_training_run(request.to_submission())
    confirm_at_backend(simulator, quote.quote_id)

    @flow
    async def re_entered() -> Any:
        steps = TaskSteps(credentials, SupervisionParameters())
        record = waits.QuoteWait(
            api_url=simulator.url,
            quote_id=quote.quote_id,
            manifest_digest=quote.manifest_digest,
            expires_at=quote.expires_at,
        )
        assert steps.flow_run_id is not None
        await waits.record_wait(steps.flow_run_id, record)
        return await submit_with_consent(steps, request, "key-re-entered", None)

    run = await re_entered()

    assert run.confirmation is not None and run.confirmation.quote_id == quote.quote_id
    quotes_made = [r for r in simulator.requests() if r.path == "/v0/training-quotes"]
    assert len(quotes_made) == 1  # only the one made above: the flow made none of its own


def test_the_form_can_only_decline_or_recheck_and_has_no_default():
    schema = SpendDecision.model_json_schema()
    # An optional type would show in the Prefect UI as a str/None switch that starts on None.
    assert schema["properties"]["reason"]["type"] == "string"
    assert set(schema["required"]) == {"decision"}
    assert "confirm" not in str(schema["properties"]["decision"].get("enum", []))
