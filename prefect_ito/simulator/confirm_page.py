"""The confirm page a quote's ``confirm_url`` names (contract v0.4, the device-login pattern).

A person opens it, signs in with their passphrase (or is signed in already, by a device login in
the same browser: ``person_session.py`` holds the sign-in, the CSRF token, the origin check, the
throttle and the headers, for every page), enters or keeps the quote's code, reads the quote as
the backend states it (cost first: the estimate, the budget ceiling, the booking's term; then the
manifest), and confirms or declines. Every string shown is escaped: booking ids, data
references, targets, notes and accounts are whatever someone typed.
"""

from __future__ import annotations

from html import escape
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse

from prefect_ito.contract import NOTE_MAX_LENGTH, QuoteAnswer, TrainingQuote
from prefect_ito.outcomes import ERROR_STATUS
from prefect_ito.simulator.code_page import CodePage, UserCode, table_html
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.identity import default_principal
from prefect_ito.simulator.ids import CONFIRM_PAGE
from prefect_ito.simulator.person_session import PageSession, PersonFormDep
from prefect_ito.simulator.quotes import HeldQuote
from prefect_ito.simulator.spend_routes import answer_quote
from prefect_ito.simulator.state import SimState, SimStateDep

router = APIRouter(include_in_schema=False)

PAGE = CodePage(
    CONFIRM_PAGE,
    ("confirm a spend", "Confirm a training spend"),
    code_label="Quote code",
    shows="the quote",
    answer_fields=(
        '<label>Note (optional, e.g. your name) <input name="note" '
        f'maxlength="{NOTE_MAX_LENGTH}"></label>\n'
        '<button name="decision" value="confirm" type="submit">Confirm</button>\n'
        '<button name="decision" value="decline" type="submit">Decline</button>\n'
    ),
    signed_out="Sign in to see the quote your terminal shows.",
    signed_in="Check the code against the one your terminal shows.",
)
router.add_api_route(CONFIRM_PAGE, PAGE.show, methods=["GET"], response_class=HTMLResponse)


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def quote_html(quote: TrainingQuote, held: HeldQuote | None = None) -> str:
    """Return the quote as the page shows it: cost first, then the manifest, then who asked for
    it (``held``'s record), all escaped."""
    plan = quote.plan
    term = "ends before" if quote.ends_before_term else "MAY OUTLAST"
    rows = [
        ("Estimated cost", f"{_usd(plan.cost_usd.low)} – {_usd(plan.cost_usd.high)}"),
        ("Budget ceiling", _usd(quote.budget_usd)),
        ("Booking's term", f"ends {quote.term_end.isoformat()}; the run {term} it"),
        (
            "Estimated duration",
            f"{plan.duration_hours.low:,.1f} – {plan.duration_hours.high:,.1f} h",
        ),
        ("GPU hours", f"{plan.gpu_hours.low:,.0f} – {plan.gpu_hours.high:,.0f}"),
    ]
    manifest = quote.manifest
    if manifest is not None:
        rows += [
            ("Booking", manifest.booking_id),
            ("Model size", manifest.model_size),
            ("Target", manifest.target),
            ("Data", ", ".join(manifest.data_refs)),
            ("Post-training", manifest.post_training.value if manifest.post_training else "none"),
        ]
    rows += [
        ("Manifest digest", quote.manifest_digest),
        ("Quote expires", quote.expires_at.isoformat()),
    ]
    if held is not None:
        rows += [
            ("Asked by", held.asked_by or "not recorded"),
            ("For flow run", held.flow_run or "not named"),
        ]
    answer = quote.confirmation
    if answer is not None:
        note = f" ({answer.note})" if answer.note else ""
        rows.append(("Answer", f"{answer.state} by {answer.principal}{note}"))
    warnings = "".join(f"<li>{escape(w)}</li>" for w in quote.warnings)
    return table_html(rows) + (f"<ul>{warnings}</ul>" if warnings else "")


@router.post(CONFIRM_PAGE, response_class=HTMLResponse)
async def confirm_answer(
    request: Request,
    state: SimStateDep,
    form: PersonFormDep,
    user_code: UserCode = "",
    decision: Annotated[Literal["confirm", "decline"] | None, Form()] = None,
    note: Annotated[str | None, Form(max_length=NOTE_MAX_LENGTH)] = None,
) -> HTMLResponse:
    """Without a decision, show the signed-in person the quote; with one, record it."""
    taken = PAGE.take_code(request, state, form, user_code, _held)
    if isinstance(taken, HTMLResponse):
        return taken
    session, held = taken
    quote = held.stated(state.engine.real_now())
    if decision is None:
        shown = quote_html(quote, held) + PAGE.answer_form(session, user_code)
        return PAGE.answer(request, session, f"Quote {quote.quote_id}, state {quote.state}.", shown)
    return _record(request, state, session, quote, decision, note)


def _held(state: SimState, session: PageSession, user_code: str) -> HeldQuote | None:
    """Return the signed-in person's quote the code names, if it is theirs."""
    held = state.engine.quotes.by_user_code(user_code)
    return held if held is not None and held.account == session.account else None


def _record(
    request: Request,
    state: SimState,
    session: PageSession,
    quote: TrainingQuote,
    decision: Literal["confirm", "decline"],
    note: str | None,
) -> HTMLResponse:
    """Record the signed-in person's answer to the quote, and say so."""
    assert session.account is not None  # PAGE.take_code signed them in
    answer = QuoteAnswer.CONFIRMED if decision == "confirm" else QuoteAnswer.DECLINED
    principal = default_principal(session.account)
    try:
        answer_quote(state, session.account, quote.quote_id, answer, principal, note or None)
    except SimError as error:
        return PAGE.answer(
            request, session, error.message, quote_html(quote), ERROR_STATUS[error.code]
        )
    # A quote is asked by a terminal or by a deployment's flow run that nobody watches: both
    # learn the answer from the backend, so the person has nowhere they must go back to.
    if answer is QuoteAnswer.CONFIRMED:
        message = f"Confirmed as {principal}: the run that asked goes on by itself."
    else:
        message = f"Declined as {principal}: the run that asked ends, and nothing is spent."
    return PAGE.answer(request, session, message, quote_html(quote))
