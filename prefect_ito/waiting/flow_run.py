"""What prefect-ito asks Prefect about the flow run it runs in, and how it suspends it."""

from __future__ import annotations

import logging
import re
from typing import Any, cast
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.exceptions import Abort, ObjectNotFound, Pause
from prefect.flow_runs import asuspend_flow_run
from prefect.input import Keyset, RunInput, keyset_from_paused_state
from prefect.input.run_input import AutomaticRunInput, run_input_subclass_from_type
from prefect.states import Suspended
from prefect.utilities.engine import propose_state

try:  # Prefect's own step after a suspension (tasks stop too); private, so guarded
    from prefect._flow_run_suspension import mark_flow_run_suspension_requested
except ImportError:  # pragma: no cover - a Prefect that moved it: see suspend()
    mark_flow_run_suspension_requested = None  # type: ignore[assignment]

__all__ = ["can_suspend", "current_flow_run_id", "fired_pause_keys", "has_ended", "suspend"]

_SUSPENSION_END = re.compile(r"Finished in state (Suspended|Paused)\(.*type=PAUSED\)", re.DOTALL)
"""What Prefect's flow engine logs when a flow run's process ends on a suspension."""


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


async def fired_pause_keys(flow_run_id: UUID) -> set[str]:
    """Return the pause keys this flow run paused or suspended under: Prefect refuses them."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
    return set(flow_run.empirical_policy.pause_keys or ())


async def suspend(key: str, *, message: str, timeout: int | None, form: Any = None) -> Any:
    """Suspend this flow run under ``key``, its state saying ``message``; Prefect's own way.

    Prefect's ``asuspend_flow_run`` proposes a Suspended state without a message, so a run
    parked for the watcher and one waiting for a person look the same in the UI. This is the
    same proposal (pause key, timeout, reschedule, the form's keyset) with the message on it,
    and ends the process the same way: Prefect's ``Pause`` signal.

    Args:
        key: The pause key; Prefect refuses a key it suspended under before.
        message: What the run waits for, as the state's message.
        timeout: Seconds before Prefect's server fails the run, or None.
        form: The form (a ``RunInput`` class) the run waits for, if any.

    Returns:
        When Prefect refuses the suspension because ``key`` fired before (the run was resumed
        and runs again from the top): the form's stored answer, or None without a form.

    Raises:
        Pause: the suspension was accepted; Prefect's engine ends the process on it.
        RuntimeError: Prefect aborted the suspension (no deployment, a subflow).
    """
    if mark_flow_run_suspension_requested is None:
        # A Prefect whose private step moved: its public suspension, without the message.
        return await asuspend_flow_run(wait_for_input=form, timeout=timeout, key=key)
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise RuntimeError("Flow runs can only be suspended from within a flow run.")
    flow_run_id = context.flow_run.id
    proposed: State[Any] = Suspended(timeout_seconds=timeout, pause_key=key, message=message)
    answer: type[RunInput | AutomaticRunInput[Any]] | None = (
        run_input_subclass_from_type(form) if form is not None else None
    )
    keyset: Keyset | None = keyset_from_paused_state(proposed) if answer is not None else None
    proposed.state_details.run_input_keyset = cast("dict[str, str] | None", keyset)
    async with get_client() as client:
        try:
            state = await propose_state(client=client, state=proposed, flow_run_id=flow_run_id)
        except Abort as exc:
            raise RuntimeError(f"Flow run cannot be suspended: {exc}") from None
        if state.is_running():  # this suspension fired before: the run was resumed since
            return await answer.aload(keyset) if answer is not None and keyset else None
        if not state.is_paused():
            raise RuntimeError(f"Flow run cannot be suspended. Received unexpected state: {state}")
        if answer is not None and keyset is not None:
            await answer.asave(keyset)
    _quiet_suspension_end()
    mark_flow_run_suspension_requested(flow_run_id, state)  # as Prefect does: tasks stop too
    raise Pause(state=state)


class _SuspensionIsNoError(logging.Filter):
    """Log the end of a process on a suspension at INFO, not ERROR.

    Prefect's flow engine logs "Finished in state …" at ERROR for every state but Completed, a
    suspension included, so each parked run's log ended on a red line that asks nothing of
    anybody. Only that exact line, for a Paused or Suspended state, is lowered; the record is
    otherwise kept as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and _SUSPENSION_END.fullmatch(record.getMessage()):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def _quiet_suspension_end() -> None:
    """Install, once per process, the filter on the logger Prefect's flow engine logs with."""
    logger = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(known, _SuspensionIsNoError) for known in logger.filters):
        logger.addFilter(_SuspensionIsNoError())


async def has_ended(flow_run_id: str) -> bool:
    """Tell whether Prefect holds the flow run ``flow_run_id`` as ended, or knows none such.

    Only ever a hint of who is still there to ask a question (anyone with Prefect API access
    can set a state): never which run to follow, nor an answer.
    """
    try:
        flow_run_uuid = UUID(flow_run_id)
    except ValueError:
        return True  # not a flow run's id: nobody in Prefect asks for it
    async with get_client() as client:
        try:
            flow_run = await client.read_flow_run(flow_run_uuid)
        except ObjectNotFound:
            return True
    return flow_run.state is None or flow_run.state.is_final()
