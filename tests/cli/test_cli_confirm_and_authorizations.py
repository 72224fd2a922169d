"""`prefect-ito confirm` and `authorizations`: a person's spend authority, at the backend.

Every command runs in this process (:func:`cli_helpers.in_process`) against a simulator on a real
loopback port, with no terminal (as a script runs it); a test that gives it a terminal runs it as
a child process. ``PREFECT_API_URL`` points where nothing listens: none of these commands asks
Prefect anything.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest
from cli_helpers import converse, in_process, one_document
from spend_cli import PERSON, REQUEST, client, env_for, one_line_error, person

from prefect_ito.contract import QuoteState, TrainingQuote
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer


def workload(simulator: SimulatorServer) -> str:
    """A workload's token: the training scopes only."""
    return simulator.mint_token("cli").get_secret_value()


def make_quote(simulator: SimulatorServer) -> TrainingQuote:
    async def quote() -> TrainingQuote:
        async with client(simulator) as desk:
            return await desk.quote_training_run(REQUEST.to_submission())

    return asyncio.run(quote())


def read_quote(simulator: SimulatorServer, quote_id: str) -> TrainingQuote:
    async def read() -> TrainingQuote:
        async with client(simulator) as desk:
            return await desk.get_quote(quote_id)

    return asyncio.run(read())


def use_quote(simulator: SimulatorServer, quote_id: str) -> None:
    async def submit() -> None:
        async with client(simulator) as desk:
            submission = REQUEST.to_submission().spending(quote_id)
            await desk.submit_training_run(submission, idempotency_key=f"k-{uuid.uuid4()}")

    asyncio.run(submit())


def answers_sent(simulator: SimulatorServer) -> list[str]:
    return [
        r.path
        for r in simulator.requests()
        if r.method == "POST" and r.path.endswith(("/confirmations", "/declines"))
    ]


# --- confirm --------------------------------------------------------------------------------------


def test_confirm_with_yes_records_the_person_s_principal_at_the_backend(simulator):
    quote = make_quote(simulator)
    token = person(simulator)

    result = in_process(
        "confirm", quote.quote_id, "--yes", "--note", "Ada L.", env=env_for(simulator, token)
    )

    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.SUCCESS, output
    assert "Traceback" not in output and token not in output
    shown = result.stdout
    assert shown.index("Spend on booking") < shown.index("model size") < shown.index("pending")
    assert f"${quote.plan.cost_usd.high:,.0f}" in shown and "$250,000.00" in shown
    assert f"Confirmed at the backend as {PERSON}: quote {quote.quote_id}" in shown
    stated = read_quote(simulator, quote.quote_id)
    assert stated.state is QuoteState.CONFIRMED
    assert stated.confirmation is not None
    assert (stated.confirmation.principal, stated.confirmation.note) == (PERSON, "Ada L.")


def test_confirm_json_is_one_document_with_the_quote_and_the_confirmation(simulator):
    quote = make_quote(simulator)
    token = person(simulator)

    result = in_process("confirm", quote.quote_id, "--yes", "--json", env=env_for(simulator, token))

    data = one_document(result, token)["data"]
    assert set(data) == {"quote", "confirmation"}
    assert data["quote"]["quote_id"] == quote.quote_id
    assert data["quote"]["state"] == "confirmed"
    assert data["confirmation"]["principal"] == PERSON
    assert data["confirmation"]["state"] == "confirmed"


def test_a_quote_that_made_a_run_is_refused_naming_its_state_and_nothing_is_sent(simulator):
    quote = make_quote(simulator)
    env = env_for(simulator, person(simulator))
    assert in_process("confirm", quote.quote_id, "--yes", env=env).returncode == 0
    use_quote(simulator, quote.quote_id)
    sent = answers_sent(simulator)

    again = in_process("confirm", quote.quote_id, "--yes", env=env)
    as_json = in_process("confirm", quote.quote_id, "--yes", "--json", env=env)

    line = one_line_error(again, ExitCode.NOT_CONFIRMED)
    assert f"quote {quote.quote_id} is used" in line and "nothing was sent" in line
    assert one_document(as_json)["error"]["code"] == "CONFIRMATION_USED"
    assert answers_sent(simulator) == sent


def test_decline_records_the_decline_and_a_declined_quote_cannot_be_confirmed(simulator):
    quote = make_quote(simulator)
    env = env_for(simulator, workload(simulator))  # declining spends nothing: any token may

    declined = in_process("confirm", quote.quote_id, "--decline", "--note", "too dear", env=env)

    assert declined.returncode == ExitCode.SUCCESS, declined.stdout + declined.stderr
    assert "Traceback" not in declined.stdout + declined.stderr
    assert "Declined at the backend as user:cli" in declined.stdout
    stated = read_quote(simulator, quote.quote_id)
    assert stated.state is QuoteState.DECLINED
    assert stated.confirmation is not None and stated.confirmation.note == "too dear"
    sent = answers_sent(simulator)

    confirm = in_process(
        "confirm", quote.quote_id, "--yes", env=env_for(simulator, person(simulator))
    )

    line = one_line_error(confirm, ExitCode.NOT_CONFIRMED)
    assert f"quote {quote.quote_id} is declined" in line
    assert answers_sent(simulator) == sent


def test_a_workload_token_is_told_where_a_person_confirms_and_nothing_is_recorded(simulator):
    quote = make_quote(simulator)
    token = workload(simulator)

    result = in_process("confirm", quote.quote_id, "--yes", env=env_for(simulator, token))

    line = one_line_error(result, ExitCode.FORBIDDEN)
    assert "INSUFFICIENT_SCOPE" in line and "spend:confirm" in line
    assert "prefect-ito login" in line
    assert quote.confirm_url and quote.confirm_url in line
    assert quote.user_code and quote.user_code in line
    assert token not in result.stdout + result.stderr
    stated = read_quote(simulator, quote.quote_id)
    assert (stated.state, stated.confirmation) == (QuoteState.PENDING, None)


@pytest.mark.parametrize("quote_id", ["../runs", "q/1", " q_1", "q?x", "x" * 129])
def test_a_malformed_quote_id_is_refused_before_any_request(simulator, quote_id):
    env = env_for(simulator, person(simulator))
    before = len(simulator.requests())

    result = in_process("confirm", quote_id, "--yes", env=env)

    line = one_line_error(result, ExitCode.INVALID_INPUT)
    assert "quote_id" in line
    assert len(simulator.requests()) == before


def test_without_a_terminal_confirm_needs_yes_and_sends_nothing(simulator):
    quote = make_quote(simulator)
    env = env_for(simulator, person(simulator))
    before = len(simulator.requests())

    result = in_process("confirm", quote.quote_id, env=env)
    as_json = in_process("confirm", quote.quote_id, "--json", env=env)

    line = one_line_error(result, ExitCode.INVALID_INPUT)
    assert "--yes" in line and "nothing was sent" in line
    assert one_document(as_json)["error"]["code"] == "INVALID_PARAMETERS"
    assert len(simulator.requests()) == before
    assert read_quote(simulator, quote.quote_id).state is QuoteState.PENDING


def at_a_terminal(env: dict[str, str], args: list[str], reply: str) -> tuple[int, str]:
    """Run the CLI with a terminal for stdin and stdout; answer its question with ``reply``."""
    return converse(
        [sys.executable, "-m", "prefect_ito.cli", *args], env, [("[y/N]", reply + "\n")]
    )


@pytest.mark.slow
@pytest.mark.parametrize(("reply", "confirmed"), [("y", True), ("", False), ("no", False)])
def test_at_a_terminal_the_person_is_asked_and_no_is_the_default(simulator, reply, confirmed):
    quote = make_quote(simulator)
    env = env_for(simulator, person(simulator))

    code, output = at_a_terminal(env, ["confirm", quote.quote_id], reply)

    assert "Confirm this spend? [y/N]" in output
    stated = read_quote(simulator, quote.quote_id)
    if confirmed:
        assert code == ExitCode.SUCCESS, output
        assert stated.state is QuoteState.CONFIRMED
    else:
        # Before: exit code 11, "declined", though nothing was declined and the quote stays open.
        assert code == ExitCode.NOT_CONFIRMED, output
        assert "not confirmed" in output and f"prefect-ito confirm {quote.quote_id}" in output
        assert stated.state is QuoteState.PENDING
        assert answers_sent(simulator) == []


# --- authorizations -------------------------------------------------------------------------------


def test_authorizations_create_list_and_revoke_round_trip(simulator):
    token = person(simulator)
    env = env_for(simulator, token)
    create = [
        "authorizations", "create", "--name", "Nightly runs", "--expires-in", "30d",
        "--max-budget", "300000", "--model-size", "8B", "--booking", "bk-h200-*",
        "--total-spend", "1000000", "--max-runs", "3",
        "--data", "s3://team-bucket/corpus/*", "--data", "catalog://fineweb-edu",
    ]  # fmt: skip

    created = one_document(in_process(*create, "--json", env=env), token)["data"]
    human = in_process(*create[:3], "Weekly", "--expires-in", "1w", "--data", "*", env=env)

    made = created["authorization"]
    assert made["authorization_id"].startswith("sa_")
    assert made["principal"] == PERSON and made["state"] == "active"
    assert made["limits"]["max_budget_usd"] == 300_000
    assert made["limits"]["model_sizes"] == ["8B"]
    assert made["limits"]["booking_id_patterns"] == ["bk-h200-*"]
    assert made["limits"]["max_runs"] == 3
    assert made["limits"]["data_ref_patterns"] == [
        "s3://team-bucket/corpus/*",
        "catalog://fineweb-edu",
    ]
    assert created["block"] == (
        f'ItoSpendAuthorization(authorization_id="{made["authorization_id"]}").save("nightly-runs")'
    )
    assert human.returncode == ExitCode.SUCCESS, human.stdout + human.stderr
    assert "Traceback" not in human.stdout + human.stderr
    assert "Created standing authorization sa_" in human.stdout
    assert '.save("weekly")' in human.stdout
    assert "Data: *." in human.stdout
    keys = [r.idempotency_key for r in simulator.requests() if r.method == "POST"]
    assert len(keys) == 2 and all(keys) and keys[0] != keys[1]

    listed = one_document(in_process("authorizations", "list", "--json", env=env), token)
    table = in_process("authorizations", "list", env=env)

    ids = [a["authorization_id"] for a in listed["data"]["authorizations"]]
    assert made["authorization_id"] in ids and len(ids) == 2
    assert table.returncode == ExitCode.SUCCESS, table.stderr
    assert "s3://team-bucket/corpus/*, catalog://fineweb-edu" in table.stdout
    for shown in (made["authorization_id"], "Nightly runs", "active", PERSON, "budget ≤"):
        assert shown in table.stdout, shown
    assert "no run so far" in table.stdout

    revoked = in_process("authorizations", "revoke", made["authorization_id"], "--json", env=env)
    again = in_process("authorizations", "revoke", made["authorization_id"], env=env)

    assert one_document(revoked, token)["data"]["authorization"]["state"] == "revoked"
    assert again.returncode == ExitCode.SUCCESS, again.stderr
    assert "is revoked by user:ada" in again.stdout
    after = one_document(in_process("authorizations", "list", "--json", env=env))
    states = {a["authorization_id"]: a["state"] for a in after["data"]["authorizations"]}
    assert states[made["authorization_id"]] == "revoked"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--expires-at", "2020-01-01T00:00Z"], "expires_at"),
        (["--expires-at", "2099-01-01T00:00"], "expires_at"),  # no time zone
        (["--expires-in", "soon"], "expires_in"),
        (["--expires-in", "30d", "--max-budget", "0"], "max_budget_usd"),
        (["--expires-in", "30d", "--total-spend", "-5"], "total_spend_usd"),
        (["--expires-in", "30d", "--max-estimate", "nan"], "max_estimate_high_usd"),
        (["--expires-in", "30d", "--max-runs", "0"], "max_runs"),
        (["--expires-in", "30d", "--expires-at", "2099-01-01T00:00Z"], None),
        (["--expires-in", "30d", "--max-budget", "1000"], "data_ref_patterns"),
        (["--expires-in", "30d", "--data", ""], "data_ref_patterns.0"),
    ],
)
def test_authorizations_create_refuses_a_past_expiry_or_a_bad_amount_locally(
    simulator, options, field
):
    env = env_for(simulator, person(simulator))

    result = in_process("authorizations", "create", "--name", "x", *options, env=env)
    as_json = in_process("authorizations", "create", "--name", "x", *options, "--json", env=env)

    line = one_line_error(result, ExitCode.INVALID_INPUT)
    if field:
        assert line.startswith(f"error: {field}:"), line
        assert one_document(as_json)["error"]["field"] == field
    assert simulator.requests() == []


def test_a_workload_token_may_not_create_an_authorization(simulator):
    env = env_for(simulator, workload(simulator))

    result = in_process(
        "authorizations", "create", "--name", "x", "--expires-in", "1d", "--data", "*", env=env
    )

    line = one_line_error(result, ExitCode.FORBIDDEN)
    assert "INSUFFICIENT_SCOPE" in line
