"""What prefect-ito asks of the Itô desk backend, as plain coroutines over an :class:`ItoClient`.

Each is one operation of the table in :mod:`prefect_ito.backend.operations`, from which the
flow's Prefect tasks and the job's plain calls are both made, so there is one way to verify,
quote, submit, relay and cancel. Nothing here trains, books, buys or overrides a gate, and nothing
submits a request the backend did not allow. Gate following lives in
:mod:`prefect_ito.backend.gates`; which run a request made, in
:mod:`prefect_ito.backend.ownership`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field

from prefect_ito.backend import ownership
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.refusals import MENDABLE_REFUSALS, SubmissionRefused
from prefect_ito.contract import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    BookingStatus,
    DecisionRequest,
    Scope,
    TrainingEligibility,
    TrainingQuote,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.exceptions import (
    BookingNotEligible,
    BookingNotFound,
    CapabilityNotAvailable,
    ClientReferenceInUse,
    ConfirmationExpired,
    ConfirmationUsed,
    InsufficientScope,
    InvalidParameters,
    ItoProtocolError,
    QuoteAlreadyDecided,
    QuoteNotFound,
)


class BookingClaim(BaseModel):
    """What the caller says about the booking; only the backend's answer proves it.

    Each field but the id is optional: None claims nothing, and every field claimed is compared
    with the backend's answer.
    """

    model_config = ConfigDict(frozen=True)

    booking_id: str
    gpu_sku: str | None = Field(default=None, description="The GPU model claimed, e.g. H200.")
    node_count: int | None = Field(default=None, description="The number of nodes claimed.")
    gpus_per_node: int | None = Field(default=None, description="The GPUs on each node claimed.")
    fabric: str | None = Field(default=None, description="The interconnect claimed.")
    region: str | None = Field(default=None, description="Where the nodes are claimed to be.")
    account: str | None = Field(
        default=None, description="The Itô account claimed to hold the booking."
    )


CANCEL_CONFIRM_SECONDS = 120.0
"""How long a cancel waits for the backend to report the workload terminal."""

Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]
_logger = logging.getLogger(__name__)


async def verify_booking(client: ItoClient, claim: BookingClaim) -> TrainingEligibility:
    """Return the backend's view of the booking when it may train and matches the claim.

    The booking must be completed and eligible, held by the account the token speaks for (as
    ``whoami`` says), and the same as every field the caller handed over.

    Raises:
        BookingNotEligible: the booking is not completed, not eligible, not the authenticated
            account's, or not what the caller handed over (GPU SKU, node count, GPUs per node,
            fabric, region, account).
        BookingNotFound: the backend knows no such booking for this account (the message names
            the booking asked for, and says which id to give instead).
    """
    try:
        eligibility = await client.get_training_eligibility(claim.booking_id)
    except BookingNotFound as error:
        raise BookingNotFound(
            _not_found(client, claim.booking_id, error.message),
            status_code=error.status_code,
            request_id=error.request_id,
            field=error.field,
        ) from None
    if eligibility.status is not BookingStatus.COMPLETED or not eligibility.eligible:
        reason = eligibility.reason or f"the booking is {eligibility.status.value}"
        raise BookingNotEligible(f"booking {claim.booking_id} cannot train: {reason}")
    await _check_account(client, claim, eligibility)
    mismatches = [
        f"{name} is {actual!r} at the backend, not {claimed!r}"
        for name, claimed, actual in (
            ("gpu_sku", claim.gpu_sku, eligibility.gpu_sku),
            ("node_count", claim.node_count, eligibility.node_count),
            ("gpus_per_node", claim.gpus_per_node, eligibility.gpus_per_node),
            ("fabric", claim.fabric, eligibility.fabric),
            ("region", claim.region, eligibility.region),
        )
        if claimed is not None and _normalise(claimed) != _normalise(actual)
    ]
    if mismatches:
        raise BookingNotEligible(
            f"booking {claim.booking_id} does not match what was handed over: "
            + "; ".join(mismatches)
        )
    return eligibility


def _not_found(client: ItoClient, booking_id: str, said: str) -> str:
    """Say which booking the backend does not know, where, and which id to give instead.

    The contract lists no bookings (a booking flow hands its id over), so the backend's own
    words come along: the simulator's say where it lists its bookings.
    """
    return (
        f"booking {booking_id!r} was not found at {client.base_url}: give the id of one of this "
        f"account's bookings, as its booking flow handed it over. The backend said: {said}"
    )


async def _check_account(
    client: ItoClient, claim: BookingClaim, eligibility: TrainingEligibility
) -> None:
    """Refuse a booking the backend does not say belongs to the authenticated account.

    A backend answers ``BOOKING_NOT_FOUND`` for another account's booking; this is the client's
    own check that it did, so a backend that leaks one still never gets work for it.
    """
    account = (await client.whoami()).account
    if eligibility.account is None:
        raise BookingNotEligible(
            f"booking {claim.booking_id} cannot be verified: the backend did not say which "
            f"account holds it (contract v0.2 requires it), and prefect-ito trains only on a "
            f"booking of the authenticated account {account!r}"
        )
    if eligibility.account != account:
        raise BookingNotEligible(
            f"booking {claim.booking_id} is held by account {eligibility.account!r}, not by "
            f"the authenticated account {account!r}"
        )
    # Account names are compared exactly: two accounts may differ only in case or a hyphen.
    if claim.account is not None and claim.account != eligibility.account:
        raise BookingNotEligible(
            f"booking {claim.booking_id} does not match what was handed over: account is "
            f"{eligibility.account!r} at the backend, not {claim.account!r}"
        )


async def check_training_capability(client: ItoClient, request: TrainingRequest) -> None:
    """Stop unless the backend can train this request, and this token may submit it.

    Raises:
        CapabilityNotAvailable: the backend cannot train (as production cannot today), does
            not offer the recipe, or does not check spend confirmations itself (v0.4).
        InsufficientScope: the token lacks ``training:submit`` (checked before any submission,
            from ``whoami``).
    """
    capabilities = await client.get_capabilities()
    if not capabilities.training_run.live:
        detail = capabilities.training_run.detail or "training_run is not live"
        raise CapabilityNotAvailable(f"the Itô desk backend cannot run training yet: {detail}")
    recipe = request.post_training
    if recipe is not None and recipe not in capabilities.post_training_recipes:
        raise CapabilityNotAvailable(f"the backend does not offer post-training {recipe.value}")
    if not (capabilities.spend_confirmation and capabilities.spend_authority):
        # Fail closed: a backend that does not check a person's confirmation itself could not
        # tell a confirmed spend from one a client only claims, so nothing is submitted to it.
        raise CapabilityNotAvailable(
            "the Itô desk backend does not keep spend authority (contract v0.4, "
            "spend_authority): prefect-ito submits nothing the backend cannot tell a person "
            "confirmed"
        )
    me = await client.whoami()
    if Scope.SUBMIT.value not in me.scopes:
        raise InsufficientScope(
            f"the token of {me.principal or me.account} lacks the scope {Scope.SUBMIT.value}: "
            "nothing was submitted; log in with a token that may submit training runs"
        )


async def quote_training_run(
    client: ItoClient, request: TrainingRequest, client_reference: str | None = None
) -> TrainingQuote:
    """Return the backend's quote for the request: plan preview, estimate, expiring quote id.

    Creates no work and spends nothing. ``client_reference`` (a flow run's id) goes with the
    quote: the confirm page names it, and the backend says which flow run a quote is for.

    Raises:
        ItoProtocolError: the quote is for another booking, manifest or budget.
    """
    body = request.to_submission()
    # Only to a backend that takes references (v0.3); an older one would refuse the field.
    if client_reference is not None and (await client.get_capabilities()).client_reference:
        body = body.referenced(client_reference)
    found = await client.quote_training_run(body)
    mismatch = quote_mismatch(found, request)
    if mismatch is not None:
        field, differ = mismatch
        raise ItoProtocolError(
            f"the backend quoted {differ}", endpoint="POST /v0/training-quotes", field=field
        )
    return found


def quote_mismatch(found: TrainingQuote, request: TrainingRequest) -> tuple[str, str] | None:
    """Return how ``found`` is a quote for another request than ``request`` — the first field
    that differs, and every difference in words — or None if it is this request's."""
    # The booking and the budget first: they are part of the manifest too, and say what a
    # person changed better than a digest does.
    differ = [
        (name, f"{name} {quoted!r} for a request of {expected!r}")
        for name, expected, quoted in (
            ("booking_id", request.booking_id, found.booking_id),
            ("budget_usd", request.budget_usd, found.budget_usd),
            ("manifest_digest", request.digest(), found.manifest_digest),
        )
        if expected != quoted
    ]
    if not differ:
        return None
    return differ[0][0], "; ".join(words for _, words in differ)


async def read_training_quote(
    client: ItoClient, request: TrainingRequest, quote_id: str
) -> TrainingQuote | None:
    """Return the quote ``quote_id`` as the backend states it now, if it is one for ``request``.

    The id may come from Prefect (where anyone with API access writes): a quote of another
    request, or one the account does not have, is no quote of this request.
    """
    try:
        found = await client.get_quote(quote_id)
    except (QuoteNotFound, InvalidParameters):
        return None
    return found if quote_mismatch(found, request) is None else None


async def decline_training_quote(client: ItoClient, quote_id: str, note: str | None) -> None:
    """Decline the quote at the backend (final for it), once, whatever a retry does.

    Declining spends nothing, so any token that may read may do it. A quote a person confirmed
    at the backend first stays confirmed: the caller reads it again.
    """
    key = f"decline-{quote_id}"[:IDEMPOTENCY_KEY_MAX_LENGTH]
    with contextlib.suppress(QuoteAlreadyDecided, ConfirmationUsed, ConfirmationExpired):
        await client.decline_quote(quote_id, note=note, idempotency_key=key)


async def read_training_run(client: ItoClient, run_id: str) -> TrainingRun:
    """Return the backend run ``run_id`` as it is now.

    Raises:
        RunNotFound: the backend has no such run (for this account).
    """
    return await client.get_training_run(run_id)


async def poll_training_run(client: ItoClient, run_id: str) -> TrainingRun:
    """Return the run as the backend states it now: read often while a person is asked to
    decide on it, so neither retried nor shown as a step of its own.

    Raises:
        RunNotFound: the backend has no such run (for this account).
    """
    return await client.get_training_run(run_id)


async def poll_training_quote(client: ItoClient, quote_id: str) -> TrainingQuote:
    """Return the quote as the backend states it now: read often while a person is asked, so
    neither retried nor shown as a step of its own.

    Raises:
        QuoteNotFound: the backend has no such quote (any more).
    """
    return await client.get_quote(quote_id)


async def submit_training_run(
    client: ItoClient,
    request: TrainingRequest,
    quote_id: str,
    authorization_id: str | None,
    idempotency_key: str,
    client_reference: str | None = None,
) -> TrainingRun | SubmissionRefused:
    """Submit the request on ``quote_id`` once under ``idempotency_key``; return the run, or
    the backend's refusal when a person or a new quote can mend it (:class:`SubmissionRefused`).

    The one call that creates work, and only the backend decides whether it may: a person's
    confirmation of the quote at the backend, or the standing authorization
    ``authorization_id`` covering it. A lost answer is resolved inside the client by looking the
    run up by its key, so this is never retried blindly. ``client_reference`` goes with the
    submission when the backend takes references; when the backend answers that the reference
    already made a run (another process of the same flow run submitted first), that run is
    returned if it is for this request.

    Raises:
        ClientReferenceInUse: the reference made a run of a different request.
    """
    body = request.to_submission().spending(quote_id, authorization_id)
    if client_reference is not None and (await client.get_capabilities()).client_reference:
        body = body.referenced(client_reference)
    try:
        submission = await client.submit_training_run(body, idempotency_key=idempotency_key)
    except MENDABLE_REFUSALS as refusal:
        return SubmissionRefused(refusal)
    except ClientReferenceInUse:
        if client_reference is None:  # not sent, so not this reference: the backend's word
            raise
        earlier = await ownership.find_referenced_run(client, request, client_reference)
        if earlier is None:
            raise
        return earlier
    return submission.run


async def decide_action(
    client: ItoClient, run: TrainingRun, action_id: str, decision: DecisionRequest
) -> TrainingRun:
    """Decide a pending action at the backend as the person ``client``'s token speaks for.

    Contract v0.5: only a person's token (``user:…``, holding ``training:decide``) decides, and
    the backend records its principal. One idempotency key per call, so that the client's
    retries of a lost answer are safe, while two people deciding at once never share a key (the
    backend records the first decision and says so to the second).

    Raises:
        InsufficientScope: the token may not decide (a workload's never may); the message says
            nothing was decided and where a person decides instead.
    """
    try:
        return await client.decide(
            run.run_id,
            action_id,
            decision,
            idempotency_key=f"ito-decision-{uuid.uuid4()}",
        )
    except InsufficientScope as error:
        where = run.pending_action.decide_url if run.pending_action else None
        raise InsufficientScope(
            f"nothing was decided on action {action_id}: {error.message}. Only a person decides, "
            f"with a token of their own ({Scope.DECIDE.value}: log in as yourself with "
            f"`prefect-ito login`)"
            + (f", or on the backend's page {where}" if where else "")
            + f"; backend run {run.run_id} still waits for a decision",
            status_code=error.status_code,
            request_id=error.request_id,
        ) from None


async def cancel_training_workload(
    client: ItoClient,
    run_id: str,
    *,
    reason: str,
    confirm_seconds: float = CANCEL_CONFIRM_SECONDS,
    wait: float = 5.0,
) -> TrainingRun:
    """Cancel the backend workload (never the booking) and wait until it is terminal.

    Returns the last run seen; its state tells whether the cancel was confirmed.
    """
    run = await client.cancel_training_run(
        run_id, reason=reason, idempotency_key=f"ito-cancel-{run_id}"
    )
    give_up = time.monotonic() + confirm_seconds
    while not run.finished and time.monotonic() < give_up:
        poll = min(wait, max(0.0, give_up - time.monotonic()))
        run = await client.get_training_run(run_id, after_version=run.version, wait=poll)
    return run


def _normalise(value: object) -> str:
    return str(value).strip().lower().replace("-", "").replace("_", "").replace(" ", "")
