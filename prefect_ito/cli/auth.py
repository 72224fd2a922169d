"""``prefect-ito login``, ``logout`` and ``whoami``.

The backend URL comes from ``--api-url``, ``ITO_COMPUTE_API_URL``, or ``--credentials`` (the name
of a saved ItoCredentials block). No command takes a token as an argument or reads one from
standard input: ``login`` gets it through the device flow and keeps it in the OS keyring, and
refuses to start when there is no keyring it may keep the token in.
Errors end the command with a one-line message and the error's own exit code (see
:class:`prefect_ito.exceptions.ExitCode`): 6 for every authentication failure.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Annotated, Any

import httpx
from cyclopts import Parameter

from prefect_ito.auth import (
    delete_token,
    load_stored_token,
    resolve_api_url,
    resolve_token,
    store_token,
    usable_keyring,
)
from prefect_ito.auth import (
    login as device_login,
)
from prefect_ito.blocks import resolve_credentials
from prefect_ito.cli import app
from prefect_ito.cli.errors import run_command
from prefect_ito.client import ItoClient
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import (
    InvalidParameters,
    ItoError,
    NotLoggedIn,
    NoUsableKeyring,
    PrefectUnreachable,
    TokenRevoked,
)

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
    run_command(command)


async def _target(api_url: str | None, credentials: str | None) -> tuple[str, str | None]:
    """Return the backend URL and keyring entry the options point at."""
    if api_url and credentials:
        raise InvalidParameters("give --api-url or --credentials, not both")
    if credentials:
        try:
            block = await resolve_credentials(credentials)
        except httpx.HTTPError as exc:
            raise PrefectUnreachable(
                f"could not load the ItoCredentials block {credentials!r}: the Prefect API did "
                f"not answer ({type(exc).__name__})"
            ) from None
        return block.api_url, block.keyring_entry
    return resolve_api_url(api_url), None


def _show_prompt(grant: DeviceAuthorization) -> None:
    print(f"To log in, open {grant.verification_uri} and enter the code {grant.user_code}")
    print(f"(or open {grant.verification_uri_complete})")
    print("Waiting for approval…", flush=True)


async def _login(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    # Before the device flow: a person must not approve a login whose token cannot be kept.
    backend = usable_keyring()
    async with ItoClient.from_settings(url) as client:
        token = await device_login(client, on_prompt=_show_prompt)
    store_token(url, token, keyring_entry=entry)  # Reads the token back, or raises.
    print(f"Logged in to {url}; the token is in the keyring ({backend.name}, service prefect-ito).")


async def _logout(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    try:
        token = load_stored_token(url, keyring_entry=entry)
    except NoUsableKeyring as exc:
        raise NotLoggedIn(
            f"not logged in to {url}: no stored Itô token, nothing to log out of",
            reason=exc.reason,
        ) from None
    if token is None:
        raise NotLoggedIn(f"not logged in to {url}: no stored Itô token, nothing to log out of")
    async with ItoClient.from_settings(url, token) as client:
        try:
            revoked = (await client.revoke_token()).revoked
        except TokenRevoked:
            revoked = True  # Already revoked on the backend: the local copy is useless.
        except ItoError as exc:
            raise _same_outcome(exc, "revocation failed, so the local token was kept") from None
    if not revoked:
        raise ItoError("the backend did not revoke the token, so the local token was kept")
    delete_token(url, keyring_entry=entry)
    print(f"Logged out of {url}: the token was revoked and removed from the keyring.")


async def _whoami(api_url: str | None, credentials: str | None) -> None:
    url, entry = await _target(api_url, credentials)
    token = resolve_token(url, keyring_entry=entry)
    async with ItoClient.from_settings(url, token) as client:
        me = await client.whoami()
    print(f"api url:   {url}")
    print(f"backend:   {me.backend}")
    print(f"account:   {me.account}")
    print(f"principal: {me.principal or '(not reported)'}")
    print(f"expires:   {me.expires_at.isoformat()}")
    print(f"scopes:    {' '.join(me.scopes) or '(none)'}")
    provenance = client.provenance
    if provenance is not None:
        print(f"live api:  {'yes' if provenance.live_api_contacted else 'no'}")
        print(f"notice:    {provenance.notice or '(none)'}")


def _same_outcome(error: ItoError, context: str) -> ItoError:
    """Return an error that says ``context`` and keeps ``error``'s code, state and exit code."""
    wrapped = ItoError(f"{context}: {error}")
    wrapped.code, wrapped.state_name, wrapped.exit_code = (
        error.code,
        error.state_name,
        error.exit_code,
    )
    return wrapped
