"""The terminal prompt asks for an explicit approve or reject; silence decides nothing."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cli_helpers import converse, person_quote
from simulator_fixture import FAST
from spend_helpers import covering_authorization

from prefect_ito.backend.origins import ENV_API_URL, ENV_TOKEN
from prefect_ito.cli import terminal, views
from prefect_ito.cli.terminal import RestartPause, SpendPause
from prefect_ito.contract import ALL_SCOPES, TrainingRequest
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.waits import ActionWait, QuoteWait


@pytest.fixture
def typed(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Script what the person types; None is the end of input."""
    answers: list[str | None] = []
    prompts: list[str] = []

    async def read_line(console: Any, prompt: str) -> str | None:
        prompts.append(prompt)
        return answers.pop(0)

    monkeypatch.setattr(terminal, "_read_line", read_line)
    return answers


@pytest.fixture
def spiked(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SimulatorServer, RestartPause]]:
    """A simulator whose run waits for a restart decision, and the pause that names it; this
    terminal holds a person's own token (``user:grace``) for it."""
    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        monkeypatch.setenv(ENV_API_URL, simulator.url)
        monkeypatch.setenv(ENV_TOKEN, person_token(simulator, "cli", "user:grace"))
        run = _spiked_run(simulator)
        record = ActionWait(
            api_url=simulator.url,
            run_id=run["run_id"],
            action_id=run["pending_action"]["action_id"],
        )
        yield simulator, RestartPause(None, "### Loss spike", record)  # type: ignore[arg-type]


def person_token(simulator: SimulatorServer, account: str, principal: str) -> str:
    scopes = [scope.value for scope in ALL_SCOPES]
    return simulator.mint_token(account, scopes=scopes, principal=principal).get_secret_value()


def _spiked_run(simulator: SimulatorServer) -> dict[str, Any]:
    """Submit a run under a standing authorization and return it once it waits for a decision."""
    token = person_token(simulator, "cli", "user:grace")
    headers = {"Authorization": f"Bearer {token}"}
    authorization = covering_authorization(simulator, "cli").authorization_id
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://x"],
        target="chat", budget_usd=250_000,
    )  # fmt: skip
    with httpx.Client(base_url=simulator.url, headers=headers, timeout=30) as http:
        quote = http.post(
            "/v0/training-quotes", json=request.to_submission().model_dump(mode="json")
        )
        body = request.to_submission().spending(quote.json()["data"]["quote_id"], authorization)
        made = http.post(
            "/v0/training-runs",
            json=body.model_dump(mode="json"),
            headers={"Idempotency-Key": "terminal-tests"},
        )
        run_id = made.json()["data"]["run"]["run_id"]
        for _ in range(300):
            run: dict[str, Any] = http.get(f"/v0/training-runs/{run_id}").json()["data"]
            if run.get("pending_action"):
                return run
            time.sleep(0.1)
    raise AssertionError("the run never waited for a decision")


def _decisions(simulator: SimulatorServer) -> list[Any]:
    return simulator.runs()[0].run.decisions


async def test_an_empty_or_unclear_answer_asks_again_instead_of_rejecting(typed, spiked):
    # Before, Enter at "Approve the restart? [y/N]" rejected the restart.
    simulator, pause = spiked
    typed += ["", "maybe", "r", "bad shard"]

    await terminal.ask_at_terminal(pause)

    assert typed == []
    ((decided),) = _decisions(simulator)
    # Decided at the backend as the person at the terminal: their login is who decided.
    assert (decided.decision.value, decided.principal, decided.reason) == (
        "reject",
        "user:grace",
        "bad shard",
    )


async def test_a_workload_token_at_the_terminal_decides_nothing_and_says_where_a_person_does(
    typed, spiked, monkeypatch, capsys
):
    simulator, pause = spiked
    workload = simulator.mint_token("cli", principal="service:nightly", scopes=["training:read"])
    monkeypatch.setenv(ENV_TOKEN, workload.get_secret_value())
    typed += ["a", "looks fine"]

    await terminal.ask_at_terminal(pause)

    assert _decisions(simulator) == []
    said = " ".join(capsys.readouterr().out.split())
    assert "nothing was decided" in said and "prefect-ito login" in said, said


async def test_the_terminal_shows_the_run_the_record_names_as_the_backend_states_it(
    typed, spiked, capsys
):
    # The record and the form's text are Prefect's, which anyone with API access may write:
    # what a person decides on is the evidence the backend states.
    simulator, pause = spiked
    typed += [None]

    await terminal.ask_at_terminal(pause)

    shown = capsys.readouterr().out
    assert "### Loss spike" not in shown  # the form's text, not shown when the backend is read
    assert pause.action is not None and pause.action.run_id in shown
    assert _decisions(simulator) == []


@pytest.mark.parametrize("real_server", [True, False], ids=["server", "ephemeral"])
async def test_the_end_of_input_leaves_the_decision_to_someone_else(
    typed, spiked, monkeypatch, capsys, real_server
):
    # Before, the ephemeral mode, whose flow run no other process can reach, pointed at a Prefect
    # UI. The backend's page is open to a person either way.
    simulator, pause = spiked
    monkeypatch.setattr(terminal, "has_real_server", lambda: real_server)
    typed += [None]

    await terminal.ask_at_terminal(pause)

    said = " ".join(capsys.readouterr().out.split())
    assert "backend's decide page" in said, said
    assert ("`prefect-ito decide`" in said) is real_server, said
    assert _decisions(simulator) == []


@pytest.fixture
def quoted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SimulatorServer, SpendPause]]:
    """A simulator with a fresh quote, and the spend pause that names it; this terminal holds
    a person's own token for it."""
    with SimulatorServer() as simulator:
        token, quote = person_quote(simulator)
        monkeypatch.setenv(ENV_API_URL, simulator.url)
        monkeypatch.setenv(ENV_TOKEN, token)
        record = QuoteWait(
            api_url=simulator.url,
            quote_id=quote["quote_id"],
            manifest_digest=quote["manifest_digest"],
            expires_at=quote["expires_at"],
        )
        yield simulator, SpendPause(None, "### Spend", record)  # type: ignore[arg-type]


def _stated(simulator: SimulatorServer, pause: SpendPause) -> dict[str, Any]:
    assert pause.quote is not None
    token = simulator.mint_token().get_secret_value()
    answer = httpx.get(
        f"{simulator.url}/v0/training-quotes/{pause.quote.quote_id}",
        headers={"Authorization": f"Bearer {token}"},
    )
    stated: dict[str, Any] = answer.json()["data"]
    return stated


async def test_the_spend_is_confirmed_at_the_backend_only_by_typing_it_out(typed, quoted):
    simulator, pause = quoted
    typed += ["", "yes", "c", "looked at it"]

    decision = await terminal.confirm_at_terminal(pause)

    # Confirmed at the backend as this person; the flow reads it there and goes on by itself.
    assert decision is None
    assert typed == []
    stated = _stated(simulator, pause)
    assert stated["state"] == "confirmed"
    assert stated["confirmation"]["principal"] == "user:grace"
    assert stated["confirmation"]["note"] == "looked at it"


async def test_the_terminal_shows_the_quote_the_record_names_as_the_backend_states_it(
    typed, quoted, capsys
):
    # The record and the form's text are Prefect's: anyone with API access could name another
    # quote of the account (a 70B run, say) beside a harmless description. Before, the terminal
    # showed the description and confirmed whatever quote the record named.
    simulator, pause = quoted
    forged = SpendPause(None, "### Spend: $10 on a tiny run", pause.quote)  # type: ignore[arg-type]
    typed += [None]

    assert await terminal.confirm_at_terminal(forged) is None

    shown = capsys.readouterr().out
    stated = _stated(simulator, pause)
    assert "$10 on a tiny run" not in shown
    assert f"${stated['plan']['cost_usd']['high']:,.0f}" in shown
    assert stated["manifest_digest"] in shown


async def test_a_quote_the_backend_does_not_know_is_never_confirmed_here(typed, quoted, capsys):
    simulator, pause = quoted
    assert pause.quote is not None
    unknown = SpendPause(
        None,  # type: ignore[arg-type]
        "### Spend",
        pause.quote.model_copy(update={"quote_id": "quote_never_made"}),
    )
    typed += ["confirm"]

    assert await terminal.confirm_at_terminal(unknown) is None

    assert "could not be read from the backend" in capsys.readouterr().out
    assert _stated(simulator, pause)["state"] == "pending"
    posts = [r for r in simulator.requests() if r.path.endswith("/confirmations")]
    assert posts == []


async def test_declining_at_the_terminal_and_the_end_of_input(typed, quoted):
    simulator, pause = quoted
    typed += ["decline", "too dear", None]

    declined = await terminal.confirm_at_terminal(pause)
    unanswered = await terminal.confirm_at_terminal(pause)

    assert declined is not None and declined.decision == "decline"
    assert declined.reason == "too dear"
    assert unanswered is None
    assert _stated(simulator, pause)["state"] == "pending"  # the flow declines, not the prompt


async def test_a_workload_token_at_the_terminal_is_told_where_a_person_confirms(
    typed, quoted, monkeypatch, capsys
):
    simulator, pause = quoted
    monkeypatch.setenv(ENV_TOKEN, simulator.mint_token().get_secret_value())
    typed += ["confirm", ""]

    assert await terminal.confirm_at_terminal(pause) is None

    assert "spend:confirm" in capsys.readouterr().out
    assert _stated(simulator, pause)["state"] == "pending"


def test_the_chart_is_named_not_dumped_as_base64_at_the_terminal():
    markdown = "before\n\n![Training loss by step](data:image/svg+xml;base64,PHN2Zz4=)\n\nafter"

    shown = terminal.without_images(markdown, ui=True)
    alone = terminal.without_images(markdown, ui=False)  # ephemeral mode: no UI to point at

    assert "base64" not in shown + alone
    assert "*(Training loss by step: a chart, shown in the Prefect UI)*" in shown
    assert "*(Training loss by step: a chart, not shown at the terminal)*" in alone


def test_task_chatter_leaves_the_console_only_and_only_when_not_verbose():
    import logging

    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    from prefect_ito.cli.views import TaskChatterFilter, quiet_tasks

    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    chatter = TaskChatterFilter()
    assert not chatter.filter(
        record("prefect.task_runs", logging.INFO, "Finished in state Completed()")
    )
    assert chatter.filter(record("prefect.task_runs", logging.ERROR, "Finished in state Failed()"))
    assert chatter.filter(
        record("prefect.flow_runs", logging.INFO, "Finished in state Completed()")
    )
    assert chatter.filter(record("prefect.flow_runs", logging.INFO, "Stage pretrain: passed"))

    root = logging.getLogger().handlers
    console = [h for h in root if isinstance(h, PrefectConsoleHandler)]
    api = [
        h for h in logging.getLogger("prefect.task_runs").handlers if isinstance(h, APILogHandler)
    ]
    assert console and api
    with quiet_tasks():
        assert all(any(isinstance(f, TaskChatterFilter) for f in h.filters) for h in console)
        assert not any(isinstance(f, TaskChatterFilter) for h in api for f in h.filters)
    with quiet_tasks(verbose=True):
        assert not any(isinstance(f, TaskChatterFilter) for h in console for f in h.filters)
    assert not any(isinstance(f, TaskChatterFilter) for h in console for f in h.filters)


@pytest.mark.parametrize(
    ("logger", "message"),
    [
        ("prefect.flow_runs", "Finished in state Detached('detached at the terminal')"),
        (  # seen when the detach interrupted a gate's wait: an ERROR line the test outran
            "prefect.task_runs",
            "Finished in state Failed('Task run encountered an exception Detached: detached at "
            "the terminal: the backend run goes on; re-attach with `prefect-ito attach RUN_ID`')",
        ),
    ],
)
def test_a_detach_leaves_no_error_line_at_the_console(logger: str, message: str):
    record = logging.LogRecord(logger, logging.ERROR, __file__, 1, message, None, None)
    other = logging.LogRecord(
        logger, logging.ERROR, __file__, 1, "Finished in state Failed('x')", None, None
    )

    assert views.DetachFilter().filter(record) is False
    assert views.DetachFilter().filter(other) is True


def test_an_expected_outcome_is_one_console_line_and_keeps_its_traceback_for_the_api():
    import logging
    import sys

    from prefect.logging.handlers import PrefectConsoleHandler

    from prefect_ito.cli.views import OutcomeFormatter, quiet_tasks
    from prefect_ito.exceptions import IdempotencyKeyReused

    def failed_with(error: Exception) -> logging.LogRecord:
        try:
            raise error
        except Exception:
            exc_info = sys.exc_info()
        return logging.LogRecord(
            "prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None, exc_info
        )

    formatter = OutcomeFormatter(logging.Formatter("%(message)s"))
    expected = failed_with(IdempotencyKeyReused("used for a different request"))
    unexpected = failed_with(KeyError("bug"))

    assert formatter.format(expected) == "Task run failed"
    assert expected.exc_info is not None  # the API handler still sends the traceback
    assert "Traceback" in logging.Formatter().format(expected)
    assert "Traceback" in formatter.format(unexpected)  # a bug keeps its traceback
    console = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    before = [h.formatter for h in console]
    with quiet_tasks():
        assert all(isinstance(h.formatter, OutcomeFormatter) for h in console)
    assert [h.formatter for h in console] == before


def test_the_decide_command_is_printed_on_one_line_to_copy(monkeypatch):
    # Before, an 80-column terminal broke it before "--reason".
    from uuid import uuid4

    from rich.console import Console

    monkeypatch.setattr(terminal, "has_real_server", lambda: True)
    console = Console(width=60, record=True)
    flow_run_id = uuid4()

    terminal._announce_pause(console, flow_run_id)

    command = f"prefect-ito decide {flow_run_id} --approve|--reject --reason TEXT"
    assert command in console.export_text().splitlines()[-1]


def test_the_summary_names_the_run_once_on_a_line_of_its_own():
    # Before, the run was named again as the stage table's title, wrapped to its narrow width.
    from played_runs import play
    from rich.console import Console

    from prefect_ito.cli.views import print_summary
    from prefect_ito.reporting.report import TrainingSummary

    run, seen = play("demo", decide="approve")
    console = Console(width=100, record=True)

    print_summary(console, TrainingSummary.of(run, actions=seen))

    text = console.export_text()
    assert text.splitlines()[0] == f"Backend run {run.run_id}: succeeded"
    assert text.count(run.run_id) == 1
    for title in ("Stages", "Gates", "Decision 1 of 1", "Telemetry"):
        assert title in text


# --- at a real terminal: a pseudo-terminal for the prompt, as a person would type -------------

ASK = """
import asyncio, os
from prefect_ito.cli import terminal
from prefect_ito.waiting.waits import ActionWait
record = ActionWait(api_url=os.environ["ITO_COMPUTE_API_URL"], run_id=os.environ["RUN_ID"],
                    action_id=os.environ["ACTION_ID"])
asyncio.run(terminal.ask_at_terminal(terminal.RestartPause(None, "### Loss spike", record)))
"""


@pytest.mark.slow
def test_at_a_terminal_the_person_decides_as_themselves_by_typing_it_out():
    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        run = _spiked_run(simulator)
        token = person_token(simulator, "cli", "user:grace")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")},
            ENV_API_URL: simulator.url, ENV_TOKEN: token,
            "RUN_ID": run["run_id"], "ACTION_ID": run["pending_action"]["action_id"],
        }  # fmt: skip
        code, output = converse(
            [sys.executable, "-c", ASK],
            env,
            [("[approve/reject]", "\n"), ("[approve/reject]", "a\n"), ("Why: ", "shard fixed\n")],
        )

        assert code == 0, output
        assert token not in output
        assert "Approved at the backend as user:grace" in output, output
        ((decided),) = _decisions(simulator)
        assert (decided.principal, decided.reason) == ("user:grace", "shard fixed")


async def test_a_waiting_train_asks_prefect_through_one_client(start_simulator, monkeypatch):
    # Each poll for a pause opened a Prefect client of its own, and each new client loads the CA
    # bundle into a TLS context: a third of the CPU of the tests that ran `train` in process.
    from flow_helpers import Person, parameters
    from rich.console import Console

    from prefect_ito.flows import ito_training

    opened: list[object] = []
    get_client = terminal.get_client

    def counting_get_client(*args: Any, **kwargs: Any) -> Any:
        client = get_client(*args, **kwargs)
        opened.append(client)
        return client

    monkeypatch.setattr(terminal, "get_client", counting_get_client)
    simulator = start_simulator("loss-spike")
    person = Person(approve=True)
    state = await terminal.run_training(
        ito_training, parameters(simulator), person, Console(quiet=True), poll=0.1
    )

    assert state.is_completed(), state.message
    assert len(person.asked) == 1
    assert len(opened) == 2, opened  # one to create the flow run, one for the whole wait
