"""The confirm page a quote's ``confirm_url`` names (contract v0.4 draft, the device-login pattern).

A person opens it, signs in the way the simulator's device-login page identifies a person (by
the account typed; the principal is ``user:<account>``), reads the quote as the backend states it
(cost first: the estimate, the budget ceiling, the booking's term; then the manifest), and
confirms or declines. Every string shown is escaped: booking ids, data references, targets, notes
and accounts are whatever someone typed.
"""

from __future__ import annotations

from html import escape
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query
from fastapi.responses import HTMLResponse

from prefect_ito.contract import ERROR_STATUS, NOTE_MAX_LENGTH, QuoteAnswer, TrainingQuote
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.identity import default_principal
from prefect_ito.simulator.quotes import CONFIRM_PAGE
from prefect_ito.simulator.spend_routes import answer_quote
from prefect_ito.simulator.state import SimStateDep

router = APIRouter(include_in_schema=False)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Itô desk simulator: confirm a spend</title>
</head><body><h1>Confirm a training spend</h1><p>{message}</p>{body}</body></html>
"""
_SIGN_IN = """<form method="post" action="{action}">
<label>Quote code <input name="user_code" value="{user_code}" required></label>
<label>Account <input name="account" value="sim-user" required></label>
<button type="submit">Sign in</button>
</form>"""
_ANSWER = """<form method="post" action="{action}">
<input type="hidden" name="user_code" value="{user_code}">
<input type="hidden" name="account" value="{account}">
<label>Note (optional, e.g. your name) <input name="note" maxlength="{note_max}"></label>
<button name="decision" value="confirm" type="submit">Confirm</button>
<button name="decision" value="decline" type="submit">Decline</button>
</form>"""
UserCode = Annotated[str, Form(max_length=32)]
Account = Annotated[str, Form(min_length=1, max_length=128)]


def _page(message: str, body: str = "", status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(_PAGE.format(message=escape(message), body=body), status_code=status_code)


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def quote_html(quote: TrainingQuote) -> str:
    """Return the quote as the page shows it: cost first, then the manifest, all escaped."""
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
    answer = quote.confirmation
    if answer is not None:
        note = f" ({answer.note})" if answer.note else ""
        rows.append(("Answer", f"{answer.state} by {answer.principal}{note}"))
    table = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    warnings = "".join(f"<li>{escape(w)}</li>" for w in quote.warnings)
    return f"<table>{table}</table>" + (f"<ul>{warnings}</ul>" if warnings else "")


@router.get(CONFIRM_PAGE, response_class=HTMLResponse)
async def confirm_page(user_code: Annotated[str, Query(max_length=32)] = "") -> HTMLResponse:
    """The sign-in form: the quote's code and the person's account."""
    form = _SIGN_IN.format(action=CONFIRM_PAGE, user_code=escape(user_code))
    return _page("Sign in to see the quote your terminal shows.", form)


@router.post(CONFIRM_PAGE, response_class=HTMLResponse)
async def confirm_answer(
    state: SimStateDep,
    user_code: UserCode,
    account: Account,
    decision: Annotated[Literal["confirm", "decline"] | None, Form()] = None,
    note: Annotated[str | None, Form(max_length=NOTE_MAX_LENGTH)] = None,
) -> HTMLResponse:
    """Without a decision, show the signed-in person the quote; with one, record it."""
    held = state.engine.quotes.by_user_code(user_code)
    if held is None or held.account != account:
        form = _SIGN_IN.format(action=CONFIRM_PAGE, user_code=escape(user_code))
        return _page("That code names no quote of this account.", form, status_code=400)
    quote = held.stated(state.engine.real_now())
    if decision is None:
        form = _ANSWER.format(
            action=CONFIRM_PAGE,
            user_code=escape(user_code),
            account=escape(account),
            note_max=NOTE_MAX_LENGTH,
        )
        return _page(f"Quote {quote.quote_id}, state {quote.state}.", quote_html(quote) + form)
    answer = QuoteAnswer.CONFIRMED if decision == "confirm" else QuoteAnswer.DECLINED
    principal = default_principal(account)
    try:
        answer_quote(state, account, quote.quote_id, answer, principal, note or None)
    except SimError as error:
        return _page(error.message, quote_html(quote), status_code=ERROR_STATUS[error.code])
    said = "Confirmed" if answer is QuoteAnswer.CONFIRMED else "Declined"
    return _page(f"{said} as {principal}: return to your terminal.", quote_html(quote))
