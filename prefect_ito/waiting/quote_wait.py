"""The record of a quote a flow run waits on a person for, kept as an input of the flow run.

A flow run from a deployment suspends while a person confirms its spend at the backend: it holds
no process. Before it does, it writes a :class:`QuoteWait` — which backend, which quote — so that
``prefect-ito watch`` can resume it once the quote is confirmed or declined there, and so that the
flow, run again from the top, asks about the same quote (the same link and code a person may
already have open) instead of making a new one.

Anyone with Prefect API access can write such a record. Nothing in it is taken on trust: the
backend's URL must be one this process may send its token to
(:mod:`prefect_ito.backend.origins`), and the quote is read from the backend and used only if it
is this very request's (see :func:`prefect_ito.backend.desk.read_training_quote`) — and whether it
may be spent on is the backend's decision.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from uuid import UUID

from prefect import get_client
from prefect.exceptions import PrefectHTTPStatusError
from pydantic import ValidationError

from prefect_ito.waiting.deferral import BackendRecord
from prefect_ito.waiting.keys import QUOTE_RECORD_PREFIX

__all__ = ["QuoteWait", "latest_quote_wait", "record_quote_wait"]


class QuoteWait(BackendRecord):
    """Which quote a flow run waits on a person for, and at which backend; no secret."""

    quote_id: str
    manifest_digest: str
    expires_at: datetime


def record_key(quote_id: str) -> str:
    """Return the input key of the record for ``quote_id``: letters, digits and dashes."""
    return QUOTE_RECORD_PREFIX + hashlib.sha256(quote_id.encode()).hexdigest()[:20]


async def record_quote_wait(flow_run_id: UUID, record: QuoteWait) -> None:
    """Write the record, once per quote (a re-entry asking about the same quote keeps it)."""
    async with get_client() as client:
        try:
            await client.create_flow_run_input(
                flow_run_id, record_key(record.quote_id), record.model_dump_json()
            )
        except PrefectHTTPStatusError as error:
            if error.response.status_code != 409:  # written before, by this very flow run
                raise


async def latest_quote_wait(flow_run_id: UUID) -> QuoteWait | None:
    """Return the newest readable record of this flow run (by the server's clock), if any."""
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            flow_run_id, key_prefix=QUOTE_RECORD_PREFIX, limit=1000, exclude_keys=set()
        )
    newest: tuple[datetime, QuoteWait] | None = None
    for item in inputs:
        try:
            record = QuoteWait.model_validate_json(item.value)
        except ValidationError:
            continue  # not one of ours: someone wrote it by hand; it names nothing to wait on
        created = item.created
        if created is not None and (newest is None or created > newest[0]):
            newest = (created, record)
    return newest[1] if newest else None


def recheck_answer(why: str) -> dict[str, str]:
    """Return the answer that resumes a spend question the backend settled: read it again.

    Prefect resumes a pause that waits for a form only with an answer the form's schema takes
    (:class:`~prefect_ito.people.spend.SpendDecision`). A recheck decides nothing: the flow reads
    the quote from the backend, and asks again if nobody answered there. The watcher sends it
    once the quote is no longer pending; the flow itself, when it waits in-process.
    """
    return {"decision": "recheck", "reason": why}
