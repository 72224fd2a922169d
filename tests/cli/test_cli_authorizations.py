"""`prefect-ito authorizations list` and `revoke`: read at 80 columns, revoked by name or id.

Every command runs in this process (:func:`cli_helpers.in_process`) against a simulator on a real
loopback port, with no terminal, and with ``PREFECT_API_URL`` pointing where nothing listens: none
of them asks Prefect.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from cli_helpers import in_process, one_document
from spend_cli import REQUEST, client, env_for, one_line_error, person

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer


def create(env: dict[str, str], name: str, *limits: str) -> str:
    """Create a standing authorization through the CLI and return its id."""
    made = in_process(
        "authorizations", "create", "--name", name, "--expires-in", "30d", *limits, "--json",
        env=env,
    )  # fmt: skip
    return str(one_document(made)["data"]["authorization"]["authorization_id"])


def states(env: dict[str, str]) -> dict[str, str]:
    listed = one_document(in_process("authorizations", "list", "--json", env=env))
    return {a["authorization_id"]: a["state"] for a in listed["data"]["authorizations"]}


def run_under(simulator: SimulatorServer, authorization_id: str) -> None:
    """Have the backend create one run of :data:`REQUEST` under the authorization."""

    async def submit() -> None:
        async with client(simulator) as desk:
            quote = await desk.quote_training_run(REQUEST.to_submission())
            submission = REQUEST.to_submission().spending(quote.quote_id, authorization_id)
            await desk.submit_training_run(submission, idempotency_key=f"k-{uuid.uuid4()}")

    asyncio.run(submit())


# --- list -----------------------------------------------------------------------------------------


def test_the_list_reads_at_80_columns_and_names_budgets_as_budgets(simulator):
    # Before: eight table columns at 80 columns cut every name, state and expiry ("nigh…",
    # "acti…") and stacked the limits one word a line; "used: 1 runs, $250,000.00" was the
    # budgets of the covered runs, shown as if it were what they spent.
    env = env_for(simulator, person(simulator), columns=80)
    nightly = create(
        env, "nightly", "--max-budget", "300000", "--max-estimate", "200000",
        "--model-size", "8B", "--target", "code-assistant", "--booking", "bk-h200-*",
        "--total-spend", "1000000", "--max-runs", "20", "--data", "catalog://ito/*",
    )  # fmt: skip
    run_under(simulator, nightly)

    listed = in_process("authorizations", "list", env=env)

    assert listed.returncode == ExitCode.SUCCESS, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), listed.stdout
    heading = next(line for line in lines if line.startswith(nightly))
    assert "'nightly'" in heading and "active, expires " in heading and "UTC" in heading
    text = " ".join(" ".join(lines).split())  # read across the wrapping of the long lines
    assert "created by user:ada" in text
    assert "data catalog://ito/*" in text
    assert (
        "limits budget ≤ $300,000.00; estimate ≤ $200,000.00; model sizes 8B; targets "
        "code-assistant; bookings bk-h200-*; budgets ≤ $1,000,000.00 in all; at most 20 runs"
    ) in text
    assert "covered 1 run so far, whose budgets add up to $250,000.00" in text
    assert "…" not in listed.stdout and "total spend" not in text


def test_an_unused_authorization_says_it_covered_no_run(simulator):
    env = env_for(simulator, person(simulator), columns=80)
    create(env, "Weekly eval", "--data", "*")

    listed = in_process("authorizations", "list", env=env)

    assert "'Weekly eval'" in listed.stdout
    assert "covered     no run so far" in listed.stdout


# --- revoke ---------------------------------------------------------------------------------------


def test_revoke_takes_the_name_of_one_authorization(simulator):
    # Before: `authorizations revoke nightly` answered "no such spend authorization".
    env = env_for(simulator, person(simulator))
    nightly = create(env, "nightly", "--data", "*")
    other = create(env, "weekly", "--data", "*")

    revoked = in_process("authorizations", "revoke", "nightly", env=env)
    as_json = one_document(in_process("authorizations", "revoke", "nightly", "--json", env=env))

    assert revoked.returncode == ExitCode.SUCCESS, revoked.stderr
    assert f"Standing authorization {nightly} ('nightly') is revoked by user:ada" in revoked.stdout
    assert as_json["data"]["authorization"]["authorization_id"] == nightly
    assert states(env) == {nightly: "revoked", other: "active"}


def test_a_name_with_spaces_is_a_name_too(simulator):
    env = env_for(simulator, person(simulator))
    made = create(env, "Nightly runs", "--data", "*")

    revoked = in_process("authorizations", "revoke", "Nightly runs", env=env)

    assert revoked.returncode == ExitCode.SUCCESS, revoked.stderr
    assert states(env) == {made: "revoked"}


def test_an_id_is_taken_before_a_name(simulator):
    env = env_for(simulator, person(simulator))
    first = create(env, "first", "--data", "*")
    create(env, first, "--data", "*")  # named like the first one's id

    revoked = in_process("authorizations", "revoke", first, env=env)

    assert revoked.returncode == ExitCode.SUCCESS, revoked.stderr
    assert states(env)[first] == "revoked"
    deletes = [r.path for r in simulator.requests() if r.method == "DELETE"]
    assert deletes == [f"/v0/spend-authorizations/{first}"]  # one request, as before


def test_a_name_two_authorizations_share_is_refused_naming_both_ids(simulator):
    env = env_for(simulator, person(simulator))
    older = create(env, "nightly", "--data", "*")
    newer = create(env, "nightly", "--data", "catalog://ito/*")

    result = in_process("authorizations", "revoke", "nightly", env=env)
    document: dict[str, Any] = one_document(
        in_process("authorizations", "revoke", "nightly", "--json", env=env)
    )

    line = one_line_error(result, ExitCode.INVALID_INPUT)
    assert line == (
        f"error: authorization: 2 standing authorizations are named 'nightly': {newer} (active), "
        f"{older} (active); revoke one by its id; nothing was revoked"
    )
    assert document["error"]["code"] == "INVALID_PARAMETERS"
    assert document["error"]["field"] == "authorization"
    assert states(env) == {older: "active", newer: "active"}


@pytest.mark.parametrize("wanted", ["nope", "sa_0123456789abcdef", "bad/name", "nightly runs"])
def test_neither_an_id_nor_a_name_of_the_account_is_not_found(simulator, wanted):
    env = env_for(simulator, person(simulator))
    made = create(env, "Nightly runs", "--data", "*")  # names match exactly, case included

    result = in_process("authorizations", "revoke", wanted, env=env)

    line = one_line_error(result, ExitCode.NOT_FOUND)
    assert "SPEND_AUTHORIZATION_NOT_FOUND" in line
    assert f"no standing authorization of this account has the id or name {wanted!r}" in line
    assert "prefect-ito authorizations list" in line
    assert states(env) == {made: "active"}


@pytest.mark.parametrize("wanted", ["", "   "])
def test_an_empty_authorization_is_refused_before_any_request(simulator, wanted):
    env = env_for(simulator, person(simulator))

    result = in_process("authorizations", "revoke", wanted, env=env)

    line = one_line_error(result, ExitCode.INVALID_INPUT)
    assert line == "error: authorization: give its id (sa_…) or its name"
    assert simulator.requests() == []
