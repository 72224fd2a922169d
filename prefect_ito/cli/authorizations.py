"""``prefect-ito authorizations``: standing spend authorizations, created, listed and revoked.

A person creates one at the backend with their own token (``spend:authorize``), and a flow run
with nobody to ask names it through an ``ItoSpendAuthorization`` block. Its limits live at the
backend, which checks them when a submission names it; nothing here covers a spend by itself.
``revoke`` takes an authorization's id, or its name when no other of the account's has it.
"""

from __future__ import annotations

import contextlib
import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from cyclopts import App, Parameter
from pydantic import ValidationError
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from prefect_ito.cli import output
from prefect_ito.cli.errors import respond
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client
from prefect_ito.contract import (
    NewSpendLimits,
    SpendAuthorization,
    SpendAuthorizationRequest,
    SpendLimits,
    id_problem,
    shown,
)
from prefect_ito.exceptions import (
    InvalidParameters,
    SpendAuthorizationNotFound,
    invalid_parameters,
)
from prefect_ito.reporting import cards

__all__ = ["authorizations", "create", "list_authorizations", "revoke"]

authorizations = App(
    name="authorizations",
    help="Create, list and revoke standing spend authorizations at the backend (a person's "
    "token, scope spend:authorize).",
)


def _console() -> Console:
    # Made when printing, so that it is as wide as the terminal is then (COLUMNS included).
    return Console()


_DURATION = re.compile(r"(\d+)([wdhms])")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}

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
    _console().print(line, markup=False, highlight=False, soft_wrap=True)


def _limits(limits: SpendLimits) -> str:
    """Return the limits but the data in one line; those left out are not shown (they do not
    restrict)."""
    parts = [
        f"budget ≤ ${limits.max_budget_usd:,.2f}" if limits.max_budget_usd else "",
        f"estimate ≤ ${limits.max_estimate_high_usd:,.2f}" if limits.max_estimate_high_usd else "",
        f"model sizes {', '.join(limits.model_sizes)}" if limits.model_sizes else "",
        f"targets {', '.join(limits.targets)}" if limits.targets else "",
        f"bookings {', '.join(limits.booking_id_patterns)}" if limits.booking_id_patterns else "",
        # The contract's "total spend" adds up the covered runs' budgets, not what they spent.
        f"budgets ≤ ${limits.total_spend_usd:,.2f} in all" if limits.total_spend_usd else "",
        f"at most {limits.max_runs} runs" if limits.max_runs else "",
    ]
    return "; ".join(part for part in parts if part) or "none"


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
    """List the account's standing authorizations, newest first, with the runs each covered."""
    respond(json_output, _list(api_url, credentials), _show_list)


async def _list(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    async with await open_client(api_url, credentials) as client:
        return {"authorizations": await client.list_spend_authorizations()}


def _show_list(result: dict[str, Any]) -> None:
    """Print each authorization as a heading and its facts below it, one per line.

    Not one table row each: eight columns leave a few characters each at 80 columns, and the
    limits would be cut into a column of single words.
    """
    found: list[SpendAuthorization] = result["authorizations"]
    if not found:
        _console().print("No standing authorizations for this account.")
        return
    _say(f"Standing spend authorizations of this account, newest first ({len(found)}):")
    console = _console()
    for item in found:
        console.print()
        # Text, not markup: a name is whatever its person typed (shown quoted, as revoke takes
        # it). The id has no space, so it is never broken.
        state = f"{item.state.value}, expires {cards.when(item.expires_at)}"
        console.print(Text(f"{item.authorization_id}  {item.name!r}  {state}"), highlight=False)
        console.print(Padding(_facts(item), (0, 0, 0, 2), expand=False))


def _facts(item: SpendAuthorization) -> Table:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(no_wrap=True)
    facts.add_column(overflow="fold")  # a long pattern breaks where it must, never cut short
    for label, value in (
        ("created by", item.principal),
        ("data", _data(item.limits)),
        ("limits", _limits(item.limits)),
        ("covered", _covered(item)),
    ):
        facts.add_row(label, Text(value))
    return facts


def _covered(item: SpendAuthorization) -> str:
    """Return what the backend counted against the authorization: runs, and their budgets.

    The contract's ``used.spend_usd`` adds up the covered runs' budgets (what its total limit
    counts), not what the runs spent, so it is named as budgets.
    """
    runs = item.used.runs
    if runs == 0:
        return "no run so far"
    return (
        f"{runs} run{'' if runs == 1 else 's'} so far, whose budgets add up to "
        f"${item.used.spend_usd:,.2f}"
    )


@authorizations.command
def revoke(
    authorization: Annotated[
        str,
        Parameter(
            help="The authorization's id (sa_…), or its name when no other of the account's "
            "standing authorizations has that name."
        ),
    ],
    /,
    *,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Revoke a standing authorization at the backend: it covers no new run from now on.

    Takes its id, or its name as `authorizations list` shows it when exactly one of the
    account's authorizations has that name (an id is tried first). Needs a person's own token
    (scope spend:authorize). Revoking again changes nothing.
    """
    respond(json_output, _revoke(authorization, api_url, credentials), _show_revoked)


async def _revoke(wanted: str, api_url: str | None, credentials: str | None) -> dict[str, Any]:
    if not wanted.strip():  # before anything reaches the backend
        raise InvalidParameters(
            "authorization: give its id (sa_…) or its name", field="authorization"
        )
    async with await open_client(api_url, credentials) as client:
        if id_problem(wanted) is None:
            # An id first: it needs no other scope, and an id names one authorization for sure.
            with contextlib.suppress(SpendAuthorizationNotFound):
                return {"authorization": await client.revoke_spend_authorization(wanted)}
        named = _named(await client.list_spend_authorizations(), wanted)
        return {"authorization": await client.revoke_spend_authorization(named)}


def _named(found: list[SpendAuthorization], name: str) -> str:
    """Return the id of the one authorization named ``name``; refuse none, or more than one."""
    matching = [item for item in found if item.name == name]
    if not matching:
        raise SpendAuthorizationNotFound(
            f"no standing authorization of this account has the id or name {shown(name)} "
            "(`prefect-ito authorizations list` shows them); nothing was revoked",
            field="authorization",
        )
    if len(matching) > 1:
        ids = ", ".join(f"{item.authorization_id} ({item.state.value})" for item in matching)
        raise InvalidParameters(
            f"authorization: {len(matching)} standing authorizations are named {shown(name)}: "
            f"{ids}; revoke one by its id; nothing was revoked",
            field="authorization",
        )
    return matching[0].authorization_id


def _show_revoked(result: dict[str, Any]) -> None:
    revoked: SpendAuthorization = result["authorization"]
    by = f" by {revoked.revoked_by}" if revoked.revoked_by else ""
    at = f" at {cards.when(revoked.revoked_at)}" if revoked.revoked_at else ""
    _say(
        f"Standing authorization {revoked.authorization_id} ({revoked.name!r}) is "
        f"{revoked.state.value}{by}{at}: it covers no new run."
    )
