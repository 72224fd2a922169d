"""Contract v0: device authorization (RFC 8628 shape), tokens and identity."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import (
    ConfigDict,
    SecretStr,
    field_serializer,
)

from prefect_ito.contract.envelope import NonEmptyStr, _Model


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
    account: str
    backend: str
    expires_at: datetime
    scopes: list[str]


class Revocation(_Model):
    revoked: bool
