"""The state one simulator holds, and the FastAPI dependencies that reach it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from prefect_ito.contract import PERSON_PRINCIPAL_PREFIX, ErrorCode, Scope
from prefect_ito.simulator.engine import Engine
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.faults import FaultInjector
from prefect_ito.simulator.identity import Identity, TokenInfo
from prefect_ito.simulator.person_session import PersonSessions
from prefect_ito.simulator.request_scope import state_of
from prefect_ito.simulator.scenario import Scenario


class RequestLogEntry(BaseModel):
    """One request the simulator answered. Headers are not kept, so no token can leak here."""

    time: datetime
    """When the answer was done; the log is in this order."""
    received: datetime
    """When the request arrived: a long-poll answered after a later request arrived before it."""
    method: str
    path: str
    status: int
    idempotency_key: str | None = None
    request_id: str
    dropped: bool = False


@dataclass
class SimState:
    """Everything one simulator instance knows; reset (but for tokens) by a scenario load."""

    engine: Engine
    identity: Identity
    faults: FaultInjector
    pages: PersonSessions
    """The sessions of the pages a person signs in on: confirm, decide and device login."""
    requests: list[RequestLogEntry] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    closing: bool = False
    """Set when the server stops: long-polls answer at once rather than being cut."""

    @classmethod
    def create(cls, scenario: Scenario) -> SimState:
        """Return fresh state for a scenario."""
        return cls(
            Engine(scenario),
            Identity(scenario),
            FaultInjector(scenario.faults),
            PersonSessions(scenario),
        )

    async def close(self) -> None:
        """Answer every long-poll now, and every one that comes after, with the run as it is."""
        self.closing = True
        async with self.changed:
            self.changed.notify_all()

    def load(self, scenario: Scenario) -> None:
        """Load a scenario: bookings, runs, logs, clock, fault dice and page sessions start over."""
        self.engine.load(scenario)
        self.identity.configure(scenario)
        self.pages.configure(scenario)
        self.faults = FaultInjector(scenario.faults)
        self.requests.clear()


def sim_state(request: Request) -> SimState:
    """Return the state of the simulator serving this request."""
    return state_of(request.scope)


_bearer = HTTPBearer(auto_error=False, description="A bearer token from device login.")
SimStateDep = Annotated[SimState, Depends(sim_state)]
"""The serving app's :class:`SimState`, as a route parameter."""


def bearer_token(
    state: SimStateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """Return the presented bearer token once it checks out."""
    token = credentials.credentials if credentials else None
    state.identity.authenticate(token)
    assert token is not None
    return token


def token_info(state: SimStateDep, token: Annotated[str, Depends(bearer_token)]) -> TokenInfo:
    """Return what the simulator knows about the presented token."""
    return state.identity.authenticate(token)


Info = Annotated[TokenInfo, Depends(token_info)]
"""What the simulator knows about any valid token, whatever its scopes."""


# One dependency per scope, each a plain module function: FastAPI resolves their annotations
# from the module's globals, which a closure over the scope would not be in.
def reader(info: Info) -> str:
    """Return the account of a token that may read (``training:read``), else 403."""
    info.require(Scope.READ)
    return info.account


def submitter(info: Info) -> TokenInfo:
    """Return a token that may submit runs (``training:submit``), else 403."""
    info.require(Scope.SUBMIT)
    return info


def canceller(info: Info) -> str:
    """Return the account of a token that may cancel runs (``training:cancel``), else 403."""
    info.require(Scope.CANCEL)
    return info.account


def decider(info: Info) -> TokenInfo:
    """Return a person's token that may decide (``training:decide``), else 403.

    Minting refuses the scope to anyone but a person; checked here again, because a decision
    recorded under a workload's principal would be nobody's.
    """
    info.require(Scope.DECIDE)
    if not info.principal.startswith(PERSON_PRINCIPAL_PREFIX):
        raise SimError(
            ErrorCode.INSUFFICIENT_SCOPE,
            f"only a person's token decides; {info.principal} is not a person",
        )
    return info


def confirmer(info: Info) -> TokenInfo:
    """Return a person's token that may confirm spend (``spend:confirm``), else 403."""
    info.require(Scope.CONFIRM)
    return info


def authorizer(info: Info) -> TokenInfo:
    """Return a person's token that may authorize spend (``spend:authorize``), else 403."""
    info.require(Scope.AUTHORIZE)
    return info


def any_reader(info: Info) -> TokenInfo:
    """Return a token that may read (``training:read``), with its principal, else 403."""
    info.require(Scope.READ)
    return info


Token = Annotated[str, Depends(bearer_token)]
Reader = Annotated[str, Depends(reader)]
Submitter = Annotated[TokenInfo, Depends(submitter)]
"""A token that may submit; its principal goes on record beside who confirmed the spend."""
Canceller = Annotated[str, Depends(canceller)]
Decider = Annotated[TokenInfo, Depends(decider)]
"""A person's token that may decide; its principal goes on record as who decided."""
Confirmer = Annotated[TokenInfo, Depends(confirmer)]
"""A token that may confirm a quote: only a person's holds ``spend:confirm``."""
Authorizer = Annotated[TokenInfo, Depends(authorizer)]
"""A token that may create and revoke standing authorizations (``spend:authorize``)."""
ReaderToken = Annotated[TokenInfo, Depends(any_reader)]
"""A token that may read; its principal goes on record when it declines a quote."""
