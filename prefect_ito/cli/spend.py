"""``prefect-ito confirm`` and ``authorizations``: a person's spend authority, at the backend.

Contract v0.4 keeps the authority to spend at the backend. ``confirm`` reads a quote, shows it
(cost first), and confirms it — or declines it — with this terminal's own token: the backend
records the principal that token speaks for, and only a person's token holds ``spend:confirm``.
``authorizations`` creates, lists and revokes standing authorizations (``spend:authorize``),
which a flow run with nobody to ask names through an ``ItoSpendAuthorization`` block. Nothing
here confirms or covers a spend by itself: the backend decides, and records who did.

Past ~400 lines on purpose: ``confirm`` and ``authorizations`` are a person's whole spend
authority at the backend, and their options, prompts and refusals read best side by side.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from cyclopts import App, Parameter
from pydantic import ValidationError
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from prefect_ito.backend.client import ItoClient
from prefect_ito.cli import output
from prefect_ito.cli.errors import respond
from prefect_ito.cli.local import check_id, interactive
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client
from prefect_ito.contract import (
    NewSpendLimits,
    QuoteConfirmation,
    QuoteConfirmationRequest,
    QuoteState,
    SpendAuthorization,
    SpendAuthorizationRequest,
    SpendLimits,
    TrainingQuote,
)
from prefect_ito.exceptions import (
    ConfirmationExpired,
    ConfirmationUsed,
    InsufficientScope,
    InvalidParameters,
    ItoAPIError,
    ItoError,
    QuoteAlreadyDecided,
    SpendDeclined,
    invalid_parameters,
)
from prefect_ito.reporting import cards
from prefect_ito.reporting import markdown as md
from prefect_ito.reporting.quote_card import describe

__all__ = ["authorizations", "confirm", "create", "list_authorizations", "revoke"]

authorizations = App(
    name="authorizations",
    help="Create, list and revoke standing spend authorizations at the backend (a person's "
    "token, scope spend:authorize).",
)

_console = Console()
_DURATION = re.compile(r"(\d+)([wdhms])")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
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
            raise SpendDeclined(
                f"not confirmed: quote {quote.quote_id} stays {_state(quote)}; nothing was sent"
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


# --- authorizations ------------------------------------------------------------------------------

Usd = Annotated[float | None, Parameter(negative=())]
Patterns = Annotated[list[str] | None, Parameter(negative=())]


@authorizations.command
def create(
    *,
    name: Annotated[str, Parameter(help="Your name for it; also the suggested block name.")],
    expires_in: Annotated[
        str | None, Parameter(help="How long it stands, such as 30d, 12h or 1w2d.")
    ] = None,
    expires_at: Annotated[
        str | None,
        Parameter(help="Instead: when it ends, ISO 8601 with a time zone (2026-12-31T18:00Z)."),
    ] = None,
    max_budget: Annotated[Usd, Parameter(help="Per run: the highest budget_usd (USD).")] = None,
    max_estimate: Annotated[
        Usd, Parameter(help="Per run: the highest estimate's high end (USD).")
    ] = None,
    model_size: Annotated[Patterns, Parameter(help="Per run: a model size covered.")] = None,
    target: Annotated[Patterns, Parameter(help="Per run: a target covered.")] = None,
    booking: Annotated[
        Patterns, Parameter(help="Per run: a booking id pattern, such as 'bk-nightly-*'.")
    ] = None,
    data: Annotated[
        Patterns,
        Parameter(
            help="Per run, required: a pattern each data reference must match, such as "
            "'s3://team-bucket/corpus/*' ('*' covers any data). Repeat it for more."
        ),
    ] = None,
    total_spend: Annotated[Usd, Parameter(help="In total: the covered budgets' sum (USD).")] = None,
    max_runs: Annotated[int | None, Parameter(help="In total: the most runs covered.")] = None,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Create a standing spend authorization at the backend, with its limits and expiry.

    Needs a person's own token (scope spend:authorize). Every limit given must hold for the
    backend to create a run under it; a limit left out does not restrict, but the data is never
    left out: name it with --data. Prints its id and the line that names it in a flow (an
    ItoSpendAuthorization block).
    """
    output.use_json(json_output)
    limits = {
        "max_budget_usd": max_budget,
        "max_estimate_high_usd": max_estimate,
        "model_sizes": model_size,
        "targets": target,
        "booking_id_patterns": booking,
        "data_ref_patterns": data,
        "total_spend_usd": total_spend,
        "max_runs": max_runs,
    }
    command = _create(name, (expires_in, expires_at), limits, api_url, credentials)
    respond(json_output, command, _show_created)


async def _create(
    name: str,
    expiry: tuple[str | None, str | None],
    limits: dict[str, Any],
    api_url: str | None,
    credentials: str | None,
) -> dict[str, Any]:
    request = _authorization_request(name, _expiry(*expiry), limits)  # before anything is sent
    async with await open_client(api_url, credentials) as client:
        created = await client.create_spend_authorization(
            request, idempotency_key=f"authorize-{uuid.uuid4()}"
        )
    return {"authorization": created, "block": _block_line(created)}


def _authorization_request(
    name: str, expires_at: datetime, limits: dict[str, Any]
) -> SpendAuthorizationRequest:
    """Return the request, its amounts checked here: finite and above 0, runs at least 1."""
    for field in ("max_budget_usd", "max_estimate_high_usd", "total_spend_usd"):
        value = limits[field]
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InvalidParameters(
                f"{field}: must be a finite amount above 0 (got {value:g})", field=field
            )
    if limits["max_runs"] is not None and limits["max_runs"] < 1:
        raise InvalidParameters(
            f"max_runs: must be at least 1 (got {limits['max_runs']})", field="max_runs"
        )
    if not name.strip():
        raise InvalidParameters("name: must not be empty", field="name")
    if not limits["data_ref_patterns"]:
        raise InvalidParameters(
            "data_ref_patterns: name the data it covers with --data PATTERN (such as --data "
            "'s3://team-bucket/corpus/*'; --data '*' covers any data, on purpose)",
            field="data_ref_patterns",
        )
    try:
        return SpendAuthorizationRequest(
            name=name, limits=NewSpendLimits(**limits), expires_at=expires_at
        )
    except ValidationError as error:
        raise invalid_parameters(error) from None


def _expiry(expires_in: str | None, expires_at: str | None) -> datetime:
    """Return when the authorization ends: one of the two options, in the future."""
    if (expires_in is None) == (expires_at is None):
        raise InvalidParameters("give exactly one of --expires-in and --expires-at")
    now = datetime.now(UTC)
    if expires_in is not None:
        field, moment = "expires_in", now + _duration(expires_in)
    else:
        field, moment = "expires_at", _moment(expires_at or "")
    if moment <= now:
        raise InvalidParameters(f"{field}: {moment.isoformat()} is not in the future", field=field)
    return moment


def _duration(text: str) -> timedelta:
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise InvalidParameters(
            f"expires_in: {text!r} is not a duration such as 30d, 12h or 1w2d (w, d, h, m, s)",
            field="expires_in",
        )
    try:
        return sum((timedelta(**{_UNITS[u]: int(n)}) for n, u in parts), timedelta())
    except OverflowError:
        raise InvalidParameters(f"expires_in: {text!r} is too long", field="expires_in") from None


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InvalidParameters(
            f"expires_at: {text!r} is not an ISO 8601 time with a time zone, such as "
            "2026-12-31T18:00Z",
            field="expires_at",
        )
    return moment


def _block_line(created: SpendAuthorization) -> str:
    """Return the Python that names the authorization in a flow (block names are slugs)."""
    slug = re.sub(r"[^a-z0-9]+", "-", created.name.lower()).strip("-") or "spend-authorization"
    return f'ItoSpendAuthorization(authorization_id="{created.authorization_id}").save("{slug}")'


def _show_created(result: dict[str, Any]) -> None:
    created: SpendAuthorization = result["authorization"]
    _say(
        f"Created standing authorization {created.authorization_id} ({created.name!r}) at the "
        f"backend, by {created.principal}; it expires {cards.when(created.expires_at)}."
    )
    _say(f"Data: {_data(created.limits)}.")
    _say(f"Limits: {_limits(created.limits)}.")
    _say("To name it in a flow (from prefect_ito.blocks):")
    _say(result["block"])


def _say(line: str) -> None:
    _console.print(line, markup=False, highlight=False, soft_wrap=True)


def _limits(limits: SpendLimits) -> str:
    """Return the limits but the data in one line; those left out are not shown (they do not
    restrict)."""
    shown = [
        f"budget ≤ ${limits.max_budget_usd:,.2f}" if limits.max_budget_usd else "",
        f"estimate ≤ ${limits.max_estimate_high_usd:,.2f}" if limits.max_estimate_high_usd else "",
        f"model sizes {', '.join(limits.model_sizes)}" if limits.model_sizes else "",
        f"targets {', '.join(limits.targets)}" if limits.targets else "",
        f"bookings {', '.join(limits.booking_id_patterns)}" if limits.booking_id_patterns else "",
        f"total spend ≤ ${limits.total_spend_usd:,.2f}" if limits.total_spend_usd else "",
        f"at most {limits.max_runs} runs" if limits.max_runs else "",
    ]
    return "; ".join(part for part in shown if part) or "none"


def _data(limits: SpendLimits) -> str:
    """Return the data an authorization covers; one made before v0.5 names none, so covers none."""
    if limits.data_ref_patterns is None:
        return "none named: it covers no run"
    return ", ".join(limits.data_ref_patterns)


@authorizations.command(name="list")
def list_authorizations(
    *,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """List the account's standing authorizations, newest first, with what each has used."""
    respond(json_output, _list(api_url, credentials), _show_list)


async def _list(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    async with await open_client(api_url, credentials) as client:
        return {"authorizations": await client.list_spend_authorizations()}


def _show_list(result: dict[str, Any]) -> None:
    found: list[SpendAuthorization] = result["authorizations"]
    if not found:
        _console.print("No standing authorizations for this account.")
        return
    table = Table(title="Standing spend authorizations", title_justify="left")
    table.add_column("id", no_wrap=True)  # an id to copy: never broken or cut
    for column in ("name", "state", "created by", "data", "limits", "used", "expires"):
        table.add_column(column)
    for item in found:
        table.add_row(
            escape(item.authorization_id),
            escape(item.name),
            escape(item.state.value),
            escape(item.principal),
            escape(_data(item.limits)),
            escape(_limits(item.limits)),
            f"{item.used.runs} runs, ${item.used.spend_usd:,.2f}",
            cards.when(item.expires_at),
        )
    _console.print(table)


@authorizations.command
def revoke(
    authorization_id: Annotated[str, Parameter(help="The authorization's id (sa_…).")],
    /,
    *,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Revoke a standing authorization at the backend: it covers no new run from now on.

    Needs a person's own token (scope spend:authorize). Revoking again changes nothing.
    """
    respond(json_output, _revoke(authorization_id, api_url, credentials), _show_revoked)


async def _revoke(
    authorization_id: str, api_url: str | None, credentials: str | None
) -> dict[str, Any]:
    check_id(authorization_id, "authorization_id")  # before anything reaches the backend
    async with await open_client(api_url, credentials) as client:
        return {"authorization": await client.revoke_spend_authorization(authorization_id)}


def _show_revoked(result: dict[str, Any]) -> None:
    revoked: SpendAuthorization = result["authorization"]
    by = f" by {revoked.revoked_by}" if revoked.revoked_by else ""
    at = f" at {cards.when(revoked.revoked_at)}" if revoked.revoked_at else ""
    _say(
        f"Standing authorization {revoked.authorization_id} ({revoked.name!r}) is "
        f"{revoked.state.value}{by}{at}: it covers no new run."
    )
