"""``prefect-ito inbox`` lists only questions the backend still holds open.

In this process against the session's real Prefect server and the simulator, which the inbox
asks with the person's own token.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import httpx
from capture_server import CaptureServer
from cli_helpers import in_process, one_document
from prefect import flow, get_client
from prefect.states import Paused, Running
from simulator_fixture import FAST
from test_terminal_prompt import _spiked_run, person_token

from prefect_ito.backend.origins import ENV_API_URL, ENV_TOKEN
from prefect_ito.contract import ALL_SCOPES, ActionKind, TrainingRequest
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.keys import action_pause_key, spend_pause_key
from prefect_ito.waiting.waits import ActionWait, QuoteWait, WaitRecord, record_wait

REQUEST = TrainingRequest(
    booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://x"],
    target="chat", budget_usd=250_000,
)  # fmt: skip


@flow
def left_waiting() -> None:
    """Never run: its flow runs stand for training flow runs paused on a question."""


async def paused_on(pause_key: str, record: WaitRecord) -> str:
    """Return a flow run paused under ``pause_key`` whose record names what it asked about."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(left_waiting)
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        await client.set_flow_run_state(flow_run.id, Paused(pause_key=pause_key), force=True)
    await record_wait(flow_run.id, record)
    return str(flow_run.id)


def listed(env: dict[str, str]) -> list[str]:
    entries = one_document(in_process("inbox", "--json", env=env))["data"]
    return [entry["flow_run_id"] for entry in entries]


def env_of(simulator: SimulatorServer, prefect_server: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")}
    return {**env, "PREFECT_API_URL": prefect_server, ENV_API_URL: simulator.url, ENV_TOKEN: token}


def quote(simulator: SimulatorServer, token: str) -> QuoteWait:
    made: dict[str, Any] = httpx.post(
        f"{simulator.url}/v0/training-quotes",
        json=REQUEST.to_submission().model_dump(mode="json"),
        headers={"Authorization": f"Bearer {token}"},
    ).json()["data"]
    return QuoteWait(
        api_url=simulator.url,
        quote_id=made["quote_id"],
        manifest_digest=made["manifest_digest"],
        expires_at=made["expires_at"],
    )


def wait_until_expired(simulator: SimulatorServer, token: str, record: QuoteWait) -> None:
    for _ in range(600):  # a bound on a hang, not a timed assertion
        stated = httpx.get(
            f"{simulator.url}/v0/training-quotes/{record.quote_id}",
            headers={"Authorization": f"Bearer {token}"},
        ).json()["data"]
        if stated["state"] == "expired":
            return
        time.sleep(0.1)
    raise AssertionError("the quote never expired")


async def test_a_spend_whose_quote_expired_is_not_listed(prefect_server):
    # Before: a `train` that died at the spend prompt stayed in the inbox for a day, with a
    # `confirm` command for a quote the backend had let expire after 15 minutes.
    scenario = builtin_scenario("default").model_copy(update={"quote_ttl_seconds": 1.0})
    with SimulatorServer(scenario) as simulator:
        token = grace(simulator)
        expired = quote(simulator, token)
        wait_until_expired(simulator, token, expired)
        stale = await paused_on(spend_pause_key(expired.manifest_digest), expired)
        shown_stale = listed(env_of(simulator, prefect_server, token))
    with SimulatorServer() as simulator:  # quotes that stand for the test's whole length
        token = grace(simulator)
        pending = quote(simulator, token)
        open_ = await paused_on(spend_pause_key(pending.manifest_digest), pending)
        shown_open = listed(env_of(simulator, prefect_server, token))

    assert stale not in shown_stale
    assert open_ in shown_open


def grace(simulator: SimulatorServer) -> str:
    scopes = [scope.value for scope in ALL_SCOPES]
    return simulator.mint_token(scopes=scopes, principal="user:grace").get_secret_value()


async def test_a_decision_the_backend_no_longer_waits_for_is_not_listed(prefect_server):
    # Before: a second flow run's question on the same action stayed listed after the real
    # answer, and answering it printed "Sent" for a decision already made.
    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        token = person_token(simulator, "cli", "user:grace")
        run = _spiked_run(simulator)
        action_id = run["pending_action"]["action_id"]
        record = ActionWait(api_url=simulator.url, run_id=run["run_id"], action_id=action_id)
        key = action_pause_key(ActionKind.LOSS_SPIKE_RESTART, action_id)
        waiting = await paused_on(key, record)
        env = env_of(simulator, prefect_server, token)

        before = listed(env)
        httpx.post(
            f"{simulator.url}/v0/training-runs/{run['run_id']}/actions/{action_id}/decision",
            json={"decision": "approve", "reason": "decided elsewhere"},
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())},
        ).raise_for_status()
        after = listed(env)

    assert waiting in before
    assert waiting not in after


async def test_a_record_naming_another_backend_gets_no_token_and_its_question_is_still_shown(
    prefect_server,
):
    # A colleague with Prefect API access writes the record beside a paused flow run, naming a
    # server of theirs (or another keyring entry): the inbox asks only the backend of its own
    # token, so the token goes nowhere else, and a question it cannot ask about is shown.
    with SimulatorServer() as simulator, CaptureServer() as capture:
        token = grace(simulator)
        honest = quote(simulator, token)
        forged = honest.model_copy(update={"api_url": capture.url, "keyring_entry": "someone"})
        flow_run = await paused_on(spend_pause_key(forged.manifest_digest), forged)
        shown = listed(env_of(simulator, prefect_server, token))

    assert capture.received == []  # no request at all, so no token
    assert flow_run in shown
