"""``status`` and ``cancel`` say where their facts come from; a Ctrl-C detach is calm; ``--json``
gives numbers as numbers. Against a real Prefect server and the simulator: ``train`` in a child
(it is interrupted), ``status`` and ``cancel`` in this process."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from io import StringIO

from cli_helpers import in_process, read_flow_run_id, start_train, worker_env
from prefect.client.schemas.objects import FlowRun
from prefect.states import Running
from prefect.utilities.asyncutils import run_coro_as_sync
from rich.console import Console

from prefect_ito.cli import views
from prefect_ito.cli.flow_runs import _cancelled
from prefect_ito.contract import RunState
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer, builtin_scenario


def test_detach_status_and_cancel_say_what_they_did_and_where_facts_come_from(prefect_server):
    with SimulatorServer(builtin_scenario("stall")) as simulator:
        env = worker_env(simulator, prefect_server)
        without_token = {k: v for k, v in env.items() if k != "ITO_COMPUTE_TOKEN"}
        train = start_train(env)
        try:
            flow_run_id = read_flow_run_id(train)
            while not simulator.runs():
                time.sleep(0.3)
            os.kill(train.pid, signal.SIGINT)
            output, _ = train.communicate(timeout=120)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait(timeout=30)
        run_id = simulator.runs()[0].run.run_id

        # Before: three ERROR lines for a deliberate detach, and a re-attach hint without the id.
        assert train.returncode == ExitCode.DETACHED, output
        assert "ERROR" not in output and "Traceback" not in output, output
        assert "Crash detected" not in output, output
        detached = [line for line in output.splitlines() if line.startswith("Detached: ")]
        assert detached == [
            f"Detached: backend run {run_id} goes on at the backend; re-attach with "
            f"`prefect-ito attach {run_id}` (or run the same `prefect-ito train`)."
        ], output

        # Without a token, only the card: said to be from its time and maybe stale.
        shown = in_process("status", flow_run_id, env=without_token)
        assert shown.returncode == ExitCode.SUCCESS, shown.stdout + shown.stderr
        assert f"Backend run: {run_id} (" in shown.stdout
        assert "from the progress card of" in shown.stdout and "may be stale" in shown.stdout

        # With one, the backend itself; numbers as numbers (before: "$0.00 of $250,000.00 …").
        read = in_process("status", flow_run_id, "--json", env=env)
        backend_run = json.loads(read.stdout)["data"]["backend_run"]
        assert (backend_run["source"], backend_run["run_id"]) == ("backend", run_id)
        assert backend_run["state"] == simulator.runs()[0].run.state.value
        for number in ("spend_usd", "budget_usd", "spend_fraction"):
            assert isinstance(backend_run[number], int | float), backend_run
        assert backend_run["budget_usd"] == 250_000

        # A detached (ended) flow run without a token: refused before anything is touched.
        refused = in_process("cancel", flow_run_id, env=without_token)
        assert refused.returncode == ExitCode.AUTHENTICATION, refused.stdout + refused.stderr
        assert simulator.runs()[0].run.state is not RunState.CANCELLED
        assert _state_name(flow_run_id) == "Detached"

        cancelled = in_process("cancel", flow_run_id, "--json", env=env)
        sent = json.loads(cancelled.stdout)["data"]
        assert sent["backend_cancelled_here"] is True and sent["left_to"] is None, sent
        assert sent["cancel_requested_in_prefect"] is False  # it had ended: left as it is
        assert (sent["backend_run"]["run_id"], sent["backend_run"]["state"]) == (
            run_id,
            "cancelled",
        )
        assert simulator.runs()[0].run.state is RunState.CANCELLED

        after = in_process("status", flow_run_id, env=env)
        assert f"Backend run: {run_id} (cancelled), as the backend states it now." in after.stdout


def _state_name(flow_run_id: str) -> str | None:
    from prefect import get_client

    async def read() -> str | None:
        async with get_client() as client:
            state = (await client.read_flow_run(flow_run_id)).state  # type: ignore[arg-type]
        return state.name if state else None

    return run_coro_as_sync(read())


def test_without_a_prefect_server_no_ui_is_named_for_the_chart():
    chart = "![Loss](data:image/svg+xml;base64,AAAA)"

    assert "Prefect UI" not in views.without_images(chart, ui=False)
    assert "not shown at the terminal" in views.without_images(chart, ui=False)
    assert "shown in the Prefect UI" in views.without_images(chart, ui=True)


def test_cancel_says_an_attach_flow_run_only_detaches():
    # Before: "No backend run was found", as if the run it followed were nobody's.
    attach = FlowRun(flow_id=uuid.uuid4(), parameters={"run_id": "run_1"}, state=Running())
    sent = _cancelled(attach, requested=True, here=False, backend_run=None)
    out = StringIO()
    views.print_cancel(Console(file=out, width=200), sent)

    assert sent["follows_run_id"] == "run_1"
    assert "follows backend run run_1, which it did not make" in out.getvalue()
    assert "only detaches" in out.getvalue()
