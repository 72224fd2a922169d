"""The commands that answer a question for a person: one line each, to copy."""

from __future__ import annotations

from uuid import UUID

__all__ = ["confirm_command", "decide_command"]


def decide_command(flow_run_id: UUID | str) -> str:
    """Return the command that answers a flow run's pending action (a restart, a deadline)."""
    return f"prefect-ito decide {flow_run_id} --approve|--reject --reason TEXT"


def confirm_command(quote_id: str) -> str:
    """Return the command that answers a spend question: confirm the quote, or decline it."""
    return f"prefect-ito confirm {quote_id} [--decline]"
