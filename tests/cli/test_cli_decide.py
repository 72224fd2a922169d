"""``prefect-ito decide`` says truthfully whether its answer was the one Prefect took."""

from __future__ import annotations

import os
from typing import Any

from cli_helpers import one_document, prefect_ito
from prefect import flow, get_client
from prefect.input.run_input import keyset_from_paused_state
from prefect.states import Paused, Running

from prefect_ito.exceptions import ExitCode
from prefect_ito.people.approval import RestartDecision

GRACE = {"decision": "approve", "decided_by": "Grace", "reason": "a data blip"}
DECIDE = ["--reject", "--reason", "the loss keeps rising", "--name", "Ada"]


@flow
def waits_for_a_restart_decision() -> None:
    """Never run: its flow run's records stand for one paused on a restart question."""


async def answered_while_ada_looked() -> str:
    """Return a flow run whose restart question Grace answered after Ada saw it still paused.

    Two answers sent at once each find the run paused; Prefect takes one. The run is put back
    as Ada's ``decide`` read it — paused, Grace's answer already stored — so her resume is the
    one that comes second, every time.
    """
    async with get_client() as client:
        flow_run = await client.create_flow_run(waits_for_a_restart_decision)
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        paused = paused_on_a_restart()
        await client.set_flow_run_state(flow_run.id, paused)  # Prefect counts the key fired
        await RestartDecision.asave(keyset_from_paused_state(paused), flow_run_id=flow_run.id)
        taken = await client.resume_flow_run(flow_run.id, run_input=GRACE)
        assert taken.status.value == "ACCEPT", taken.details
        await client.set_flow_run_state(flow_run.id, paused_on_a_restart(), force=True)
    return str(flow_run.id)


def paused_on_a_restart() -> Any:
    paused = Paused(timeout_seconds=600, pause_key="restart-act-1")
    paused.state_details.run_input_keyset = keyset_from_paused_state(paused)
    return paused


async def test_an_answer_that_came_second_is_told_whose_was_taken(prefect_server):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    flow_run_id = await answered_while_ada_looked()

    result = prefect_ito("decide", flow_run_id, *DECIDE, env=env)

    assert result.returncode == ExitCode.ANSWERED_BY_ANOTHER, result.stdout + result.stderr
    # Before: a traceback of Prefect's 409 here, or "Sent: reject by Ada." where Prefect's server
    # had turned the second resume away without an error (the run no longer paused).
    assert "Sent" not in result.stdout
    assert result.stderr.strip() == "error: another answer was taken first: approve by Grace"

    result = prefect_ito("decide", flow_run_id, *DECIDE, "--json", env=env)

    document = one_document(result)
    assert document["ok"] is False
    assert document["error"] == {
        "code": "ANSWERED_BY_ANOTHER",
        "message": "another answer was taken first: approve by Grace",
        "exit_code": ExitCode.ANSWERED_BY_ANOTHER,
    }
