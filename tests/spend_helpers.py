"""How tests stand in for the person who confirms a spend: one way each, shared by every test."""

from __future__ import annotations

from prefect_ito.contract import ConfirmationVia, SpendConfirmation, TrainingRunRequest
from prefect_ito.simulator.engine import Engine


def confirmed_on(engine: Engine, account: str, request: TrainingRunRequest) -> TrainingRunRequest:
    """Return ``request`` confirmed by a person on a quote the simulator's engine just made."""
    quote = engine.quote(account, request)
    confirmation = SpendConfirmation(
        quote_id=quote.quote_id, confirmed_by="Ada", via=ConfirmationVia.PERSON
    )
    return request.confirmed(confirmation)
