"""``prefect-ito quote`` and ``train --confirm QUOTE_ID``: scriptable, never blind, used once."""

from __future__ import annotations

import httpx
from cli_helpers import (
    TRAIN,
    UNCONFIRMED,
    confirming_env,
    in_process,
    one_document,
    quote_for_train,
    worker_env,
)

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer

QUOTE = ["quote", *UNCONFIRMED[1:]]


def posts(simulator: SimulatorServer, path: str = "/v0/training-runs") -> list[object]:
    return [r for r in simulator.requests() if r.method == "POST" and r.path == path]


def test_a_booking_the_backend_does_not_know_is_named_and_where_its_bookings_are(simulator):
    # Before: "error: [BOOKING_NOT_FOUND request …] no such booking": which booking, and which
    # ones there are, the person had to find out alone.
    unknown = [*QUOTE[:2], "bk-123", *QUOTE[3:]]
    assert QUOTE[1] == "--booking"
    env = worker_env(simulator, "")

    result = in_process(*unknown, env=env)
    document = one_document(in_process(*unknown, "--json", env=env))

    assert result.returncode == ExitCode.BOOKING, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: [BOOKING_NOT_FOUND request req_"), line
    assert f"booking 'bk-123' was not found at {simulator.url}: give the id of one" in line
    assert "this simulator lists its bookings at /_sim/bookings" in line
    listed = httpx.get(f"{simulator.url}/_sim/bookings", timeout=10).json()["data"]
    assert "bk-h200-2x8-ib" in [booking["booking_id"] for booking in listed]
    assert document["error"]["code"] == "BOOKING_NOT_FOUND"
    assert document["error"]["exit_code"] == ExitCode.BOOKING
    assert "'bk-123'" in document["error"]["message"]


def test_quote_prints_the_plan_the_estimate_and_the_command_that_confirms_it(
    simulator, prefect_server
):
    result = in_process(*QUOTE, env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.SUCCESS, result.stdout + result.stderr
    for shown in ("GPU hours", "cost", "duration", "$250,000.00", "The booking's term ends"):
        assert shown in result.stdout, shown
    (quote,) = [entry for entry in posts(simulator, "/v0/training-quotes")]
    assert quote is not None
    command = " ".join(["prefect-ito train", *QUOTE[1:], "--confirm", "quote_"])
    assert command in result.stdout.replace("\n", " ")
    # A quote and nothing else: nothing submitted, nothing confirmed.
    requests = [(r.method, r.path) for r in simulator.requests()]
    assert ("GET", "/v0/bookings/bk-h200-2x8-ib/training-eligibility") in requests
    assert [r for r in requests if r[0] != "GET"] == [("POST", "/v0/training-quotes")]
    assert simulator.runs() == []


def test_train_confirming_a_quote_runs_once_recorded_as_the_person(simulator, prefect_server):
    env = confirming_env(simulator, prefect_server)
    quote_id = quote_for_train(simulator)

    result = in_process(*UNCONFIRMED, "--confirm", quote_id, "--name", "Grace", env=env)

    assert result.returncode == ExitCode.SUCCESS, result.stdout + result.stderr
    assert f"Confirmed quote {quote_id} at the backend as user:ada" in result.stdout
    (admin,) = simulator.runs()
    record = admin.run.confirmation
    assert record is not None
    assert (record.confirmed_by, record.via, record.note) == ("user:ada", "person", "Grace")
    assert record.carried_from == quote_id  # the flow's own quote carried the confirmation


def test_the_same_confirm_again_follows_the_run_that_quote_made_and_spends_nothing(
    simulator, prefect_server
):
    # Before (v0.3), `--confirm sha256:…` was reusable forever: the same command twice made
    # two runs, both "confirmed by Alice". Then (v0.4) the same command again, as after a
    # `train` killed once it had submitted, stopped on the used quote and followed nothing.
    env = confirming_env(simulator, prefect_server)
    quote_id = quote_for_train(simulator)
    first = in_process(*UNCONFIRMED, "--confirm", quote_id, env=env)
    assert first.returncode == ExitCode.SUCCESS, first.stdout + first.stderr

    again = in_process(*UNCONFIRMED, "--confirm", quote_id, env=env)

    assert again.returncode == ExitCode.SUCCESS, again.stdout + again.stderr
    (admin,) = simulator.runs()
    assert f"already made backend run {admin.run.run_id}" in again.stdout
    assert "Traceback" not in again.stderr
    assert len(posts(simulator)) == 1
    confirmations = posts(simulator, f"/v0/training-quotes/{quote_id}/confirmations")
    assert len(confirmations) == 1


def test_train_confirming_a_quote_of_another_request_is_refused_before_any_spend(
    simulator, prefect_server
):
    env = confirming_env(simulator, prefect_server)
    quote_id = quote_for_train(simulator)
    args = [*UNCONFIRMED[:-1], "250001", "--confirm", quote_id]  # another budget

    result = in_process(*args, env=env)

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stdout + result.stderr
    assert "is a quote of another request" in result.stderr and "budget_usd" in result.stderr
    assert "Traceback" not in result.stderr
    assert posts(simulator, f"/v0/training-quotes/{quote_id}/confirmations") == []
    assert simulator.runs() == []


def test_a_workload_token_cannot_confirm_with_train(simulator, prefect_server):
    quote_id = quote_for_train(simulator)

    result = in_process(
        *UNCONFIRMED, "--confirm", quote_id, env=worker_env(simulator, prefect_server)
    )

    assert result.returncode == ExitCode.FORBIDDEN, result.stdout + result.stderr
    assert "spend:confirm" in result.stderr and "Traceback" not in result.stderr
    assert simulator.runs() == []


def test_train_without_a_terminal_confirm_or_authorization_stops_first(simulator, prefect_server):
    result = in_process(*UNCONFIRMED, env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stdout + result.stderr
    assert "prefect-ito quote" in result.stderr and "--confirm QUOTE_ID" in result.stderr
    assert simulator.requests() == []


def test_train_with_an_authorization_the_backend_refuses_declines_and_spends_nothing(
    simulator, prefect_server
):
    env = worker_env(simulator, prefect_server)
    args = [*TRAIN[:-1], "2e9"]  # above the tests' authorization's maximum

    result = in_process(*args, env=env)

    assert result.returncode == ExitCode.DECLINED, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "does not cover" in output and "--confirm QUOTE_ID" in output
    assert "Traceback" not in output
    assert simulator.runs() == []
