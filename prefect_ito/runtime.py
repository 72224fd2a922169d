"""What prefect-ito asks Prefect about the flow run it runs in."""

from __future__ import annotations

from uuid import UUID

from prefect import get_client
from prefect.context import FlowRunContext


def current_flow_run_id() -> UUID | None:
    """Return the id of the flow run this code runs in, or None outside one."""
    context = FlowRunContext.get()
    return context.flow_run.id if context and context.flow_run else None


async def cancellation_requested(flow_run_id: UUID | None = None) -> bool:
    """Tell whether someone asked Prefect to cancel the flow run (default: the current one).

    A flow run that no runner or worker executes never hears of its cancellation, so
    supervision asks for it between polls and while paused.
    """
    flow_run_id = flow_run_id or current_flow_run_id()
    if flow_run_id is None:
        return False
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
    state = flow_run.state
    return state is not None and (state.is_cancelling() or state.is_cancelled())
