"""What prefect-ito asks Prefect about the flow run it runs in."""

from __future__ import annotations

from uuid import UUID

from prefect.context import FlowRunContext

__all__ = ["can_suspend", "current_flow_run_id"]


def current_flow_run_id() -> UUID | None:
    """Return the id of the flow run this code runs in, or None outside one."""
    context = FlowRunContext.get()
    return context.flow_run.id if context and context.flow_run else None


def can_suspend() -> bool:
    """Tell whether this flow run may suspend: it comes from a deployment and is no subflow."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return False
    flow_run = context.flow_run
    return flow_run.deployment_id is not None and flow_run.parent_task_run_id is None
