"""A spend to confirm: the backend quoted a run and holds it until a person confirms the quote
at the backend (its confirm page, or ``prefect-ito confirm``), or a standing authorization covers
it. Asking it is :mod:`prefect_ito.people.spend`'s; what any place needs of it is here."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar
from uuid import UUID

from prefect_ito.questions.commands import confirm_command
from prefect_ito.questions.registry import Kind, Question, register
from prefect_ito.waiting.keys import SPEND_PREFIX

if TYPE_CHECKING:
    from prefect_ito.waiting.waits import WaitRecord

__all__ = ["SPEND"]

_QUOTE_IN_COMMAND = re.compile(r"prefect-ito confirm ([A-Za-z0-9_.:-]{1,128})")
"""A quote id, as a flow run's record names it in its command: only an id's characters."""


class Spend(Question):
    """A spend to confirm at the backend."""

    name: ClassVar[Kind] = "spend"
    form_does: ClassVar[str] = (
        " (its form can only decline, or recheck once confirmed at the backend: a person "
        "confirms on the backend's page, which the form names, or with the command below)"
    )

    @property
    def pause_prefix(self) -> str:
        return SPEND_PREFIX

    @property
    def record(self) -> type[WaitRecord]:
        from prefect_ito.waiting.waits import QuoteWait  # reads Prefect: imported when asked

        return QuoteWait

    def command(self, flow_run_id: UUID | str, recorded: str | None) -> str | None:
        # The record is anyone's to write: only a quote id is taken from it, never its words.
        found = _QUOTE_IN_COMMAND.match(recorded or "")
        return confirm_command(found.group(1)) if found else None


SPEND = register(Spend())
