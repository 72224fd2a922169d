"""What prefect-ito asks Prefect about the flow run it runs in."""

from __future__ import annotations

from uuid import UUID

from prefect.context import FlowRunContext

__all__ = ["current_flow_run_id"]


def current_flow_run_id() -> UUID | None:
    """Return the id of the flow run this code runs in, or None outside one."""
    context = FlowRunContext.get()
    return context.flow_run.id if context and context.flow_run else None
