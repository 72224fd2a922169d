"""Client references through the client and desk, against the simulator over loopback TCP."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from ito_fakes import Sleeps

from prefect_ito import exceptions as exc
from prefect_ito.backend import desk, ownership
from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import ALL_SCOPES, TrainingRequest
from prefect_ito.simulator import SimulatorServer, builtin_scenario

BOOKING = "bk-h200-2x8-ib"
REFERENCE = "0b1d6d2e-6f5c-4a8e-9a7e-3c2b1a0f9e8d"
REQUEST = TrainingRequest(
    booking_id=BOOKING,
    model_size="150M",
    data_refs=["catalog://fineweb-edu"],
    target="code-assist",
    budget_usd=250_000.0,
)


@pytest.fixture
def start_sim():
    started: list[SimulatorServer] = []

    def start(**changes: Any) -> SimulatorServer:
        scenario = builtin_scenario("default").model_copy(update=changes)
        server = SimulatorServer(scenario.with_options(time_scale=4_000_000.0))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _client(sim: SimulatorServer) -> ItoClient:
    # A person's token: these tests confirm their own quotes at the backend.
    token = sim.mint_token(scopes=[scope.value for scope in ALL_SCOPES], principal="user:ada")
    return ItoClient(sim.url, token, sleep=Sleeps())


async def _confirmation(client: ItoClient, request: TrainingRequest) -> str:
    """Return the id of a fresh quote for ``request``, confirmed by a person at the backend."""
    quote = await desk.quote_training_run(client, request)
    await client.confirm_quote(quote.quote_id, idempotency_key=f"confirm-{quote.quote_id}")
    return quote.quote_id


async def _finished(client: ItoClient, run_id: str) -> None:
    run = await client.get_training_run(run_id)
    while not run.finished:
        run = await client.get_training_run(run_id, after_version=run.version, wait=1)


async def test_the_run_is_found_by_reference_after_its_key_expired(start_sim) -> None:
    sim = start_sim(idempotency_key_retention_seconds=0.3)
    async with _client(sim) as client:
        confirmation = await _confirmation(client, REQUEST)
        run = await desk.submit_training_run(client, REQUEST, confirmation, None, "k-1", REFERENCE)
        await _finished(client, run.run_id)
        await asyncio.sleep(0.4)
        by_key = await ownership.find_attachable_run(client, REQUEST, "k-1")
        by_reference = await ownership.find_attachable_run(client, REQUEST, "k-1", REFERENCE)
        another = await ownership.find_attachable_run(client, REQUEST, "k-1", "another-flow-run")

    assert run.client_reference == REFERENCE
    assert by_key is None  # what re-entry found before: it then quoted and submitted again
    assert by_reference is not None and by_reference.run_id == run.run_id
    assert by_reference.finished
    assert another is None


async def test_a_reference_that_made_another_request_stops_before_any_quote(start_sim) -> None:
    sim = start_sim()
    other = REQUEST.model_copy(update={"target": "chat"})
    async with _client(sim) as client:
        run = await desk.submit_training_run(
            client, REQUEST, await _confirmation(client, REQUEST), None, "k-1", REFERENCE
        )
        await _finished(client, run.run_id)
        with pytest.raises(exc.ClientReferenceInUse, match=run.run_id) as caught:
            await ownership.find_attachable_run(client, other, "k-2", REFERENCE)

    assert caught.value.state_name == "ClientReferenceInUse"
    assert [r.path for r in sim.requests() if r.path == "/v0/training-quotes"] == [
        "/v0/training-quotes"
    ]


async def test_a_refused_second_submission_returns_the_run_the_reference_made(start_sim) -> None:
    # Two processes of one flow run: the second submits after the first did, under another key.
    sim = start_sim()
    async with _client(sim) as client:
        first = await desk.submit_training_run(
            client, REQUEST, await _confirmation(client, REQUEST), None, "k-1", REFERENCE
        )
        await _finished(client, first.run_id)
        second = await desk.submit_training_run(
            client, REQUEST, await _confirmation(client, REQUEST), None, "k-2", REFERENCE
        )

    assert second.run_id == first.run_id
    assert len(sim.runs()) == 1
    statuses = [
        r.status for r in sim.requests() if r.path == "/v0/training-runs" and r.method == "POST"
    ]
    assert statuses == [201, 409]


async def test_a_backend_without_references_is_neither_sent_nor_asked_one(
    start_sim, caplog: pytest.LogCaptureFixture
) -> None:
    sim = start_sim(client_reference=False)
    logger = logging.getLogger("test.reference")
    async with _client(sim) as client:
        run = await desk.submit_training_run(
            client, REQUEST, await _confirmation(client, REQUEST), None, "k-1", REFERENCE
        )
        await _finished(client, run.run_id)
        with caplog.at_level(logging.INFO, logger="test.reference"):
            found = await ownership.find_attachable_run(client, REQUEST, "k-1", REFERENCE, logger)
        # Asked anyway, such a backend ignores the filter: the client keeps only referenced runs.
        listed = await client.find_runs_by_client_reference(REFERENCE)

    assert run.client_reference is None
    assert found is not None and found.run_id == run.run_id  # by its key, as before
    assert "does not advertise client references" in caplog.text
    assert listed == []
    lists = [r for r in sim.requests() if r.method == "GET" and r.path == "/v0/training-runs"]
    assert len(lists) == 2  # the key, which found it; then the filter asked here
