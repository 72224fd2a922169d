"""Running the training flow from a terminal: a live view, and a person answering at the prompt.

The flow runs in this process (against ``PREFECT_API_URL`` when set, else Prefect's ephemeral
mode). When it pauses for a restart decision, the answer goes back through Prefect's resume API —
the same one the Prefect UI uses — so the flow cannot tell a terminal from the UI.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, cast
from uuid import UUID

from prefect import Flow, State, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import ObjectNotFound
from prefect.flow_engine import run_flow_async
from prefect.flow_runs import aresume_flow_run
from prefect.input.run_input import keyset_from_paused_state
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL
from rich.console import Console
from rich.markdown import Markdown

from prefect_ito.approval import RestartDecision
from prefect_ito.flows import ito_training

Operator = Callable[[FlowRun, str], Awaitable[RestartDecision | None]]
"""Answers a paused flow run, given the markdown it shows a person; None leaves it waiting."""


def has_real_server() -> bool:
    """Tell whether a Prefect server (not the ephemeral one) is configured."""
    return bool(PREFECT_API_URL.value())


async def run_training(
    parameters: dict[str, Any],
    operator: Operator,
    console: Console,
    *,
    poll: float = 1.0,
    flow: Flow[Any, Any] = ito_training,
) -> State[Any]:
    """Run ``flow`` (``ito-training``) here, answering its pauses through ``operator``."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(flow, parameters=parameters)
    console.print(f"Flow run [bold]{flow_run.name}[/] ({flow_run.id})")
    running = asyncio.ensure_future(
        run_flow_async(
            cast(Any, flow), flow_run=flow_run, parameters=parameters, return_type="state"
        )
    )
    answering = asyncio.ensure_future(_answer_pauses(flow_run.id, operator, console, poll))
    try:
        await asyncio.wait({running, answering}, return_when=asyncio.FIRST_COMPLETED)
        if answering.done():
            answering.result()  # the operator failed: say so rather than wait for nobody
        state = await running
    finally:
        answering.cancel()
        running.cancel()
    assert isinstance(state, State)
    return state


async def _answer_pauses(
    flow_run_id: UUID, operator: Operator, console: Console, poll: float
) -> None:
    """Hand each new pause of the flow run to ``operator``, once, and relay its answer."""
    handled: set[str] = set()
    while True:
        await asyncio.sleep(poll)
        pause = await _waiting_pause(flow_run_id)
        if pause is None or pause[1] in handled:
            continue
        flow_run, key, description = pause
        handled.add(key)
        _announce_pause(console, flow_run_id)
        decision = await operator(flow_run, description)
        if decision is not None:
            await aresume_flow_run(flow_run_id, run_input=decision.model_dump(mode="json"))


async def _waiting_pause(flow_run_id: UUID) -> tuple[FlowRun, str, str] | None:
    """Return the flow run, its pause's key and description while it waits for input."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
        state = flow_run.state
        if state is None or not state.is_paused() or not state.state_details.run_input_keyset:
            return None
        keyset = keyset_from_paused_state(state)
        try:
            description = await client.read_flow_run_input(flow_run_id, keyset["description"])
        except ObjectNotFound:
            return None  # Prefect saves the form just after the Paused state: look again soon
    return flow_run, keyset["response"], json.loads(description)


def _announce_pause(console: Console, flow_run_id: UUID) -> None:
    console.print("[bold yellow]A restart needs a decision.[/]")
    if has_real_server():
        ui = PREFECT_UI_URL.value()
        if ui:
            console.print(f"Decide in the Prefect UI: {ui}/runs/flow-run/{flow_run_id}")
        console.print(
            f"or: prefect-ito decide {flow_run_id} --approve|--reject --reason TEXT --name NAME"
        )


async def ask_at_terminal(flow_run: FlowRun, description: str) -> RestartDecision | None:
    """Ask the person at this terminal; the answer is relayed exactly as the UI would."""
    console = Console()
    console.print(Markdown(description))
    answer = await asyncio.to_thread(console.input, "Approve the restart? [y/N] ")
    name = await asyncio.to_thread(console.input, "Your name: ")
    reason = await asyncio.to_thread(console.input, "Why: ")
    return RestartDecision(
        approve=answer.strip().lower() in {"y", "yes"},
        decided_by=name.strip() or "terminal user",
        reason=reason.strip() or "no reason given",
    )


async def leave_to_others(flow_run: FlowRun, description: str) -> RestartDecision | None:
    """Answer nothing: a person decides in the Prefect UI or with ``prefect-ito decide``."""
    return None


def interactive() -> bool:
    """Tell whether a person is at this terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()
