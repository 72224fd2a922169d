"""Bearer tokens and the device authorization grant (RFC 8628 shape) of the simulator.

Tokens are opaque random strings held only in memory. Token lifetimes are on the real clock, not
the scaled one: a person logs in in real time.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum

from pydantic import SecretStr

from prefect_ito.contract import (
    PERSON_PRINCIPAL_PREFIX,
    PERSON_SCOPES,
    TRAINING_SCOPES,
    WORKLOAD_SCOPES,
    DeviceAuthorization,
    ErrorCode,
    Scope,
    TokenGrant,
)
from prefect_ito.simulator.errors import SimError
from prefect_ito.simulator.ids import DEVICE_PAGE
from prefect_ito.simulator.ids import user_code as new_user_code
from prefect_ito.simulator.scenario import Scenario

TOKEN_TTL = timedelta(days=30)
SLOW_DOWN_TOLERANCE = 0.9
"""A poll counts as too fast below this share of the interval, so timer jitter is forgiven."""
SLOW_DOWN_STEP_SECONDS = 5
"""RFC 8628 section 3.5: each ``slow_down`` adds five seconds to the grant's polling interval."""


@dataclass
class TokenInfo:
    """What the simulator knows about a bearer token (never the token in a repr)."""

    account: str
    issued: float
    expires_at: datetime
    principal: str
    scopes: tuple[str, ...] = tuple(TRAINING_SCOPES)
    revoked: bool = False

    def require(self, scope: Scope) -> None:
        """Raise ``INSUFFICIENT_SCOPE``, naming ``scope``, unless the token carries it."""
        if scope.value not in self.scopes:
            raise SimError(
                ErrorCode.INSUFFICIENT_SCOPE, f"this token lacks the scope {scope.value}"
            )


def default_principal(account: str) -> str:
    """Return the principal a token speaks for when nobody named one: the account's user."""
    return f"user:{account}"


def check_person_scopes(principal: str, scopes: tuple[str, ...]) -> None:
    """Refuse a person's scope for a principal that is not a person's.

    Spend (v0.4) and decisions (v0.5) are a person's: a workload (``service:…``) may submit what
    a person allowed, but never confirm or authorize spend, nor decide a pending action.
    """
    held = [scope.value for scope in PERSON_SCOPES if scope.value in scopes]
    if held and not principal.startswith(PERSON_PRINCIPAL_PREFIX):
        raise SimError(
            ErrorCode.VALIDATION_ERROR,
            f"only a person's token ({PERSON_PRINCIPAL_PREFIX}…) may hold {', '.join(held)}; "
            f"{principal} is not a person",
            field="scopes",
        )


def default_scopes(principal: str) -> tuple[str, ...]:
    """Return what a token holds when nobody said: the training scopes, without
    ``training:decide`` for anyone but a person."""
    if principal.startswith(PERSON_PRINCIPAL_PREFIX):
        return tuple(TRAINING_SCOPES)
    return tuple(WORKLOAD_SCOPES)


class DeviceStatus(Enum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


@dataclass
class DeviceGrant:
    """One device authorization in progress."""

    device_code: str
    user_code: str
    expires: float
    interval: int
    """The seconds to poll at: the scenario's, plus five for each ``slow_down`` answered."""
    status: DeviceStatus = DeviceStatus.PENDING
    account: str = "sim-user"
    last_poll: float | None = field(default=None)


class Identity:
    """Tokens and device grants; tokens survive a scenario reload, device grants do not."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: dict[str, TokenInfo] = {}
        self.configure(scenario)

    def configure(self, scenario: Scenario) -> None:
        """Apply a newly loaded scenario: its device settings and its token-revocation fault."""
        self._scenario = scenario
        self._loaded = self._clock()
        self._devices: dict[str, DeviceGrant] = {}

    def mint(
        self,
        account: str,
        *,
        scopes: tuple[str, ...] | None = None,
        principal: str | None = None,
    ) -> str:
        """Issue a new bearer token for an account.

        Args:
            account: The account the token acts for.
            scopes: What it may do; by default the training scopes (a workload's without
                ``training:decide``), never a spend scope.
            principal: Who it speaks for; default ``user:<account>``.

        Raises:
            SimError: ``VALIDATION_ERROR`` (field ``scopes``) for a person's scope (deciding,
                confirming, authorizing) asked for a principal that is not a person's.
        """
        principal = principal or default_principal(account)
        scopes = default_scopes(principal) if scopes is None else scopes
        check_person_scopes(principal, scopes)
        token = "itosim_" + secrets.token_urlsafe(24)
        self._tokens[token] = TokenInfo(
            account=account,
            issued=self._clock(),
            expires_at=datetime.now(UTC) + TOKEN_TTL,
            principal=principal,
            scopes=scopes,
        )
        return token

    def authenticate(self, token: str | None) -> TokenInfo:
        """Return the token's record, or raise ``UNAUTHENTICATED`` / ``TOKEN_REVOKED``."""
        info = self._tokens.get(token) if token else None
        if info is None or info.expires_at <= datetime.now(UTC):
            raise SimError(ErrorCode.UNAUTHENTICATED, "a valid bearer token is required")
        if info.revoked or self._revoked_by_fault(info):
            raise SimError(ErrorCode.TOKEN_REVOKED, "this bearer token has been revoked")
        return info

    def _revoked_by_fault(self, info: TokenInfo) -> bool:
        after = self._scenario.faults.revoke_tokens_after_seconds
        if after is None:
            return False
        deadline = self._loaded + after
        return self._clock() >= deadline and info.issued < deadline

    def revoke(self, token: str) -> None:
        """Revoke a token; later calls with it get ``TOKEN_REVOKED``."""
        self._tokens[token].revoked = True

    def start_device(self, base_url: str) -> DeviceAuthorization:
        """Begin a device authorization and return what the person needs."""
        user_code = new_user_code()
        ttl = self._scenario.device_code_ttl_seconds
        grant = DeviceGrant(
            device_code=secrets.token_urlsafe(24),
            user_code=user_code,
            expires=self._clock() + ttl,
            interval=self._scenario.device_interval_seconds,
        )
        self._devices[grant.device_code] = grant
        uri = base_url.rstrip("/") + DEVICE_PAGE
        return DeviceAuthorization(
            device_code=grant.device_code,
            user_code=user_code,
            verification_uri=uri,
            verification_uri_complete=f"{uri}?user_code={user_code}",
            expires_in=ttl,
            interval=self._scenario.device_interval_seconds,
        )

    def verify(self, user_code: str, *, approve: bool, account: str) -> bool:
        """Record the person's answer for a user code; return False if no grant waits for it."""
        wanted = user_code.strip().upper()
        for grant in self._devices.values():
            live = grant.expires > self._clock() and grant.status is DeviceStatus.PENDING
            if live and grant.user_code == wanted:
                grant.status = DeviceStatus.APPROVED if approve else DeviceStatus.DENIED
                grant.account = account
                return True
        return False

    def poll(self, device_code: str) -> TokenGrant:
        """Answer a token poll: a grant, or the RFC 8628 error for the grant's state."""
        grant = self._devices.get(device_code)
        now = self._clock()
        if grant is None or grant.expires <= now:
            self._devices.pop(device_code, None)
            raise SimError(ErrorCode.EXPIRED_TOKEN, "the device code is unknown or expired")
        too_fast = (
            grant.last_poll is not None
            and now - grant.last_poll < grant.interval * SLOW_DOWN_TOLERANCE
        )
        grant.last_poll = now
        if grant.status is DeviceStatus.DENIED:
            del self._devices[device_code]
            raise SimError(ErrorCode.ACCESS_DENIED, "the person denied this device")
        if too_fast:
            grant.interval += SLOW_DOWN_STEP_SECONDS
            raise SimError(
                ErrorCode.SLOW_DOWN,
                f"polling faster than the interval: poll every {grant.interval} s from now on",
                details={"interval": grant.interval},
            )
        if grant.status is DeviceStatus.PENDING:
            raise SimError(ErrorCode.AUTHORIZATION_PENDING, "waiting for the person to approve")
        del self._devices[device_code]
        scopes = tuple(scope.value for scope in self._scenario.login_scopes)
        token = self.mint(grant.account, scopes=scopes)
        return TokenGrant(
            access_token=SecretStr(token),
            expires_in=int(TOKEN_TTL.total_seconds()),
            scope=" ".join(scopes),
        )
