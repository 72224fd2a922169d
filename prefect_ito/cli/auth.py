"""``prefect-ito login``, ``logout`` and ``whoami``.

The backend URL comes from ``--api-url``, ``ITO_COMPUTE_API_URL``, or ``--credentials`` (the name
of a saved ItoCredentials block). No command takes a token as an argument or reads one from
standard input: ``login`` gets it through the device flow and keeps it in the OS keyring.
Errors end the command with a one-line message and exit code 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Annotated, Any, cast

from cyclopts import Parameter

from prefect_ito.auth import (
    delete_token,
    load_stored_token,
    resolve_api_url,
    resolve_token,
    store_token,
)
from prefect_ito.auth import (
    login as device_login,
)
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli import app
from prefect_ito.client import ItoClient
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import ItoError, NotLoggedIn, TokenRevoked

__all__ = ["login", "logout", "whoami"]

ApiUrl = Annotated[
    str | None,
    Parameter(help="Root URL of the Itô backend (default: $ITO_COMPUTE_API_URL)."),
]
CredentialsName = Annotated[
    str | None,
    Parameter(help="Name of a saved ItoCredentials block to take the backend from."),
]


@app.command
def login(*, api_url: ApiUrl = None, credentials: CredentialsName = None) -> None:
    """Log in to an Itô backend (device flow) and keep the token in the OS keyring."""
    _run(_login(api_url, credentials))


@app.command
def logout(*, api_url: ApiUrl = None, credentials: CredentialsName = None) -> None:
    """Revoke the stored token on the backend, then remove it from the keyring."""
    _run(_logout(api_url, credentials))


@app.command
def whoami(*, api_url: ApiUrl = None, credentials: CredentialsName = None) -> None:
    """Show which backend and account the credential is for (never the token itself)."""
    _run(_whoami(api_url, credentials))


def _run(command: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.run(command)
    except ItoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


async def _target(api_url: str | None, credentials: str | None) -> tuple[str, str | None]:
    """Return the backend URL and keyring entry the options point at."""
    if api_url and credentials:
        raise ItoError("give --api-url or --credentials, not both")
    if credentials:
        # Prefect's aload is typed loosely; it returns an instance of the class it is called on.
        block = cast(ItoCredentials, await ItoCredentials.aload(credentials))
        return block.api_url, block.keyring_entry
    return resolve_api_url(api_url), None


def _show_prompt(grant: DeviceAuthorization) -> None:
    print(f"To log in, open {grant.verification_uri} and enter the code {grant.user_code}")
    print(f"(or open {grant.verification_uri_complete})")
    print("Waiting for approval…", flush=True)


async def _login(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    async with ItoClient.from_settings(url) as client:
        token = await device_login(client, on_prompt=_show_prompt)
    store_token(url, token, keyring_entry=entry)
    print(f"Logged in to {url}; the token is in the OS keyring (service prefect-ito).")


async def _logout(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    token = load_stored_token(url, keyring_entry=entry)
    if token is None:
        raise NotLoggedIn(f"no stored Itô token for {url}; nothing to log out of")
    async with ItoClient.from_settings(url, token) as client:
        try:
            revoked = (await client.revoke_token()).revoked
        except TokenRevoked:
            revoked = True  # Already revoked on the backend: the local copy is useless.
        except ItoError as exc:
            raise ItoError(f"revocation failed, so the local token was kept: {exc}") from None
    if not revoked:
        raise ItoError("the backend did not revoke the token, so the local token was kept")
    delete_token(url, keyring_entry=entry)
    print(f"Logged out of {url}: the token was revoked and removed from the keyring.")


async def _whoami(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    token = resolve_token(url, keyring_entry=entry)
    async with ItoClient.from_settings(url, token) as client:
        me = await client.whoami()
    print(f"api url:  {url}")
    print(f"backend:  {me.backend}")
    print(f"account:  {me.account}")
    print(f"expires:  {me.expires_at.isoformat()}")
    print(f"scopes:   {' '.join(me.scopes) or '(none)'}")
