"""Following a gate: one long-poll of ``poll_wait_seconds``, the stop check beside it.

A supervisor must hear a cancellation (or a detach) within ``state_poll_seconds``, yet an idle
run should cost one backend request per ``poll_wait_seconds``, not one per check. The checks run
beside the long-poll; they do not cut it short.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ito_fakes import Sleeps, sample_request

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.gates import Watchdog, await_stage_gate, gate_settled
from prefect_ito.contract import ALL_SCOPES, RunState, TrainingRun
from prefect_ito.simulator import SimulatorServer, builtin_scenario

COMPLETED = "bk-h200-2x8-ib"
CHECK_SECONDS = 0.2


@pytest.fixture
def still_sim() -> Iterator[Any]:
    """A simulator whose clock runs at wall speed: for a few seconds, no run changes."""
    with SimulatorServer(builtin_scenario("default").with_options(time_scale=1.0)) as server:
        yield server


@pytest.fixture
def _long_poll_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_INTEGRATIONS_ITO_POLL_WAIT_SECONDS", "30")
    monkeypatch.setenv("PREFECT_INTEGRATIONS_ITO_STATE_POLL_SECONDS", str(CHECK_SECONDS))


def _person(sim: Any) -> Any:
    """A person's token: these tests confirm their own quotes at the backend."""
    return sim.mint_token(scopes=[scope.value for scope in ALL_SCOPES], principal="user:ada")


async def _submitted(client: ItoClient) -> TrainingRun:
    request = sample_request(COMPLETED)
    quote = await client.quote_training_run(request)
    await client.confirm_quote(quote.quote_id, idempotency_key=f"confirm-{quote.quote_id}")
    confirmed = request.spending(quote.quote_id)
    return (await client.submit_training_run(confirmed, idempotency_key="k-gate")).run


async def _started(client: ItoClient) -> TrainingRun:
    """Return a submitted run once it left ``accepted``: it then stays as it is for hours."""
    run = await _submitted(client)
    while run.state is RunState.ACCEPTED:
        run = await client.get_training_run(run.run_id, after_version=run.version, wait=5)
    return run


def _count_reads(client: ItoClient, monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Record the ``wait`` of every read of a run the client starts from now on.

    Counted at the client: the simulator logs a request when it answers, and an abandoned
    long-poll is never answered.
    """
    waits: list[float | None] = []
    read = client.get_training_run

    async def counted(run_id: str, **options: Any) -> TrainingRun:
        waits.append(options.get("wait"))
        return await read(run_id, **options)

    monkeypatch.setattr(client, "get_training_run", counted)
    return waits


@pytest.mark.usefixtures("_long_poll_settings")
async def test_a_cancel_is_heard_between_checks_while_one_long_poll_waits(
    still_sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[int] = []

    async def cancelled_on_the_fourth_check() -> bool:
        checks.append(len(checks))
        return len(checks) >= 4

    async with ItoClient(still_sim.url, _person(still_sim), sleep=Sleeps()) as client:
        run = await _started(client)
        waits = _count_reads(client, monkeypatch)
        seen = await await_stage_gate(client, run, Watchdog(), cancelled_on_the_fourth_check)

    # The wait ended on the check, with the run as it was: nothing changed in between.
    assert seen.version == run.version
    assert len(checks) == 4
    # One long-poll the whole time: the checks did not cut it into one read each.
    assert len(waits) == 1
    assert waits[0] is not None and waits[0] >= 30


@pytest.mark.usefixtures("_long_poll_settings")
async def test_a_change_ends_the_long_poll_with_no_check_waiting(sim: Any) -> None:
    checks: list[int] = []

    async def never() -> bool:
        checks.append(len(checks))
        return False

    async with ItoClient(sim.url, _person(sim), sleep=Sleeps()) as client:
        run = await _submitted(client)
        seen = await await_stage_gate(client, run, Watchdog(), never)

    # The default scenario's clock is fast: the gate settles within a few long-poll answers.
    assert seen.version > run.version
    assert gate_settled(seen, run.current_stage)
