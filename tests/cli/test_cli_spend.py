"""``prefect-ito quote`` and ``train --confirm``: scriptable, never blind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_helpers import CONFIRMED, TRAIN, TRAIN_CONFIRMED, prefect_ito, worker_env

from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario

QUOTE = ["quote", *TRAIN_CONFIRMED[1:-2]]  # the options of TRAIN, without --confirm
UNCONFIRMED = TRAIN_CONFIRMED[:-2]


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(builtin_scenario("default")) as server:
        yield server


def test_quote_prints_the_plan_the_estimate_and_the_command_that_confirms_it(
    simulator, prefect_server
):
    result = prefect_ito(*QUOTE, env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.SUCCESS, result.stdout + result.stderr
    for shown in ("GPU hours", "cost", "duration", "$250,000.00", "The booking's term ends"):
        assert shown in result.stdout, shown
    assert f"Manifest digest: {CONFIRMED}" in result.stdout
    command = " ".join(["prefect-ito train", *QUOTE[1:], "--confirm", CONFIRMED])
    assert command in result.stdout.replace("\n", " ") or command in result.stdout
    # Read-only: the booking, the capability, then a quote; nothing submitted.
    requests = [(r.method, r.path) for r in simulator.requests()]
    assert ("GET", "/v0/bookings/bk-h200-2x8-ib/training-eligibility") in requests
    assert ("GET", "/v0/capabilities") in requests
    assert [r for r in requests if r[0] != "GET"] == [("POST", "/v0/training-quotes")]
    assert requests[-1] == ("POST", "/v0/training-quotes")
    assert simulator.runs() == []


def test_train_with_the_quoted_digest_runs_confirmed_by_the_name_given(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)

    result = prefect_ito(*TRAIN_CONFIRMED, "--name", "Grace", env=env)

    assert result.returncode == ExitCode.SUCCESS, result.stdout + result.stderr
    (admin,) = simulator.runs()
    assert admin.run.manifest_digest == CONFIRMED
    assert admin.run.confirmation is not None
    assert (admin.run.confirmation.confirmed_by, admin.run.confirmation.via) == ("Grace", "person")


def test_train_confirming_another_manifest_is_refused_before_anything_is_sent(
    simulator, prefect_server
):
    env = worker_env(simulator, prefect_server)
    args = [*UNCONFIRMED[:-1], "250001", "--confirm", CONFIRMED]  # another budget

    result = prefect_ito(*args, env=env)

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stdout + result.stderr
    assert CONFIRMED in result.stderr and "is not the manifest these options make" in result.stderr
    assert "Traceback" not in result.stderr
    assert simulator.requests() == []


def test_train_without_a_terminal_confirm_or_authorization_stops_first(simulator, prefect_server):
    result = prefect_ito(*UNCONFIRMED, env=worker_env(simulator, prefect_server))

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stdout + result.stderr
    assert "prefect-ito quote" in result.stderr and "--confirm" in result.stderr
    assert simulator.requests() == []


def test_train_with_an_authorization_that_cannot_cover_it_stops_first(simulator, prefect_server):
    env = worker_env(simulator, prefect_server)
    args = [*TRAIN[:-1], "2e9"]  # above the tests' authorization's maximum

    result = prefect_ito(*args, env=env)

    assert result.returncode == ExitCode.NOT_CONFIRMED, result.stdout + result.stderr
    assert "does not cover this request" in result.stderr and "per run" in result.stderr
    assert simulator.requests() == []
