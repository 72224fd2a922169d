"""Running a training flow from a terminal: a live view, and a person answering at the prompt.

The flow runs in this process (against ``PREFECT_API_URL`` when set, else Prefect's ephemeral
mode). When it waits for a person — a spend to confirm, a restart to decide — the person at the
prompt answers at the backend with their own token, which records who they are; the flow, which
reads the backend at every poll, goes on by itself. Nothing answered through Prefect decides.
Ctrl-C detaches: supervision stops at its next check and the flow run ends ``Detached``, while the
backend run goes on; a second Ctrl-C stops at once. A closed terminal (SIGHUP) or a termination
signal (SIGTERM) stops supervision the same way, and the flow run ends ``TerminalClosed``: never
left paused for nobody, and a question it asked is left to others, never declined.

Just past ~400 lines: running the flow, noticing its pauses and reading a person's answer at the
prompt share one event loop and one console, and are read together. Starting the temporary
Prefect server lives in :mod:`prefect_ito.cli.temporary_prefect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast
from uuid import UUID

from prefect import Flow, State, get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.flow_engine import run_flow_async
from prefect.input import RunInput
from prefect.input.run_input import keyset_from_paused_state
from prefect.settings import PREFECT_UI_URL
from rich.console import Console
from rich.markdown import Markdown

from prefect_ito.cli.hangup import end_without_terminal, stop_when_closed, terminal_went_away
from prefect_ito.cli.local import interactive
from prefect_ito.cli.restart_answers import decide_here, stated_run
from prefect_ito.cli.spend_answers import (
    ConfirmedBeforehand,
    NobodyHere,
    confirm_quote_here,
    stated_quote,
)
from prefect_ito.cli.temporary_prefect import (
    EPHEMERAL_STARTUP_SECONDS,
    has_real_server,
    prefect_api,
)
from prefect_ito.cli.views import quiet_tasks, without_images
from prefect_ito.contract import DecisionChoice, DecisionRequest
from prefect_ito.people import answers, approval
from prefect_ito.people.approval import Choice
from prefect_ito.people.notices import decide_command
from prefect_ito.people.spend import SpendDecision
from prefect_ito.questions import asked_by, question_for
from prefect_ito.questions.spend import SPEND
from prefect_ito.reporting.quote_card import describe
from prefect_ito.waiting.cancellation import request_detach
from prefect_ito.waiting.waits import ActionWait, QuoteWait, latest_wait

__all__ = [
    "EPHEMERAL_STARTUP_SECONDS",
    "ConfirmedBeforehand",
    "Confirmer",
    "NobodyHere",
    "Operator",
    "RestartPause",
    "SpendPause",
    "ask_at_terminal",
    "confirm_at_terminal",
    "confirm_quote_here",
    "has_real_server",
    "interactive",
    "leave_to_others",
    "prefect_api",
    "run_training",
    "stated_quote",
    "without_images",
]


@dataclass(frozen=True)
class RestartPause:
    """A flow run waiting for a person to decide, at the backend, what it proposes (a restart, a
    deadline extension): what it shows, and the action it recorded (None if it recorded none)."""

    flow_run: FlowRun
    description: str
    action: ActionWait | None


Operator = Callable[[RestartPause], Awaitable[None]]
"""Acts on a decision at the backend (or leaves it to others); the flow, which reads the
run from the backend at every poll, goes on by itself once the backend has a decision."""


@dataclass(frozen=True)
class SpendPause:
    """A flow run waiting for a person to confirm its spend at the backend: what it shows, and
    the quote it recorded (None if it recorded none)."""

    flow_run: FlowRun
    description: str
    quote: QuoteWait | None


Confirmer = Callable[[SpendPause], Awaitable[SpendDecision | None]]
"""Acts on a spend confirmation (at the backend) and returns an answer for the flow's form, if
any; None leaves the flow waiting for the backend to say the quote was answered."""


async def run_training(
    flow: Flow[Any, Any],
    parameters: dict[str, Any],
    operator: Operator,
    console: Console,
    *,
    confirmer: Confirmer | None = None,
    poll: float = 1.0,
    verbose: bool = False,
) -> State[Any]:
    """Run ``flow`` here with ``parameters``; ``operator`` answers restart decisions, and
    ``confirmer`` spend confirmations (without one, a person confirms at the backend: its page,
    or ``prefect-ito confirm``).

    Prefect's per-task "Finished in state" lines stay off the console unless ``verbose``.
    """
    async with get_client() as client:
        flow_run = await client.create_flow_run(flow, parameters=parameters)
    console.print(f"Flow run [bold]{flow_run.name}[/] ({flow_run.id})")
    running = asyncio.ensure_future(
        run_flow_async(
            cast(Any, flow), flow_run=flow_run, parameters=parameters, return_type="state"
        )
    )
    answering = asyncio.ensure_future(
        _answer_pauses(flow_run.id, _Answerers(operator, confirmer), console, poll)
    )
    closed = asyncio.Event()
    gone = asyncio.ensure_future(closed.wait())
    state: Any = None
    try:
        with _detach_on_interrupt(console), stop_when_closed(closed), quiet_tasks(verbose):
            await asyncio.wait({running, answering, gone}, return_when=asyncio.FIRST_COMPLETED)
            if answering.done() and not closed.is_set():
                if isinstance(answering.exception(), OSError):  # the terminal can't be written
                    terminal_went_away(closed, "its output was lost")
                else:
                    answering.result()  # the operator failed: say so rather than wait for nobody
            if closed.is_set():
                answering.cancel()  # nobody is at the prompt: nothing may be answered for them
                state = await end_without_terminal(running, flow_run.id)
            else:
                state = await running
    finally:
        for task in (gone, answering, running):
            task.cancel()
    assert isinstance(state, State)
    return state


@contextlib.contextmanager
def _detach_on_interrupt(console: Console) -> Iterator[None]:
    """Turn the first Ctrl-C into a detach; a second one interrupts as usual."""
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        console.print("[yellow]Detaching: supervision stops; the backend run goes on.[/]")
        request_detach()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@dataclass(frozen=True)
class _Answerers:
    operator: Operator
    confirmer: Confirmer | None


@dataclass(frozen=True)
class _Pause:
    flow_run: FlowRun
    state: State[Any]
    response_key: str
    description: str
    spend: bool
    defaults: dict[str, Any]


async def _answer_pauses(
    flow_run_id: UUID, answerers: _Answerers, console: Console, poll: float
) -> None:
    """Hand each new pause of the flow run to whoever answers it, once, and relay the answer."""
    handled: set[str] = set()
    # One client for the whole wait: each new one loads the CA bundle into a TLS context (tens of
    # milliseconds of CPU), which a poll a second made the biggest cost of a waiting `train`.
    async with get_client() as client:
        while True:
            await asyncio.sleep(poll)
            await _answer_new_pause(client, flow_run_id, answerers, console, handled)


async def _answer_new_pause(
    client: PrefectClient,
    flow_run_id: UUID,
    answerers: _Answerers,
    console: Console,
    handled: set[str],
) -> None:
    """Answer the flow run's pause if it waits and was not handled yet; relay the answer."""
    pause = await _waiting_pause(client, flow_run_id)
    if pause is None or pause.response_key in handled:
        return
    handled.add(pause.response_key)
    _announce_pause(console, flow_run_id, spend=pause.spend)
    answer = await _answer(pause, answerers)
    if answer is None:
        return
    kept = await answers.resume_with(flow_run_id, pause.state, answer.model_dump(mode="json"))
    if not kept.ours and kept.answer is not None:
        # Names come from whoever answered: printed as they are, never read as markup.
        taken = f"Another answer was taken first: {kept.describe()}."
        console.print(taken, style="yellow", markup=False, soft_wrap=True)


async def _answer(pause: _Pause, answerers: _Answerers) -> RunInput | None:
    if not pause.spend:
        action = await latest_wait(pause.flow_run.id, ActionWait)
        await answerers.operator(RestartPause(pause.flow_run, pause.description, action))
        return None
    if answerers.confirmer is None:
        return None
    quote = await latest_wait(pause.flow_run.id, QuoteWait)
    return await answerers.confirmer(SpendPause(pause.flow_run, pause.description, quote))


async def _waiting_pause(client: PrefectClient, flow_run_id: UUID) -> _Pause | None:
    """Return the flow run's pause while it waits for input: key, description, form defaults."""
    flow_run = await client.read_flow_run(flow_run_id)
    state = flow_run.state
    if state is None or not state.is_paused() or not state.state_details.run_input_keyset:
        return None
    keyset = keyset_from_paused_state(state)
    try:
        description = await client.read_flow_run_input(flow_run_id, keyset["description"])
        schema = await client.read_flow_run_input(flow_run_id, keyset["schema"])
    except (ObjectNotFound, PrefectHTTPStatusError) as error:
        if _status(error) not in (None, 404):
            raise
        return None  # Prefect saves the form just after the Paused state: look again soon
    fields = json.loads(schema).get("properties", {})
    return _Pause(
        flow_run=flow_run,
        state=state,
        response_key=keyset["response"],
        description=json.loads(description),
        spend=asked_by(state.state_details.pause_key) is SPEND,
        defaults={name: spec["default"] for name, spec in fields.items() if "default" in spec},
    )


def _status(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _announce_pause(console: Console, flow_run_id: UUID, *, spend: bool = False) -> None:
    if spend:
        # A person confirms at the backend, never in Prefect: its form only declines or rechecks.
        console.print(
            "[bold yellow]The spend needs a person's confirmation at the backend[/] (its confirm "
            "page, or `prefect-ito confirm QUOTE_ID` logged in as yourself).",
            soft_wrap=True,
        )
        if has_real_server() and (ui := PREFECT_UI_URL.value()):
            console.print(
                f"The flow run in the Prefect UI: {ui}/runs/flow-run/{flow_run_id} (its form "
                "can only decline the spend, or recheck once it was confirmed at the backend)",
                soft_wrap=True,
            )
        return
    console.print("[bold yellow]The run needs a person's decision at the backend.[/]")
    if has_real_server():
        console.print(  # a command to copy: never broken across lines
            f"Anyone logged in as themselves can also decide: {decide_command(flow_run_id)}",
            soft_wrap=True,
        )


def _elsewhere() -> str:
    """Say where else a person can answer: the backend's page always (the flow, waiting here,
    reads the backend); ``prefect-ito decide`` only where a real server lets it reach the run."""
    if has_real_server():
        return "(the backend's decide page, or `prefect-ito decide`)"
    return "(the backend's decide page: this flow run, waiting here, sees the decision)"


async def ask_at_terminal(pause: RestartPause) -> None:
    """Ask the person at this terminal, and decide at the backend with their own token.

    What they read is the run the flow recorded, as the backend states it. Approve or reject
    must be typed out (or ``a`` / ``r``): an empty answer asks again, and the end of input
    leaves the decision to someone else instead of rejecting by accident. The backend records
    who decided from the token (a workload's token may not decide: it is told where a person
    does); the reason goes beside it.
    """
    console = Console()
    record = pause.action
    run = await stated_run(record) if record is not None else None
    action = run.pending_action if run is not None else None
    if record is None or run is None or action is None or action.action_id != record.action_id:
        console.print(Markdown(without_images(pause.description)))
        console.print(
            "[yellow]The run could not be read from the backend, or waits for no decision any "
            f"more, so nothing is decided here {_elsewhere()}.[/]"
        )
        return
    question = question_for(action)
    subject = question.subject if question is not None else "it"
    console.print(Markdown(without_images(approval.describe(run, action))))
    choice = await _read_choice(console, f"Approve or reject {subject}?", _CHOICES)
    if choice is None:
        console.print(f"[yellow]No answer: {subject} still waits for a decision {_elsewhere()}.[/]")
        return
    reason = await _read_line(console, "Why: ")
    decision = DecisionRequest(
        decision=DecisionChoice(choice), reason=(reason or "").strip() or "no reason given"
    )
    await decide_here(record, run, decision, console)


async def confirm_at_terminal(pause: SpendPause) -> SpendDecision | None:
    """Ask the person at this terminal to confirm or decline the spend, and do it at the backend.

    Confirm or decline must be typed out (or ``c`` / ``d``): an empty answer asks again, and the
    end of input leaves the confirmation to someone else instead of deciding by accident. A
    confirmation is made at the backend with this person's own token (it needs
    ``spend:confirm``; a workload's token cannot), and the flow, which reads the quote from the
    backend at every poll, goes on by itself. A decline is the flow's to make: it is returned.
    """
    console = Console()
    # What a person confirms is the quote the record names, so that quote is what they read, as
    # the backend states it: the record and the form's text are Prefect's, which anyone with
    # API access may have written.
    stated = await stated_quote(pause.quote) if pause.quote is not None else None
    if stated is None or stated.manifest is None:
        console.print(Markdown(without_images(pause.description)))
        console.print(
            "[yellow]The quote could not be read from the backend, so it cannot be confirmed "
            "here: confirm it on the backend's own page, or decline it.[/]"
        )
    else:
        # The quote without the Prefect form's answers (decline, recheck): here the answers are
        # this prompt's own.
        console.print(Markdown(describe(stated, stated.manifest, choices=False)))
        console.print(Markdown(_WHAT_EACH_ANSWER_DOES_HERE))
    decision = await _read_choice(console, "Confirm or decline the spend?", _SPEND_CHOICES)
    if decision is None or pause.quote is None or (decision == "confirm" and stated is None):
        console.print(
            "[yellow]No answer: the spend still waits for a person's confirmation at the "
            "backend; nothing is submitted until then.[/]"
        )
        return None
    if decision == "decline":
        reason = await _read_line(console, "Why (optional): ")
        return SpendDecision(decision="decline", reason=(reason or "").strip())
    note = await _read_line(console, "A note beside your confirmation (optional): ")
    await confirm_quote_here(pause.quote, (note or "").strip() or None, console)
    return None


_Word = TypeVar("_Word", bound=str)

_CHOICES: dict[str, Choice] = {
    "a": "approve",
    "approve": "approve",
    "r": "reject",
    "reject": "reject",
}


_WHAT_EACH_ANSWER_DOES_HERE = (
    "- **confirm**: confirmed at the backend as you (this terminal's login); the flow goes on.\n"
    "- **decline**: nothing is submitted; the quote is declined at the backend and the flow run "
    "ends Declined."
)
"""What the terminal's two answers to a spend do: shown above its prompt."""

_SPEND_CHOICES: dict[str, Literal["confirm", "decline"]] = {
    "c": "confirm",
    "confirm": "confirm",
    "d": "decline",
    "decline": "decline",
}


async def _read_choice(console: Console, question: str, choices: dict[str, _Word]) -> _Word | None:
    """Ask ``question`` until the person types one of ``choices``; None at the end of input.

    ``choices`` maps what may be typed (a word, or its first letter) to the answer; there is no
    default, so an empty or unknown answer asks again.
    """
    first, second = dict.fromkeys(choices.values())
    while True:
        answer = await _read_line(console, f"{question} [{first}/{second}] ")
        if answer is None:
            return None
        choice = choices.get(answer.strip().lower())
        if choice is not None:
            return choice
        console.print(f"Type {first} or {second} ({first[0]} or {second[0]}): there is no default.")


async def _read_line(console: Console, prompt: str) -> str | None:
    """Read a line in a daemon thread, so a detach never waits for the person to press Enter.

    Returns None at the end of input (or on Ctrl-C at the prompt).
    """
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        line: str | None
        try:
            # Rich would read "[approve/reject]" as markup and print nothing of it.
            line = console.input(prompt, markup=False)
        except (EOFError, KeyboardInterrupt):
            line = None
        loop.call_soon_threadsafe(_settle, answer, line)

    threading.Thread(target=read, name="prefect-ito-prompt", daemon=True).start()
    return await answer


def _settle(future: asyncio.Future[str | None], value: str | None) -> None:
    if not future.done():
        future.set_result(value)


async def leave_to_others(pause: RestartPause) -> None:
    """Answer nothing: a person decides on the backend's page or with ``prefect-ito decide``."""
