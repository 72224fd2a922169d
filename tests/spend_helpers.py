"""How tests stand in for the person who allows a spend: one way each, shared by every test.

Since contract v0.4 only the backend can tell that a person stands behind a spend, so the tests
do what a person does there: confirm a quote with a token of their own (``spend:confirm``), or
create a standing authorization (``spend:authorize``) and name it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from prefect_ito.blocks import ItoSpendAuthorization
from prefect_ito.contract import (
    ALL_SCOPES,
    NewSpendLimits,
    QuoteAnswer,
    SpendAuthorizationRequest,
    TrainingRunRequest,
)
from prefect_ito.simulator import SimulatorServer
from prefect_ito.simulator.engine import Engine

PERSON = "user:ada"
"""Who the tests' person is, as the backend authenticates them."""


def confirmed_on(engine: Engine, account: str, request: TrainingRunRequest) -> TrainingRunRequest:
    """Return ``request`` naming a quote the simulator's engine just made, confirmed by a person
    at the backend."""
    quote = engine.quote(account, request)
    engine.answer_quote(account, quote.quote_id, QuoteAnswer.CONFIRMED, PERSON, None)
    return request.spending(quote.quote_id)


def person_token(simulator: SimulatorServer, account: str = "flow-tests") -> str:
    """Return a token of the tests' person: every scope, spend scopes included."""
    return simulator.mint_token(
        account, scopes=[scope.value for scope in ALL_SCOPES], principal=PERSON
    ).get_secret_value()


def covering_authorization(
    simulator: SimulatorServer, account: str = "flow-tests", **limits: Any
) -> ItoSpendAuthorization:
    """Put on file at ``simulator`` a standing authorization the tests' person made, covering
    every request the tests make for a day (or within ``limits``); return the block naming it.

    The tests' one way to allow a spend without a person at hand: they pass it as
    ``authorization``. Put on file through the simulator's admin surface, so that it is no entry
    in the request log the tests judge the flow by.
    """
    request = SpendAuthorizationRequest(
        name="prefect-ito's own tests",
        limits=NewSpendLimits.model_validate(
            {"max_budget_usd": 1e9, "data_ref_patterns": ["*"], **limits}
        ),
        expires_at=datetime.now(UTC) + timedelta(days=1),
    )
    made = simulator.add_spend_authorization(request, account=account, principal=PERSON)
    return ItoSpendAuthorization(authorization_id=made.authorization_id)


def revoke(simulator: SimulatorServer, authorization_id: str) -> None:
    """Revoke the authorization at the backend, as its person does."""
    response = httpx.delete(
        f"{simulator.url}/v0/spend-authorizations/{authorization_id}",
        headers={"Authorization": f"Bearer {person_token(simulator)}"},
        timeout=10,
    )
    response.raise_for_status()


def confirm_at_backend(
    simulator: SimulatorServer, quote_id: str, account: str = "flow-tests"
) -> Any:
    """Confirm ``quote_id`` at ``simulator`` as the tests' person; return the confirmation."""
    response = httpx.post(
        f"{simulator.url}/v0/training-quotes/{quote_id}/confirmations",
        json={"note": "confirmed by the tests"},
        headers={
            "Authorization": f"Bearer {person_token(simulator, account)}",
            "Idempotency-Key": f"tests-{uuid.uuid4()}",
        },
        timeout=10,
    )
    response.raise_for_status()
    return response.json()["data"]
