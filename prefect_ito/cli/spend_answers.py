"""What a terminal does about a spend besides asking: read the quote, confirm it, or say why not.

:func:`prefect_ito.cli.terminal.confirm_at_terminal` asks the person; these act at the backend
with this terminal's own token, or answer for a command where nobody can be asked.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markdown import Markdown

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.stated import read_stated
from prefect_ito.cli.views import without_images
from prefect_ito.contract import TrainingQuote
from prefect_ito.exceptions import InsufficientScope, ItoAPIError
from prefect_ito.people.spend import SpendDecision
from prefect_ito.waiting.waits import QuoteWait

if TYPE_CHECKING:
    from prefect_ito.cli.terminal import SpendPause

__all__ = ["ConfirmedBeforehand", "NobodyHere", "confirm_quote_here", "stated_quote"]


async def stated_quote(record: QuoteWait) -> TrainingQuote | None:
    """Return the quote ``record`` names, as the backend states it; None if it cannot be read."""
    return await read_stated(record, lambda client: client.get_quote(record.quote_id))


async def confirm_quote_here(record: QuoteWait, note: str | None, console: Console) -> bool:
    """Confirm the recorded quote at the backend with this terminal's token; say what happened.

    Returns whether the backend took the confirmation. A token without ``spend:confirm`` (a
    workload's) is told where a person confirms instead.
    """
    credentials = ItoCredentials(api_url=record.api_url, keyring_entry=record.keyring_entry)
    try:
        async with credentials.get_client() as client:
            confirmed = await client.confirm_quote(
                record.quote_id, note=note, idempotency_key=f"confirm-{uuid.uuid4()}"
            )
    except InsufficientScope:
        console.print(
            "[yellow]This terminal's token may not confirm a spend (it lacks spend:confirm: "
            "log in as yourself with `prefect-ito login`). Confirm on the backend's page "
            "instead; the flow goes on when you do.[/]",
            soft_wrap=True,
        )
        return False
    except ItoAPIError as error:
        console.print(f"The backend refused the confirmation: {error}", markup=False)
        return False
    console.print(
        f"Confirmed at the backend as {confirmed.principal} (quote {record.quote_id}).",
        markup=False,
        soft_wrap=True,
    )
    return True


@dataclass(frozen=True)
class ConfirmedBeforehand:
    """The person confirmed a quote before the flow started (``train --confirm QUOTE_ID``).

    The flow's own quote carries that confirmation when nothing got worse, and it never pauses.
    If it pauses all the same, the backend asked again: this says why and leaves it waiting.
    """

    quote_id: str
    console: Console

    async def __call__(self, pause: SpendPause) -> SpendDecision | None:
        self.console.print(
            f"The backend asks for a confirmation again: quote {self.quote_id}, confirmed with "
            "--confirm, does not carry to the flow's quote. Nothing is submitted until a person "
            "confirms the new one.",
            markup=False,
            soft_wrap=True,
        )
        self.console.print(Markdown(without_images(pause.description)))
        return None


@dataclass(frozen=True)
class NobodyHere:
    """``train`` without a terminal or ``--confirm``: nobody here can confirm a spend.

    The flow asks only when the backend let no standing authorization cover the quote. Rather
    than wait for someone who is not there, the quote is declined (a quote is free; declining it
    spends nothing) and the command ends, saying how to confirm one.
    """

    console: Console

    async def __call__(self, pause: SpendPause) -> SpendDecision:
        self.console.print(
            "Nobody at this command can confirm the spend, and the backend let no standing "
            "authorization cover it: the quote is declined. To run it, `prefect-ito quote` with "
            "the same options, then `prefect-ito train … --confirm QUOTE_ID`.",
            markup=False,
            soft_wrap=True,
        )
        return SpendDecision(
            decision="decline",
            reason="prefect-ito train had no terminal, and no standing authorization covered it",
        )
