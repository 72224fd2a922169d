"""Training quotes: the plan preview and estimate a person confirms before any spend.

:class:`QuoteBook` issues quotes and checks the confirmation a new submission carries. The engine
consumes a quote in the same synchronous step that creates the run, so two submissions can never
both use one quote.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from prefect_ito.contract import (
    ConfirmationRecord,
    CostRange,
    ErrorCode,
    PlanPreview,
    QuoteAnswer,
    QuoteConfirmation,
    QuoteState,
    SpendConfirmation,
    TrainingQuote,
    TrainingRequest,
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
_USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # as device login's: no vowels, no accidental words
CONFIRM_PAGE = "/confirm"
"""The simulator's confirm page, relative to its base URL."""


def _user_code() -> str:
    return "-".join(
        "".join(secrets.choice(_USER_CODE_ALPHABET) for _ in range(4)) for _ in range(2)
    )


@dataclass
class _Held:
    """A quote issued to an account, when it expires (real clock), and the run that used it."""

    quote: TrainingQuote
    account: str
    expires: float
    used_by: str | None = None
    answer: QuoteConfirmation | None = None
    """A person's confirmation or someone's decline, recorded at the backend (v0.4)."""

    def state(self, real_now: float) -> QuoteState:
        """Return where the quote stands at the real moment ``real_now``."""
        if self.used_by is not None:
            return QuoteState.USED
        if self.answer is not None and self.answer.state is QuoteAnswer.DECLINED:
            return QuoteState.DECLINED
        if real_now >= self.expires:
            return QuoteState.EXPIRED
        if self.answer is not None:
            return QuoteState.CONFIRMED
        return QuoteState.PENDING

    def stated(self, real_now: float) -> TrainingQuote:
        """Return the quote as the backend states it now: with its state and its answer."""
        return self.quote.model_copy(
            update={"state": self.state(real_now), "confirmation": self.answer}
        )


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


def _same_answer(earlier: QuoteConfirmation, answer: QuoteAnswer, principal: str) -> bool:
    """Whether ``answer`` repeats ``earlier``: any decline repeats a decline (nobody spends)."""
    if earlier.state is not answer:
        return False
    return answer is QuoteAnswer.DECLINED or earlier.principal == principal


def _already_decided(earlier: QuoteConfirmation) -> SimError:
    return SimError(
        ErrorCode.QUOTE_ALREADY_DECIDED,
        f"the quote was already {earlier.state.value} by {earlier.principal}",
        details={"state": earlier.state.value, "principal": earlier.principal},
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
        base_url: str | None = None,
    ) -> TrainingQuote:
        """Return a new quote for ``request``, confirmable for the book's time to live.

        With ``base_url`` the quote names the confirm page a person answers it on.
        """
        plan = preview(request, booking, script)
        user_code = _user_code()
        confirm_url = (
            f"{base_url.rstrip('/')}{CONFIRM_PAGE}?user_code={user_code}" if base_url else None
        )
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
            manifest=TrainingRequest.model_validate(
                request.model_dump(include=set(TrainingRequest.model_fields))
            ),
            confirm_url=confirm_url,
            user_code=user_code,
        )
        quote = quote.model_copy(update={"warnings": _warnings(quote)})
        held = _Held(quote, account, real_now + self._ttl)
        self._held[quote.quote_id] = held
        return held.stated(real_now)

    def held(self, account: str, quote_id: str) -> _Held:
        """Return the account's quote, or raise ``QUOTE_NOT_FOUND`` (another account's too)."""
        held = self._held.get(quote_id)
        if held is None or held.account != account:
            raise SimError(ErrorCode.QUOTE_NOT_FOUND, "no such quote for this account")
        return held

    def by_user_code(self, user_code: str) -> _Held | None:
        """Return the quote a confirm page's user code names, if any."""
        wanted = user_code.strip().upper()
        return next((h for h in self._held.values() if h.quote.user_code == wanted), None)

    def answer(
        self,
        held: _Held,
        *,
        answer: QuoteAnswer,
        principal: str,
        note: str | None,
        at: datetime,
        real_now: float,
    ) -> QuoteConfirmation:
        """Record a confirmation or a decline of ``held``; the same answer again is a replay.

        Raises:
            SimError: ``CONFIRMATION_USED`` or ``CONFIRMATION_EXPIRED`` for a quote past
                answering, ``QUOTE_ALREADY_DECIDED`` for one answered the other way (or
                confirmed by another person).
        """
        earlier = held.answer
        if earlier is not None and _same_answer(earlier, answer, principal):
            return earlier
        state = held.state(real_now)
        if state is QuoteState.USED:
            raise SimError(
                ErrorCode.CONFIRMATION_USED, f"the quote was already used by run {held.used_by}"
            )
        if state is QuoteState.EXPIRED:
            raise SimError(
                ErrorCode.CONFIRMATION_EXPIRED,
                f"the quote expired at {held.quote.expires_at.isoformat()}: ask for a new one",
            )
        if earlier is not None:
            raise _already_decided(earlier)
        held.answer = QuoteConfirmation(
            confirmation_id=f"qc_{uuid4().hex[:16]}",
            quote_id=held.quote.quote_id,
            state=answer,
            principal=principal,
            note=note,
            confirmed_at=at,
        )
        return held.answer

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
        if held.answer is not None and held.answer.state is QuoteAnswer.DECLINED:
            # Declined at the backend (v0.4): no confirmation a client writes can undo that.
            raise _already_decided(held.answer)
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
