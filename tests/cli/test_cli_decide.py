"""``prefect-ito decide`` decides at the backend as the person whose token it sends (contract
v0.5): a workload's token decides nothing, a decoy flow run names nobody else's run, and the
record is the person's principal. Against a real Prefect server and the simulator: ``train`` in a
child, ``decide`` in this process.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cli_helpers import confirming_env, in_process, read_flow_run_id, start_train, worker_env
from prefect import get_client
from prefect.states import Paused
from prefect.utilities.asyncutils import run_coro_as_sync
from simulator_fixture import FAST

from prefect_ito.contract import WORKLOAD_SCOPES
from prefect_ito.exceptions import ExitCode
from prefect_ito.flows import ito_training
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.keys import BACKEND_RUN_KEY, RESTART_PREFIX
from prefect_ito.waiting.waits import ActionWait, record_wait

REASON = ["--reason", "the loss keeps rising"]


def _workload_env(simulator: SimulatorServer, prefect_server: str) -> dict[str, str]:
    """A deployment's environment: a workload's token, which may submit but never decide."""
    token = simulator.mint_token(
        "cli", principal="service:nightly", scopes=[scope.value for scope in WORKLOAD_SCOPES]
    ).get_secret_value()
    return {**worker_env(simulator, prefect_server), "ITO_COMPUTE_TOKEN": token}


def _paused_on_restart(flow_run_id: str, timeout: float = 120) -> None:
    async def wait() -> None:
        async with get_client() as client:
            give_up = time.monotonic() + timeout
            while time.monotonic() < give_up:
                state = (await client.read_flow_run(flow_run_id)).state
                key = state.state_details.pause_key if state else None
                if state is not None and state.is_paused() and (key or "").startswith("restart"):
                    return
                time.sleep(0.5)
        raise AssertionError(f"flow run {flow_run_id} never paused for a restart")

    run_coro_as_sync(wait())


def _decoy(simulator: SimulatorServer, victim_run: str, action_id: str) -> str:
    """A flow run an attacker with only Prefect API access made: paused on a restart, its
    records naming a colleague's run and action."""

    async def make() -> str:
        async with get_client() as client:
            flow_run = await client.create_flow_run(
                ito_training, parameters=dict(training=dict(booking="bk-h200-2x8-ib"))
            )
            record = ActionWait(api_url=simulator.url, run_id=victim_run, action_id=action_id)
            await record_wait(flow_run.id, record)
            await client.create_flow_run_input(
                flow_run.id, BACKEND_RUN_KEY, json.dumps({"run_id": victim_run})
            )
            paused = Paused(timeout_seconds=600, pause_key=f"{RESTART_PREFIX}{action_id}")
            await client.set_flow_run_state(flow_run.id, paused, force=True)
            return str(flow_run.id)

    return run_coro_as_sync(make())


def _pending(simulator: SimulatorServer) -> Any:
    return simulator.runs()[0].run.pending_action


def test_only_a_person_s_own_token_decides_and_the_backend_records_who(prefect_server):
    with SimulatorServer(builtin_scenario("loss-spike"), time_scale=FAST) as simulator:
        workload = _workload_env(simulator, prefect_server)
        person = confirming_env(simulator, prefect_server)
        train = start_train(workload)
        try:
            flow_run_id = read_flow_run_id(train)
            _paused_on_restart(flow_run_id)
            action = _pending(simulator)
            assert action is not None

            # The deployment's own token: refused at the backend, and said so in one line.
            refused = in_process("decide", flow_run_id, "--approve", *REASON, env=workload)
            assert refused.returncode == ExitCode.FORBIDDEN, refused.stdout + refused.stderr
            assert "nothing was decided" in refused.stderr and "Traceback" not in refused.stderr
            assert _pending(simulator) == action and not simulator.runs()[0].run.decisions

            # A decoy whose Prefect records name the colleague's run decides nothing for it:
            # before, the backend recorded an approval of the colleague's restart.
            decoy = _decoy(simulator, simulator.runs()[0].run.run_id, action.action_id)
            fooled = in_process("decide", decoy, "--approve", *REASON, env=person)
            assert fooled.returncode == ExitCode.INVALID_INPUT, fooled.stdout + fooled.stderr
            assert _pending(simulator) == action and not simulator.runs()[0].run.decisions

            # The person, as themselves: the record is their principal, the typed note a note.
            decided = in_process(
                "decide", flow_run_id, "--reject", *REASON, "--note", "Ada", "--json", env=person
            )
            assert decided.returncode == ExitCode.SUCCESS, decided.stdout + decided.stderr
            sent = json.loads(decided.stdout)["data"]
            assert (sent["decision"], sent["decided_by"]) == ("reject", "user:ada")
            record = simulator.runs()[0].run.decisions[-1]
            assert (record.principal, record.decided_by) == ("user:ada", "Ada")

            output, _ = train.communicate(timeout=180)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait(timeout=30)
        assert train.returncode == ExitCode.SUCCESS, output
        assert "user:ada rejected the restart at the backend" in output, output
