"""Asking a person through a Prefect pause or suspension, and reading the answer back.

A restart and a spend are both decided by people at the backend; in Prefect, a flow run waits
for them with a typed :class:`~prefect.input.RunInput` form on the **Resume** button, which shows
the question and offers what Prefect may do about it (read the backend again, or decline a
spend). The flow (never a subflow: Prefect cannot suspend subflows) asks with :func:`ask`:

- A flow run from a deployment (and no subflow) **suspends**: it holds no process while a person
  thinks. Resuming runs the flow again from the top, where the stable pause key hands back the
  stored answer (:func:`stored_answer`) without asking, or logging that it waits, a second time.
  The question's deadline counts from when it was first asked, however often it is asked again;
  Prefect's own comes :data:`~prefect_ito.waiting.waits.DEADLINE_GRACE_SECONDS` later, so that
  ``prefect-ito watch`` resumes the run at the question's and the flow ends it itself.
- Any other flow run **pauses in-process**, watching for a cancellation, and gives up
  :data:`PAUSE_MARGIN_SECONDS` before Prefect's own deadline, after which the server would turn
  any final state into "never resumed".

Answers are taken only for questions asked (:mod:`prefect_ito.people.answers`): an input stored
under a pause's response key before that pause began, for a pause that never happened, or in a
shape the form does not take, is deleted and logged as a warning, and the person is asked as usual;
a question asked again gets a pause key of its own, since Prefect returns at once from a pause
under a key that already fired.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.flow_runs import apause_flow_run
from prefect.input import RunInput
from pydantic import ValidationError

from prefect_ito.exceptions import ItoError
from prefect_ito.people import answers
from prefect_ito.reporting.moments import when
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.flow_run import can_suspend, current_flow_run_id, suspend
from prefect_ito.waiting.waits import DEADLINE_GRACE_SECONDS

__all__ = ["PAUSE_MARGIN_SECONDS", "ask", "state_message", "stored_answer"]

PAUSE_MARGIN_SECONDS = 5.0
"""How long before Prefect's own pause deadline an in-process wait gives up by itself."""

F = TypeVar("F", bound=RunInput)

Settled = Callable[[], Awaitable[RunInput | None]]
"""Returns the answer to resume with once the question was settled somewhere else (at the
backend), or None while it is not."""


async def ask(
    form: type[F],
    *,
    key: str,
    description: str,
    timeout: float,
    poll_interval: float,
    waiting: Callable[[], None],
    timed_out: Callable[[], ItoError],
    initial: dict[str, Any] | None = None,
    settled: Settled | None = None,
    fresh: bool = False,
    asks: str = "answer the form under Resume",
) -> F | None:
    """Wait for a person's answer on ``form``; None if the flow run was cancelled meanwhile.

    Only an answer to a question this flow run asked counts (see
    :mod:`prefect_ito.people.answers`): one stored after the pause under ``key`` began. An input
    written before (or for a pause that never happened) is deleted, logged as a warning, and the
    person is asked as usual.

    Args:
        form: The form a person fills in.
        key: The pause key: stable across re-entries, letters, digits and dashes.
        description: The markdown a person reads above the form.
        timeout: Seconds a person has to answer.
        poll_interval: Seconds between checks for an answer or a cancellation.
        waiting: Called once when the flow starts to wait (not again after a resumed
            suspension): says so in the flow's log.
        timed_out: Returns the error to raise when nobody answered in time.
        initial: Values the form shows filled in.
        settled: Checked at every poll of an in-process pause; once it returns an answer (the
            question was settled elsewhere), the flow run resumes itself with that answer,
            which is then returned as any other. (A suspended run is resumed by
            ``prefect-ito watch`` instead.)
        fresh: Ask anew even if the latest question under ``key`` has an answer: that answer
            was already acted on.
        asks: What the person is asked to do, for the suspended state's message (see
            :func:`state_message`).

    Raises:
        ItoError: what ``timed_out`` returns, when nobody answered in time: in-process, or on
            the re-entry of a suspended run resumed at its deadline (by ``prefect-ito watch``;
            with none, Prefect's server fails the run a grace later).
    """
    if not fresh and (answer := await stored_answer(form, key)) is not None:
        return answer  # resumed: asking (and logging that it waits) again would mislead
    suspending = can_suspend()
    deadline = await _deadline(key, timeout) if suspending else None
    if deadline is not None and deadline <= datetime.now(UTC):
        raise timed_out()  # resumed at its deadline by a watcher: the flow ends it itself
    waiting()
    prefilled = form.with_initial_data(description=description, **(initial or {}))
    give_up_at = asyncio.get_running_loop().time() + timeout
    message = state_message(asks, deadline or datetime.now(UTC) + timedelta(seconds=timeout))
    while True:
        asked_key = await _unused_key(key, "suspended" if suspending else "paused")
        if deadline is not None:  # suspending
            # Prefect's own deadline comes later: a watcher resumes the run at the question's,
            # and the flow ends the question itself, its cards saying so.
            left = (deadline - datetime.now(UTC)).total_seconds() + DEADLINE_GRACE_SECONDS
            with contextlib.suppress(ValidationError):  # resumed without an answer: see below
                await suspend(asked_key, message=message, timeout=int(left), form=prefilled)
        else:
            left = give_up_at - asyncio.get_running_loop().time()
            if not await _pause(prefilled, asked_key, left, poll_interval, timed_out, settled):
                return None
        if (answer := await stored_answer(form, key, only=asked_key)) is not None:
            return answer
        get_run_logger().warning(
            "The question under pause key %s ended without an answer given after it was asked; "
            "asking again.",
            asked_key,
        )


async def _deadline(key: str, timeout: float) -> datetime:
    """Return when the question under ``key`` expires: ``timeout`` after this flow run first
    asked it (by Prefect's clock), or from now if it has not; the same on every re-entry."""
    async with get_client() as client:
        asked_at = await answers.first_asked(client, _flow_run_id(), key)
    return (asked_at or datetime.now(UTC)) + timedelta(seconds=timeout)


def state_message(asks: str, deadline: datetime) -> str:
    """Return what a suspended run's state says it waits for: a person, to do what, by when.

    Example:
        ``Waiting for a person: confirm the spend of $23k–$34k by 2026-11-30 09:12 UTC``
    """
    return f"Waiting for a person: {asks} by {when(deadline)}"


async def stored_answer(form: type[F], key: str, *, only: str | None = None) -> F | None:
    """Return the answer a person gave to this flow run's latest question under ``key``, if any.

    A resumed suspension runs the flow again from the top. Prefect's own ``suspend_flow_run``
    would hand the stored answer back too, but only after logging "Suspending flow run" and
    proposing a suspension the server then refuses; and Prefect hands back any input stored
    under the key, also one written before the question was asked.

    Args:
        form: The form the answer fills in.
        key: The question's pause key; its later keys (see :mod:`prefect_ito.people.answers`)
            count.
        only: Read the answer to the pause under exactly this key.
    """
    flow_run_id = _flow_run_id()
    async with get_client() as client:
        questions = await answers.asked(client, flow_run_id, key)
        if only is not None:
            questions = [question for question in questions if question.pause_key == only]
        if not questions:
            return None  # an input for a question never asked is no answer: _unused_key
        question = questions[-1]
        record = await answers.read_answer(client, flow_run_id, question.response_key)
        if record is None:
            return None
        if record.created is None or record.created <= question.asked_at:
            _ignored(record.key, f"at {record.created}, before the question was asked at "
                     f"{question.asked_at}")  # fmt: skip
            await answers.discard(client, record)
            return None
        try:
            return form.model_validate(record.decoded_value)
        except ValidationError:
            # Written through Prefect's API, not the form (an "approve" where only "recheck"
            # is taken, say): no answer, and it must not stop the question being asked again.
            _ignored(record.key, "in a shape the question's form does not take")
            await answers.discard(client, record)
            return None


async def _unused_key(key: str, kind: str) -> str:
    """Return a key of the question that has not fired, with no input stored under it yet.

    Prefect's server deletes a pause's inputs when the pause begins; deleting them here first
    is what lets the flow say so. One written between the two is older than the pause, and
    :func:`stored_answer` refuses it.
    """
    flow_run_id = _flow_run_id()
    async with get_client() as client:
        used = await answers.fired_keys(client, flow_run_id)
        used |= {question.pause_key for question in await answers.asked(client, flow_run_id, key)}
        asked_key = answers.next_key(key, used)
        early = await answers.read_answer(
            client, flow_run_id, answers.response_key(kind, asked_key)
        )
        if early is not None:
            _ignored(early.key, f"at {early.created}, before the question was asked")
            await answers.discard(client, early)
    return asked_key


def _ignored(response_key: str, how: str) -> None:
    get_run_logger().warning(
        "Ignored the answer stored under %s: it was written %s. Only an answer given to the "
        "form after a question is asked counts; a person is asked as usual.",
        response_key,
        how,
    )


def _flow_run_id() -> UUID:
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        raise RuntimeError("a person can only be asked from within a flow run")
    return flow_run_id


async def _pause(
    prefilled: Any,
    key: str,
    timeout: float,
    poll_interval: float,
    timed_out: Callable[[], ItoError],
    settled: Settled | None = None,
) -> bool:
    """Pause in-process under ``key`` until it ends; False if the flow run was cancelled.

    Raises:
        ItoError: what ``timed_out`` returns, :data:`PAUSE_MARGIN_SECONDS` before Prefect's own
            deadline.
    """
    pause = asyncio.ensure_future(
        apause_flow_run(
            wait_for_input=prefilled,
            timeout=max(1, int(timeout)),
            poll_interval=max(1, int(poll_interval)),
            key=key,
        )
    )
    try:
        return await _first_of(
            pause, poll_interval, max(0.0, timeout - PAUSE_MARGIN_SECONDS), settled
        )
    except TimeoutError:
        raise timed_out() from None
    except ValidationError:
        return True  # resumed without an answer; Prefect's form class cannot be empty
    finally:
        pause.cancel()


async def _first_of(
    pause: asyncio.Future[Any],
    poll_interval: float,
    give_up_after: float,
    settled: Settled | None,
) -> bool:
    async with asyncio.timeout(give_up_after):
        while True:
            done, _ = await asyncio.wait({pause}, timeout=poll_interval)
            if done:
                pause.result()  # the answer is read from Prefect's records, not taken from here
                return True
            if await stop_requested(None):
                return False
            if settled is not None and (answer := await settled()) is not None:
                await _resume_self(answer)


async def _resume_self(answer: RunInput) -> None:
    """Resume this paused flow run with ``answer``: the question was settled elsewhere.

    Prefect resumes a pause that waits for a form only with an answer its schema takes. The
    pause itself then ends as after any resume, and the answer is read back as any other.
    """
    async with get_client() as client:
        # Resumed (or cancelled) meanwhile by someone else: just as good, nothing to undo.
        with contextlib.suppress(PrefectHTTPStatusError, ObjectNotFound):
            await client.resume_flow_run(_flow_run_id(), run_input=answer.model_dump(mode="json"))
