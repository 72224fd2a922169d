"""The decide page a pending action's ``decide_url`` names (contract v0.5, as device login).

A person opens it, signs in with their passphrase (or is signed in already, by a device login in
the same browser: :mod:`prefect_ito.simulator.person_session` holds the sign-in, the CSRF token,
the origin check, the throttle and the headers, for every page), enters or keeps the action's
code, reads the evidence as the backend states it — the loss spike, the proposed checkpoint, what
holding the run costs — and who asked (the principal that submitted the run, and the flow run it
was submitted for), then approves or rejects with a reason. The backend records the signed-in
person's principal as who decided. A code whose action no longer waits (decided, or its run
cancelled) says what became of it, and decides nothing. Every string shown is escaped.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse

from prefect_ito.contract import (
    NOTE_MAX_LENGTH,
    DecisionChoice,
    DecisionRequest,
    PendingAction,
    TrainingRun,
)
from prefect_ito.outcomes import ERROR_STATUS
from prefect_ito.simulator.code_page import CodePage, UserCode, table_html
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.identity import default_principal
from prefect_ito.simulator.ids import DECIDE_PAGE
from prefect_ito.simulator.person_session import PageSession, PersonFormDep
from prefect_ito.simulator.runs import DECIDED, RunRecord
from prefect_ito.simulator.state import SimState, SimStateDep

router = APIRouter(include_in_schema=False)

PAGE = CodePage(
    DECIDE_PAGE,
    ("decide a restart", "Decide a proposed restart"),
    code_label="Decision code",
    shows="the proposal",
    answer_fields=(
        '<label>Why (recorded with your decision) <input name="reason" '
        f'maxlength="{NOTE_MAX_LENGTH}" required>\n</label>\n'
        f'<label>Note (optional) <input name="note" maxlength="{NOTE_MAX_LENGTH}"></label>\n'
        '<button name="decision" value="approve" type="submit">Approve the restart</button>\n'
        '<button name="decision" value="reject" type="submit">Reject it</button>\n'
    ),
    signed_out="Sign in to see the restart your terminal or the Prefect UI shows.",
    signed_in="Check the code against the one your terminal or the Prefect UI shows.",
)
router.add_api_route(DECIDE_PAGE, PAGE.show, methods=["GET"], response_class=HTMLResponse)
Text = Annotated[str | None, Form(max_length=NOTE_MAX_LENGTH)]


def action_html(run: TrainingRun, action: PendingAction) -> str:
    """Return the proposal as the page shows it: the evidence, its cost, who asked; escaped."""
    rows = [("Backend run", run.run_id), ("Booking", run.booking_id), ("Stage", action.stage)]
    if action.loss is not None and action.baseline_loss is not None:
        times = f" ({action.loss / action.baseline_loss:.1f}×)" if action.baseline_loss else ""
        rows += [
            ("Loss spike", f"{action.loss:.2f} at step {action.step:,}"),
            ("Baseline loss", f"{action.baseline_loss:.2f}{times}"),
        ]
    checkpoint = action.proposed_checkpoint
    if checkpoint is not None:
        back = action.step - checkpoint.step
        rows.append(
            (
                "Restart from",
                f"{checkpoint.checkpoint_id}, step {checkpoint.step:,} ({back:,} back)",
            )
        )
    if action.deadline_at is not None and action.proposed_deadline_at is not None:
        rows += [
            ("Deadline now", f"{action.deadline_at:%Y-%m-%d %H:%M} UTC, at step {action.step:,}"),
            ("Proposed deadline", f"{action.proposed_deadline_at:%Y-%m-%d %H:%M} UTC"),
        ]
    if action.hold_usd_per_hour is not None:
        rows.append(("Holding the run costs", f"${action.hold_usd_per_hour:,.2f} an hour"))
    t = run.telemetry
    rows.append(("Spent so far", f"${t.spend_usd:,.2f} of ${t.budget_usd:,.2f}"))
    submitted_by = run.confirmation.submitted_by if run.confirmation else None
    rows += [
        ("Asked by", submitted_by or "not recorded"),
        ("For flow run", run.client_reference or "not named"),
    ]
    return table_html(rows)


@router.post(DECIDE_PAGE, response_class=HTMLResponse)
async def decide_answer(
    request: Request,
    state: SimStateDep,
    form: PersonFormDep,
    user_code: UserCode = "",
    decision: Annotated[Literal["approve", "reject"] | None, Form()] = None,
    reason: Text = None,
    note: Text = None,
) -> HTMLResponse:
    """Without a decision, show the signed-in person the proposal; with one, record it."""
    taken = PAGE.take_code(request, state, form, user_code, _held)
    if isinstance(taken, HTMLResponse):
        return taken
    session, (rec, action_id) = taken
    run, action = rec.snapshot(), rec.pending_action
    if action is None or action.action_id != action_id:
        # The form again, empty: the person may have another code to enter.
        return PAGE.answer(
            request, session, _gone(run, action_id), PAGE.code_form(session, ""), 409
        )
    shown = action_html(run, action)
    if decision is None or not (reason or "").strip():
        said = "Give a reason: it is recorded with your decision." if decision else ""
        body = shown + PAGE.answer_form(session, user_code)
        return PAGE.answer(request, session, f"Restart proposed for run {run.run_id}. {said}", body)
    return _record(request, state, session, rec, decision, reason or "", note)


def _held(state: SimState, session: PageSession, user_code: str) -> tuple[RunRecord, str] | None:
    """Return the signed-in person's run and the action the code names, pending or not; None
    for a code of another account's action."""
    named = state.engine.by_user_code(user_code)
    return named if named is not None and named[0].account == session.account else None


def _gone(run: TrainingRun, action_id: str) -> str:
    """Say what became of an action the code names that no longer waits for anyone."""
    decided = next((d for d in run.decisions if d.action_id == action_id), None)
    if decided is None:
        return f"This restart is no longer pending: run {run.run_id} is {run.state.value}."
    when = decided.decided_at.isoformat(timespec="seconds")
    who = decided.principal or "a person"
    return (
        f"This restart was already {DECIDED[decided.decision]} by {who} at {when} "
        f"(“{decided.reason}”). Nothing was changed."
    )


def _record(
    request: Request,
    state: SimState,
    session: PageSession,
    rec: RunRecord,
    decision: Literal["approve", "reject"],
    reason: str,
    note: str | None,
) -> HTMLResponse:
    """Record the signed-in person's decision, and say so."""
    assert session.account is not None  # see PAGE.take_code
    assert rec.pending_action is not None  # see decide_answer
    action = rec.pending_action
    principal = default_principal(session.account)
    body = DecisionRequest(
        decision=DecisionChoice(decision), reason=reason.strip(), decided_by=note or None
    )
    shown = action_html(rec.snapshot(), action)
    try:
        state.engine.decide(
            session.account, rec.run_id, action.action_id, body, None, principal=principal
        )
    except SimError as error:
        return PAGE.answer(request, session, error.message, shown, ERROR_STATUS[error.code])
    said = "Approved" if decision == "approve" else "Rejected"
    message = f"{said} as {principal}: return to your terminal or the Prefect UI."
    return PAGE.answer(request, session, message, shown)
