"""Contract v0.4 routes: a person's quote confirmation and standing authorizations.

``POST /v0/training-runs`` (:mod:`prefect_ito.simulator.routes`) then names the quote, and the
engine checks what these routes recorded.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from prefect_ito.contract import (
    ID_MAX_LENGTH,
    REPLAYED_HEADER,
    Envelope,
    ErrorCode,
    QuoteAnswer,
    QuoteConfirmation,
    QuoteConfirmationRequest,
    SpendAuthorization,
    SpendAuthorizationList,
    SpendAuthorizationRequest,
    TrainingQuote,
)
from prefect_ito.simulator.envelopes import AUTHENTICATED_ERRORS, documented, ok
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.routes import IdempotencyKey, OptionalIdempotencyKey
from prefect_ito.simulator.state import (
    Authorizer,
    Confirmer,
    Reader,
    ReaderToken,
    SimState,
    SimStateDep,
)

router = APIRouter(prefix="/v0", tags=["spend authority"])

QuoteIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH)]
AuthorizationIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH)]


def _errors(
    *codes: ErrorCode, status: int = 200, replay: type | None = None
) -> dict[int | str, Any]:
    return documented(
        *AUTHENTICATED_ERRORS,
        ErrorCode.INSUFFICIENT_SCOPE,
        ErrorCode.CAPABILITY_NOT_AVAILABLE,
        *codes,
        status=status,
        replay=replay,
    )


def _served(state: SimState) -> None:
    """Refuse with 501 on a backend that does not say ``spend_authority: true``."""
    if not state.engine.capabilities().spend_authority:
        raise SimError(
            ErrorCode.CAPABILITY_NOT_AVAILABLE,
            "this backend keeps no spend authority (spend_authority is false)",
        )


_ANSWER_ERRORS = (
    ErrorCode.QUOTE_NOT_FOUND,
    ErrorCode.QUOTE_ALREADY_DECIDED,
    ErrorCode.CONFIRMATION_EXPIRED,
    ErrorCode.CONFIRMATION_USED,
)


@router.get("/training-quotes/{quote_id}", responses=_errors(ErrorCode.QUOTE_NOT_FOUND))
async def get_training_quote(
    state: SimStateDep, account: Reader, quote_id: QuoteIdPath
) -> Envelope[TrainingQuote]:
    """Read a quote as the backend states it: its state, and who confirmed or declined it."""
    _served(state)
    held = state.engine.quotes.held(account, quote_id)
    return ok(held.stated(state.engine.real_now()))


def answer_quote(
    state: SimState,
    account: str,
    quote_id: str,
    answer: QuoteAnswer,
    principal: str,
    note: str | None,
) -> QuoteConfirmation:
    """Record a confirmation or decline of the account's quote by ``principal``."""
    return state.engine.answer_quote(account, quote_id, answer, principal, note)


@router.post("/training-quotes/{quote_id}/confirmations", responses=_errors(*_ANSWER_ERRORS))
async def confirm_training_quote(
    state: SimStateDep,
    token: Confirmer,
    quote_id: QuoteIdPath,
    body: QuoteConfirmationRequest | None = None,
    key: OptionalIdempotencyKey = None,
) -> Envelope[QuoteConfirmation]:
    """Confirm a quote as the person the token speaks for (scope `spend:confirm`).

    The backend records the authenticated principal, and the note at most beside it. The same
    person confirming again gets the same confirmation.
    """
    _served(state)
    note = body.note if body else None
    return ok(
        answer_quote(state, token.account, quote_id, QuoteAnswer.CONFIRMED, token.principal, note)
    )


@router.post("/training-quotes/{quote_id}/declines", responses=_errors(*_ANSWER_ERRORS))
async def decline_training_quote(
    state: SimStateDep,
    token: ReaderToken,
    quote_id: QuoteIdPath,
    body: QuoteConfirmationRequest | None = None,
    key: OptionalIdempotencyKey = None,
) -> Envelope[QuoteConfirmation]:
    """Decline a quote (scope `training:read`: declining spends nothing); final for the quote."""
    _served(state)
    note = body.note if body else None
    return ok(
        answer_quote(state, token.account, quote_id, QuoteAnswer.DECLINED, token.principal, note)
    )


@router.post(
    "/spend-authorizations",
    status_code=201,
    responses=_errors(
        ErrorCode.IDEMPOTENCY_KEY_REUSED, status=201, replay=Envelope[SpendAuthorization]
    ),
)
async def create_spend_authorization(
    state: SimStateDep,
    token: Authorizer,
    key: IdempotencyKey,
    body: SpendAuthorizationRequest,
    response: Response,
) -> Envelope[SpendAuthorization]:
    """Create a standing authorization (scope `spend:authorize`); the same key replays it."""
    _served(state)
    created, replayed = state.engine.authorizations.create(
        token.account, token.principal, body, key=key, now=state.engine.wall_now()
    )
    if replayed:
        response.status_code = 200
        response.headers[REPLAYED_HEADER] = "true"
    return ok(created)


@router.get("/spend-authorizations", responses=_errors())
async def list_spend_authorizations(
    state: SimStateDep, account: Reader
) -> Envelope[SpendAuthorizationList]:
    """The account's standing authorizations, newest first, with what each has used."""
    _served(state)
    found = state.engine.authorizations.list(account, state.engine.wall_now())
    return ok(SpendAuthorizationList(authorizations=found))


@router.get(
    "/spend-authorizations/{authorization_id}",
    responses=_errors(ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND),
)
async def get_spend_authorization(
    state: SimStateDep, account: Reader, authorization_id: AuthorizationIdPath
) -> Envelope[SpendAuthorization]:
    """One of the account's standing authorizations, with what it has used."""
    _served(state)
    return ok(state.engine.authorizations.get(account, authorization_id, state.engine.wall_now()))


@router.delete(
    "/spend-authorizations/{authorization_id}",
    responses=_errors(ErrorCode.SPEND_AUTHORIZATION_NOT_FOUND),
)
async def revoke_spend_authorization(
    state: SimStateDep, token: Authorizer, authorization_id: AuthorizationIdPath
) -> Envelope[SpendAuthorization]:
    """Revoke a standing authorization (scope `spend:authorize`); revoking again is a no-op."""
    _served(state)
    revoked = state.engine.authorizations.revoke(
        token.account, authorization_id, token.principal, state.engine.wall_now()
    )
    return ok(revoked)
