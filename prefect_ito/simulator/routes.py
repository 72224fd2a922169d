"""The contract's training routes: capabilities, eligibility, quotes, runs, events, decisions."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response

from prefect_ito.contract import (
    CLIENT_REFERENCE_PATTERN,
    CURSOR_MAX_LENGTH,
    DEFAULT_PAGE_LIMIT,
    ID_MAX_LENGTH,
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    MAX_PAGE_LIMIT,
    MAX_WAIT_SECONDS,
    REPLAYED_HEADER,
    CancelRequest,
    Capabilities,
    ChangePage,
    DecisionRequest,
    Envelope,
    ErrorCode,
    EventPage,
    Submission,
    TrainingEligibility,
    TrainingQuote,
    TrainingRun,
    TrainingRunList,
    TrainingRunRequest,
)
from prefect_ito.simulator.envelopes import AUTHENTICATED_ERRORS, documented, ok
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.state import (
    Canceller,
    Decider,
    Reader,
    ReaderToken,
    SimState,
    SimStateDep,
    Submitter,
)

router = APIRouter(prefix="/v0", tags=["training"])

IdempotencyKey = Annotated[
    str,
    Header(
        alias=IDEMPOTENCY_HEADER,
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
        description="One key per logical request (a submission, an authorization); resend it "
        "on every retry.",
    ),
]
OptionalIdempotencyKey = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_HEADER,
        min_length=1,
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH,
        description="Optional: one key per logical request; resend it on every retry.",
    ),
]
RunId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH)]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=CURSOR_MAX_LENGTH,
        description="The `next` of the previous page; absent for the first page.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT, description="The most items in the page.")]
BookingIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH)]


def _errors(
    *codes: ErrorCode, status: int = 200, replay: type | None = None
) -> dict[int | str, Any]:
    return documented(
        *AUTHENTICATED_ERRORS,
        ErrorCode.INSUFFICIENT_SCOPE,
        *codes,
        status=status,
        replay=replay,
    )


@router.get("/capabilities", responses=_errors())
async def get_capabilities(state: SimStateDep, _: Reader) -> Envelope[Capabilities]:
    """What this backend offers: whether training runs are live, recipes, long-poll."""
    return ok(state.engine.capabilities())


@router.get(
    "/bookings/{booking_id}/training-eligibility", responses=_errors(ErrorCode.BOOKING_NOT_FOUND)
)
async def get_training_eligibility(
    state: SimStateDep, account: Reader, booking_id: BookingIdPath
) -> Envelope[TrainingEligibility]:
    """The backend's view of one of the account's bookings: the only proof it may train."""
    return ok(state.engine.eligibility(account, booking_id))


@router.post(
    "/training-quotes",
    status_code=201,
    responses=_errors(
        ErrorCode.BOOKING_NOT_FOUND,
        ErrorCode.BOOKING_NOT_ELIGIBLE,
        ErrorCode.CAPABILITY_NOT_AVAILABLE,
        ErrorCode.CONTRACT_VERSION_UNSUPPORTED,
        status=201,
    ),
)
async def create_training_quote(
    state: SimStateDep, token: ReaderToken, body: TrainingRunRequest, request: Request
) -> Envelope[TrainingQuote]:
    """Preview the plan and estimate the cost of a request; creates no work and spends nothing.

    The quote's id, confirmed by a person, goes with the submission until the quote expires.
    A person may confirm it at the backend, on the page its `confirm_url` names (v0.4).
    """
    quote = state.engine.quote(
        token.account, body, base_url=str(request.base_url), asked_by=token.principal
    )
    return ok(quote)


@router.post(
    "/training-runs",
    status_code=201,
    responses=_errors(
        ErrorCode.BOOKING_NOT_FOUND,
        ErrorCode.BOOKING_NOT_ELIGIBLE,
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
        ErrorCode.BOOKING_BUSY,
        ErrorCode.CAPABILITY_NOT_AVAILABLE,
        ErrorCode.CONFIRMATION_REQUIRED,
        ErrorCode.CONFIRMATION_MISMATCH,
        ErrorCode.CONFIRMATION_EXPIRED,
        ErrorCode.CONFIRMATION_USED,
        ErrorCode.CLIENT_REFERENCE_IN_USE,
        ErrorCode.QUOTE_NOT_FOUND,
        ErrorCode.QUOTE_ALREADY_DECIDED,
        ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND,
        ErrorCode.AUTHORIZATION_DOES_NOT_COVER,
        ErrorCode.CONTRACT_VERSION_UNSUPPORTED,
        status=201,
        replay=Envelope[Submission],
    ),
)
async def create_training_run(
    state: SimStateDep,
    token: Submitter,
    key: IdempotencyKey,
    body: TrainingRunRequest,
    request: Request,
    response: Response,
) -> Envelope[Submission]:
    """Submit a training run on a quote a person confirmed at the backend, or one a standing
    authorization covers; the same key and body replay the run."""
    with state.engine.keyed_write(token.account, key):
        await _commit_delay(state)
        submitted = state.engine.submit(
            token.account, key, body, principal=token.principal, base_url=str(request.base_url)
        )
    if submitted.replayed:
        response.status_code = 200
        response.headers[REPLAYED_HEADER] = "true"
    else:
        state.faults.drop_after_commit(request.scope)
    return ok(Submission(run=submitted.run, replayed=submitted.replayed))


def _moved(page: ChangePage) -> bool:
    """Whether the feed has anything after the cursor: a run that moved, or an answered quote."""
    return bool(page.changes or page.quotes)


@router.get("/training-runs", responses=_errors())
async def list_training_runs(
    state: SimStateDep,
    account: Reader,
    idempotency_key: Annotated[
        str | None, Query(min_length=1, max_length=IDEMPOTENCY_KEY_MAX_LENGTH)
    ] = None,
    booking_id: Annotated[str | None, Query(min_length=1, max_length=ID_MAX_LENGTH)] = None,
    active: bool | None = None,
    client_reference: Annotated[
        str | None,
        Query(
            pattern=CLIENT_REFERENCE_PATTERN,
            description="Only the runs submitted with this `client_reference` (v0.3), "
            "whatever the idempotency keys' retention.",
        ),
    ] = None,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_PAGE_LIMIT,
) -> Envelope[TrainingRunList]:
    """Find runs by idempotency key, client reference, or booking (unfinished); paged."""
    return ok(
        state.engine.find(
            account,
            idempotency_key=idempotency_key,
            booking_id=booking_id,
            active=active,
            client_reference=client_reference,
            cursor=cursor,
            limit=limit,
        )
    )


# Declared before /training-runs/{run_id}, which would otherwise take "changes" for a run id.
@router.get("/training-runs/changes", responses=_errors(ErrorCode.NOT_FOUND))
async def list_run_changes(
    state: SimStateDep,
    account: Reader,
    after: Annotated[int | None, Query(ge=0, description="The cursor of the last page.")] = None,
    wait: Annotated[float, Query(ge=0, allow_inf_nan=False, description="Capped at 60.")] = 0,
) -> Envelope[ChangePage]:
    """The account's runs whose version moved after ``after``; with ``wait``, hold until one does.

    Without ``after`` the answer is at once, empty, with the current cursor to start from.
    """
    if not state.engine.scenario.change_feed:
        raise SimError(ErrorCode.NOT_FOUND, "this backend serves no change feed")
    if after is not None and wait > 0:
        await _wait_for(state, lambda: _moved(state.engine.changes(account, after)), wait)
    return ok(state.engine.changes(account, after))


@router.get("/training-runs/{run_id}", responses=_errors(ErrorCode.RUN_NOT_FOUND))
async def get_training_run(
    state: SimStateDep,
    account: Reader,
    run_id: RunId,
    after_version: Annotated[int | None, Query(ge=0)] = None,
    wait: Annotated[float, Query(ge=0, allow_inf_nan=False, description="Capped at 60.")] = 0,
) -> Envelope[TrainingRun]:
    """Read a run; with ``after_version`` and ``wait``, hold until its version exceeds it."""
    if after_version is not None:
        await _wait_for_change(state, account, run_id, after_version, wait)
    return ok(state.engine.record(account, run_id).snapshot())


async def _wait_for_change(
    state: SimState, account: str, run_id: str, after_version: int, wait: float
) -> None:
    """Return once the run's version exceeds ``after_version``, or after ``wait`` seconds."""

    def changed() -> bool:
        return state.engine.record(account, run_id).version > after_version

    await _wait_for(state, changed, wait)


async def _wait_for(state: SimState, done: Callable[[], bool], wait: float) -> None:
    """Return once ``done()`` holds, or after ``wait`` seconds (at most the contract's cap).

    A server that is stopping answers at once, as a long-poll's timeout would.
    """
    wait = min(wait, MAX_WAIT_SECONDS)

    def settled() -> bool:
        return state.closing or done()

    if wait <= 0 or settled():
        return
    async with state.changed:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.changed.wait_for(settled), timeout=wait)


@router.get("/training-runs/{run_id}/events", responses=_errors(ErrorCode.RUN_NOT_FOUND))
async def list_run_events(
    state: SimStateDep,
    account: Reader,
    run_id: RunId,
    after: Annotated[int, Query(ge=0, description="Read the events after this `seq`.")] = 0,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_PAGE_LIMIT,
) -> Envelope[EventPage]:
    """The run's append-only event log, after a sequence number (or a page's cursor); paged."""
    if cursor is not None:
        if after or not cursor.isdigit():
            raise SimError(
                ErrorCode.VALIDATION_ERROR,
                "give a cursor from a page's next, and not with after",
                field="cursor",
            )
        after = int(cursor)  # this simulator's event cursors are sequence numbers
    return ok(state.engine.events(account, run_id, after, limit))


@router.post(
    "/training-runs/{run_id}/actions/{action_id}/decision",
    responses=_errors(
        ErrorCode.RUN_NOT_FOUND,
        ErrorCode.ACTION_NOT_PENDING,
        ErrorCode.DECISION_CONFLICT,
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
    ),
)
async def decide_action(
    state: SimStateDep,
    token: Decider,
    run_id: RunId,
    action_id: Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH)],
    body: DecisionRequest,
    key: OptionalIdempotencyKey = None,
) -> Envelope[TrainingRun]:
    """Approve or reject a pending human-gated action; repeating the same decision is safe."""
    with state.engine.keyed_write(token.account, key):
        await _commit_delay(state)
        decided = state.engine.decide(
            token.account, run_id, action_id, body, key, principal=token.principal
        )
        return ok(decided)


@router.post(
    "/training-runs/{run_id}/cancel",
    responses=_errors(
        ErrorCode.RUN_NOT_FOUND,
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        ErrorCode.IDEMPOTENCY_KEY_IN_FLIGHT,
    ),
)
async def cancel_training_run(
    state: SimStateDep,
    account: Canceller,
    run_id: RunId,
    body: CancelRequest | None = None,
    key: OptionalIdempotencyKey = None,
) -> Envelope[TrainingRun]:
    """Cancel the run's workload (never the booking); a finished run is returned unchanged."""
    with state.engine.keyed_write(account, key):
        await _commit_delay(state)
        return ok(state.engine.cancel(account, run_id, body or CancelRequest(), key))


async def _commit_delay(state: SimState) -> None:
    """Keep a keyed write in flight for the scenario's ``commit_delay_seconds``."""
    delay = state.faults.config.commit_delay_seconds
    if delay:
        await asyncio.sleep(delay)
