"""How tests stand in for the person who confirms a spend: one way each, shared by every test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect_ito.blocks import ItoSpendAuthorization
from prefect_ito.contract import ConfirmationVia, SpendConfirmation, TrainingRunRequest
from prefect_ito.simulator.engine import Engine


def confirmed_on(engine: Engine, account: str, request: TrainingRunRequest) -> TrainingRunRequest:
    """Return ``request`` confirmed by a person on a quote the simulator's engine just made."""
    quote = engine.quote(account, request)
    confirmation = SpendConfirmation(
        quote_id=quote.quote_id, confirmed_by="Ada", via=ConfirmationVia.PERSON
    )
    return request.confirmed(confirmation)


def covering_authorization(**changes: Any) -> ItoSpendAuthorization:
    """Return a standing authorization that covers every request the tests make, for a day.

    The tests' one way to confirm a spend without a person: they pass it as ``authorization``.
    """
    fields: dict[str, Any] = {
        "authorized_by": "Ada (tests)",
        "max_budget_usd": 1e9,
        "booking_ids": ["*"],
        "expires_at": datetime.now(UTC) + timedelta(days=1),
        "note": "prefect-ito's own tests, against the simulator",
    }
    return ItoSpendAuthorization(**{**fields, **changes})
