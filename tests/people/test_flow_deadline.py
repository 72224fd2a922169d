"""A deadline extension (contract v0.5), the kind of question added through the registry alone:
the flow asks it with its own evidence, a person decides at the backend, and the run goes on or
stops at its deadline as the backend says."""

from __future__ import annotations

from flow_helpers import Person, parameters
from rich.console import Console

from prefect_ito.cli.terminal import run_training
from prefect_ito.contract import DecisionChoice, RunState
from prefect_ito.flows import ito_training


async def test_an_approved_extension_lets_the_run_finish(start_simulator):
    simulator = start_simulator("deadline-extension")
    person = Person(approve=True)
    state = await run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.3
    )

    assert state.is_completed(), state.message
    (form,) = person.asked
    assert "### Deadline in `mid_train` — an extension is proposed" in form
    assert "| deadline now |" in form and "(12 h later)" in form
    assert "- **approve**: the run may go on until" in form
    assert "- **reject**: the run stops at its deadline" in form
    assert "Nothing typed in Prefect approves or rejects the deadline extension." in form
    run = simulator.runs()[0].run
    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, (d.principal or "")[:5]) for d in run.decisions] == [
        (DecisionChoice.APPROVE, "user:")
    ]


async def test_a_rejected_extension_stops_the_run_at_its_deadline(start_simulator):
    simulator = start_simulator("deadline-extension")
    state = await run_training(
        ito_training, parameters(simulator), Person(approve=False), Console(quiet=True), poll=0.3
    )

    run = simulator.runs()[0].run
    assert run.state is RunState.FAILED and run.outcome is not None
    assert run.outcome.code == "DEADLINE_REACHED"
    assert not state.is_completed()
    assert "deadline" in (state.message or ""), state.message
    assert [d.decision for d in run.decisions] == [DecisionChoice.REJECT]
