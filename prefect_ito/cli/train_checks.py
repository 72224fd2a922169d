"""What ``train`` settles before its flow runs: the checks that need no Prefect server, and who
confirms the spend.

Everything here is asked before Prefect's temporary server starts when no saved block is
named (see ``train`` in :mod:`prefect_ito.cli.training`): a malformed ``--confirm``, a manifest
digest given for a quote id, a backend that is down, or a quote that cannot be confirmed ends
the command in seconds, in one line.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from prefect_ito.backend import desk, ownership
from prefect_ito.backend.operations import resend
from prefect_ito.blocks import ItoCredentials, resolve_authorization, resolve_credentials
from prefect_ito.cli import terminal
from prefect_ito.contract import QuoteState, TrainingRequest
from prefect_ito.exceptions import (
    BackendUnavailable,
    ConfirmationExpired,
    ConfirmationMismatch,
    ConfirmationRequired,
    ConfirmationUsed,
    InvalidParameters,
    ItoAPIError,
    ItoError,
    RateLimited,
)
from prefect_ito.parameters import TrainingParameters, check_id, resolve_booking

__all__ = [
    "Spend",
    "check_backend",
    "checked_id",
    "confirm_beforehand",
    "nobody_to_confirm",
    "spend_confirmer",
]

_console = Console()
_logger = logging.getLogger("prefect_ito.cli")


def checked_id(confirm: str) -> InvalidParameters | None:
    try:
        check_id(confirm, "confirm")
    except InvalidParameters as error:
        return error
    return None


def _check_confirm(confirm: str, digest: str) -> ItoError | None:
    """Return what is wrong with ``--confirm`` for the request of manifest ``digest``, as far
    as it can be told without a request: a manifest digest is no quote id, and whether it is
    this request's is known here."""
    if not _DIGEST.fullmatch(confirm):
        return None
    if digest != confirm:
        return ConfirmationMismatch(
            f"--confirm {confirm} is the manifest digest of another request: nothing was sent; "
            "`prefect-ito quote` with the same options makes this one's quote",
            field="confirm",
        )
    return InvalidParameters(
        f"--confirm takes a quote's id, not a manifest digest ({confirm}): `prefect-ito quote` "
        "with the same options prints the quote id and the command that confirms it",
        field="confirm",
    )


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


async def check_backend(
    parameters: TrainingParameters,
    where: ItoCredentials | None,
    confirm: str | None,
    note: str | None,
) -> None:
    """Ask the backend what it can tell before a flow run exists; with ``--confirm``, confirm.

    Raises:
        ItoTransportError: the backend did not answer (its URL is named).
        ConfirmationMismatch, ConfirmationUsed, ConfirmationExpired: see :func:`confirm_beforehand`.
    """
    request = parameters.to_request(await resolve_booking(parameters))
    credentials = await resolve_credentials(where)
    if confirm is not None and (error := _check_confirm(confirm, request.digest())) is not None:
        raise error
    await _probe(credentials)
    if confirm is not None:
        await confirm_beforehand(credentials, request, confirm, note, parameters.idempotency_key)


async def _probe(credentials: ItoCredentials) -> None:
    """Ask the backend once whether it answers; raise ``ItoTransportError`` if it does not.

    Only whether it answers: what it answers is the flow's to judge, in a flow run that records
    it (a backend that cannot train ends the run Unavailable, with its summary). One attempt, so
    that a backend that is down is one line within the connect timeout rather than after the
    client's retries; a backend busy for a moment (503, 429) did answer, and the flow's own
    calls retry it as usual.
    """
    async with credentials.get_client(max_retries=0) as client:
        with contextlib.suppress(BackendUnavailable, RateLimited):
            await client.get_capabilities()


def nobody_to_confirm() -> ItoAPIError:
    return ConfirmationRequired(
        "nothing was sent: without a terminal nobody can confirm the spend. Run `prefect-ito "
        "quote` with the same options, check the plan and the estimate, then run this command "
        "again with `--confirm QUOTE_ID`, or name a standing authorization with --authorization"
    )


@dataclass(frozen=True)
class Spend:
    """What ``train``'s options say about the spend: a quote to confirm, a note, an
    authorization block's name."""

    confirm: str | None
    note: str | None
    authorization: str | None


async def spend_confirmer(
    parameters: TrainingParameters,
    flow_parameters: dict[str, Any],
    spend: Spend,
    confirmed: str | None,
) -> terminal.Confirmer | None:
    """Return who acts on the flow's spend confirmation here; with ``--confirm``, confirm first
    (unless ``confirmed`` says it was, before Prefect's API was started).

    A named authorization block is loaded first, so that a broken one is one line before
    anything is sent (what it names is the backend's to judge).

    Raises:
        InvalidParameters: the authorization block is missing or its data is broken.
        ConfirmationMismatch: ``--confirm`` names a quote of another request.
        ConfirmationUsed, ConfirmationExpired: the quote can make no run any more.
        InsufficientScope: this token may not confirm a spend (it is not a person's).
    """
    await resolve_authorization(spend.authorization)
    if spend.confirm is not None:
        if confirmed is None:
            request = parameters.to_request(await resolve_booking(parameters))
            if (error := _check_confirm(spend.confirm, request.digest())) is not None:
                raise error
            credentials = await resolve_credentials(flow_parameters["credentials"])
            await confirm_beforehand(
                credentials, request, spend.confirm, spend.note, parameters.idempotency_key
            )
        return terminal.ConfirmedBeforehand(spend.confirm, _console)
    if terminal.interactive():
        return terminal.confirm_at_terminal
    # The backend decides on the authorization; if it says no, nobody here could confirm.
    return terminal.NobodyHere(_console)


async def confirm_beforehand(
    credentials: ItoCredentials,
    request: TrainingRequest,
    quote_id: str,
    note: str | None,
    idempotency_key: str | None = None,
) -> None:
    """Confirm ``quote_id`` at the backend for exactly ``request``; refuse anything else.

    A quote that already made its run under ``idempotency_key`` (the same command, run again
    after its process was killed) is not confirmed again: the flow follows that run. A busy
    backend (503, 429) is asked again as the flow's own steps are, once the client's retries are
    spent: it answered, so the command goes on.

    Raises:
        ConfirmationMismatch: the quote is another request's.
        ConfirmationUsed, ConfirmationExpired, QuoteAlreadyDecided: it can make no run now.
    """
    check_id(quote_id, "confirm")
    # One key for every attempt: a confirmation resent after a storm is made once.
    key = f"confirm-{uuid.uuid4()}"
    await resend(
        lambda: _confirm(credentials, request, quote_id, note, idempotency_key, key), _logger
    )


async def _confirm(
    credentials: ItoCredentials,
    request: TrainingRequest,
    quote_id: str,
    note: str | None,
    idempotency_key: str | None,
    key: str,
) -> None:
    async with credentials.get_client() as client:
        # Fail closed first: a backend that cannot train is told nothing, not even a yes.
        await desk.check_training_capability(client, request)
        quote = await client.get_quote(quote_id)
        mismatch = desk.quote_mismatch(quote, request)
        if mismatch is not None:
            raise ConfirmationMismatch(
                f"--confirm {quote_id} is a quote of another request (it has {mismatch[1]}): "
                "nothing was sent; `prefect-ito quote` with the same options makes this one's",
                field="confirm",
            )
        if quote.state not in (QuoteState.PENDING, QuoteState.CONFIRMED):
            made = await ownership.find_keyed_run(client, request, idempotency_key)
            if made is not None:
                _console.print(
                    f"Quote {quote_id} already made backend run {made.run_id}: following it; "
                    "nothing is confirmed or submitted again.",
                    markup=False,
                    soft_wrap=True,
                )
                return
            state = quote.state.value if quote.state else "unknown"
            error = ConfirmationExpired if quote.state is QuoteState.EXPIRED else ConfirmationUsed
            raise error(
                f"--confirm {quote_id}: the quote is {state}, and makes no run any more: nothing "
                "was sent; `prefect-ito quote` with the same options makes a new one",
                field="confirm",
            )
        confirmed = await client.confirm_quote(quote_id, note=note, idempotency_key=key)
    _console.print(
        f"Confirmed quote {quote_id} at the backend as {confirmed.principal}: up to "
        f"${quote.plan.cost_usd.high:,.0f} estimated, ${request.budget_usd:,.2f} at most.",
        markup=False,
        soft_wrap=True,
    )
