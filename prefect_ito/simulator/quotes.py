"""Training quotes: the plan preview and estimate a person confirms before any spend.

:class:`QuoteBook` issues quotes and checks the confirmation a new submission carries. The engine
consumes a quote in the same synchronous step that creates the run, so two submissions can never
both use one quote.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from prefect_ito.contract import (
    ConfirmationRecord,
    CostRange,
    ErrorCode,
    PlanPreview,
    SpendConfirmation,
    TrainingQuote,
    TrainingRunRequest,
)
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.pipeline import (
    is_custom_data,
    plan_parallelism,
    plan_stages,
    planned_hours,
)
from prefect_ito.simulator.scenario import RunScript, SimBooking

ESTIMATE_LOW = 0.9
"""The low end of an estimate, as a share of the planned hours: a run may go a little faster."""
ESTIMATE_HIGH = 1.3
"""The high end: restarts after loss spikes, and interruptions beyond the scripted ones."""


@dataclass
class _Held:
    """A quote issued to an account, when it expires (real clock), and the run that used it."""

    quote: TrainingQuote
    account: str
    expires: float
    used_by: str | None = None


def preview(request: TrainingRunRequest, booking: SimBooking, script: RunScript) -> PlanPreview:
    """Return the plan and the estimate the backend gives for ``request`` on ``booking``."""
    hours = planned_hours(request, script)
    custom = is_custom_data(request.data_refs)
    return PlanPreview(
        parallelism=plan_parallelism(request.model_size, booking, script),
        stages=[stage.name for stage in plan_stages(request, script)],
        custom_data=custom,
        ladder_check=custom,
        gpu_hours=_range(hours * booking.gpus),
        cost_usd=_range(hours * booking.gpus * script.gpu_hour_usd),
        duration_hours=_range(hours),
    )


def _range(value: float) -> CostRange:
    return CostRange(low=round(value * ESTIMATE_LOW, 2), high=round(value * ESTIMATE_HIGH, 2))


def _warnings(quote: TrainingQuote) -> list[str]:
    plan = quote.plan
    warnings = []
    if plan.parallelism.refused:
        warnings.append(f"the backend refuses this plan: {plan.parallelism.reason}")
    if not quote.within_budget:
        warnings.append(
            f"the estimate reaches ${plan.cost_usd.high:,.0f}, above the budget of "
            f"${quote.budget_usd:,.0f}: the run may stop at the ceiling"
        )
    if not quote.ends_before_term:
        warnings.append(
            f"the run may take up to {plan.duration_hours.high:,.0f} h and outlast the "
            f"booking's term, which ends {quote.term_end.isoformat()}"
        )
    if plan.ladder_check:
        warnings.append("custom data goes through the 150M ladder first, which may reject it")
    return warnings


def _check_match(quote: TrainingQuote, request: TrainingRunRequest) -> None:
    """Refuse a submission made for another booking, budget or manifest than its quote.

    Every field that differs is named. The booking and the budget are part of the manifest, so
    a different one changes the digest too: they come first, and ``field`` names the first, so
    that the answer says what a person changed rather than only that the digest differs.
    """
    differ = [
        (name, quoted)
        for name, quoted, sent in (
            ("booking_id", quote.booking_id, request.booking_id),
            ("budget_usd", quote.budget_usd, request.budget_usd),
            ("manifest_digest", quote.manifest_digest, request.manifest_digest),
        )
        if quoted != sent
    ]
    if not differ:
        return
    shown = ", ".join(
        f"{name} {quoted:,.2f}" if isinstance(quoted, float) else f"{name} {quoted}"
        for name, quoted in differ
    )
    raise SimError(
        ErrorCode.CONFIRMATION_MISMATCH,
        f"the quote was made for another {', '.join(name for name, _ in differ)} ({shown})",
        field=differ[0][0],
        details={"fields": [name for name, _ in differ]},
    )


class QuoteBook:
    """The quotes one simulator issued, each confirmable until it expires or is used."""

    def __init__(self, ttl_seconds: float) -> None:
        self._ttl = ttl_seconds
        self._held: dict[str, _Held] = {}

    def issue(
        self,
        account: str,
        request: TrainingRunRequest,
        booking: SimBooking,
        script: RunScript,
        *,
        now: datetime,
        real_now: float,
    ) -> TrainingQuote:
        """Return a new quote for ``request``, confirmable for the book's time to live."""
        plan = preview(request, booking, script)
        quote = TrainingQuote(
            quote_id=f"quote_{uuid4().hex[:16]}",
            booking_id=request.booking_id,
            manifest_digest=request.manifest_digest,
            budget_usd=request.budget_usd,
            plan=plan,
            within_budget=plan.cost_usd.high <= request.budget_usd,
            term_end=booking.term_end,
            # Compared in hours: a model of thousands of trillions of parameters would date the
            # end of its run past the year 9999.
            ends_before_term=plan.duration_hours.high * 3600
            <= (booking.term_end - now).total_seconds(),
            expires_at=now + timedelta(seconds=self._ttl),
        )
        quote = quote.model_copy(update={"warnings": _warnings(quote)})
        self._held[quote.quote_id] = _Held(quote, account, real_now + self._ttl)
        return quote

    def check(self, account: str, request: TrainingRunRequest, real_now: float) -> _Held:
        """Return the quote a new submission confirms, if it may be used for it.

        Raises:
            SimError: ``CONFIRMATION_REQUIRED``, ``CONFIRMATION_MISMATCH``,
                ``CONFIRMATION_USED`` or ``CONFIRMATION_EXPIRED``.
        """
        confirmation = request.confirmation
        if confirmation is None:
            raise SimError(
                ErrorCode.CONFIRMATION_REQUIRED,
                "a new run needs a spend confirmation: ask for a quote (POST "
                "/v0/training-quotes) and send its quote_id, confirmed by a person",
                field="confirmation",
            )
        held = self._held.get(confirmation.quote_id)
        if held is None or held.account != account:
            raise SimError(
                ErrorCode.CONFIRMATION_MISMATCH,
                "no such quote for this account",
                field="confirmation.quote_id",
            )
        quote = held.quote
        _check_match(quote, request)
        if held.used_by is not None:
            raise SimError(
                ErrorCode.CONFIRMATION_USED, f"the quote was already used by run {held.used_by}"
            )
        if real_now >= held.expires:
            raise SimError(
                ErrorCode.CONFIRMATION_EXPIRED,
                f"the quote expired at {quote.expires_at.isoformat()}: ask for a new one",
            )
        return held

    @staticmethod
    def use(
        held: _Held,
        confirmation: SpendConfirmation,
        run_id: str,
        at: datetime,
        principal: str | None = None,
    ) -> ConfirmationRecord:
        """Mark the quote used by ``run_id`` and return the record the run keeps."""
        held.used_by = run_id
        return ConfirmationRecord(
            **confirmation.model_dump(mode="json"), confirmed_at=at, principal=principal
        )
