"""Training quotes: the plan preview and estimate a person confirms before any spend.

:class:`QuoteBook` issues quotes, records a person's answer to one (contract v0.4), carries a
confirmation to a new quote of the same manifest when nothing got worse, and checks the quote a new
submission names. The engine consumes a quote in the same synchronous step that creates the run,
so two submissions can never both use one quote.

One module past ~400 lines on purpose: issuing, answering, carrying over and checking a quote
are one set of rules, and the contract's spend rules read against this one file.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from prefect_ito.contract import (
    CostRange,
    ErrorCode,
    PlanPreview,
    QuoteAnswer,
    QuoteConfirmation,
    QuoteState,
    TrainingQuote,
    TrainingRequest,
    TrainingRunRequest,
)
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.ids import CONFIRM_PAGE, mint, user_code
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
class HeldQuote:
    """A quote issued to an account, when it expires (real clock), and the run that used it."""

    quote: TrainingQuote
    account: str
    expires: float
    used_by: str | None = None
    answer: QuoteConfirmation | None = None
    """A person's confirmation or someone's decline, recorded at the backend (v0.4)."""
    answered: float = 0.0
    """When (real clock) the person confirmed: a carried confirmation keeps its first moment."""
    superseded_by: str | None = None
    """The newer quote of the same manifest this quote's confirmation carried to."""
    asked_by: str | None = None
    """The principal whose token asked for the quote: shown on the confirm page."""
    flow_run: str | None = None
    """The request's client reference (a Prefect flow run's id): shown on the confirm page."""

    def state(self, real_now: float) -> QuoteState:
        """Return where the quote stands at the real moment ``real_now``."""
        if self.used_by is not None:
            return QuoteState.USED
        if self.superseded_by is not None:
            return QuoteState.SUPERSEDED
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


def _priced(
    request: TrainingRunRequest, booking: SimBooking, script: RunScript, now: datetime
) -> TrainingQuote:
    """Return what ``request`` costs on ``booking`` as it is ``now``, as a quote without an id."""
    plan = preview(request, booking, script)
    quote = TrainingQuote(
        quote_id="unissued",
        booking_id=request.booking_id,
        manifest_digest=request.manifest_digest,
        budget_usd=request.budget_usd,
        plan=plan,
        within_budget=plan.cost_usd.high <= request.budget_usd,
        term_end=booking.term_end,
        # Compared in hours: a model of thousands of trillions of parameters would date the end
        # of its run past the year 9999.
        ends_before_term=plan.duration_hours.high * 3600
        <= (booking.term_end - now).total_seconds(),
        expires_at=now,
        booking_usd_per_hour=round(booking.gpus * script.gpu_hour_usd, 2),
        manifest=TrainingRequest.model_validate(
            request.model_dump(include=set(TrainingRequest.model_fields))
        ),
    )
    return quote.model_copy(update={"warnings": _warnings(quote)})


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


def _what_got_worse(confirmed: TrainingQuote, new: TrainingQuote) -> list[str]:
    """Return what makes ``new`` something the person who confirmed ``confirmed`` did not see."""
    worse = []
    if new.plan.cost_usd.high > confirmed.plan.cost_usd.high:
        worse.append(
            f"the estimate's high end rose from ${confirmed.plan.cost_usd.high:,.0f} to "
            f"${new.plan.cost_usd.high:,.0f}"
        )
    if confirmed.ends_before_term and not new.ends_before_term:
        worse.append(
            f"the run may now outlast the booking's term, which ends {new.term_end.isoformat()}"
        )
    if new.plan.parallelism.refused and not confirmed.plan.parallelism.refused:
        worse.append(f"the backend now refuses the plan: {new.plan.parallelism.reason}")
    return worse


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
        self._held: dict[str, HeldQuote] = {}

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
        asked_by: str | None = None,
    ) -> TrainingQuote:
        """Return a new quote for ``request``, confirmable for the book's time to live.

        With ``base_url`` the quote names the confirm page a person answers it on.
        """
        code = user_code()
        confirm_url = f"{base_url.rstrip('/')}{CONFIRM_PAGE}?user_code={code}" if base_url else None
        quote = _priced(request, booking, script, now).model_copy(
            update={
                "quote_id": mint("quote"),
                "expires_at": now + timedelta(seconds=self._ttl),
                "confirm_url": confirm_url,
                "user_code": code,
                "client_reference": request.client_reference,
            }
        )
        held = HeldQuote(
            quote,
            account,
            real_now + self._ttl,
            asked_by=asked_by,
            flow_run=request.client_reference,
        )
        self._carry(held, real_now)
        self._held[quote.quote_id] = held
        return held.stated(real_now)

    def _carry(self, new: HeldQuote, real_now: float) -> None:
        """Carry an earlier person's confirmation of the same manifest to ``new``, if it may.

        It may while it is unused and younger than a quote's lifetime, and only when the new
        estimate's high end is no higher than the one the person saw and the run is still
        expected to end before the booking's term; otherwise ``new`` says what changed.
        """
        earlier = self._standing_confirmation(new.account, new.quote.manifest_digest, real_now)
        if earlier is None or earlier.answer is None:
            return
        changed = _what_got_worse(earlier.quote, new.quote)
        if changed:
            new.quote = new.quote.model_copy(update={"not_carried": changed})
            return
        earlier.superseded_by = new.quote.quote_id
        new.answer = earlier.answer.model_copy(update={"quote_id": new.quote.quote_id})
        new.answered = earlier.answered
        # The quote the person confirmed, however many quotes the confirmation crossed since:
        # an intermediate quote was never shown to anyone.
        confirmed = earlier.quote.carried_from or earlier.quote.quote_id
        new.quote = new.quote.model_copy(update={"carried_from": confirmed})

    def _standing_confirmation(
        self, account: str, digest: str, real_now: float
    ) -> HeldQuote | None:
        """Return the account's latest quote of ``digest`` whose confirmation may still carry."""
        for held in reversed(self._held.values()):
            if held.account != account or held.quote.manifest_digest != digest:
                continue
            confirmed = held.answer is not None and held.answer.state is QuoteAnswer.CONFIRMED
            if confirmed and held.used_by is None and held.superseded_by is None:
                return held if real_now < held.answered + self._ttl else None
        return None

    def held(self, account: str, quote_id: str) -> HeldQuote:
        """Return the account's quote, or raise ``QUOTE_NOT_FOUND`` (another account's too)."""
        held = self._held.get(quote_id)
        if held is None or held.account != account:
            raise SimError(ErrorCode.QUOTE_NOT_FOUND, "no such quote for this account")
        return held

    def holds(self, account: str, quote_id: str) -> bool:
        """Whether ``quote_id`` is one of the account's quotes."""
        held = self._held.get(quote_id)
        return held is not None and held.account == account

    def by_user_code(self, user_code: str) -> HeldQuote | None:
        """Return the quote a confirm page's user code names, if any."""
        wanted = user_code.strip().upper()
        return next((h for h in self._held.values() if h.quote.user_code == wanted), None)

    def answer(
        self,
        held: HeldQuote,
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
        state = held.state(real_now)
        if state in (QuoteState.USED, QuoteState.SUPERSEDED):
            # Before any replay: a confirmation is used once, and saying it again is no answer.
            raise _used(held)
        if earlier is not None and _same_answer(earlier, answer, principal):
            return earlier
        if state is QuoteState.EXPIRED:
            raise SimError(
                ErrorCode.CONFIRMATION_EXPIRED,
                f"the quote expired at {held.quote.expires_at.isoformat()}: ask for a new one",
            )
        if earlier is not None:
            raise _already_decided(earlier)
        held.answer = QuoteConfirmation(
            confirmation_id=mint("qc"),
            quote_id=held.quote.quote_id,
            state=answer,
            principal=principal,
            note=note,
            confirmed_at=at,
        )
        held.answered = real_now
        return held.answer

    def check(self, account: str, request: TrainingRunRequest, real_now: float) -> HeldQuote:
        """Return the quote a new submission names, if it may make this run.

        Whether a person confirmed it (or an authorization covers it) is the engine's next
        question; this checks the quote is this account's, for this request, and still usable.

        Raises:
            SimError: ``CONFIRMATION_REQUIRED`` (no quote named), ``QUOTE_NOT_FOUND``,
                ``CONFIRMATION_MISMATCH``, ``QUOTE_ALREADY_DECIDED`` (declined),
                ``CONFIRMATION_USED`` or ``CONFIRMATION_EXPIRED``.
        """
        if request.quote_id is None:
            raise SimError(
                ErrorCode.CONFIRMATION_REQUIRED,
                "a new run names the quote it spends on: ask for a quote (POST "
                "/v0/training-quotes), have a person confirm it at the backend, and send its "
                "quote_id (or an authorization_id that covers it)",
                field="quote_id",
            )
        held = self._held.get(request.quote_id)
        if held is None or held.account != account:
            raise SimError(
                ErrorCode.QUOTE_NOT_FOUND, "no such quote for this account", field="quote_id"
            )
        _check_match(held.quote, request)
        state = held.state(real_now)
        if state is QuoteState.DECLINED and held.answer is not None:
            raise _already_decided(held.answer)
        if state in (QuoteState.USED, QuoteState.SUPERSEDED):
            raise _used(held)
        if state is QuoteState.EXPIRED:
            raise SimError(
                ErrorCode.CONFIRMATION_EXPIRED,
                f"the quote expired at {held.quote.expires_at.isoformat()}: ask for a new one",
                field="quote_id",
            )
        return held

    @staticmethod
    def person_confirmed(held: HeldQuote) -> QuoteConfirmation:
        """Return the person's confirmation of ``held``, or refuse the run for want of one.

        Raises:
            SimError: ``CONFIRMATION_REQUIRED``, naming the confirm page and what changed.
        """
        answer = held.answer
        if answer is not None and answer.state is QuoteAnswer.CONFIRMED:
            return answer
        quote = held.quote
        changed = f" ({'; '.join(quote.not_carried)})" if quote.not_carried else ""
        raise SimError(
            ErrorCode.CONFIRMATION_REQUIRED,
            f"nobody confirmed quote {quote.quote_id} at the backend{changed}: a person "
            f"confirms it at {quote.confirm_url or 'the confirm page'} (code {quote.user_code}) "
            "or with a token of theirs holding spend:confirm",
            field="quote_id",
            details={
                "quote_id": quote.quote_id,
                "confirm_url": quote.confirm_url,
                "user_code": quote.user_code,
                "reasons": quote.not_carried,
            },
        )

    @staticmethod
    def as_it_stands(
        held: HeldQuote,
        request: TrainingRunRequest,
        booking: SimBooking,
        script: RunScript,
        now: datetime,
    ) -> TrainingQuote:
        """Return ``held``'s quote priced again on the booking as it is ``now``, if nothing got
        worse since it was quoted (then it is the quote as issued).

        A confirmation, and an authorization's cover, are of the cost and term a person saw:
        a booking that grew or whose term shrank since is another spend.

        Raises:
            SimError: ``CONFIRMATION_REQUIRED`` naming what changed; ask for a new quote.
        """
        now_priced = _priced(request, booking, script, now)
        worse = _what_got_worse(held.quote, now_priced)
        if not worse:
            return held.quote
        quote = held.quote
        raise SimError(
            ErrorCode.CONFIRMATION_REQUIRED,
            f"the booking changed since quote {quote.quote_id} was made ({'; '.join(worse)}): "
            "ask for a new quote, which a person confirms again",
            field="quote_id",
            details={"quote_id": quote.quote_id, "reasons": worse},
        )

    @staticmethod
    def use(held: HeldQuote, run_id: str) -> None:
        """Mark the quote used by ``run_id``: it makes no other run."""
        held.used_by = run_id


def _used(held: HeldQuote) -> SimError:
    if held.superseded_by is not None:
        return SimError(
            ErrorCode.CONFIRMATION_USED,
            f"the quote's confirmation carried to the newer quote {held.superseded_by}",
            field="quote_id",
        )
    return SimError(
        ErrorCode.CONFIRMATION_USED,
        f"the quote was already used by run {held.used_by}",
        field="quote_id",
    )
