"""``prefect-ito confirm``: a person confirms or declines a quote, at the backend, as themselves.

Contract v0.4 keeps the authority to spend at the backend. ``confirm`` reads a quote, shows it
(cost first), and confirms it — or declines it — with this terminal's own token: the backend
records the principal that token speaks for, and only a person's token holds ``spend:confirm``.
Nothing here confirms a spend by itself: the backend decides, and records who did. Standing
authorizations, the other way a person stands behind a spend, are in
:mod:`prefect_ito.cli.authorizations`.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from cyclopts import Parameter
from pydantic import ValidationError
from rich.console import Console
from rich.markdown import Markdown
from rich.text import Text

from prefect_ito.backend.client import ItoClient
from prefect_ito.cli import output
from prefect_ito.cli.errors import respond
from prefect_ito.cli.local import check_id, interactive
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client
from prefect_ito.contract import (
    QuoteConfirmation,
    QuoteConfirmationRequest,
    QuoteState,
    TrainingQuote,
)
from prefect_ito.exceptions import (
    ConfirmationExpired,
    ConfirmationUsed,
    InsufficientScope,
    InvalidParameters,
    ItoAPIError,
    ItoError,
    NotConfirmed,
    QuoteAlreadyDecided,
    invalid_parameters,
)
from prefect_ito.reporting import cards
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.quote_card import describe

__all__ = ["confirm"]

_console = Console()
_ANSWERED: dict[QuoteState, tuple[type[ItoAPIError], str]] = {
    QuoteState.USED: (ConfirmationUsed, "it already made a run"),
    QuoteState.SUPERSEDED: (
        QuoteAlreadyDecided,
        "its confirmation carried to a newer quote of the same manifest",
    ),
    QuoteState.EXPIRED: (ConfirmationExpired, "ask for a new one with `prefect-ito quote`"),
    QuoteState.DECLINED: (QuoteAlreadyDecided, "it can never make a run"),
}
"""The states in which a quote takes no answer: the error and what the state means."""


# --- confirm ------------------------------------------------------------------------------------


def confirm(
    quote_id: Annotated[str, Parameter(help="The quote, as `quote` or the backend showed it.")],
    /,
    *,
    note: Annotated[
        str | None,
        Parameter(help="Kept at the backend beside your principal (at most 256 characters)."),
    ] = None,
    decline: Annotated[
        bool,
        Parameter(negative=(), help="Decline the quote instead: final, it never makes a run."),
    ] = False,
    yes: Annotated[
        bool,
        Parameter(
            name=["--yes", "-y"],
            negative=(),
            help="Confirm without asking; needed when no person is at the terminal.",
        ),
    ] = False,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Confirm a training quote at the backend as yourself (or decline it with --decline).

    Reads the quote from the backend and shows it, cost first; then asks "Confirm this spend?"
    (unless --yes) and confirms it with this terminal's token, which must be a person's own
    (scope spend:confirm). A quote already used, superseded, expired or declined is refused
    before anything is sent (exit code 10).
    """
    output.use_json(json_output)
    answer = _Answer(quote_id, note, decline=decline, yes=yes)
    respond(json_output, _confirm(answer, api_url, credentials), _show_answer)


class _Answer:
    """What the person asked ``confirm`` to do, checked before anything is sent."""

    def __init__(self, quote_id: str, note: str | None, *, decline: bool, yes: bool) -> None:
        self.quote_id, self.note, self.decline, self.yes = quote_id, note, decline, yes

    def check(self) -> None:
        check_id(self.quote_id, "quote_id")
        try:
            QuoteConfirmationRequest(note=self.note)
        except ValidationError as error:
            raise invalid_parameters(error) from None
        if not (self.yes or self.decline or interactive()):
            raise InvalidParameters(
                f"no person at this terminal to ask: pass --yes to confirm quote "
                f"{self.quote_id} (or --decline); nothing was sent",
                field="yes",
            )


async def _confirm(answer: _Answer, api_url: str | None, credentials: str | None) -> dict[str, Any]:
    """Read the quote, show it, and confirm or decline it at the backend."""
    answer.check()  # before anything reaches the backend
    async with await open_client(api_url, credentials) as client:
        quote = await client.get_quote(answer.quote_id)
        _print_quote(quote)
        _refuse_answered(quote, answer.decline)
        if not (answer.decline or answer.yes or _person_agrees()):
            raise NotConfirmed(
                f"not confirmed: quote {quote.quote_id} stays {_state(quote)}; nothing was sent "
                f"(confirm it later with `prefect-ito confirm {quote.quote_id}`, or decline it "
                "with --decline)"
            )
        confirmation = await _send(client, quote, answer)
        quote = await _read_again(client, quote)
    return {"quote": quote, "confirmation": confirmation}


def _state(quote: TrainingQuote) -> str:
    return quote.state.value if quote.state is not None else "unknown"


def _refuse_answered(quote: TrainingQuote, decline: bool) -> None:
    """Refuse a quote that can take no answer, naming its state; nothing is sent."""
    if quote.state is None or quote.state not in _ANSWERED:
        return
    if decline and quote.state is QuoteState.DECLINED:
        return  # the same answer again: the backend replays it (or names who declined)
    error, meaning = _ANSWERED[quote.state]
    raise error(f"quote {quote.quote_id} is {quote.state.value}: {meaning}; nothing was sent")


def _person_agrees() -> bool:
    """Ask the person at the terminal; anything but yes (the end of input too) is no."""
    try:
        # A Text, not a str: Rich would colour the brackets of a str as if they were code.
        reply = _console.input(Text("Confirm this spend? [y/N] "))
    except EOFError:
        return False
    return reply.strip().lower() in {"y", "yes"}


async def _send(client: ItoClient, quote: TrainingQuote, answer: _Answer) -> QuoteConfirmation:
    """Confirm or decline at the backend, under one idempotency key for this command's retries."""
    key = f"{'decline' if answer.decline else 'confirm'}-{uuid.uuid4()}"
    if answer.decline:
        return await client.decline_quote(quote.quote_id, note=answer.note, idempotency_key=key)
    try:
        return await client.confirm_quote(quote.quote_id, note=answer.note, idempotency_key=key)
    except InsufficientScope as error:
        raise InsufficientScope(
            _confirm_elsewhere(quote), status_code=error.status_code, request_id=error.request_id
        ) from None


def _confirm_elsewhere(quote: TrainingQuote) -> str:
    """Say where a person confirms when this token may not: their own login, or the page."""
    page = quote.confirm_url if quote.confirm_url and md.is_http_url(quote.confirm_url) else None
    where = f"open {page}" if page else "open the backend's confirm page"
    code = quote.user_code if quote.user_code and quote.user_code.isprintable() else None
    return (
        "this token may not confirm a spend (it lacks spend:confirm, which only a person's own "
        f"login holds): log in as yourself with `prefect-ito login`, or {where}"
        + (f" and enter the code {code}" if code else "")
        + "; nothing was confirmed"
    )


async def _read_again(client: ItoClient, quote: TrainingQuote) -> TrainingQuote:
    """Return the quote as it stands after the answer, or as read before if it cannot be read.

    The answer is recorded either way: a failed read must not make the command fail.
    """
    try:
        return await client.get_quote(quote.quote_id)
    except ItoError:
        return quote


def _print_quote(quote: TrainingQuote) -> None:
    text = describe(quote, quote.manifest, choices=False) if quote.manifest else _summary(quote)
    _console.print(Markdown(text))
    standing = (
        f"Quote {quote.quote_id} is {_state(quote)}; it expires {cards.when(quote.expires_at)}."
    )
    if quote.confirmation is not None:
        answered = quote.confirmation
        standing += f" {answered.state.value.capitalize()} by {answered.principal}."
    _console.print(standing, markup=False, highlight=False, soft_wrap=True)


def _summary(quote: TrainingQuote) -> str:
    """Return the quote in short, cost first, when the backend sent no manifest with it."""
    cost = quote.plan.cost_usd
    over = "" if quote.within_budget else " — **the estimate is above it**"
    who = quote.confirmation.principal if quote.confirmation else None
    return "\n".join(
        [
            f"### Spend on booking {md.code(quote.booking_id)}: ${cost.low:,.0f} to "
            f"${cost.high:,.0f} estimated, ${quote.budget_usd:,.2f} at most{over}",
            "",
            f"- state: {md.text(_state(quote))}" + (f", answered by {md.code(who)}" if who else ""),
            f"- the booking's term ends {cards.when(quote.term_end)}",
            f"- manifest digest: {md.code(quote.manifest_digest)}",
            "- the backend sent no manifest with it: model size and target are not shown",
        ]
    )


def _show_answer(result: dict[str, Any]) -> None:
    confirmation: QuoteConfirmation = result["confirmation"]
    done = confirmation.state.value
    line = f"{done.capitalize()} at the backend as {confirmation.principal}: quote "
    line += f"{confirmation.quote_id} ({confirmation.confirmation_id})."
    if done == "confirmed":
        line += " It may make one run; a submission names it."
    _console.print(line, markup=False, highlight=False, soft_wrap=True)
