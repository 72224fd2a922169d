"""The records of what a suspended flow run waits on a person for, kept as its flow-run inputs.

A flow run from a deployment suspends while a person answers at the backend — confirms a spend
(a quote) or decides a proposed restart (a run's pending action) — and holds no process meanwhile.
Before it does, it writes a record: which backend, which quote or action. ``prefect-ito watch``
resumes it once the backend says the question was answered, and the flow, run again from the top,
asks about the same quote (the same link and code a person may already have open) instead of
making a new one.

Anyone with Prefect API access can write such a record. Nothing in it is taken on trust: the
backend's URL must be one this process may send its token to
(:mod:`prefect_ito.backend.origins`), what it names is read from the backend, the flow acts only
on its own quote or run (:mod:`prefect_ito.backend.ownership`), and what a person answered is the
backend's to say. A forged record at most resumes a flow run with ``recheck``, which decides
nothing.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from prefect import State, get_client
from prefect.exceptions import PrefectHTTPStatusError
from pydantic import ValidationError

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.refusals import Uncovered
from prefect_ito.contract import ChangePage, PendingAction, QuoteState
from prefect_ito.exceptions import QuoteNotFound, RunNotFound
from prefect_ito.waiting.deferral import BackendRecord
from prefect_ito.waiting.keys import ACTION_RECORD_PREFIX, QUOTE_RECORD_PREFIX

__all__ = [
    "DEADLINE_GRACE_SECONDS",
    "ActionWait",
    "QuoteWait",
    "WaitRecord",
    "all_waits",
    "latest_wait",
    "question_deadline",
    "recheck_answer",
    "record_wait",
]

DEADLINE_GRACE_SECONDS = 300
"""How long past a question's deadline Prefect's own suspension of it lasts. A watcher resumes
the flow run at the question's deadline (with ``recheck``), and the flow ends the question
itself, so that its cards end in what happened; with no watcher, Prefect's server fails the run
this much later."""


def question_deadline(state: State[Any]) -> datetime | None:
    """Return when the question a paused flow run asks expires: for a suspension, Prefect's
    deadline less :data:`DEADLINE_GRACE_SECONDS`; for an in-process pause, Prefect's own (its
    process gives up by itself just before). None when the pause has none."""
    until: datetime | None = state.state_details.pause_timeout
    if until is None or not state.state_details.pause_reschedule:
        return until
    return until - timedelta(seconds=DEADLINE_GRACE_SECONDS)


class WaitRecord(BackendRecord):
    """What a suspended flow run waits on a person for, at which backend; no secret."""

    prefix: ClassVar[str]
    """The input keys of this kind of record start with it."""

    def names(self) -> str:
        """Return the backend object the record names (the input key is derived from it)."""
        raise NotImplementedError

    def key(self) -> str:
        """Return the input key of the record: letters, digits and dashes."""
        return self.prefix + hashlib.sha256(self.names().encode()).hexdigest()[:20]

    async def settled(self, client: ItoClient) -> str | None:
        """Read the backend: say why the question is settled there, or None while it is open.

        Raises:
            ItoError: the backend could not be read; nothing is known.
        """
        raise NotImplementedError

    def woken_by(self, page: ChangePage) -> bool:
        """Tell whether a page of the change feed may have settled the question."""
        raise NotImplementedError


class QuoteWait(WaitRecord):
    """Which quote a flow run waits on a person to confirm or decline."""

    prefix: ClassVar[str] = QUOTE_RECORD_PREFIX

    quote_id: str
    manifest_digest: str
    expires_at: datetime
    named_authorization: bool | None = None
    """Whether the flow run named a standing authorization; None in a record written before
    this was kept, of which nothing is said."""
    refused: Uncovered | None = None
    """The standing authorization the backend said does not cover the quote, and its reason: a
    watcher telling people again reads the authorization at the backend and says why a person is
    asked (the reason it shows only quoted, as this record's words)."""

    def names(self) -> str:
        return self.quote_id

    async def settled(self, client: ItoClient) -> str | None:
        try:
            state = (await client.get_quote(self.quote_id)).state
        except QuoteNotFound:
            return f"quote {self.quote_id} is gone"  # the flow, run again, makes a new quote
        # A quote without a state (no v0.4 backend) tells nothing: the flow would ask again at
        # once, so it is left to its own timeout.
        if state is None or state is QuoteState.PENDING:
            return None
        return f"quote {self.quote_id} is {state.value}"

    def woken_by(self, page: ChangePage) -> bool:
        return any(change.quote_id == self.quote_id for change in page.quotes)


class ActionWait(WaitRecord):
    """Which pending action of which backend run a flow run waits on a person to decide."""

    prefix: ClassVar[str] = ACTION_RECORD_PREFIX

    run_id: str
    action_id: str
    action: PendingAction | None = None
    """What the action proposed, as the backend stated it when the flow asked: shown on the
    flow run's cards once decided (a decided action leaves the backend run), never acted on."""

    def names(self) -> str:
        return f"{self.run_id}/{self.action_id}"

    async def settled(self, client: ItoClient) -> str | None:
        try:
            run = await client.get_training_run(self.run_id)
        except RunNotFound:
            return None  # not this account's run, or gone: the flow's own timeout ends the wait
        pending = run.pending_action
        if pending is not None and pending.action_id == self.action_id:
            return None
        return f"backend run {self.run_id} no longer waits for {self.action_id}"

    def woken_by(self, page: ChangePage) -> bool:
        return any(change.run_id == self.run_id for change in page.changes)


W = TypeVar("W", bound=WaitRecord)


async def record_wait(flow_run_id: UUID, record: WaitRecord) -> None:
    """Write the record, once per quote or action (a re-entry asking the same keeps it)."""
    async with get_client() as client:
        try:
            await client.create_flow_run_input(flow_run_id, record.key(), record.model_dump_json())
        except PrefectHTTPStatusError as error:
            if error.response.status_code != 409:  # written before, by this very flow run
                raise


async def latest_wait(flow_run_id: UUID, kind: type[W]) -> W | None:
    """Return the newest readable record of ``kind`` on the flow run (by the server's clock)."""
    found = await all_waits(flow_run_id, kind)
    return found[-1] if found else None


async def all_waits(flow_run_id: UUID, kind: type[W]) -> list[W]:
    """Return the flow run's readable records of ``kind``, oldest first (by the server's clock)."""
    async with get_client() as client:
        inputs = await client.filter_flow_run_input(
            flow_run_id, key_prefix=kind.prefix, limit=1000, exclude_keys=set()
        )
    found: list[tuple[datetime, W]] = []
    for item in inputs:
        try:
            record = kind.model_validate_json(item.value)
        except ValidationError:
            continue  # not one of ours: someone wrote it by hand; it names nothing to wait on
        if item.created is not None:
            found.append((item.created, record))
    return [record for _, record in sorted(found, key=lambda pair: pair[0])]


def recheck_answer(why: str) -> dict[str, str]:
    """Return the answer that resumes a question the backend settled: read it again.

    Prefect resumes a pause that waits for a form only with an answer the form's schema takes;
    every question's form takes this one. A recheck decides nothing: the flow reads the quote or
    the run from the backend, and asks again if nobody answered there. The watcher sends it once
    the backend settled the question; the flow itself, when it waits in-process.
    """
    return {"decision": "recheck", "reason": why}
