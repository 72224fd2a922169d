"""What prefect-ito asks of the Itô desk backend, as plain coroutines over an :class:`ItoClient`.

Both ways of doing the steps of :mod:`prefect_ito.supervision.loop` — the flow's Prefect tasks and
the
job's plain calls — come down to these, so there is one way to verify, submit and follow a run.
Nothing here trains, books, buys or overrides a gate, and nothing submits a request a person did
not confirm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    ActionKind,
    BookingStatus,
    DecisionRequest,
    GateStatus,
    PendingAction,
    Scope,
    Stage,
    TrainingEligibility,
    TrainingQuote,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.exceptions import (
    BookingBusy,
    BookingNotEligible,
    CapabilityNotAvailable,
    ClientReferenceInUse,
    ConfirmationExpired,
    ConfirmationUsed,
    DeadlineExceeded,
    IdempotencyKeyReused,
    InsufficientScope,
    InvalidParameters,
    ItoProtocolError,
    QuoteAlreadyDecided,
    QuoteNotFound,
    RunStalled,
)
from prefect_ito.parameters import BookingClaim
from prefect_ito.settings import ItoSettings

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
    """
    eligibility = await client.get_training_eligibility(claim.booking_id)
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


async def quote(client: ItoClient, request: TrainingRequest) -> TrainingQuote:
    """Return the backend's quote for the request: plan preview, estimate, expiring quote id.

    Creates no work and spends nothing.

    Raises:
        ItoProtocolError: the quote is for another booking, manifest or budget.
    """
    found = await client.quote_training_run(request.to_submission())
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


async def read_quote(
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


async def decline_quote(client: ItoClient, quote_id: str, note: str | None) -> None:
    """Decline the quote at the backend (final for it), once, whatever a retry does.

    Declining spends nothing, so any token that may read may do it. A quote a person confirmed
    at the backend first stays confirmed: the caller reads it again.
    """
    key = f"decline-{quote_id}"[:IDEMPOTENCY_KEY_MAX_LENGTH]
    with contextlib.suppress(QuoteAlreadyDecided, ConfirmationUsed, ConfirmationExpired):
        await client.decline_quote(quote_id, note=note, idempotency_key=key)


async def find_attachable_run(
    client: ItoClient,
    request: TrainingRequest,
    idempotency_key: str | None = None,
    client_reference: str | None = None,
    logger: Logger = _logger,
) -> TrainingRun | None:
    """Return this very request's run: the one its client reference or its key made, or the
    booking's unfinished one.

    The run ``client_reference`` made comes first, finished or not, and is found however long
    ago it was submitted (:func:`find_referenced_run`). The run ``idempotency_key`` made is
    looked up too, finished or not, within the key's retention: a supervisor that lost its
    record of a run (or a person sending the same key again) attaches to it, and nobody is asked
    to confirm a spend that cannot happen again.

    Raises:
        ClientReferenceInUse: ``client_reference`` already made a run of a different request.
        BookingBusy: the booking has an unfinished run for a different request.
        IdempotencyKeyReused: ``idempotency_key`` already made a run of a different request.
    """
    if client_reference is not None:
        referenced = await find_referenced_run(client, request, client_reference, logger)
        if referenced is not None:
            return referenced
    digest = request.digest()
    for run in await client.list_active_runs(request.booking_id):
        if run.manifest_digest == digest:
            return run
        raise BookingBusy(
            f"booking {request.booking_id} is busy with run {run.run_id} "
            f"({run.manifest_digest}); this request is {digest}"
        )
    if idempotency_key is None:
        return None
    earlier = await client.find_run_by_idempotency_key(idempotency_key)
    if earlier is not None and earlier.manifest_digest != digest:
        raise IdempotencyKeyReused(
            f"idempotency key {idempotency_key} already made run {earlier.run_id} of another "
            f"manifest ({earlier.manifest_digest}); this request is {digest}"
        )
    return earlier


async def find_referenced_run(
    client: ItoClient, request: TrainingRequest, client_reference: str, logger: Logger = _logger
) -> TrainingRun | None:
    """Return the run submitted with ``client_reference``, finished or not, or None.

    A backend keeps a reference for as long as the run exists, whatever its idempotency keys'
    retention. One that does not advertise references (``Capabilities.client_reference``,
    contract v0.3) is not asked: re-attaching then goes by the booking and the key only, as
    before, and ``logger`` says so.

    Raises:
        ClientReferenceInUse: the reference made a run of a different request.
    """
    if not (await client.get_capabilities()).client_reference:
        logger.info(
            "The backend does not advertise client references (contract v0.3): re-attaching "
            "goes by the booking's unfinished run and the idempotency key only, which a backend "
            "keeps for at least 24 hours."
        )
        return None
    runs = await client.find_runs_by_client_reference(client_reference)
    if not runs:
        return None
    run, digest = runs[0], request.digest()
    if run.manifest_digest != digest:
        raise ClientReferenceInUse(
            f"client reference {client_reference} already made run {run.run_id} of another "
            f"manifest ({run.manifest_digest}); this request is {digest}, and nothing is "
            "submitted again under that reference"
        )
    return run


async def submit(
    client: ItoClient,
    request: TrainingRequest,
    quote_id: str,
    authorization_id: str | None,
    idempotency_key: str,
    client_reference: str | None = None,
) -> TrainingRun:
    """Submit the request on ``quote_id`` once under ``idempotency_key``; return the run.

    The one call that creates work, and only the backend decides whether it may: a person's
    confirmation of the quote at the backend, or the standing authorization
    ``authorization_id`` covering it. A lost answer is resolved inside the client by looking the
    run up by its key, so this is never retried blindly. ``client_reference`` goes with the
    submission when the backend takes references; when the backend answers that the reference
    already made a run (another process of the same flow run submitted first), that run is
    returned if it is for this request.

    Raises:
        ClientReferenceInUse: the reference made a run of a different request.
        ConfirmationRequired, AuthorizationDoesNotCover, ConfirmationExpired, ConfirmationUsed:
            the backend's refusal; nothing was created.
    """
    body = request.to_submission().spending(quote_id, authorization_id)
    if client_reference is not None and (await client.get_capabilities()).client_reference:
        body = body.referenced(client_reference)
    try:
        submission = await client.submit_training_run(body, idempotency_key=idempotency_key)
    except ClientReferenceInUse:
        if client_reference is None:  # not sent, so not this reference: the backend's word
            raise
        earlier = await find_referenced_run(client, request, client_reference)
        if earlier is None:
            raise
        return earlier
    return submission.run


@dataclass
class Watchdog:
    """Wall-clock limits on supervision, measured with ``clock`` (monotonic unless deferred).

    ``stall_timeout`` ends supervision when the backend's ``heartbeat_at`` has not advanced for
    that long; ``deadline`` when supervision as a whole has run that long. Neither touches the run.
    """

    stall_timeout: float | None = None
    deadline: float | None = None
    clock: Callable[[], float] = time.monotonic
    _started: float = field(init=False)
    _heartbeat: datetime | None = field(init=False, default=None)
    _heartbeat_seen: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self._heartbeat_seen = self.clock()

    def resume(
        self, *, started: float, heartbeat: datetime | None, heartbeat_seen: float | None
    ) -> Watchdog:
        """Carry the clocks on from an earlier process (times in this watchdog's ``clock``).

        A deferred flow run re-enters many times over weeks; its limits count from when
        supervision started and when the heartbeat last moved, not from this process's start.
        """
        self._started = started
        if heartbeat is not None and heartbeat_seen is not None:
            self._heartbeat, self._heartbeat_seen = heartbeat, heartbeat_seen
        return self

    @property
    def heartbeat_seen(self) -> float:
        """When (on ``clock``) the current heartbeat was first seen."""
        return self._heartbeat_seen

    @property
    def deadline_at(self) -> float | None:
        """When (on ``clock``) the deadline is reached, or None without one."""
        return None if self.deadline is None else self._started + self.deadline

    def observe(self, run: TrainingRun) -> None:
        """Record the run's heartbeat and raise when a limit is passed."""
        now = self.clock()
        if run.heartbeat_at != self._heartbeat:
            self._heartbeat, self._heartbeat_seen = run.heartbeat_at, now
        if self.stall_timeout is not None and now - self._heartbeat_seen > self.stall_timeout:
            raise RunStalled(
                f"run {run.run_id} shows no sign of life: heartbeat_at stayed at "
                f"{run.heartbeat_at.isoformat()} for over {self.stall_timeout:g} s"
            )
        if self.deadline is not None and now - self._started > self.deadline:
            raise DeadlineExceeded(
                f"supervision of run {run.run_id} reached its deadline of {self.deadline:g} s; "
                "the backend run goes on and running the flow again re-attaches"
            )

    def remaining(self) -> float | None:
        """Seconds until the nearest limit could be passed, or None without limits."""
        now = self.clock()
        limits = [
            limit - (now - since)
            for limit, since in (
                (self.stall_timeout, self._heartbeat_seen),
                (self.deadline, self._started),
            )
            if limit is not None
        ]
        return max(0.0, min(limits)) if limits else None


def current_stage(run: TrainingRun) -> Stage | None:
    """Return the stage the run is in, or None before the first and after the last."""
    return next((stage for stage in run.stages if stage.name == run.current_stage), None)


def decidable(action: PendingAction | None) -> bool:
    """Tell whether prefect-ito can put ``action`` to a person: a kind it knows how to show.

    An action of a kind added to the contract later is left to tools that know it; supervision
    reports it and goes on following the run.
    """
    return action is not None and action.kind is ActionKind.LOSS_SPIKE_RESTART


def gate_settled(run: TrainingRun, stage_name: str | None) -> bool:
    """Tell whether supervision of ``stage_name`` has something to report.

    True when the run finished, a person must decide, the run moved past the stage, or the
    stage's gate (or, for a stage without one, the stage itself) has a result. A status this
    prefect-ito does not know is no result: the wait goes on.
    """
    if run.finished or decidable(run.pending_action):
        return True
    if run.current_stage != stage_name:
        return True
    stage = current_stage(run)
    if stage is None:
        return False
    if stage.gate is not None:
        return stage.gate.status in (GateStatus.PASSED, GateStatus.FAILED)
    return stage.status.done


async def await_gate(
    client: ItoClient,
    run: TrainingRun,
    *,
    wait: float,
    watchdog: Watchdog,
    interrupted: Callable[[], Awaitable[bool]] | None = None,
    check_every: float | None = None,
    patience: float | None = None,
) -> TrainingRun:
    """Long-poll the run until the current stage's gate settles (see :func:`gate_settled`).

    Every read is a fresh long-poll of up to ``wait`` seconds on the run's ``version``.
    ``interrupted`` (e.g. whether a person cancelled the flow run) is asked between polls and,
    with ``check_every``, that often during one; when true the wait ends early. With
    ``patience``, the wait also ends after that many seconds, the gate settled or not.

    Raises:
        RunStalled: the heartbeat stopped advancing for ``watchdog.stall_timeout``.
        DeadlineExceeded: supervision reached ``watchdog.deadline``.
    """
    stage = run.current_stage
    give_up = None if patience is None else time.monotonic() + patience
    while True:
        watchdog.observe(run)
        if gate_settled(run, stage) or (interrupted is not None and await interrupted()):
            return run
        limits = [wait]
        remaining = watchdog.remaining()
        if remaining is not None:
            limits.append(remaining)
        if give_up is not None:
            if give_up <= time.monotonic():
                return run
            limits.append(give_up - time.monotonic())
        poll = max(0.0, min(limits) + 0.01)
        read = client.get_training_run(run.run_id, after_version=run.version, wait=poll)
        if interrupted is None or check_every is None or check_every >= poll:
            run = await read
            continue
        answer = await _read_unless_interrupted(read, interrupted, check_every)
        if answer is None:
            return run
        run = answer


async def _read_unless_interrupted(
    read: Awaitable[TrainingRun], interrupted: Callable[[], Awaitable[bool]], every: float
) -> TrainingRun | None:
    """Await a long-poll, asking ``interrupted`` every ``every`` seconds meanwhile.

    Returns None, the read abandoned, once ``interrupted`` is true. A long-poll is a read, so
    abandoning it changes nothing at the backend. Racing the check beside one long wait, rather
    than cutting the wait to the check's interval, keeps an idle run to one request per
    ``poll_wait_seconds`` while a cancel is still heard within ``state_poll_seconds``.
    """
    poll = asyncio.ensure_future(read)
    try:
        while True:
            done, _ = await asyncio.wait({poll}, timeout=every)
            if done:
                return poll.result()
            if await interrupted():
                return None
    finally:
        if not poll.done():
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll


async def follow_gate(
    client: ItoClient,
    run: TrainingRun,
    watchdog: Watchdog,
    interrupted: Callable[[], Awaitable[bool]],
    patience: float | None = None,
) -> TrainingRun:
    """Wait for the current stage's gate with the configured long-poll, asking ``interrupted``.

    Each long-poll waits up to ``poll_wait_seconds``; beside it ``interrupted`` is asked every
    ``state_poll_seconds``, so a cancel or a detach is heard that soon.
    """
    settings = ItoSettings()
    return await await_gate(
        client,
        run,
        wait=settings.poll_wait_seconds,
        watchdog=watchdog,
        interrupted=interrupted,
        check_every=settings.state_poll_seconds,
        patience=patience,
    )


async def relay_decision(
    client: ItoClient, run: TrainingRun, action_id: str, decision: DecisionRequest
) -> TrainingRun:
    """Pass a person's decision to the backend, under one key per action.

    Raises:
        InsufficientScope: the token lacks ``training:decide``; the message says the decision
            was not relayed and that the backend still waits for one.
    """
    try:
        return await client.decide(
            run.run_id,
            action_id,
            decision,
            idempotency_key=f"ito-decision-{run.run_id}-{action_id}",
        )
    except InsufficientScope as error:
        raise InsufficientScope(
            f"the decision to {decision.decision.value} (by {decision.decided_by}) on action "
            f"{action_id} was not relayed: {error.message}. Backend run {run.run_id} still "
            f"waits for a decision; give it with a token that carries {Scope.DECIDE.value}",
            status_code=error.status_code,
            request_id=error.request_id,
        ) from None


async def cancel_workload(
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
