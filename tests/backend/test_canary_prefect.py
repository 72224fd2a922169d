"""The canary, Prefect half: nothing Prefect persists for a flow using ItoCredentials holds it.

A flow loads an ItoCredentials block, calls the simulator through ``get_client()`` with httpx,
httpcore and prefect-ito logging at DEBUG into Prefect's API log handler, and writes a log line,
an artifact and events. Everything is then read back through the API (blocks with
``include_secrets=True``, logs, flow runs and their parameters, run inputs, artifacts, events)
and the server's SQLite files are scanned byte for byte.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort
from prefect.logging.handlers import APILogHandler
from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

from prefect_ito.backend.auth import ENV_API_URL, ENV_TOKEN
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.exceptions import RunNotFound

pytestmark = pytest.mark.e2e
EXTRA_LOGGERS = ("httpx", "httpcore", "prefect_ito")


@pytest.fixture
async def debug_logs_to_prefect() -> AsyncIterator[None]:
    """What PREFECT_LOGGING_EXTRA_LOGGERS=httpx,httpcore,prefect_ito does, at DEBUG."""
    handler = APILogHandler()
    handler.setLevel(logging.DEBUG)
    saved = []
    for name in EXTRA_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    try:
        # Prefect's own client calls outside the flow run are logged too; don't warn about them.
        with temporary_settings({PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}):
            yield
            await APILogHandler.aflush()
    finally:
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)


@flow(name="ito-canary")
async def talk_to_the_backend(credentials_block: str, booking_block: str) -> str:
    credentials = await ItoCredentials.aload(credentials_block)
    booking = await ItoBooking.aload(booking_block)
    async with credentials.get_client() as client:
        await client.get_capabilities()
        eligibility = await client.get_training_eligibility(booking.booking_id)
        try:
            await client.get_training_run("run-does-not-exist")
        except RunNotFound as error:
            get_run_logger().warning("expected: %s (%r)", error, error)
        me = await client.whoami()
    get_run_logger().info("talked to %s as %s", credentials, me.account)
    await acreate_markdown_artifact(f"eligible: {eligibility.eligible}", key="ito-canary")
    return me.account


def _server_db_files() -> list[Path]:
    # The session server's PREFECT_HOME is the "server" sibling of the tests' PREFECT_HOME.
    home = Path(os.environ["PREFECT_HOME"]).parent / "server"
    return [p for p in home.glob("prefect.db*") if p.is_file()]


async def _read_everything(flow_run_id: Any) -> list[str]:
    async with get_client() as client:
        blocks = await client.read_block_documents(include_secrets=True)
        # The session server holds every test's logs; one page of them may miss this run's.
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
        logs += await client.read_logs(limit=200, sort=LogSort.TIMESTAMP_DESC)
        runs = await client.read_flow_runs()
        artifacts = await client.read_artifacts()
        inputs = await client.filter_flow_run_input(flow_run_id, "", 100, set())
        events = await client._client.post("/events/filter", json={"limit": 50})
    texts = [b.model_dump_json() for b in blocks]
    texts += [log.model_dump_json() for log in logs]
    texts += [run.model_dump_json() for run in runs]
    texts += [a.model_dump_json() for a in artifacts]
    texts += [i.model_dump_json() for i in inputs]
    texts.append(events.text)
    return texts


async def test_nothing_prefect_persists_holds_the_token(
    prefect_server: str,
    sim: Any,
    debug_logs_to_prefect: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = sim.mint_token("canary-user")
    canary = token.get_secret_value()
    monkeypatch.setenv(ENV_API_URL, sim.url)
    monkeypatch.setenv(ENV_TOKEN, canary)
    await ItoCredentials(api_url=sim.url).save("ito-canary", overwrite=True)
    await ItoBooking(
        booking_id="bk-h200-2x8-ib",
        gpu_sku="H200",
        node_count=2,
        gpus_per_node=8,
        fabric="InfiniBand",
        node_ips=["10.0.0.1"],
        ssh_user="ubuntu",
    ).save("ito-canary-booking", overwrite=True)

    state = await talk_to_the_backend("ito-canary", "ito-canary-booking", return_state=True)
    assert await state.result() == "canary-user"
    await APILogHandler.aflush()

    texts = await _read_everything(state.state_details.flow_run_id)
    logged = " ".join(texts)
    assert "HTTP Request: GET" in logged, "httpx DEBUG/INFO lines did not reach Prefect"
    assert "RUN_NOT_FOUND" in logged
    assert [text[:200] for text in texts if canary in text] == []
    db_files = _server_db_files()
    assert db_files, "the server's SQLite files were not found"
    for path in db_files:
        assert canary.encode() not in path.read_bytes(), path.name
