"""Which questions a flow run asked, and which answers count, read from Prefect's own records.

Anyone who can reach the Prefect API can write a flow run's inputs, also before the pause that
would read them exists, and anyone can press Resume. So an answer counts only for a question
the flow run asked:

1. The question is a Paused or Suspended state of the flow run under the question's pause key.
2. The answer is the response input of that pause (Prefect's keyset ``<state>-<key>-response``),
   stored **after** that state began. Both timestamps are Prefect's server's (the state's
   ``timestamp``, the input's ``created``), never this machine's clock.

A pause key fires once per flow run in Prefect: pausing again under a used key returns at once
with whatever input is stored. A question asked again gets a key of its own, the question's key
and ``-again-2``, ``-again-3``…; all of them are one question's keys (:func:`question_keys`).

The side that answers (``prefect-ito decide``, the terminal) resumes through
:func:`resume_with`, which reads back which answer Prefect kept: of several answers sent at once,
Prefect keeps the first and drops the others without an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRunInput, State
from prefect.client.schemas.responses import SetStateStatus
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.input.run_input import keyset_from_base_key, keyset_from_paused_state

__all__ = [
    "Kept",
    "Question",
    "asked",
    "discard",
    "fired_keys",
    "first_asked",
    "is_question_key",
    "next_key",
    "read_answer",
    "resume_with",
]

_AGAIN = "-again-"
_PAGE = 100


@dataclass(frozen=True)
class Question:
    """A pause the flow run made: its key, the kind of pause, and when it began (server time)."""

    pause_key: str
    kind: str
    """``paused`` or ``suspended``: the first word of the pause's input keys."""
    asked_at: datetime

    @property
    def response_key(self) -> str:
        """The key of the flow-run input Prefect stores the answer under."""
        return response_key(self.kind, self.pause_key)


def response_key(kind: str, pause_key: str) -> str:
    """Return the input key a ``kind`` pause under ``pause_key`` reads its answer from."""
    return keyset_from_base_key(f"{kind}-{pause_key}")["response"]


def is_question_key(key: str, pause_key: str) -> bool:
    """Tell whether ``pause_key`` is one of the keys the question ``key`` was asked under."""
    return re.fullmatch(re.escape(key) + rf"(?:{_AGAIN}\d+)?", pause_key) is not None


def next_key(key: str, used: set[str]) -> str:
    """Return the first of the question's keys that has not fired in this flow run."""
    if key not in used:
        return key
    attempt = 2
    while f"{key}{_AGAIN}{attempt}" in used:
        attempt += 1
    return f"{key}{_AGAIN}{attempt}"


async def asked(client: PrefectClient, flow_run_id: UUID, key: str) -> list[Question]:
    """Return the pauses the flow run made under the question's keys, oldest first."""
    states = await client.read_flow_run_states(flow_run_id)
    found = [_question(state) for state in states if _is_pause_of(state, key)]
    return sorted(found, key=lambda question: question.asked_at)


async def first_asked(client: PrefectClient, flow_run_id: UUID, key: str) -> datetime | None:
    """Return when the flow run first paused under the question's keys in its current run of
    the flow (after any final state a retry started from), or None if it has not.

    A question asked again — after a resume that was no answer, or with a new quote of the same
    manifest — keeps the deadline counted from then.
    """
    states = sorted(await client.read_flow_run_states(flow_run_id), key=lambda s: s.timestamp)
    ended = [index for index, state in enumerate(states) if state.is_final()]
    since = states[ended[-1] + 1 :] if ended else states
    return next((state.timestamp for state in since if _is_pause_of(state, key)), None)


def _is_pause_of(state: State, key: str) -> bool:
    pause_key = state.state_details.pause_key
    return state.is_paused() and pause_key is not None and is_question_key(key, pause_key)


def _question(state: State) -> Question:
    # Prefect names a pause's inputs after its state: "Paused" or "Suspended".
    return Question(str(state.state_details.pause_key), (state.name or "").lower(), state.timestamp)


async def fired_keys(client: PrefectClient, flow_run_id: UUID) -> set[str]:
    """Return the pause keys Prefect counts as fired in the flow run (pausing again returns)."""
    flow_run = await client.read_flow_run(flow_run_id)
    return set(flow_run.empirical_policy.pause_keys or ())


async def read_answer(client: PrefectClient, flow_run_id: UUID, key: str) -> FlowRunInput | None:
    """Return the flow-run input stored under exactly ``key``, with its server timestamps."""
    # Prefect reads one input's value but not its record; its filter returns records, of every
    # key that starts with ``key``. Anyone can write many such keys: page past them all.
    others: set[str] = set()
    while True:
        found = await client.filter_flow_run_input(
            flow_run_id, key, limit=_PAGE, exclude_keys=others
        )
        if (record := next((r for r in found if r.key == key), None)) is not None:
            return record
        if len(found) < _PAGE:
            return None
        others |= {record.key for record in found}


async def discard(client: PrefectClient, record: FlowRunInput) -> None:
    """Delete an input that is no answer; one already gone (Prefect deletes too) is fine."""
    try:
        await client.delete_flow_run_input(record.flow_run_id, record.key)
    except ObjectNotFound:
        pass
    except PrefectHTTPStatusError as error:
        if error.response.status_code != 404:
            raise


@dataclass(frozen=True)
class Kept:
    """What Prefect kept for a pause after a resume: the answer stored, and whether it is ours."""

    answer: dict[str, Any] | None
    """The stored answer, or None when the pause ended without one (cancelled, timed out)."""
    ours: bool

    def describe(self) -> str:
        """Return the kept answer in a few words: its choice and who gave it."""
        answer = self.answer or {}
        choice = answer.get("decision")
        if choice is None and "approve" in answer:  # the earlier restart form: a tick box
            choice = "approve" if answer["approve"] is True else "reject"
        who = answer.get("decided_by") or answer.get("confirmed_by") or "someone unnamed"
        return f"{choice or 'an answer'} by {who}"


async def resume_with(flow_run_id: UUID, paused: State, answer: dict[str, Any]) -> Kept:
    """Resume the pause ``paused`` with ``answer``; return which answer Prefect kept for it.

    Several answers sent at once all "succeed" through Prefect's client: the first resume is
    taken, the others are aborted (the run is no longer paused) without an error, or, on a
    database that runs them side by side, fail on the stored answer's key. So the answer is read
    back from the pause's response input.

    Raises:
        RuntimeError: Prefect's server refused the answer (the pause timed out, or the answer
            does not fit the form); Prefect's own message.
    """
    key = keyset_from_paused_state(paused)["response"]
    async with get_client() as client:
        try:
            result = await client.resume_flow_run(flow_run_id, run_input=answer)
        except PrefectHTTPStatusError:
            result = None  # another answer was stored meanwhile: read back which
        if result is not None and result.status is SetStateStatus.REJECT:
            raise RuntimeError(f"Cannot resume this run: {getattr(result.details, 'reason', '')}")
        record = await read_answer(client, flow_run_id, key)
    stored = None if record is None else record.decoded_value
    return Kept(answer=stored, ours=stored == answer)
