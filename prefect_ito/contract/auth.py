"""Contract v0: device authorization (RFC 8628 shape), tokens, scopes and identity."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_serializer,
)

from prefect_ito.contract.envelope import NonEmptyStr, _Model


class Scope(StrEnum):
    """What a token may do (v0.2). Each ``/v0`` training route needs exactly one of them."""

    READ = "training:read"
    """Capabilities, eligibility, runs, the change feed and events."""
    SUBMIT = "training:submit"
    """Submitting training runs: the scope that spends."""
    DECIDE = "training:decide"
    """Deciding a pending action (a proposed restart) as the person the token speaks for. v0.5:
    only a person's token."""
    CANCEL = "training:cancel"
    """Cancelling a run's workload."""
    CONFIRM = "spend:confirm"
    """v0.4: confirming a quote as the person the token speaks for. Only a person's token."""
    AUTHORIZE = "spend:authorize"
    """v0.4: creating and revoking standing spend authorizations. Only a person's token."""


TRAINING_SCOPES: Final = (Scope.READ, Scope.SUBMIT, Scope.DECIDE, Scope.CANCEL)
"""The four training scopes, one per ``/v0/training-runs`` route family."""
SPEND_SCOPES: Final = (Scope.CONFIRM, Scope.AUTHORIZE)
"""The spend scopes (v0.4): held only by a person's token (principal ``user:…``)."""
PERSON_SCOPES: Final = (Scope.DECIDE, *SPEND_SCOPES)
"""What only a person's token (principal ``user:…``) may hold: a decision on a pending action
(v0.5) and the spend scopes (v0.4). A backend grants none of them to any other principal."""
WORKLOAD_SCOPES: Final = (Scope.READ, Scope.SUBMIT, Scope.CANCEL)
"""What a workload's token (``service:…``) holds at most (v0.5): it reads, submits what a person
allowed, and cancels; it never decides and never confirms."""
ALL_SCOPES: Final = tuple(Scope)
"""Every scope, in the order above: what a person's device login grants unless the backend
limits it."""
PERSON_PRINCIPAL_PREFIX: Final = "user:"
"""The principals of people; a backend grants a person's scope to no other principal."""

Principal = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256),
    Field(
        description="The authenticated principal the backend saw: a stable id of who holds "
        "the token, such as `user:ada@example.com` or `service:nightly-train`.",
        examples=["user:ada@example.com"],
    ),
]
"""Who a token speaks for, as the backend knows it; never the token."""


class DeviceAuthorization(_Model):
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int = 5


class DeviceTokenRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device_code: NonEmptyStr
    grant_type: Literal["urn:ietf:params:oauth:grant-type:device_code"] = (
        "urn:ietf:params:oauth:grant-type:device_code"
    )


class TokenGrant(_Model):
    """A bearer token. Held as ``SecretStr`` so no repr, log or dump shows it."""

    access_token: SecretStr
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int
    scope: str

    @field_serializer("access_token", when_used="json")
    def _reveal_on_wire(self, value: SecretStr) -> str:
        # Only the wire form carries the secret; python-mode dumps keep it masked.
        return value.get_secret_value()


class WhoAmI(_Model):
    """Who the presented token speaks for, and what it may do; never the token."""

    account: str
    backend: str
    expires_at: datetime
    scopes: list[str] = Field(
        description="The token's scopes. A client ignores scopes it does not know."
    )
    principal: Principal | None = Field(
        default=None,
        description="The authenticated principal (v0.2; absent from older backends).",
    )


class Revocation(_Model):
    revoked: bool
