"""``prefect-ito train | attach | demo | decide | status | cancel``.

Exit codes come from the outcome classes (see :class:`prefect_ito.exceptions.ExitCode` and
the table in ``docs/flows.md``).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Any, Literal
from uuid import UUID

from cyclopts import Parameter
from prefect import get_client
from prefect.flow_runs import aresume_flow_run
from prefect.states import Cancelling
from rich.console import Console

from prefect_ito import console as terminal
from prefect_ito.approval import RestartDecision
from prefect_ito.cli import app
from prefect_ito.exceptions import ExitCode
from prefect_ito.flows import cancel_for_flow_run, ito_training, resolve_credentials
from prefect_ito.outcomes import exit_code

_console = Console()


def _run(parameters: dict[str, Any]) -> None:
    operator = terminal.ask_at_terminal if terminal.interactive() else terminal.leave_to_others
    try:
        state = asyncio.run(terminal.run_training(parameters, operator, _console))
    except KeyboardInterrupt:
        _console.print(
            "Detached: the backend run goes on. Re-attach by running the same `prefect-ito "
            "train` command again, or `prefect-ito attach RUN_ID`."
        )
        sys.exit(130)
    _console.print(f"Final state: [bold]{state.name}[/] {state.message or ''}")
    sys.exit(int(exit_code(state)))


@app.command
def train(
    *,
    booking: str,
    model_size: str,
    data: Annotated[list[str], Parameter(consume_multiple=False)],
    target: str,
    budget_usd: float,
    post_training: Literal["sft", "dpo", "rlvr"] | None = None,
    credentials: str | None = None,
    approval_timeout: int = 86_400,
) -> None:
    """Run the training flow on a completed booking, with a live view of its stages.

    Args:
        booking: The completed booking's id.
        model_size: Parameter count such as 150M, 8B or 70B.
        data: A data reference; repeat for more.
        target: The capability to train for.
        budget_usd: Spend ceiling in US dollars.
        post_training: sft, dpo or rlvr.
        credentials: Name of a saved ItoCredentials block (default: ITO_COMPUTE_API_URL).
        approval_timeout: Seconds a person has to decide on a proposed restart.
    """
    _run(
        {
            "booking": booking,
            "model_size": model_size,
            "data": data,
            "target": target,
            "budget_usd": budget_usd,
            "post_training": post_training,
            "credentials": credentials,
            "approval_timeout": approval_timeout,
        }
    )


@app.command
def attach(run_id: str, *, credentials: str | None = None) -> None:
    """Supervise an existing backend run again, from the request it was made for.

    Args:
        run_id: The backend's training run id.
        credentials: Name of a saved ItoCredentials block (default: ITO_COMPUTE_API_URL).
    """

    async def request_of() -> dict[str, Any]:
        async with (await resolve_credentials(credentials)).get_client() as client:
            run = await client.get_training_run(run_id)
        return {
            "booking": run.request.booking_id,
            "model_size": run.request.model_size,
            "data": run.request.data_refs,
            "target": run.request.target,
            "budget_usd": run.request.budget_usd,
            "post_training": run.request.post_training,
            "credentials": credentials,
        }

    _run(asyncio.run(request_of()))


@app.command
def demo(*, scenario: str = "demo") -> None:
    """Run the real training flow end to end on the built-in reference simulator.

    Args:
        scenario: A built-in scenario: demo, gate-failure, refused, ladder-rejection,
            budget-exhausted, stall, two-spikes, unavailable.
    """
    from prefect_ito.demo import run_demo

    sys.exit(run_demo(scenario))


def _require_server(command: str) -> None:
    if not terminal.has_real_server():
        _console.print(
            f"`prefect-ito {command}` needs a real Prefect server: set PREFECT_API_URL. "
            "In ephemeral mode only the terminal that started the flow can reach it."
        )
        sys.exit(int(ExitCode.ERROR))


@app.command
def decide(
    flow_run_id: UUID,
    *,
    approve: bool = False,
    reject: bool = False,
    reason: str,
    name: str,
) -> None:
    """Approve or reject the restart a paused training flow run waits for.

    Args:
        flow_run_id: The paused ito-training flow run.
        approve: Approve the proposed restart.
        reject: Reject it; the run goes on without restarting.
        reason: Why; recorded at the backend.
        name: Your name; recorded at the backend as who decided.
    """
    _require_server("decide")
    if approve == reject:
        _console.print("Give exactly one of --approve and --reject.")
        sys.exit(int(ExitCode.INVALID_INPUT))
    decision = RestartDecision(approve=approve, decided_by=name, reason=reason)
    asyncio.run(aresume_flow_run(flow_run_id, run_input=decision.model_dump(mode="json")))
    _console.print(f"Sent: {'approve' if approve else 'reject'} by {name}.")


@app.command
def status(flow_run_id: UUID) -> None:
    """Show a training flow run's state.

    Args:
        flow_run_id: The ito-training flow run.
    """
    _require_server("status")
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
    state = flow_run.state
    _console.print(f"{flow_run.name}: [bold]{state.name if state else '?'}[/]")
    if state and state.message:
        _console.print(state.message)


@app.command
def cancel(flow_run_id: UUID) -> None:
    """Cancel a training flow run and its backend workload (never the booking).

    Args:
        flow_run_id: The ito-training flow run.
    """
    _require_server("cancel")

    async def request_cancel() -> None:
        async with get_client() as client:
            flow_run = await client.read_flow_run(flow_run_id)
            state = flow_run.state
            suspended = state is not None and bool(state.state_details.pause_reschedule)
            await client.set_flow_run_state(flow_run_id, Cancelling(), force=True)
            if suspended:
                # No process runs a paused flow's hooks: cancel the workload from here.
                await cancel_for_flow_run(ito_training, flow_run, flow_run.state)  # type: ignore[arg-type]

    asyncio.run(request_cancel())
    _console.print(f"Cancellation requested for {flow_run_id}.")


__all__ = ["attach", "cancel", "decide", "demo", "status", "train"]
