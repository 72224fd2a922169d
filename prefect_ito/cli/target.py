"""Which backend a command's ``--api-url`` or ``--credentials`` names, and a client for it.

``login``, ``logout``, ``whoami``, ``capabilities`` and ``runs show`` take the backend the same
way: ``--api-url``, else ``--credentials`` (the name of a saved ItoCredentials block, whose
keyring entry is then used), else ``ITO_COMPUTE_API_URL``. A block's URL is followed only to an
origin this process is configured for (:func:`prefect_ito.backend.origins.admit`); a URL a person
types
is theirs to choose, and gets only the token that belongs to its own origin.
"""

from __future__ import annotations

from typing import Annotated

import httpx
from cyclopts import Parameter

from prefect_ito.backend.auth import resolve_api_url, resolve_token
from prefect_ito.backend.client import ItoClient
from prefect_ito.exceptions import InvalidParameters, PrefectUnreachable

__all__ = ["ApiUrl", "CredentialsName", "open_client", "resolve_target"]

ApiUrl = Annotated[
    str | None,
    Parameter(help="Root URL of the Itô backend (default: $ITO_COMPUTE_API_URL)."),
]
CredentialsName = Annotated[
    str | None,
    Parameter(help="Name of a saved ItoCredentials block to take the backend from."),
]


async def resolve_target(api_url: str | None, credentials: str | None) -> tuple[str, str | None]:
    """Return the backend URL and keyring entry the options point at.

    Raises:
        InvalidParameters: Both options were given, or the URL is not an http(s) URL.
        PrefectUnreachable: The credentials block could not be read from Prefect.
    """
    if api_url and credentials:
        raise InvalidParameters("give --api-url or --credentials, not both")
    if credentials:
        # Only a saved block needs Prefect; `--api-url` and the environment do not import it.
        from prefect_ito.blocks import resolve_credentials

        try:
            block = await resolve_credentials(credentials)
        except httpx.HTTPError as exc:
            raise PrefectUnreachable(
                f"could not load the ItoCredentials block {credentials!r}: the Prefect API did "
                f"not answer ({type(exc).__name__})"
            ) from None
        return block.api_url, block.keyring_entry  # admitted by resolve_credentials
    return resolve_api_url(api_url), None


async def open_client(api_url: str | None, credentials: str | None) -> ItoClient:
    """Return a client for the backend the options name, with its token resolved now.

    Raises:
        NotLoggedIn: No token for that backend in the environment or the keyring.
    """
    url, entry = await resolve_target(api_url, credentials)
    return ItoClient.from_settings(url, resolve_token(url, keyring_entry=entry))
