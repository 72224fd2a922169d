"""Spending: a run is created only on a quote the backend knows a person stands behind.

Contract v0.4 moves the authority to spend out of prefect-ito and out of Prefect. Before anything
is submitted, the backend quotes the request (:class:`TrainingQuote`: its plan, its estimate, the
manifest digest, a link and a short code). Then the backend alone decides, when the run would be
created:

- a **person** confirmed that quote at the backend — on the backend's own page (the quote's
  ``confirm_url`` and ``user_code``), or with a token of their own that holds ``spend:confirm``
  (``prefect-ito confirm``, or the terminal ``train`` runs in). The backend records their
  principal; nothing a client writes, and nothing written in Prefect, confirms a spend.
- or a **standing authorization** a person created at the backend covers the quote at that moment
  (:class:`~prefect_ito.blocks.ItoSpendAuthorization` only names one).

:func:`submit_with_consent` walks that: a plan the backend refuses stops at once; a named
authorization is tried first, and when the backend says it does not cover the quote, a person is
asked. Asking is waiting for the backend to say the quote was confirmed or declined: a flow run
from a deployment suspends (``prefect-ito watch`` resumes it when the quote changes), any other
pauses in-process and reads the quote at every poll. The Prefect form shows the quote, cost first,
with the link and the code, and offers to **decline** — which needs no proof of anything, since
declining spends nothing — or to **recheck** the backend. Each confirmation is used once; a new
quote of the same manifest inherits it only if nothing got worse (the backend's rule), and
otherwise the person is asked again with what changed.

One module past ~400 lines: the walk from a quote to a submission — authorization, person,
requote, and the quote's card at each end — is read in one place.
"""

from __future__ import annotations

import logging
from typing import Literal, Protocol

from prefect import get_run_logger
from prefect.input import RunInput
from pydantic import Field

from prefect_ito.backend.operations import (
    DECLINE_TRAINING_QUOTE,
    POLL_TRAINING_QUOTE,
    QUOTE_TRAINING_RUN,
    READ_TRAINING_QUOTE,
    SUBMIT_TRAINING_RUN,
    TRANSIENT_FAULTS,
    Operation,
    P,
    R,
)
from prefect_ito.backend.refusals import NO_AUTHORIZATION, SubmissionRefused, Uncovered
from prefect_ito.blocks import ItoSpendAuthorization
from prefect_ito.contract import (
    QuoteState,
    TrainingQuote,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.exceptions import (
    AuthorizationDoesNotCover,
    AwaitingConfirmation,
    ConfirmationRequired,
    ItoError,
    RunCancelled,
    RunRefused,
    SpendDeclined,
)
from prefect_ito.people import asking, notices
from prefect_ito.reporting.publishing import Card
from prefect_ito.reporting.quote_card import describe, estimate, spend_question
from prefect_ito.reporting.report import PUBLISHER, artifact_key
from prefect_ito.waiting.flow_run import current_flow_run_id
from prefect_ito.waiting.keys import spend_pause_key as pause_key
from prefect_ito.waiting.waits import recheck_answer

__all__ = [
    "NO_AUTHORIZATION",
    "SpendDecision",
    "describe",
    "pause_key",
    "publish_quote",
    "recheck",
    "refuse_unworkable",
    "submit_with_consent",
    "wait_for_person",
]


class Supervisor(Protocol):
    """What spending needs of a supervisor (:class:`~prefect_ito.supervision.steps.Steps`)."""

    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
    authorization: ItoSpendAuthorization | None

    async def perform(self, operation: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Do a backend operation (see :mod:`prefect_ito.backend.operations`)."""

    async def await_person(
        self,
        quote: TrainingQuote,
        request: TrainingRequest,
        *,
        again: bool,
        why: str,
        refused: Uncovered | None = None,
    ) -> TrainingQuote:
        """Wait for a person to confirm or decline the quote (see :func:`wait_for_person`);
        ``why`` says why a person is needed now, ``refused`` which authorization did not cover
        it, if one was named."""

    async def recorded_quote(self, request: TrainingRequest) -> TrainingQuote | None:
        """Return the quote an earlier process of this supervisor asked a person about."""

    async def record_quote(self, quote: TrainingQuote, refused: Uncovered | None = None) -> None:
        """Record the quote a person is asked about, and the authorization that did not cover
        it, for a watcher and for a re-entry."""


MAX_REQUOTES = 5
"""New quotes one submission asks for when one expired or moved on, before it gives up."""

WHAT_EACH_ANSWER_DOES = (
    "decline: nothing is submitted, the backend records the quote as declined, and the flow run "
    "ends Declined. recheck: you confirmed on the backend's page (the link above): the flow "
    "reads the quote from the backend again; only a confirmation made there counts. There is "
    "no default."
)


class SpendDecision(RunInput):
    """What a person can do about a spend in Prefect: decline it, or have the backend read again.

    Confirming is not among the choices: a person confirms at the backend, which knows who they
    are. ``decision`` is required and has no default, so a form submitted untouched is refused.
    """

    decision: Literal["decline", "recheck"] = Field(
        title="Decision", description=WHAT_EACH_ANSWER_DOES
    )
    # Text with an empty default, not ``str | None``: the UI draws an optional type as a
    # str/None switch that starts on None, which reads as "no field here".
    reason: str = Field(
        default="", description="Why, if you decline: kept at the backend beside the decline."
    )


def recheck(why: str) -> SpendDecision:
    """Return the answer that resumes a spend question settled at the backend (see
    :func:`~prefect_ito.waiting.waits.recheck_answer`)."""
    return SpendDecision.model_validate(recheck_answer(why))


async def publish_quote(
    quote: TrainingQuote, request: TrainingRequest, *, why: str | None = None, said: str = ""
) -> None:
    """Show the quote as a card on this flow run while it waits for its spend, and how the
    wait ended (``said``) once it did.

    The run's other cards are keyed by the backend run, which does not exist before the spend
    is confirmed; so until then the Artifacts tab would be empty. One card per manifest,
    updated in place when a new quote replaces the old, and when the wait ends.
    """
    waiting = (
        f"Waiting for a person: spend {estimate(quote)} estimated, "
        f"${request.budget_usd:,.0f} at most, on booking {quote.booking_id}."
    )
    await PUBLISHER.publish(
        [
            Card(
                key=artifact_key(pause_key(quote.manifest_digest), "quote"),
                type="markdown",
                data=describe(quote, request, choices=False, why=None if said else why),
                description=said or waiting,
            )
        ]
    )


def refuse_unworkable(quote: TrainingQuote) -> None:
    """Stop when the backend's plan refuses the request: nothing is worth confirming.

    Raises:
        RunRefused: the same outcome as a refusal by a running backend; nothing was submitted.
    """
    parallelism = quote.plan.parallelism
    if parallelism.refused:
        raise RunRefused(
            f"the backend refuses the plan for booking {quote.booking_id}: "
            f"{parallelism.reason or 'no reason given'}; nothing was submitted"
        )


async def submit_with_consent(
    steps: Supervisor, request: TrainingRequest, idempotency_key: str, client_reference: str | None
) -> TrainingRun:
    """Submit the request once, on a quote a person confirmed or an authorization covers.

    A re-entered flow run asks about the quote it recorded (the link and code a person may have
    open) while that quote can still be confirmed.

    Raises:
        RunRefused: the backend refuses the plan; nobody was asked.
        SpendDeclined: the quote was declined (in Prefect, or at the backend).
        AwaitingConfirmation, RunCancelled: nobody answered in time; the flow run was cancelled.
        ConfirmationRequired: the quotes kept expiring or moving on; nothing was submitted.
    """
    quote, shown = await _current_quote(steps, request)
    authorization = steps.authorization
    asked, requotes, why = False, 0, NO_AUTHORIZATION
    refused: Uncovered | None = None
    try:
        while True:
            _check(quote)
            if authorization is not None and quote.state is not QuoteState.CONFIRMED:
                allowed_by = authorization.authorization_id
            elif quote.state is QuoteState.CONFIRMED:
                allowed_by = None
            else:
                quote = await steps.await_person(
                    quote, request, again=asked, why=why, refused=refused
                )
                asked = shown = True
                continue
            made = await steps.perform(
                SUBMIT_TRAINING_RUN,
                request,
                quote.quote_id,
                allowed_by,
                idempotency_key,
                client_reference,
            )
            if not isinstance(made, SubmissionRefused):
                if shown:
                    await publish_quote(quote, request, said=_submitted(quote, made))
                return made
            if isinstance(made.error, AuthorizationDoesNotCover) and authorization is not None:
                refused = Uncovered(
                    authorization_id=authorization.authorization_id, reason=made.reason()
                )
                why = refused.why(authorization.label)
                steps.logger.warning("%s. Asking a person.", why[:1].upper() + why[1:])
                authorization = None
                continue
            # Expired, superseded, or priced on a booking that changed since: a new quote,
            # which a person's confirmation carries to only if nothing got worse.
            requotes += 1
            if requotes > MAX_REQUOTES:
                raise ConfirmationRequired(
                    f"the quotes for booking {request.booking_id} kept expiring or moving on "
                    "before a submission; nothing was submitted, and running the flow again "
                    "asks again"
                ) from None
            quote = await _new_quote(steps, request)  # a confirmation carries if nothing worse
    except (SpendDeclined, AwaitingConfirmation, RunCancelled, ConfirmationRequired) as ended:
        if shown:  # the quote's card ends in what happened, not "Waiting for a person"
            await publish_quote(quote, request, said=f"Not submitted: {ended.message}.")
        raise


def _submitted(quote: TrainingQuote, run: TrainingRun) -> str:
    """Return the quote card's last line once its run was submitted."""
    answer = quote.confirmation
    who = f", confirmed by {answer.principal}" if answer is not None else ""
    return f"Submitted{who}: backend run {run.run_id}."


async def _current_quote(steps: Supervisor, request: TrainingRequest) -> tuple[TrainingQuote, bool]:
    """Return the quote this flow run recorded, while it can still be confirmed, else a new one;
    and whether it is the recorded one (a person was asked about it, and its card shown)."""
    recorded = await steps.recorded_quote(request)
    if recorded is not None and recorded.state in _STILL_ANSWERABLE:
        steps.logger.info(
            "Resumed: the quote %s is %s at the backend.",
            recorded.quote_id,
            recorded.state.value if recorded.state else "of unknown state",
        )
        # Answered while this flow run held no process (on the backend's page, with `confirm`):
        # whoever resumed it (the watcher, a recheck), this is where the flow learns it.
        _tell_answered(steps, recorded)
        return recorded, True
    return await _new_quote(steps, request), False


_STILL_ANSWERABLE = (QuoteState.PENDING, QuoteState.CONFIRMED, QuoteState.DECLINED)


async def _new_quote(steps: Supervisor, request: TrainingRequest) -> TrainingQuote:
    # The quote names the flow run that asks (its client reference, as the submission's), so
    # that the backend can say which flow run a quote is for: on its confirm page, and to a
    # watcher that tells people again of a question Prefect lost.
    flow_run_id = current_flow_run_id()
    reference = str(flow_run_id) if flow_run_id is not None else None
    quote = await steps.perform(QUOTE_TRAINING_RUN, request, reference)
    for warning in quote.warnings:
        steps.logger.warning("Quote %s: %s.", quote.quote_id, warning)
    if quote.state is QuoteState.CONFIRMED and quote.confirmation is not None:
        steps.logger.info(
            "Quote %s carries the confirmation %s gave at the backend (quote %s): nothing got "
            "worse since.",
            quote.quote_id,
            quote.confirmation.principal,
            quote.carried_from,
        )
    return quote


def _check(quote: TrainingQuote) -> None:
    """Stop on a refused plan, or on a quote someone declined."""
    refuse_unworkable(quote)
    if quote.state is QuoteState.DECLINED:
        raise SpendDeclined(_declined(quote))


def _declined(quote: TrainingQuote) -> str:
    answer = quote.confirmation
    who = f" by {answer.principal}" if answer is not None else ""
    why = f" ({answer.note})" if answer is not None and answer.note else ""
    return (
        f"the spend on booking {quote.booking_id} (quote {quote.quote_id}) was declined{who}"
        f"{why}; nothing was submitted"
    )


async def wait_for_person(
    steps: Supervisor,
    quote: TrainingQuote,
    request: TrainingRequest,
    *,
    again: bool,
    why: str,
    timeout: float,
    poll_interval: float,
    refused: Uncovered | None = None,
) -> TrainingQuote:
    """Wait until the quote is confirmed or declined at the backend; return it as it is then.

    ``why`` says why a person is needed now (no authorization is named, or which one does not
    cover the run and why): the form, the card, the log and the notice all say it. ``refused``
    (the authorization that did not cover it, if one was named) is kept in the quote's record,
    so that a watcher telling people again says why too.

    An expired or superseded quote is replaced by a new one (which a person's confirmation may
    carry to); a quote still pending after a "recheck" is asked about again.

    Raises:
        SpendDeclined: declined in the Prefect form (and then at the backend) or at the backend.
        AwaitingConfirmation: nobody answered in time; nothing was submitted.
        RunCancelled: the flow run was cancelled while it waited.
    """
    await steps.record_quote(quote, refused)
    await publish_quote(quote, request, why=why)

    async def settled() -> SpendDecision | None:
        try:
            now = await steps.perform(POLL_TRAINING_QUOTE, quote.quote_id)
        except TRANSIENT_FAULTS:
            return None  # a busy backend for a moment: the next poll reads it again
        if now is not None and now.state is QuoteState.PENDING:
            return None
        state = now.state.value if now is not None and now.state else "gone"
        return recheck(f"the quote is {state} at the backend")

    def waiting() -> None:
        get_run_logger().warning(
            "Waiting for a person to confirm or decline the spend of %s estimated ($%s at "
            "most) on booking %s at the backend: %s (code %s). Nothing is submitted until then.",
            estimate(quote),
            f"{request.budget_usd:,.2f}",
            request.booking_id,
            quote.confirm_url or "the backend's confirm page",
            quote.user_code or "none",
        )
        get_run_logger().warning("A person is asked because %s.", why)
        notices.spend_needed(quote, timeout=timeout, why=why)

    def timed_out() -> ItoError:
        return AwaitingConfirmation(
            f"nobody confirmed the spend on booking {request.booking_id} (quote "
            f"{quote.quote_id}) within {timeout:g} s; nothing was submitted, and running the "
            "flow again asks again"
        )

    answer = await asking.ask(
        SpendDecision,
        key=pause_key(quote.manifest_digest),
        description=describe(quote, request, why=why),
        timeout=timeout,
        poll_interval=poll_interval,
        waiting=waiting,
        timed_out=timed_out,
        settled=settled,
        fresh=again,
        asks=spend_question(quote),
    )
    if answer is None:
        raise RunCancelled(
            "the flow run was cancelled while the spend waited for a person; nothing was submitted"
        )
    if answer.decision == "decline":
        await steps.perform(DECLINE_TRAINING_QUOTE, quote.quote_id, answer.reason or None)
    return await _after_answer(steps, quote, request)


async def _after_answer(
    steps: Supervisor, quote: TrainingQuote, request: TrainingRequest
) -> TrainingQuote:
    """Return the quote as the backend states it after a person acted, or a new one."""
    now = await steps.perform(READ_TRAINING_QUOTE, request, quote.quote_id)
    if now is None or now.state not in _STILL_ANSWERABLE:
        return await _new_quote(steps, request)
    if now.state is QuoteState.PENDING:
        steps.logger.warning(
            "Rechecked: the quote %s is still pending at the backend: nobody confirmed or "
            "declined it. Confirm it at %s (code %s) or with `%s`; asking again.",
            now.quote_id,
            now.confirm_url or "the backend's confirm page",
            now.user_code or "none",
            notices.confirm_command(now.quote_id),
        )
        return now
    _tell_answered(steps, now)
    return now


def _tell_answered(steps: Supervisor, quote: TrainingQuote) -> None:
    """Say who answered the quote a person was asked about: in the flow's log, and to people
    (``person.answered``, which also withdraws the reminder). Said where the flow learns it,
    once per way it learns it: after its own wait, or on the re-entry of a resumed run; the
    event's id is the question's, so Prefect keeps one however often it is said.
    """
    answer = quote.confirmation
    if quote.state in (QuoteState.CONFIRMED, QuoteState.DECLINED) and answer is not None:
        steps.logger.info(
            "%s %s the spend at the backend (quote %s)%s.",
            answer.principal,
            quote.state.value,
            quote.quote_id,
            f": {answer.note}" if answer.note else "",
        )
    notices.spend_answered(quote)
