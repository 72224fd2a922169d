"""The simulator's deterministic state machine on a scaled clock.

Simulated seconds are real monotonic seconds times the scenario's ``time_scale``. A run's
timestamps start at the real moment it was submitted and then run ``time_scale`` times faster, so
a run submitted long after the scenario loaded does not date itself years ahead. Each run is driven
by its pipeline (:mod:`prefect_ito.simulator.pipeline`); :meth:`Engine.advance` catches every run up
with the clock, and every public method advances first, so no answer is stale. The engine is not
thread-safe: the app calls it from its event loop only.

One module past ~400 lines on purpose: the state machine's transitions are kept together so
that every answer the simulator gives can be followed in one file; pipelines, quotes and
authorizations, which need no view of the whole, live in modules of their own.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prefect_ito.contract import (
    DEFAULT_PAGE_LIMIT,
    CancelRequest,
    Capabilities,
    Capability,
    ChangePage,
    ConfirmationRecord,
    ConfirmationVia,
    DecisionRecord,
    DecisionRequest,
    ErrorCode,
    EventPage,
    EventType,
    PostTraining,
    QuoteAnswer,
    QuoteChange,
    QuoteConfirmation,
    RunChange,
    RunState,
    StageStatus,
    TrainingEligibility,
    TrainingQuote,
    TrainingRun,
    TrainingRunList,
    TrainingRunRequest,
)
from prefect_ito.simulator.action_codes import ActionCodes
from prefect_ito.simulator.authorizations import AuthorizationBook
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.ids import mint
from prefect_ito.simulator.pipeline import Pipeline, Signal, plan_stages, run_pipeline
from prefect_ito.simulator.quotes import HeldQuote, QuoteBook
from prefect_ito.simulator.runs import DECIDED, RunRecord
from prefect_ito.simulator.scenario import Scenario, SimBooking

IN_FLIGHT_RETRY_AFTER_SECONDS = 1
"""The ``Retry-After`` of a 409 ``IDEMPOTENCY_KEY_IN_FLIGHT``."""

_ALWAYS_DRIVEN = frozenset({RunState.CANCELLING, RunState.AWAITING_DECISION})
"""States in which a run changes however far its step has come."""


@dataclass(frozen=True)
class _Claim:
    """What an idempotency key was first used for, when (real clock), and the run it made."""

    fingerprint: str
    at: float
    run_id: str | None = None


@dataclass(frozen=True)
class Submitted:
    """The result of a submission: the run, and whether it is a replay of an earlier one."""

    run: TrainingRun
    replayed: bool


class Engine:
    """Bookings, runs and idempotency records for one loaded scenario."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.load(scenario)

    def load(self, scenario: Scenario) -> None:
        """Replace the scenario: bookings, runs and idempotency records start over, clock at 0."""
        self.scenario = scenario
        self._started = self._clock()
        self._anchor = scenario.start_at or datetime.now(UTC)
        self.bookings: dict[str, SimBooking] = {b.booking_id: b for b in scenario.bookings}
        self.runs: dict[str, RunRecord] = {}
        self._pipelines: dict[str, Pipeline] = {}
        self._waits: dict[str, float] = {}
        self._quiet: dict[str, tuple[float, RunState, bool]] = {}
        """Per run: until when it only works on, and in what state (``advance_changes``)."""
        self._claims: dict[tuple[str, str], _Claim] = {}
        self._feed_cursor = 0
        self._feed_versions: dict[str, int] = {}
        self._changed_at: dict[str, int] = {}
        self._quote_changed_at: dict[str, int] = {}
        self._in_flight: set[tuple[str, str]] = set()
        self.quotes = QuoteBook(scenario.quote_ttl_seconds)
        self.authorizations = AuthorizationBook()
        self.action_codes = ActionCodes()

    # --- clock -----------------------------------------------------------------------------

    def now(self) -> float:
        """Return simulated seconds since the scenario was loaded."""
        return (self._clock() - self._started) * self.scenario.time_scale

    def _new_run_clock(self) -> tuple[datetime, float]:
        """Return the epoch and the simulated now of a run created at this real moment.

        Only the run's own progress is scaled: a run created ``t`` real seconds after the load
        says it was created at ``start_at + t``, not ``t × time_scale`` later. Both come from
        one reading of the clock: the microseconds between two readings, times the time scale,
        would date the run seconds after the answer that created it.
        """
        real_seconds = self._clock() - self._started
        simulated = real_seconds * self.scenario.time_scale
        return self._anchor + timedelta(seconds=real_seconds - simulated), simulated

    def real_now(self) -> float:
        """Return the real clock's reading, on which quotes expire."""
        return self._clock()

    def wall_now(self) -> datetime:
        """Return the timestamp of this real moment (from ``start_at``, at the real rate)."""
        return self._anchor + timedelta(seconds=self._clock() - self._started)

    def revision(self) -> int:
        """Return a number that grows whenever any run changes or a quote is answered (for
        waking long-polls)."""
        return sum(rec.version for rec in self.runs.values()) + len(self._quote_changed_at)

    def advance(self) -> None:
        """Catch every unfinished run up with the simulated clock."""
        for rec in self.runs.values():
            self._drive(rec, self._run_now(rec))

    def advance_changes(self) -> None:
        """Catch up every run whose state or version may have moved: one whose step ended or
        budget ran out, or one cancelling or waiting for a person.

        A run that only works on within its step is left for a read of it to catch up (its
        spend and heartbeat): the ticker calls this every few milliseconds, and driving
        thousands of runs each time took a core of its own.
        """
        now, quiets = self.now(), self._quiet
        for run_id, rec in self.runs.items():
            quiet = quiets.get(run_id)
            # Cheap on purpose (no tuple built): it runs for every run at every tick.
            if (
                quiet is not None
                and now < quiet[0]
                and quiet[1] is rec.state
                and quiet[2] is rec.stalled
            ):
                continue
            self._drive(rec, self._run_now(rec))
            quiets[run_id] = (self._quiet_until(rec), rec.state, rec.stalled)

    def _caught_up(self, rec: RunRecord) -> RunRecord:
        self._drive(rec, self._run_now(rec))
        return rec

    def _quiet_until(self, rec: RunRecord) -> float:
        """Return the engine's time until which ``rec`` only works on within its step."""
        if rec.state.terminal or rec.stalled:
            return math.inf  # only a request moves it, and a request drives it
        if rec.held_at is not None or rec.state in _ALWAYS_DRIVEN:
            return -math.inf
        horizon = self._waits.get(rec.run_id, 0.0)
        rate = rec.cost_per_second
        if rate > 0:
            horizon = min(horizon, (rec.request.budget_usd - rec.counters.spend_usd) / rate)
        return rec.clock + rec.lag + horizon

    def _run_now(self, rec: RunRecord) -> float:
        """Return the run's own simulated now: behind the engine's by the waits for people.

        A person decides on the real clock, so while a run waits for a decision its clock moves
        at the real rate, not ``time_scale`` times faster; a ten-minute wait is dated ten
        minutes, not months.
        """
        if rec.held_at is None:
            return self.now() - rec.lag
        real_start = self._started + (rec.held_at + rec.lag) / self.scenario.time_scale
        return rec.held_at + max(0.0, self._clock() - real_start)

    def _hold(self, rec: RunRecord) -> None:
        """Begin a wait for a person: date it on the pending action in real time, and name the
        decide page and the code a person answers it with.

        The hold began at the real moment the run's clock reached it, which may be before the
        engine noticed (it catches runs up only when asked); people wait in real time, so the
        date is the wall clock's, not the run's scaled one.
        """
        rec.held_at = rec.clock
        real_seconds = (rec.held_at + rec.lag) / self.scenario.time_scale
        action = rec.pending_action
        if action is not None:
            code, url = self.action_codes.issue(rec.run_id, action.action_id, rec.base_url)
            held_since = self._anchor + timedelta(seconds=real_seconds)
            update = {"held_since": held_since, "user_code": code, "decide_url": url}
            if action.deadline_at is not None and action.proposed_deadline_at is not None:
                # A deadline is the wall clock's: the run reached it as the hold began.
                extension = action.proposed_deadline_at - action.deadline_at
                update |= {
                    "deadline_at": held_since,
                    "proposed_deadline_at": held_since + extension,
                }
            rec.pending_action = action.model_copy(update=update)

    def _release(self, rec: RunRecord) -> None:
        """End a wait for a person: from now on the run's clock lags the engine's by the wait."""
        rec.clock = max(rec.clock, self._run_now(rec))
        rec.lag = self.now() - rec.clock
        rec.held_at = None

    def _drive(self, rec: RunRecord, now: float) -> None:
        pipeline = self._pipelines[rec.run_id]
        while not (rec.state.terminal or rec.stalled):
            if rec.state is RunState.CANCELLING:
                self._tear_down(rec, now)
                return
            if rec.state is RunState.AWAITING_DECISION:
                # Time passes without progress; the workload stays alive while it waits.
                if rec.held_at is None:
                    self._hold(rec)
                    now = self._run_now(rec)
                rec.clock = rec.heartbeat = max(rec.clock, now)
                return
            wait = self._waits[rec.run_id]
            if wait > now - rec.clock:
                self._consume(rec, now - rec.clock)
                break
            if not self._consume(rec, wait):
                return
            step = next(pipeline, None)
            if step is None:
                return
            if step is Signal.STALL:
                rec.stalled = True
                rec.heartbeat = rec.clock
                return
            self._waits[rec.run_id] = 0.0 if step is Signal.HOLD else step
        if not rec.state.terminal and not rec.stalled:
            rec.heartbeat = rec.clock

    def _tear_down(self, rec: RunRecord, now: float) -> None:
        """Let a cancel that takes time run its course: no progress, no spend, then cancelled."""
        left = self._waits[rec.run_id]
        if left > now - rec.clock:
            self._waits[rec.run_id] -= now - rec.clock
            rec.clock = rec.heartbeat = now  # the backend is busy stopping the workload
            return
        rec.clock += left
        self._stop(rec, StageStatus.CANCELLED)
        rec.finish(RunState.CANCELLED, "CANCELLED", rec.cancel_reason or "cancelled")

    def _consume(self, rec: RunRecord, seconds: float) -> bool:
        """Let simulated time pass for a run; return False when the budget ran out first."""
        rate = rec.cost_per_second
        left = rec.request.budget_usd - rec.counters.spend_usd
        if rate > 0 and seconds * rate >= left:
            self._spend(rec, left / rate)
            rec.counters.spend_usd = rec.request.budget_usd
            self._stop(rec, StageStatus.FAILED)
            message = f"spend reached the budget ceiling of ${rec.request.budget_usd:,.2f}"
            rec.finish(RunState.BUDGET_EXHAUSTED, "BUDGET_EXHAUSTED", message)
            return False
        self._spend(rec, seconds)
        return True

    def _spend(self, rec: RunRecord, seconds: float) -> None:
        rec.clock += seconds
        self._waits[rec.run_id] -= seconds
        rec.counters.spend_usd += seconds * rec.cost_per_second
        if rec.recovering:
            rec.counters.down_seconds += seconds
        else:
            rec.counters.busy_seconds += seconds

    def _stop(self, rec: RunRecord, status: StageStatus) -> None:
        """Mark the running stage as stopped and end the pipeline."""
        running = [s.name for s in rec.stages if s.status is StageStatus.RUNNING]
        for name in running:
            rec.set_stage(name, status)
        self._pipelines[rec.run_id].close()

    # --- reads -----------------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """Return what this backend offers; a scaffold answers like production today."""
        live = not self.scenario.scaffold
        detail = "reference simulator" if live else "scaffold: training runs are not live yet"
        return Capabilities(
            training_run=Capability(live=live, detail=detail),
            post_training_recipes=list(PostTraining),
            long_poll=True,
            change_feed=self.scenario.change_feed,
            spend_confirmation=self.scenario.spend_confirmation,
            client_reference=self.scenario.client_reference,
            spend_authority=self.scenario.spend_confirmation,
        )

    def changes(self, account: str, after: int | None) -> ChangePage:
        """Return the account's runs whose version moved after the cursor ``after``."""
        self._note_changes()
        if after is None:
            return ChangePage(changes=[], cursor=self._feed_cursor)
        changed = [
            rec
            for run_id, rec in self.runs.items()
            if rec.account == account and self._changed_at.get(run_id, 0) > after
        ]
        real_now = self._clock()
        answered = [
            QuoteChange(
                quote_id=quote_id, state=self.quotes.held(account, quote_id).state(real_now)
            )
            for quote_id, at in self._quote_changed_at.items()
            if at > after and self.quotes.holds(account, quote_id)
        ]
        return ChangePage(
            quotes=answered,
            changes=[
                RunChange(
                    run_id=rec.run_id,
                    version=rec.version,
                    state=rec.state,
                    current_stage=rec.current_stage,
                    pending_action=rec.pending_action is not None,
                )
                for rec in changed
            ],
            cursor=self._feed_cursor,
        )

    def answer_quote(
        self, account: str, quote_id: str, answer: QuoteAnswer, principal: str, note: str | None
    ) -> QuoteConfirmation:
        """Record a confirmation or decline of the account's quote by ``principal``.

        A new answer goes on the change feed, so that a watcher resumes the flow run waiting
        on it.
        """
        held = self.quotes.held(account, quote_id)
        before = held.answer
        recorded = self.quotes.answer(
            held,
            answer=answer,
            principal=principal,
            note=note,
            at=self.wall_now(),
            real_now=self._clock(),
        )
        if recorded is not before:
            self._note_changes()  # runs first: the cursor orders every change as it happened
            self._feed_cursor += 1
            self._quote_changed_at.pop(quote_id, None)
            self._quote_changed_at[quote_id] = self._feed_cursor
        return recorded

    def _note_changes(self) -> None:
        # The feed's cursor counts version moves, run by run, in the order they are noticed.
        for run_id, rec in self.runs.items():
            if self._feed_versions.get(run_id) != rec.version:
                self._feed_versions[run_id] = rec.version
                self._feed_cursor += 1
                self._changed_at[run_id] = self._feed_cursor

    def booking(self, account: str, booking_id: str) -> SimBooking:
        """Return a booking the account holds, or raise ``BOOKING_NOT_FOUND``.

        A booking of another account is not found either: the answer never reveals that it
        exists.
        """
        booking = self.bookings.get(booking_id)
        if booking is None or not booking.held_by(account):
            raise SimError(
                ErrorCode.BOOKING_NOT_FOUND,
                "no such booking for this account; this simulator lists its bookings at "
                "/_sim/bookings",
            )
        return booking

    def eligibility(self, account: str, booking_id: str) -> TrainingEligibility:
        """Return the backend's view of one of the account's bookings."""
        return self.booking(account, booking_id).eligibility(account)

    def record(self, account: str, run_id: str) -> RunRecord:
        """Return one of the account's runs, caught up with the clock.

        Only this run is caught up: every waiting long-poll reads its run again at each change
        of any run, so catching every run up here made N waiting runs cost N² steps a change.
        """
        rec = self.runs.get(run_id)
        if rec is None or rec.account != account:
            raise SimError(ErrorCode.RUN_NOT_FOUND, "no such training run")
        self._drive(rec, self._run_now(rec))
        return rec

    def find(
        self,
        account: str,
        *,
        idempotency_key: str | None = None,
        booking_id: str | None = None,
        active: bool | None = None,
        client_reference: str | None = None,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
    ) -> TrainingRunList:
        """Return a page of the account's runs matching every filter given, oldest first.

        The cursor is the id of the last run of the previous page, so a page never repeats or
        skips a run, even when runs are added or finish in between. A client reference is kept
        on its run, so it finds the run whatever the idempotency keys' retention; a backend that
        does not take references (``client_reference: false``) ignores the filter, as an older
        one ignores a query parameter it does not know.
        """
        self.advance()
        runs = [rec for rec in self.runs.values() if rec.account == account]
        if cursor is not None:
            ids = [rec.run_id for rec in runs]
            if cursor not in ids:
                raise SimError(ErrorCode.VALIDATION_ERROR, "unknown cursor", field="cursor")
            runs = runs[ids.index(cursor) + 1 :]
        if idempotency_key is not None:
            claim = self._claim(account, idempotency_key)
            runs = [rec for rec in runs if claim is not None and rec.run_id == claim.run_id]
        if client_reference is not None and self.scenario.client_reference:
            runs = [rec for rec in runs if rec.client_reference == client_reference]
        if booking_id is not None:
            runs = [rec for rec in runs if rec.request.booking_id == booking_id]
        if active is not None:
            runs = [rec for rec in runs if rec.state.terminal is not active]
        page = runs[:limit]
        more = len(runs) > limit
        return TrainingRunList(
            runs=[rec.snapshot() for rec in page], next=page[-1].run_id if more else None
        )

    def events(
        self, account: str, run_id: str, after: int, limit: int = DEFAULT_PAGE_LIMIT
    ) -> EventPage:
        """Return a page of a run's events with a sequence number above ``after``."""
        rec = self.record(account, run_id)
        events = rec.events[after : after + limit]
        last_seq = events[-1].seq if events else after
        more = after + limit < len(rec.events)
        return EventPage(events=events, last_seq=last_seq, next=str(last_seq) if more else None)

    # --- writes ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def keyed_write(self, account: str, key: str | None) -> Iterator[None]:
        """Hold an idempotency key while a write with it is processed.

        Raises:
            SimError: ``IDEMPOTENCY_KEY_IN_FLIGHT`` while another request holds the same key.
        """
        if key is None:
            yield
            return
        if (account, key) in self._in_flight:
            raise SimError(
                ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
                "a request with this Idempotency-Key is still being processed",
                headers={"Retry-After": str(IN_FLIGHT_RETRY_AFTER_SECONDS)},
            )
        self._in_flight.add((account, key))
        try:
            yield
        finally:
            self._in_flight.discard((account, key))

    def _claim(self, account: str, key: str) -> _Claim | None:
        """Return the earlier use of a key, forgetting it once its retention has passed."""
        claim = self._claims.get((account, key))
        retention = self.scenario.idempotency_key_retention_seconds
        if claim is not None and self._clock() - claim.at >= retention:
            del self._claims[(account, key)]
            return None
        return claim

    def _remember(self, account: str, key: str, fingerprint: str, run_id: str | None) -> None:
        self._claims[(account, key)] = _Claim(fingerprint, self._clock(), run_id)

    def _check_key(self, account: str, key: str | None, fingerprint: str) -> _Claim | None:
        """Return the earlier use of this key, refusing one with a different request."""
        claim = self._claim(account, key) if key is not None else None
        if claim is not None and claim.fingerprint != fingerprint:
            raise SimError(
                ErrorCode.IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was used for a different request",
            )
        return claim

    def _check_request(self, request: TrainingRunRequest) -> None:
        """Refuse a request this backend cannot train, or whose digest is not its manifest's."""
        if self.scenario.scaffold:
            raise SimError(
                ErrorCode.CAPABILITY_NOT_AVAILABLE, "training runs are not live on this backend"
            )
        if request.manifest_digest != request.digest():
            raise SimError(
                ErrorCode.VALIDATION_ERROR,
                "manifest_digest does not match the request's canonical manifest",
                field="manifest_digest",
            )

    def quote(
        self,
        account: str,
        request: TrainingRunRequest,
        base_url: str | None = None,
        asked_by: str | None = None,
    ) -> TrainingQuote:
        """Return a quote for ``request``: the plan, the estimate, a confirmable id. No work.

        ``asked_by``, the principal whose token asked, is kept to show on the confirm page.

        Raises:
            SimError: ``CAPABILITY_NOT_AVAILABLE`` on a backend that does not say
                ``spend_confirmation: true``, as for training runs that are not live.
        """
        self._check_request(request)
        if not self.scenario.spend_confirmation:
            raise SimError(
                ErrorCode.CAPABILITY_NOT_AVAILABLE,
                "this backend serves no training quotes (spend_confirmation is false)",
            )
        booking = self.booking(account, request.booking_id)
        eligibility = booking.eligibility(account)
        if not eligibility.eligible:
            raise SimError(ErrorCode.BOOKING_NOT_ELIGIBLE, eligibility.reason or "not eligible")
        script = self.scenario.script_for(booking.booking_id)
        return self.quotes.issue(
            account,
            request,
            booking,
            script,
            now=self.wall_now(),
            real_now=self._clock(),
            base_url=base_url,
            asked_by=asked_by,
        )

    def submit(
        self,
        account: str,
        key: str,
        request: TrainingRunRequest,
        principal: str | None = None,
        base_url: str | None = None,
    ) -> Submitted:
        """Create a run, or return the one this key (or this manifest) already made.

        A new run needs a confirmation of a quote made for this account, booking, digest and
        budget; the quote is used up in the same step that creates the run. The run's record of
        the confirmation keeps ``principal``, whose token submitted it. With ``base_url``, the
        run's pending actions name the decide page a person answers them on.
        """
        self._check_request(request)
        if request.client_reference is not None and not self.scenario.client_reference:
            # As an older backend refuses a member it does not know, before anything else.
            raise SimError(
                ErrorCode.VALIDATION_ERROR,
                "client_reference: this backend takes no client references",
                field="client_reference",
            )
        # Whether a run of the booking is unfinished is all it needs: not every run's spend.
        self.advance_changes()
        fingerprint = f"submit:{request.manifest_digest}"
        claim = self._check_key(account, key, fingerprint)
        if claim is not None and claim.run_id is not None:
            return Submitted(self._caught_up(self.runs[claim.run_id]).snapshot(), replayed=True)
        booking = self.booking(account, request.booking_id)
        eligibility = booking.eligibility(account)
        if not eligibility.eligible:
            raise SimError(ErrorCode.BOOKING_NOT_ELIGIBLE, eligibility.reason or "not eligible")
        unfinished = [
            rec
            for rec in self.runs.values()
            if rec.request.booking_id == booking.booking_id and not rec.state.terminal
        ]
        for rec in unfinished:
            # Another account's run is never replayed, nor named: accounts never see each other.
            if rec.account != account or rec.request.manifest_digest != request.manifest_digest:
                raise SimError(ErrorCode.BOOKING_BUSY, "the booking has an unfinished run")
            # The same manifest on the same booking is the same logical submission.
            self._remember(account, key, fingerprint, rec.run_id)
            return Submitted(self._caught_up(rec).snapshot(), replayed=True)
        self._check_reference(account, request.client_reference)
        confirmation = self._allow(account, request, booking, principal)
        # The run keeps the manifest it was asked for; what allowed it and the client reference
        # are recorded beside it.
        asked = request.model_copy(
            update={"quote_id": None, "authorization_id": None, "client_reference": None}
        )
        rec = self._create(account, key, asked, booking, base_url)
        rec.client_reference = request.client_reference
        if confirmation is not None:
            held, rec.confirmation = confirmation
            self.quotes.use(held, rec.run_id)
        self._remember(account, key, fingerprint, rec.run_id)
        return Submitted(rec.snapshot(), replayed=False)

    def _allow(
        self,
        account: str,
        request: TrainingRunRequest,
        booking: SimBooking,
        submitter: str | None,
    ) -> tuple[HeldQuote, ConfirmationRecord] | None:
        """Return the quote a new run spends on and what allowed it; refuse it otherwise.

        A person's confirmation of that quote, recorded at the backend, or the named standing
        authorization covering it now (its use is counted here, in the step that creates the
        run). An older backend (``spend_confirmation`` false) takes no confirmation at all.
        """
        if not self.scenario.spend_confirmation:
            return None
        held = self.quotes.check(account, request, self._clock())
        now = self.wall_now()
        script = self.scenario.script_for(booking.booking_id)
        # What was confirmed or covered is the cost and term quoted: not a booking grown since.
        quote = self.quotes.as_it_stands(held, request, booking, script, now)
        if request.authorization_id is not None:
            authorization = self.authorizations.charge(
                account, request.authorization_id, quote, now
            )
            return held, ConfirmationRecord(
                quote_id=held.quote.quote_id,
                confirmed_by=authorization.principal,
                via=ConfirmationVia.STANDING_AUTHORIZATION,
                authorization=authorization.authorization_id,
                confirmed_at=now,
                submitted_by=submitter,
            )
        answer = self.quotes.person_confirmed(held)
        return held, ConfirmationRecord(
            quote_id=held.quote.quote_id,
            confirmed_by=answer.principal,
            via=ConfirmationVia.PERSON,
            confirmed_at=answer.confirmed_at,
            note=answer.note,
            carried_from=held.quote.carried_from,
            submitted_by=submitter,
        )

    def _check_reference(self, account: str, reference: str | None) -> None:
        """Refuse a client reference that one of the account's runs already carries.

        Checked for a run that would be new, after every replay and before the confirmation, so
        a refused submission uses no quote.
        """
        if reference is None:
            return
        holder = next(
            (
                rec
                for rec in self.runs.values()
                if rec.account == account and rec.client_reference == reference
            ),
            None,
        )
        if holder is not None:
            raise SimError(
                ErrorCode.CLIENT_REFERENCE_IN_USE,
                f"client_reference {reference!r} is already on run {holder.run_id}; find it with "
                "GET /v0/training-runs?client_reference=…",
                field="client_reference",
                details={"run_id": holder.run_id},
            )

    def _create(
        self,
        account: str,
        key: str,
        request: TrainingRunRequest,
        booking: SimBooking,
        base_url: str | None,
    ) -> RunRecord:
        script = self.scenario.script_for(booking.booking_id)
        epoch, created = self._new_run_clock()
        rec = RunRecord(
            run_id=mint("run"),
            account=account,
            idempotency_key=key,
            request=request,
            booking=booking,
            script=script,
            epoch=epoch,
            created=created,
            stages=plan_stages(request, script),
            base_url=base_url,
        )
        rec.emit(EventType.RUN_ACCEPTED, "run accepted", booking_id=booking.booking_id)
        self.runs[rec.run_id] = rec
        self._pipelines[rec.run_id] = run_pipeline(rec)
        self._waits[rec.run_id] = 0.0
        return rec

    def decide(
        self,
        account: str,
        run_id: str,
        action_id: str,
        body: DecisionRequest,
        key: str | None,
        *,
        principal: str,
    ) -> TrainingRun:
        """Record a person's decision on a pending action; repeat-safe, conflict-checked.

        The record keeps ``principal``, whose token relayed it, beside the name the person gave.
        """
        rec = self.record(account, run_id)
        fingerprint = f"decide:{run_id}:{action_id}:{body.model_dump_json()}"
        self._check_key(account, key, fingerprint)
        earlier = rec.decision_for(action_id)
        if earlier is not None and earlier is not body.decision:
            raise SimError(ErrorCode.DECISION_CONFLICT, f"action was already {DECIDED[earlier]}")
        if earlier is None:
            if rec.pending_action is None or rec.pending_action.action_id != action_id:
                raise SimError(ErrorCode.ACTION_NOT_PENDING, "no such pending action")
            self._apply(rec, action_id, body, principal)
        if key is not None and self._claim(account, key) is None:
            self._remember(account, key, fingerprint, None)
        return rec.snapshot()

    def by_user_code(self, user_code: str) -> tuple[RunRecord, str] | None:
        """Return the run and the action id a decide page's code names, pending or not."""
        named = self.action_codes.find(user_code)
        return None if named is None else (self.runs[named.run_id], named.action_id)

    def _apply(self, rec: RunRecord, action_id: str, body: DecisionRequest, principal: str) -> None:
        self._release(rec)
        rec.decisions.append(
            DecisionRecord(
                # A person decides at a real moment: dated by the wall clock, not the run's.
                action_id=action_id,
                decided_at=self.wall_now(),
                principal=principal,
                **body.model_dump(),
            )
        )
        rec.pending_action = None
        rec.state = RunState.RUNNING
        rec.emit(
            EventType.DECISION_RECORDED,
            f"{body.decision.value} by {principal}",
            rec.current_stage,
            action_id=action_id,
            decision=body.decision.value,
        )
        self._drive(rec, rec.clock)

    def cancel(
        self, account: str, run_id: str, body: CancelRequest, key: str | None
    ) -> TrainingRun:
        """Cancel a run's workload (never its booking); a finished run is returned unchanged."""
        rec = self.record(account, run_id)
        fingerprint = f"cancel:{run_id}:{body.model_dump_json()}"
        self._check_key(account, key, fingerprint)
        if not rec.state.terminal and rec.state is not RunState.CANCELLING:
            self._begin_cancel(rec, body.reason or "cancelled by the client")
        if key is not None and self._claim(account, key) is None:
            self._remember(account, key, fingerprint, None)
        return rec.snapshot()

    def _begin_cancel(self, rec: RunRecord, reason: str) -> None:
        """Stop a run's workload: at once, or through ``cancelling`` if the script says so."""
        if rec.held_at is not None:
            self._release(rec)
        rec.clock = max(rec.clock, self._run_now(rec))
        if rec.script.cancel_seconds <= 0:
            rec.emit(EventType.CANCEL_REQUESTED, reason, rec.current_stage)
            self._stop(rec, StageStatus.CANCELLED)
            rec.finish(RunState.CANCELLED, "CANCELLED", reason)
            return
        self._pipelines[rec.run_id].close()
        self._waits[rec.run_id] = rec.script.cancel_seconds
        rec.state, rec.cancel_reason = RunState.CANCELLING, reason
        rec.pending_action, rec.stalled, rec.recovering = None, False, False
        rec.heartbeat = rec.clock
        rec.emit(EventType.CANCEL_REQUESTED, reason, rec.current_stage)

    def add_booking(self, booking: SimBooking) -> None:
        """Put a booking on file (replacing one with the same id)."""
        self.bookings[booking.booking_id] = booking
