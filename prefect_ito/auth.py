"""Where the backend URL and the bearer token come from, and the device login that gets a token.

The token is found by these rules, in order, and by nothing else:

1. The environment variable ``ITO_COMPUTE_TOKEN``, for headless workers whose orchestrator injects
   a secret into the worker's own environment (never through deployment job variables, which
   Prefect stores in plain text).
2. The OS keyring: service ``prefect-ito``, entry named by the normalised backend URL (or by an
   explicit ``keyring_entry``). ``prefect-ito login`` writes it there.
3. Otherwise :class:`~prefect_ito.exceptions.NotLoggedIn`, whose message says to run
   ``prefect-ito login --api-url URL``.

No file, argument, block field or Prefect Secret block is ever read for the token. A keyring
backend that keeps secrets in a plaintext file is refused with
:class:`~prefect_ito.exceptions.InsecureKeyring` unless
``PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING`` is set.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import keyring
import keyring.errors
from pydantic import SecretStr

from prefect_ito.client import ItoClient
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import (
    AuthorizationPending,
    ExpiredToken,
    InsecureKeyring,
    ItoError,
    NotLoggedIn,
    SlowDown,
)
from prefect_ito.settings import ItoSettings

__all__ = [
    "ENV_API_URL",
    "ENV_TOKEN",
    "KEYRING_SERVICE",
    "delete_token",
    "load_stored_token",
    "login",
    "normalise_api_url",
    "resolve_api_url",
    "resolve_token",
    "store_token",
]

logger = logging.getLogger(__name__)

ENV_TOKEN = "ITO_COMPUTE_TOKEN"  # noqa: S105 (a variable name, not a secret)
ENV_API_URL = "ITO_COMPUTE_API_URL"
KEYRING_SERVICE = "prefect-ito"
SLOW_DOWN_STEP_SECONDS = 5
"""RFC 8628: on ``slow_down`` the polling interval grows by five seconds."""

_PLAINTEXT_BACKENDS = frozenset({"keyrings.alt.file.PlaintextKeyring"})
"""Keyring backends (or their bases) that write secrets unencrypted to a file."""


def normalise_api_url(url: str) -> str:
    """Return ``url`` in the one spelling used as a keyring entry: no trailing slash.

    Raises:
        ItoError: The URL is not an absolute http(s) URL.
    """
    text = url.strip().rstrip("/")
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ItoError(f"not an http(s) URL for an Itô backend: {text!r}")
    return text


def resolve_api_url(explicit: str | None = None) -> str:
    """Return the backend URL: ``explicit``, else ``ITO_COMPUTE_API_URL``.

    There is no built-in production default to fall back on.

    Raises:
        ItoError: Neither was given, or the URL is not an http(s) URL.
    """
    url = explicit or os.environ.get(ENV_API_URL)
    if not url:
        raise ItoError(
            f"no Itô backend URL: pass --api-url URL, set {ENV_API_URL}, "
            "or use an ItoCredentials block"
        )
    return normalise_api_url(url)


def resolve_token(api_url: str, *, keyring_entry: str | None = None) -> SecretStr:
    """Return the bearer token for ``api_url``, by the rules in this module's docstring.

    Args:
        api_url: The backend the token is for.
        keyring_entry: The keyring entry to read instead of the normalised URL.

    Raises:
        NotLoggedIn: No token in the environment or the keyring.
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    from_env = os.environ.get(ENV_TOKEN, "").strip()
    if from_env:
        return SecretStr(from_env)
    stored = load_stored_token(api_url, keyring_entry=keyring_entry)
    if stored is None:
        raise NotLoggedIn(api_url=normalise_api_url(api_url))
    return stored


def load_stored_token(api_url: str, *, keyring_entry: str | None = None) -> SecretStr | None:
    """Return the token the keyring holds for ``api_url``, or None (also without a keyring).

    Raises:
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = _keyring_backend()
    try:
        value = backend.get_password(KEYRING_SERVICE, _entry(api_url, keyring_entry))
    except keyring.errors.NoKeyringError:
        logger.info("No OS keyring is available; looking no further for an Itô token")
        return None
    return SecretStr(value) if value else None


def store_token(api_url: str, token: SecretStr, *, keyring_entry: str | None = None) -> None:
    """Store ``token`` in the keyring for ``api_url``.

    Raises:
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
        ItoError: No keyring is available to store it in.
    """
    backend = _keyring_backend()
    try:
        backend.set_password(
            KEYRING_SERVICE, _entry(api_url, keyring_entry), token.get_secret_value()
        )
    except keyring.errors.KeyringError as exc:
        raise ItoError(
            f"could not store the token in the OS keyring ({type(exc).__name__}); on a headless "
            f"worker, inject {ENV_TOKEN} from the orchestrator's secret store instead"
        ) from None


def delete_token(api_url: str, *, keyring_entry: str | None = None) -> None:
    """Delete the keyring's token for ``api_url``; nothing happens if there is none.

    Raises:
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = _keyring_backend()
    try:
        backend.delete_password(KEYRING_SERVICE, _entry(api_url, keyring_entry))
    except keyring.errors.PasswordDeleteError:
        logger.debug("No stored Itô token to delete")
    except keyring.errors.NoKeyringError:
        logger.info("No OS keyring is available; nothing to delete")


def _entry(api_url: str, keyring_entry: str | None) -> str:
    return keyring_entry or normalise_api_url(api_url)


def _keyring_backend() -> Any:
    backend = keyring.get_keyring()
    if _is_plaintext(backend) and not ItoSettings().allow_plaintext_keyring:
        raise InsecureKeyring(
            f"the keyring backend {type(backend).__name__} keeps secrets in a plaintext file, "
            "so prefect-ito will not use it; configure a secure keyring, or set "
            "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING=true on a throwaway machine"
        )
    return backend


def _is_plaintext(backend: Any) -> bool:
    # A chainer backend stores through its members; any plaintext member makes it plaintext.
    members = getattr(backend, "backends", None)
    if isinstance(members, list | tuple):
        return any(_is_plaintext(member) for member in members)
    return any(
        f"{cls.__module__}.{cls.__qualname__}" in _PLAINTEXT_BACKENDS
        for cls in type(backend).__mro__
    )


async def login(
    client: ItoClient,
    *,
    on_prompt: Callable[[DeviceAuthorization], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> SecretStr:
    """Run the device authorization flow and return the token once a person approves.

    Polls at the backend's interval, five seconds slower after each ``slow_down``, until the
    device code expires. The caller stores the token (see :func:`store_token`).

    Args:
        client: A client for the backend (no token needed).
        on_prompt: Shows the person the verification URL and user code.
        sleep: How to wait between polls.
        clock: A monotonic clock, for the device code's expiry.

    Raises:
        AccessDenied: The person refused.
        ExpiredToken: The device code expired before approval.
    """
    grant = await client.start_device_authorization()
    on_prompt(grant)
    interval = float(grant.interval)
    deadline = clock() + grant.expires_in
    while clock() < deadline:
        await sleep(interval)
        try:
            token = await client.exchange_device_code(grant.device_code)
        except AuthorizationPending:
            continue
        except SlowDown:
            interval += SLOW_DOWN_STEP_SECONDS
            continue
        return token.access_token
    raise ExpiredToken("the device code expired before the login was approved")
