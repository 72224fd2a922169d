"""The ``/_sim`` admin surface: set the simulator up and see what a client really did.

Not part of the contract and absent from the OpenAPI document. It has no authentication: the
simulator binds to loopback.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from prefect_ito.contract import (
    PERSON_PRINCIPAL_PREFIX,
    Envelope,
    ErrorCode,
    Principal,
    Scope,
    SpendAuthorization,
    SpendAuthorizationRequest,
    TrainingRun,
)
from prefect_ito.simulator.envelopes import ok
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.scenario import Scenario, SimBooking
from prefect_ito.simulator.state import RequestLogEntry, SimStateDep

router = APIRouter(prefix="/_sim", include_in_schema=False)


class MintRequest(BaseModel):
    """The token to mint: for which account, with which scopes, speaking for whom."""

    account: str = Field(default="sim-user", min_length=1, max_length=128)
    scopes: list[Scope] | None = Field(
        default=None,
        description="What the token may do (default the training scopes: a person's four, a "
        "workload's without `training:decide`); an empty list mints a token that may do nothing "
        "but say who it is. `training:decide`, `spend:confirm` and `spend:authorize` are minted "
        "only for a person's principal (`user:…`).",
    )
    principal: Principal | None = Field(
        default=None, description="Who the token speaks for; default `user:<account>`."
    )


class MintedToken(BaseModel):
    """A freshly minted bearer token (the admin surface is the one place it is shown)."""

    token: str
    account: str
    scopes: list[str] = Field(default_factory=list)
    principal: str | None = None


class AdminRun(BaseModel):
    """A run as the admin surface shows it: with its account and idempotency key."""

    run_id: str
    account: str
    idempotency_key: str
    run: TrainingRun


class LoadedScenario(BaseModel):
    name: str


@router.put("/scenario")
async def put_scenario(state: SimStateDep, scenario: Scenario) -> Envelope[LoadedScenario]:
    """Load a scenario: bookings, runs, request log and clock start over; tokens stay valid."""
    state.load(scenario)
    async with state.changed:
        state.changed.notify_all()
    return ok(LoadedScenario(name=scenario.name))


@router.post("/tokens")
async def mint_token(state: SimStateDep, body: MintRequest | None = None) -> Envelope[MintedToken]:
    """Mint a bearer token without device login: the training scopes, or those asked for.

    A person's scope (``training:decide`` or a spend scope) for a principal that is not a
    person's is refused with ``VALIDATION_ERROR``; by default such a principal gets the workload
    scopes, without ``training:decide``.
    """
    wanted = body or MintRequest()
    scopes = None if wanted.scopes is None else tuple(scope.value for scope in wanted.scopes)
    token = state.identity.mint(wanted.account, scopes=scopes, principal=wanted.principal)
    info = state.identity.authenticate(token)
    return ok(
        MintedToken(
            token=token, account=info.account, scopes=list(info.scopes), principal=info.principal
        )
    )


@router.get("/bookings")
async def list_bookings(state: SimStateDep) -> Envelope[list[SimBooking]]:
    """Every booking on file."""
    return ok(list(state.engine.bookings.values()))


@router.post("/bookings")
async def add_booking(state: SimStateDep, booking: SimBooking) -> Envelope[SimBooking]:
    """Put a booking on file."""
    state.engine.add_booking(booking)
    return ok(booking)


class AuthorizationOnFile(BaseModel):
    """A standing authorization to put on file, as the person ``principal`` of ``account``."""

    account: str = Field(default="sim-user", min_length=1, max_length=128)
    principal: Principal = Field(description="The person who made it (`user:…`).")
    authorization: SpendAuthorizationRequest


@router.post("/spend-authorizations")
async def add_spend_authorization(
    state: SimStateDep, on_file: AuthorizationOnFile
) -> Envelope[SpendAuthorization]:
    """Put a standing authorization on file, as if its person had created it: the seeding
    counterpart of ``POST /v0/spend-authorizations``, kept out of the request log."""
    if not on_file.principal.startswith(PERSON_PRINCIPAL_PREFIX):
        raise SimError(ErrorCode.VALIDATION_ERROR, "only a person makes a standing authorization")
    created, _ = state.engine.authorizations.create(
        on_file.account,
        on_file.principal,
        on_file.authorization,
        key=f"admin-{uuid.uuid4()}",
        now=state.engine.wall_now(),
    )
    return ok(created)


@router.get("/runs")
async def list_runs(state: SimStateDep) -> Envelope[list[AdminRun]]:
    """Every run of every account, with its idempotency key."""
    state.engine.advance()
    runs: list[Any] = [
        AdminRun(
            run_id=rec.run_id,
            account=rec.account,
            idempotency_key=rec.idempotency_key,
            run=rec.snapshot(),
        )
        for rec in state.engine.runs.values()
    ]
    return ok(runs)


@router.get("/requests")
async def list_requests(state: SimStateDep) -> Envelope[list[RequestLogEntry]]:
    """The request log: time, method, path, status, idempotency key; never a header."""
    return ok(list(state.requests))
