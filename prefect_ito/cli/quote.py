"""``prefect-ito quote``: what ``train`` with the same options would run and may cost, read-only.

It verifies the booking, checks the backend can train, and asks the backend for a quote: the
plan, the estimate, the budget, the booking's term, when the quote expires, and the manifest
digest — with the exact ``prefect-ito train … --confirm QUOTE_ID`` that confirms that quote, once,
and runs it. A quote creates no work and spends nothing.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from typing import Annotated, Any

from cyclopts import Parameter
from rich.console import Console
from rich.markdown import Markdown

from prefect_ito.backend import desk
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.desk import BookingClaim
from prefect_ito.cli import output
from prefect_ito.cli.errors import respond
from prefect_ito.cli.options import CommandLineTraining, DataFile, backend_url, training_fields
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client
from prefect_ito.contract import TrainingQuote, TrainingRequest
from prefect_ito.reporting.quote_card import describe
from prefect_ito.request_fields import TrainingFields

__all__ = ["quote"]

_console = Console()


def quote(
    training: Annotated[CommandLineTraining, Parameter(name="*")],
    *,
    data_file: DataFile = None,
    credentials: CredentialsName = None,
    api_url: ApiUrl = None,
    json_output: JsonOption = False,
) -> None:
    """Show the plan, the estimate and the manifest digest `train` with these options would run.

    Creates a quote and nothing else: nothing is submitted and nothing is spent. Confirm it,
    once, with the printed `prefect-ito train … --confirm QUOTE_ID` (or on the backend's page).
    """
    output.use_json(json_output)
    fields = training_fields(training, data_file)
    url = backend_url(credentials, api_url)
    reads_a_block = url is None or fields.booking_block is not None
    with _prefect_api() if reads_a_block else contextlib.nullcontext():
        respond(json_output, _quote(fields, url, credentials), _show)


@contextlib.contextmanager
def _prefect_api() -> Iterator[None]:
    """Make Prefect's API ready: a saved block is read through it (Prefect is imported now)."""
    from prefect_ito.cli.temporary_prefect import prefect_api

    with prefect_api():
        yield


async def _quote(
    fields: TrainingFields[str], url: str | None, credentials: str | None
) -> dict[str, Any]:
    """Return the quote, the request it prices, and the command that confirms its manifest."""
    claim = await _claim(fields)
    request = fields.to_request(claim)
    async with await _client(url, credentials) as client:
        await desk.verify_booking(client, claim)
        await desk.check_training_capability(client, request)
        found = await desk.quote_training_run(client, request)
    return {
        "quote": found.model_dump(mode="json"),
        "request": request.model_dump(mode="json"),
        "confirm_command": _train_command(found.quote_id),
    }


async def _claim(fields: TrainingFields[str]) -> BookingClaim:
    """Return the booking claim: the id given, or what the saved ItoBooking block says."""
    if fields.booking is not None:
        return BookingClaim(booking_id=fields.booking)
    from prefect_ito.parameters import resolve_booking  # a saved block: only Prefect reads it

    return await resolve_booking(fields)


async def _client(url: str | None, credentials: str | None) -> ItoClient:
    """Return a client for ``url``, or for the saved ItoCredentials block ``credentials``."""
    if url is not None:
        return await open_client(url, None)
    from prefect_ito.blocks import resolve_credentials  # a saved block: only Prefect reads it

    return (await resolve_credentials(credentials)).get_client()


def _show(result: dict[str, Any]) -> None:
    found = TrainingQuote.model_validate(result["quote"])
    request = TrainingRequest.model_validate(result["request"])
    _console.print(Markdown(describe(found, request, choices=False)))
    _console.print(f"Quote {found.quote_id}; nothing was submitted and nothing was spent.")
    _console.print(f"Manifest digest: {found.manifest_digest}", soft_wrap=True)
    _console.print("To confirm this quote (once, while it stands) and run it:")
    _console.print(  # a command to copy: never broken across lines
        result["confirm_command"], markup=False, highlight=False, soft_wrap=True
    )


def _train_command(quote_id: str) -> str:
    """Return this very command as ``train``, confirming ``quote_id`` (``--json`` left out)."""
    arguments = sys.argv[sys.argv.index("quote") + 1 :] if "quote" in sys.argv else []
    kept = [argument for argument in arguments if argument != "--json"]
    return shlex.join(["prefect-ito", "train", *kept, "--confirm", quote_id])
