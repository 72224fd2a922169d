"""``prefect-ito inbox``: every flow run that waits for a person, oldest first.

A paused flow run waits for a person unless it is parked for the watcher (its pause key starts
with :data:`~prefect_ito.waiting.keys.DEFER_PREFIX`: it waits for the backend, and
``prefect-ito watch`` resumes it). What is asked comes from the question's record
(:mod:`prefect_ito.people.notices`); since when and the deadline come from the flow run's own
paused state. Anyone with Prefect API access can write a record, so the inbox only shows it:
the link to the form is built here from the flow run's id, and text is printed as text.

A question the backend no longer holds open is left out: a spend whose quote expired, was
answered or was used, a decision on an action the run no longer waits for (another flow run's
answer, a run that ended). The backend is asked with this terminal's own token; a question it
cannot be asked about (no token here, the backend down, no record of what was asked) is shown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.utilities.urls import url_for
from pydantic import ValidationError
from rich.console import Console

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli import views
from prefect_ito.cli.errors import respond
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.temporary_prefect import has_real_server
from prefect_ito.exceptions import ItoError, PrefectServerRequired
from prefect_ito.people.answers import is_question_key
from prefect_ito.people.notices import Question
from prefect_ito.questions import asked_by, questions
from prefect_ito.waiting.keys import (
    DEFER_PREFIX,
    QUESTION_RECORD_PREFIX,
)
from prefect_ito.waiting.waits import latest_wait, question_deadline

__all__ = ["inbox"]

_console = Console()

_PAGE = 200
"""Flow runs read per request."""


def inbox(*, json_output: JsonOption = False) -> None:
    """Show every flow run that waits for a person, oldest first, and how to answer each.

    For each: what is asked, since when, the deadline, the cost held so far, the link to its
    form in the Prefect UI and the command that answers it. Runs parked for the watcher wait
    for the backend, not for a person, and are left out, as are questions the backend no longer
    holds open (an expired quote, an action already decided).
    """
    respond(json_output, _read_inbox(), _show_inbox)


async def _read_inbox() -> list[dict[str, Any]]:
    if not has_real_server():
        raise PrefectServerRequired(
            "`prefect-ito inbox` needs a real Prefect server: set PREFECT_API_URL"
        )
    async with get_client() as client:
        paused = [run for run in await _paused_runs(client) if _waits_for_person(run)]
        waiting = [run for run in paused if await _still_open(run)]
        now = datetime.now(UTC)  # one moment for every cost held, said with it
        entries = [_entry(run, await _question(client, run), now) for run in waiting]
    return sorted(entries, key=lambda entry: entry["since"] or "")


async def _paused_runs(client: PrefectClient) -> list[FlowRun]:
    """Return every paused or suspended flow run, across deployments and work pools."""
    paused = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
    )
    found: list[FlowRun] = []
    while True:
        page = await client.read_flow_runs(
            flow_run_filter=paused,
            sort=FlowRunSort.START_TIME_ASC,
            limit=_PAGE,
            offset=len(found),
        )
        found += page
        if len(page) < _PAGE:
            return found


def _waits_for_person(flow_run: FlowRun) -> bool:
    state = flow_run.state
    if state is None or not state.is_paused():
        return False
    return not (state.state_details.pause_key or "").startswith(DEFER_PREFIX)


async def _still_open(flow_run: FlowRun) -> bool:
    """Tell whether the backend still holds open what the flow run's pause asks about.

    Asked as the watcher asks (:meth:`~prefect_ito.waiting.waits.WaitRecord.settled`). True
    when it cannot be told: no record of what was asked, or the backend not readable with this
    terminal's token. A question wrongly shown costs a look; one wrongly hidden, a person.
    """
    asked = asked_by(flow_run.state.state_details.pause_key if flow_run.state else None)
    if asked is None:
        return True
    record = await latest_wait(flow_run.id, asked.record)
    if record is None:
        return True
    try:
        credentials = ItoCredentials(api_url=record.api_url, keyring_entry=record.keyring_entry)
        async with credentials.get_client() as backend:
            return await record.settled(backend) is None
    except (ItoError, ValidationError):
        return True


async def _question(client: PrefectClient, flow_run: FlowRun) -> Question | None:
    """Return the record of the question the run's pause asks, if one was kept (display only)."""
    pause_key = (flow_run.state.state_details.pause_key if flow_run.state else None) or ""
    records = await client.filter_flow_run_input(
        flow_run.id, QUESTION_RECORD_PREFIX, limit=50, exclude_keys=set()
    )
    for record in records:
        if is_question_key(record.key.removeprefix(QUESTION_RECORD_PREFIX), pause_key):
            try:
                return Question.model_validate(record.decoded_value)
            except (ValidationError, ValueError):
                return None  # not a record prefect-ito wrote: nothing to show of it
    return None


def _entry(flow_run: FlowRun, question: Question | None, now: datetime) -> dict[str, Any]:
    """Return what the inbox shows of one waiting flow run; numbers as numbers.

    The cost held is counted from the record's ``held_since`` and hourly rate to ``now``, not
    taken from what the record said when it was written: the wait costs more every hour.
    """
    state = flow_run.state
    details = state.state_details if state else None
    pause_key = (details.pause_key if details else None) or ""
    cost = (
        views.held_numbers(question.held_since, question.held_usd_per_hour, now)
        if question
        else None
    )
    return {
        "flow_run_id": str(flow_run.id),
        "flow_run_name": flow_run.name,
        "kind": _kind(pause_key),
        "suspended": bool(details and details.pause_reschedule),
        "asked": question.asked if question else None,
        "evidence": question.evidence if question else None,
        "why": question.why if question else None,
        "since": _iso(state.timestamp if state else None),
        "deadline": _iso(question_deadline(state) if state else None),
        "held": views.held_text(cost) if cost else None,
        "held_usd": cost["usd"] if cost else None,
        "held_seconds": cost["seconds"] if cost else None,
        "held_usd_per_hour": cost["usd_per_hour"] if cost else None,
        "held_as_of": cost["as_of"] if cost else None,
        "link": url_for("flow-run", obj_id=flow_run.id),
        "command": _command(flow_run.id, pause_key, question),
    }


def _kind(pause_key: str) -> str:
    asked = asked_by(pause_key)
    return asked.name if asked is not None else "other"


def _command(flow_run_id: UUID, pause_key: str, question: Question | None) -> str | None:
    """Return the command that answers the question, built by its kind."""
    asked = asked_by(pause_key)
    if asked is None:
        return None
    return asked.command(flow_run_id, question.command if question else None)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _form_does(kind: str) -> str:
    """Return what the flow run's form can do for a question of ``kind`` ("" for another)."""
    return next((q.form_does for q in questions().values() if q.name == kind), "")


def _show_inbox(entries: list[dict[str, Any]]) -> None:
    if not entries:
        _console.print("Nobody is needed: no flow run waits for a person.")
        return
    _console.print(f"{len(entries)} flow run(s) wait for a person, oldest first:")
    for entry in entries:
        _show_entry(entry)


def _show_entry(entry: dict[str, Any]) -> None:
    # Names and records come from Prefect, where anyone with API access writes them: text only.
    lines = [
        "",
        f"{entry['flow_run_name']} ({entry['flow_run_id']}): {entry['kind']}",
        f"  Asked: {entry['asked'] or 'not recorded (see the form)'}",
        *([f"  Why a person: {entry['why']}"] if entry["why"] else []),
        *([f"  Evidence: {entry['evidence']}"] if entry["evidence"] else []),
        f"  Since: {entry['since'] or '?'}   Deadline: {entry['deadline'] or 'none'}",
        f"  {views.held_line(entry['held']) if entry['held'] else 'Cost held: not reported'}",
        f"  Flow run: {entry['link'] or 'set PREFECT_UI_URL to get a link'}"
        f"{_form_does(entry['kind'])}",
        *([f"  Answer: {entry['command']}"] if entry["command"] else []),
    ]
    for line in lines:
        _console.print(line, markup=False, highlight=False, soft_wrap=True)
