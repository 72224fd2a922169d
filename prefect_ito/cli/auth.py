"""``prefect-ito login``, ``logout`` and ``whoami``.

The backend URL comes from ``--api-url``, ``ITO_COMPUTE_API_URL``, or ``--credentials`` (the name
of a saved ItoCredentials block; see :mod:`prefect_ito.cli.target`). No command takes a token as
an argument or reads one from standard input: ``login`` gets it through the device flow and
keeps it in the OS keyring, and refuses to start when there is no keyring it may keep the token
in. With ``--json``, ``login`` still shows where to approve the login, on standard error.
Errors end the command with a one-line message and the error's own exit code (see
:class:`prefect_ito.exceptions.ExitCode`): 6 for every authentication failure.
"""

from __future__ import annotations

from typing import Any

from prefect_ito.backend import provenance
from prefect_ito.backend.auth import (
    delete_token,
    load_stored_token,
    store_token,
    usable_keyring,
)
from prefect_ito.backend.auth import (
    login as device_login,
)
from prefect_ito.backend.client import ItoClient
from prefect_ito.cli.errors import respond
from prefect_ito.cli.output import JsonOption
from prefect_ito.cli.target import ApiUrl, CredentialsName, open_client, resolve_target
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import (
    ItoError,
    NotLoggedIn,
    NoUsableKeyring,
    TokenRevoked,
)

__all__ = ["login", "logout", "whoami"]


def login(
    *, api_url: ApiUrl = None, credentials: CredentialsName = None, json_output: JsonOption = False
) -> None:
    """Log in to an Itô backend (device flow) and keep the token in the OS keyring."""
    respond(json_output, _login(api_url, credentials), _show_login)


def logout(
    *, api_url: ApiUrl = None, credentials: CredentialsName = None, json_output: JsonOption = False
) -> None:
    """Revoke the stored token on the backend, then remove it from the keyring."""
    respond(json_output, _logout(api_url, credentials), _show_logout)


def whoami(
    *, api_url: ApiUrl = None, credentials: CredentialsName = None, json_output: JsonOption = False
) -> None:
    """Show which backend and account the credential is for (never the token itself)."""
    respond(json_output, _whoami(api_url, credentials), _show_whoami)


def _show_prompt(grant: DeviceAuthorization) -> None:
    print(f"To log in, open {grant.verification_uri} and enter the code {grant.user_code}")
    print(f"(or open {grant.verification_uri_complete})")
    print("Waiting for approval…", flush=True)


async def _login(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    url, entry = await resolve_target(api_url, credentials)
    # Before the device flow: a person must not approve a login whose token cannot be kept.
    backend = usable_keyring()
    async with ItoClient.from_settings(url) as client:
        token = await device_login(client, on_prompt=_show_prompt)
    store_token(url, token, keyring_entry=entry)  # Reads the token back, or raises.
    return {"api_url": url, "keyring": backend.name, "keyring_service": "prefect-ito"}


def _show_login(done: dict[str, Any]) -> None:
    print(
        f"Logged in to {done['api_url']}; the token is in the keyring ({done['keyring']}, "
        f"service {done['keyring_service']})."
    )


async def _logout(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    url, entry = await resolve_target(api_url, credentials)
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
    return {"api_url": url, "revoked": True}


def _show_logout(done: dict[str, Any]) -> None:
    print(f"Logged out of {done['api_url']}: the token was revoked and removed from the keyring.")


async def _whoami(api_url: str | None, credentials: str | None) -> dict[str, Any]:
    async with await open_client(api_url, credentials) as client:
        me = await client.whoami()
    return {"api_url": client.base_url, **me.model_dump(mode="json")}


def _show_whoami(me: dict[str, Any]) -> None:
    print(f"api url:   {me['api_url']}")
    print(f"backend:   {me['backend']}")
    print(f"account:   {me['account']}")
    print(f"principal: {me.get('principal') or '(not reported)'}")
    print(f"expires:   {me['expires_at']}")
    print(f"scopes:    {' '.join(me['scopes']) or '(none)'}")
    answered = provenance.last_seen(me["api_url"])
    if answered is not None:
        print(f"live api:  {'yes' if answered.live_api_contacted else 'no'}")
        print(f"notice:    {answered.notice or '(none)'}")


def _same_outcome(error: ItoError, context: str) -> ItoError:
    """Return an error that says ``context`` and keeps ``error``'s code, state and exit code."""
    wrapped = ItoError(f"{context}: {error}")
    wrapped.code, wrapped.state_name, wrapped.exit_code = (
        error.code,
        error.state_name,
        error.exit_code,
    )
    return wrapped
