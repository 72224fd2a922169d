"""The one supervision loop: start or re-attach, then follow the backend run to its end.

:func:`start` and :func:`supervise` say *what* happens, in which order; a :class:`Steps` says
*how* each step is done. The ``ito-training`` flow runs every step as a Prefect task (so each shows
in the UI, with retries where they are safe); :class:`~prefect_ito.jobs.ItoTrainingRun` calls the
same steps plainly over one client (:class:`ClientSteps`). Both therefore verify, quote, wait for
a person, delegate, report, ask people and stop on request in exactly the same way, and only
:meth:`Steps.submit` creates work — reached from :func:`start` only after nothing could be
re-attached, and only on a quote the backend says a person confirmed or an authorization covers
(see :mod:`prefect_ito.people.spend`); the backend decides, and refuses anything else.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TypeAlias, TypeVar

from prefect_ito.backend import desk
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.desk import Watchdog
from prefect_ito.backend.provenance import Provenance
from prefect_ito.blocks import ItoSpendAuthorization
from prefect_ito.contract import (
    ConfirmationRecord,
    ConfirmationVia,
    DecisionRequest,
    TrainingEligibility,
    TrainingQuote,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.exceptions import (
    BackendUnavailable,
    ConfirmationRequired,
    DecisionRequired,
    Detached,
    IdempotencyKeyInFlight,
    InsufficientScope,
    ItoTransportError,
    RateLimited,
)
from prefect_ito.parameters import BookingClaim, SupervisionParameters
from prefect_ito.people import approval, spend
from prefect_ito.reporting import report as reporting
from prefect_ito.settings import ItoSettings
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.flow_run import current_flow_run_id

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[logging.Logger]

__all__ = ["CancelRequested", "ClientSteps", "Steps", "start", "stop_for_cancel", "supervise"]

_T = TypeVar("_T")
TRANSIENT_FAULTS = (ItoTransportError, BackendUnavailable, RateLimited, IdempotencyKeyInFlight)
"""What may pass by itself: a lost connection, 503, 429, a keyed write still in flight."""
STEP_RETRY_DELAYS_SECONDS = (2.0, 10.0)
"""A step's waits before each of its retries after a transient fault, once the client's own
retries are spent: the flow's tasks (as Prefect task retries) and ``ItoTrainingRun``'s calls
alike. Reads and keyed writes only: both are safe to send again."""


class CancelRequested(Exception):
    """A person asked Prefect to cancel the flow run while it supervised ``run``."""

    def __init__(self, run: TrainingRun) -> None:
        super().__init__(run.run_id)
        self.run = run


class Steps(ABC):
    """How each step of supervision is done; see the module docstring."""

    def __init__(
        self,
        supervision: SupervisionParameters,
        logger: Logger,
        authorization: ItoSpendAuthorization | None = None,
    ) -> None:
        self.supervision = supervision
        self.logger = logger
        self.authorization = authorization

    @abstractmethod
    async def find_attachable_run(
        self, request: TrainingRequest, idempotency_key: str, client_reference: str | None
    ) -> TrainingRun | None:
        """Return the run this request's client reference or key made, or its unfinished run
        (``desk``'s rules)."""

    @abstractmethod
    async def verify_booking(self, claim: BookingClaim) -> TrainingEligibility:
        """Return the booking's eligibility; raise ``BookingNotEligible``."""

    @abstractmethod
    async def check_training_capability(self, request: TrainingRequest) -> None:
        """Raise ``CapabilityNotAvailable`` unless the backend can train this request."""

    @abstractmethod
    async def quote(self, request: TrainingRequest) -> TrainingQuote:
        """Return the backend's quote for the request: plan, estimate, digest. No work."""

    @abstractmethod
    async def read_quote(self, request: TrainingRequest, quote_id: str) -> TrainingQuote | None:
        """Return the quote as the backend states it, if it is one for ``request``."""

    @abstractmethod
    async def poll_quote(self, quote_id: str) -> TrainingQuote | None:
        """Return the quote as the backend states it (None if gone): read often, while waiting."""

    @abstractmethod
    async def decline_quote(self, quote_id: str, note: str | None) -> None:
        """Decline the quote at the backend (declining spends nothing)."""

    async def recorded_quote(self, request: TrainingRequest) -> TrainingQuote | None:
        """Return the quote an earlier process of this supervisor asked a person about."""
        return None

    async def record_quote(self, quote: TrainingQuote) -> None:  # noqa: B027 (optional hook)
        """Record the quote a person is asked about, for a watcher and for a re-entry."""

    async def await_person(
        self, quote: TrainingQuote, request: TrainingRequest, *, again: bool
    ) -> TrainingQuote:
        """Wait for a person to confirm or decline the quote at the backend; see
        :func:`prefect_ito.people.spend.wait_for_person`."""
        return await spend.wait_for_person(
            self,
            quote,
            request,
            again=again,
            timeout=self.supervision.approval_timeout,
            poll_interval=ItoSettings().state_poll_seconds,
        )

    @abstractmethod
    async def submit(
        self,
        request: TrainingRequest,
        quote_id: str,
        authorization_id: str | None,
        idempotency_key: str,
        client_reference: str | None,
    ) -> TrainingRun:
        """Submit the request on ``quote_id`` once under ``idempotency_key`` (with
        ``client_reference`` where the backend takes one): the one step that creates work, and
        the backend decides whether it may."""

    @abstractmethod
    async def read_run(self, run_id: str) -> TrainingRun:
        """Return the backend run ``run_id``; raise ``RunNotFound``."""

    @abstractmethod
    async def report(self, run: TrainingRun, after_seq: int) -> int:
        """Relay events after ``after_seq`` and refresh artifacts; return the last seq seen."""

    @abstractmethod
    async def await_gate(
        self, run: TrainingRun, watchdog: Watchdog, events_seen: int
    ) -> TrainingRun:
        """Return the run once its current stage's gate settled (or it must stop waiting)."""

    async def recorded_run_id(self) -> str | None:
        """Return the backend run this supervisor recorded before (in an earlier process)."""
        return None

    async def record_run(self, run: TrainingRun) -> None:  # noqa: B027 (optional hook)
        """Record the backend run this supervisor follows, so a re-entry never submits again."""

    async def settle(self, run: TrainingRun, events_seen: int) -> None:  # noqa: B027 (optional hook)
        """Make sure the finished run's relayed events arrived; by default, trust the sending."""

    async def resume_point(self, run: TrainingRun) -> tuple[int, Watchdog]:
        """Return the events already relayed and the watchdog to carry on with."""
        limits = self.supervision
        return 0, Watchdog(stall_timeout=limits.stall_timeout, deadline=limits.deadline)

    @abstractmethod
    async def ask_person(self, run: TrainingRun) -> DecisionRequest | None:
        """Return a person's decision on the pending action; None if the flow run was cancelled."""

    @abstractmethod
    async def relay_decision(
        self, run: TrainingRun, action_id: str, decision: DecisionRequest
    ) -> TrainingRun:
        """Pass the decision to the backend, once per action."""

    @abstractmethod
    async def cancel_workload(self, run_id: str, reason: str) -> TrainingRun:
        """Cancel the backend workload (never the booking); return the last run seen."""

    @abstractmethod
    def provenance(self) -> Provenance | None:
        """Return what the backend last said of its answers' origin; None before any answer."""

    async def interrupted(self) -> bool:
        """Tell whether a person cancelled the flow run; raise ``Detached`` on a detach."""
        return await stop_requested(current_flow_run_id())


async def start(
    steps: Steps,
    claim: BookingClaim,
    request: TrainingRequest,
    idempotency_key: Callable[[], str],
    client_reference: str | None = None,
) -> TrainingRun:
    """Re-attach to this request's run (made under its client reference or its key, or
    unfinished); otherwise verify, check, quote, have the spend confirmed, and submit it once.

    Re-attaching comes first, so a re-entered supervisor never verifies again a booking the
    backend already accepted work for, nor asks anyone again; the booking's active runs are
    listed once. ``client_reference`` (the flow run's id) finds the run this supervisor
    submitted however long ago, after its idempotency key expired too, and goes with the
    submission.
    """
    recorded = await steps.recorded_run_id()
    if recorded is not None:
        # Whatever state that run is in now, even finished: this flow run never submits again.
        known = await steps.read_run(recorded)
        steps.logger.info("Re-attached to backend run %s (%s).", known.run_id, known.state.value)
        return known
    attachable = await steps.find_attachable_run(request, idempotency_key(), client_reference)
    if attachable is not None:
        steps.logger.info(
            "Re-attached to backend run %s (%s), %s: nothing is quoted, confirmed or submitted "
            "again.",
            attachable.run_id,
            attachable.state.value,
            f"which this flow run submitted (client reference {client_reference})"
            if client_reference is not None and attachable.client_reference == client_reference
            else "made for this request under its idempotency key or still running on the booking",
        )
        await steps.record_run(attachable)
        return attachable
    eligibility = await steps.verify_booking(claim)
    steps.logger.info(
        "Booking %s verified: %s × %d nodes × %d GPUs on %s.",
        eligibility.booking_id,
        eligibility.gpu_sku,
        eligibility.node_count,
        eligibility.gpus_per_node,
        eligibility.fabric,
    )
    await steps.check_training_capability(request)
    run = await spend.submit_with_consent(steps, request, idempotency_key(), client_reference)
    on_record = run.confirmation
    steps.logger.info(
        "Delegated to the Itô desk backend as run %s%s.",
        run.run_id,
        _allowed_by(on_record) if on_record is not None else "",
    )
    await steps.record_run(run)
    return run


def _allowed_by(record: ConfirmationRecord) -> str:
    """Say who allowed the spend, as the backend recorded it."""
    if record.via == ConfirmationVia.STANDING_AUTHORIZATION:
        return f", under the standing authorization {record.authorization} of {record.confirmed_by}"
    return f", confirmed at the backend by {record.confirmed_by}"


async def supervise(steps: Steps, run: TrainingRun) -> TrainingRun:
    """Follow the backend's own stage plan until the run ends; ask people to decide restarts.

    Raises:
        CancelRequested: a person cancelled the flow run; the caller cancels the workload.
        Detached: the person at the terminal detached; the backend run goes on.
        RunStalled, DeadlineExceeded: a watchdog limit passed; the backend run goes on.
    """
    seen, watchdog = await steps.resume_point(run)
    before, noted = None, set[str]()
    _log_provenance(steps)
    try:
        while True:
            seen = await _report(steps, run, seen)
            for line in reporting.stage_changes(before, run):
                steps.logger.info("%s", line)
            before = run
            if run.finished:
                await steps.settle(run, seen)
                return run
            if await steps.interrupted():
                raise CancelRequested(run)
            _note_unknown(steps, run, noted)
            if run.pending_action is not None and desk.decidable(run.pending_action):
                decision = await steps.ask_person(run)
                if decision is None:
                    raise CancelRequested(run)
                run = await steps.relay_decision(run, run.pending_action.action_id, decision)
                continue
            run = await steps.await_gate(run, watchdog, seen)
    except Detached:
        raise Detached(
            f"detached at the terminal: backend run {run.run_id} goes on; re-attach with "
            f"`prefect-ito attach {run.run_id}`"
        ) from None


async def stop_for_cancel(steps: Steps, run: TrainingRun) -> tuple[TrainingRun, str]:
    """Cancel the workload of a cancelled flow run; return the last run seen and what happened."""
    steps.logger.info("Cancellation requested: cancelling backend workload %s.", run.run_id)
    try:
        final = await steps.cancel_workload(run.run_id, "the Prefect flow run was cancelled")
    except InsufficientScope as error:
        # The flow run is cancelled either way; say plainly that the workload was not.
        return run, (
            f"Backend workload {run.run_id} was NOT cancelled and goes on: {error.message}; "
            "cancel it with a token that carries training:cancel"
        )
    if final.finished:
        return final, f"Backend workload {run.run_id} cancelled ({final.state.value})."
    return final, (
        f"Cancel of backend workload {run.run_id} is unconfirmed: it was still "
        f"{final.state.value} after {desk.CANCEL_CONFIRM_SECONDS:g} s."
    )


def _log_provenance(steps: Steps) -> None:
    """Say in the flow's log where the backend's answers come from (a warning if surprising)."""
    provenance = steps.provenance()
    if provenance is None:
        return
    if provenance.surprising:
        steps.logger.warning("%s", provenance.warning())
    steps.logger.info("%s", provenance.describe())


def _note_unknown(steps: Steps, run: TrainingRun, noted: set[str]) -> None:
    """Say once what of the run this prefect-ito does not know, and that supervision goes on."""
    if not run.state.known and f"state:{run.state.value}" not in noted:
        noted.add(f"state:{run.state.value}")
        steps.logger.warning(
            "Backend run %s is in state %r, which this prefect-ito does not know: it is treated "
            "as unfinished, and supervision goes on until the backend reports an end.",
            run.run_id,
            run.state.value,
        )
    action = run.pending_action
    if action is not None and not desk.decidable(action) and action.action_id not in noted:
        noted.add(action.action_id)
        steps.logger.warning(
            "Backend run %s waits for a decision on action %s of kind %r, which prefect-ito "
            "cannot put to a person: decide it with a tool that knows it. Supervision goes on.",
            run.run_id,
            action.action_id,
            action.kind.value,
        )


async def _report(steps: Steps, run: TrainingRun, seen: int) -> int:
    # A report that fails for a passing reason must never be what stops supervision: the events
    # are read again from the same sequence next time round, so nothing is lost.
    try:
        return await steps.report(run, seen)
    except TRANSIENT_FAULTS as error:  # only delays a report: it is made next time round
        steps.logger.warning("Could not report on run %s this time: %s", run.run_id, error)
        return seen


class ClientSteps(Steps):
    """Each step as a plain call over one client, for :class:`~prefect_ito.jobs.ItoTrainingRun`.

    Inside a flow run a spend or a proposed restart is put to a person exactly as the flow does;
    outside one :class:`ConfirmationRequired` or :class:`DecisionRequired` is raised instead, since
    nobody could answer a pause.
    """

    def __init__(
        self,
        client: ItoClient,
        supervision: SupervisionParameters,
        logger: Logger,
        authorization: ItoSpendAuthorization | None = None,
    ) -> None:
        super().__init__(supervision, logger, authorization)
        self.client = client

    async def _again(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """Make a read or keyed write as the flow's retried tasks make it (see
        :data:`STEP_RETRY_DELAYS_SECONDS`), so a storm ends a job no sooner than a flow."""
        for delay in STEP_RETRY_DELAYS_SECONDS:
            try:
                return await call()
            except TRANSIENT_FAULTS as fault:
                self.logger.warning("%s; trying again in %g s", fault, delay)
                await asyncio.sleep(delay)
        return await call()

    async def find_attachable_run(
        self, request: TrainingRequest, idempotency_key: str, client_reference: str | None
    ) -> TrainingRun | None:
        return await self._again(
            lambda: desk.find_attachable_run(
                self.client, request, idempotency_key, client_reference, self.logger
            )
        )

    async def verify_booking(self, claim: BookingClaim) -> TrainingEligibility:
        return await self._again(lambda: desk.verify_booking(self.client, claim))

    async def check_training_capability(self, request: TrainingRequest) -> None:
        await self._again(lambda: desk.check_training_capability(self.client, request))

    async def quote(self, request: TrainingRequest) -> TrainingQuote:
        return await self._again(lambda: desk.quote(self.client, request))

    async def read_quote(self, request: TrainingRequest, quote_id: str) -> TrainingQuote | None:
        return await self._again(lambda: desk.read_quote(self.client, request, quote_id))

    async def poll_quote(self, quote_id: str) -> TrainingQuote | None:
        return await self.client.get_quote(quote_id)

    async def decline_quote(self, quote_id: str, note: str | None) -> None:
        await self._again(lambda: desk.decline_quote(self.client, quote_id, note))

    async def await_person(
        self, quote: TrainingQuote, request: TrainingRequest, *, again: bool
    ) -> TrainingQuote:
        if current_flow_run_id() is None:
            where = f" at {quote.confirm_url} (code {quote.user_code})" if quote.confirm_url else ""
            raise ConfirmationRequired(
                f"the spend on booking {request.booking_id} (quote {quote.quote_id}) needs a "
                f"person's confirmation at the backend{where}, and outside a flow run nobody "
                "can be waited for: confirm it there and run the job again, give the job a "
                "standing authorization that covers it, or trigger it in a flow run"
            )
        return await super().await_person(quote, request, again=again)

    async def submit(
        self,
        request: TrainingRequest,
        quote_id: str,
        authorization_id: str | None,
        idempotency_key: str,
        client_reference: str | None,
    ) -> TrainingRun:
        return await desk.submit(
            self.client, request, quote_id, authorization_id, idempotency_key, client_reference
        )

    async def read_run(self, run_id: str) -> TrainingRun:
        return await self._again(lambda: self.client.get_training_run(run_id))

    async def report(self, run: TrainingRun, after_seq: int) -> int:
        return await reporting.report(self.client, run, after_seq)

    async def await_gate(
        self, run: TrainingRun, watchdog: Watchdog, events_seen: int
    ) -> TrainingRun:
        flow_run_id = current_flow_run_id()
        return await self._again(
            lambda: desk.follow_gate(
                self.client, run, watchdog, lambda: stop_requested(flow_run_id)
            )
        )

    async def ask_person(self, run: TrainingRun) -> DecisionRequest | None:
        action = run.pending_action
        assert action is not None
        if current_flow_run_id() is None:
            raise DecisionRequired(action, run_id=run.run_id)
        return await approval.ask_and_log(run, timeout=self.supervision.approval_timeout)

    async def relay_decision(
        self, run: TrainingRun, action_id: str, decision: DecisionRequest
    ) -> TrainingRun:
        return await self._again(lambda: desk.relay_decision(self.client, run, action_id, decision))

    async def cancel_workload(self, run_id: str, reason: str) -> TrainingRun:
        return await desk.cancel_workload(self.client, run_id, reason=reason)

    def provenance(self) -> Provenance | None:
        return self.client.provenance
