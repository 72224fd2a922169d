"""The token never follows a backend URL that a Prefect user wrote: flow parameters and deferral
records, against a real Prefect server, the simulator and a capture server on loopback.

A colleague with Prefect API access (and no Itô token) names their own server in a flow run's
``credentials`` parameter or in a forged deferral record; the worker or the watcher has the real
token in its own environment. Their server must receive nothing at all.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest
from capture_server import CaptureServer
from flow_helpers import BOOKING, REQUEST, Person, parameters, sweep_watcher, training_deployment
from prefect import get_client
from prefect.states import Running, Suspended
from rich.console import Console

from prefect_ito.backend.origins import ENV_ALLOWED_ORIGINS
from prefect_ito.cli.terminal import run_training
from prefect_ito.flows import ito_training
from prefect_ito.waiting.deferral import Deferral
from prefect_ito.waiting.keys import DEFER_PREFIX
from prefect_ito.waiting.watcher import Watcher


@pytest.mark.parametrize("allowed", [False, True], ids=["not-allowed", "allowed-but-not-its-token"])
async def test_a_credentials_parameter_naming_their_server_sends_it_nothing(
    worker_environment, monkeypatch, allowed
):
    with CaptureServer() as theirs:
        if allowed:
            monkeypatch.setenv(ENV_ALLOWED_ORIGINS, theirs.url)
        params = parameters(worker_environment, credentials={"api_url": theirs.url})
        state = await run_training(ito_training, params, Person(True), Console(quiet=True))
    assert theirs.received == []
    assert worker_environment.requests() == []  # nothing reached the real backend either
    if allowed:
        assert state.name == "Unauthenticated", state.message
        assert f"belongs to {worker_environment.url} only" in (state.message or "")
    else:
        assert state.name == "OriginNotAllowed", state.message
        assert f"add {theirs.url} to ITO_COMPUTE_ALLOWED_ORIGINS" in (state.message or "")


async def _forged_deferral(api_url: str, keyring_entry: str | None = None):
    """A flow run suspended under a defer- key, beside a record a Prefect user wrote."""
    deployment = await training_deployment("origin-tests")
    key = f"{DEFER_PREFIX}1-forged{time.monotonic_ns()}"
    record = Deferral(
        api_url=api_url, keyring_entry=keyring_entry, run_id="run_forged", version=1,
        stage="pretrain", events_seen=0, heartbeat_at=datetime.now(UTC),
        heartbeat_seen_at=time.time(), stall_timeout=None, deadline_at=None,
    )  # fmt: skip
    async with get_client() as client:
        training = {**REQUEST, "booking": BOOKING}
        flow_run = await client.create_flow_run_from_deployment(
            deployment, parameters={"training": training}
        )
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        await client.create_flow_run_input(flow_run.id, key, record.model_dump_json())
        await client.set_flow_run_state(flow_run.id, Suspended(pause_key=key), force=True)
    return flow_run


async def test_the_watcher_follows_no_record_to_their_server(worker_environment, caplog):
    with CaptureServer() as theirs:
        forged = await _forged_deferral(theirs.url)
        # The keyring route: their server, with the real backend's keyring entry named.
        by_entry = await _forged_deferral(theirs.url, keyring_entry=worker_environment.url)
        watcher = await sweep_watcher(caplog)
    assert theirs.received == []
    # Only theirs: runs other tests left suspended on this server name other backends.
    said = f"Not watching runs recorded for {theirs.url}"
    refusals = [r for r in caplog.records if said in r.getMessage()]
    assert len(refusals) == 2, [r.getMessage() for r in refusals]  # each said once, not a sweep
    assert any("ITO_COMPUTE_ALLOWED_ORIGINS" in r.getMessage() for r in refusals)
    assert any("another backend" in r.getMessage() for r in refusals)
    assert forged.id not in watcher.resumed and by_entry.id not in watcher.resumed
    async with get_client() as client:
        for flow_run in (forged, by_entry):
            await client.delete_flow_run(flow_run.id)


async def test_a_record_that_is_no_deferral_costs_the_sweep_nothing(worker_environment, caplog):
    flow_run = await _forged_deferral(worker_environment.url)
    async with get_client() as client:
        state = (await client.read_flow_run(flow_run.id)).state
        key = state.state_details.pause_key
        await client.delete_flow_run_input(flow_run.id, key)
        await client.create_flow_run_input(flow_run.id, key, '{"not": "a record"}')
    watcher = Watcher(wait=0.5, lost_after=None)
    try:
        with caplog.at_level(logging.WARNING, logger="prefect_ito.waiting.watcher"):
            await watcher.sweep()
            await watcher.sweep()
    finally:
        await watcher.close()
    said = [r.getMessage() for r in caplog.records if "is not a deferral" in r.getMessage()]
    assert len(said) == 1
    assert not [r for r in caplog.records if "A sweep failed" in r.getMessage()]
    async with get_client() as client:
        await client.delete_flow_run(flow_run.id)
