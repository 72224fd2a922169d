"""Where the backend URL and the bearer token come from, and the device login that gets a token.

The token is found by these rules, in order, and by nothing else:

1. The environment variable ``ITO_COMPUTE_TOKEN``, for headless workers whose orchestrator injects
   a secret into the worker's own environment (never through deployment job variables, which
   Prefect stores in plain text).
2. The OS keyring: service ``prefect-ito``, entry named by the normalised backend URL (or by an
   explicit ``keyring_entry``). ``prefect-ito login`` writes it there. A keyring that cannot be
   used (:func:`usable_keyring`) is not consulted.
3. Otherwise :class:`~prefect_ito.exceptions.NotLoggedIn`, whose message says to run
   ``prefect-ito login --api-url URL`` and, if the keyring was not consulted, why.

No file, argument, block field or Prefect Secret block is ever read for the token. The keyring
cannot be used when there is none (keyring's ``fail`` or ``null`` backend, or a chainer with
nothing to chain), and a backend that keeps secrets in a plaintext file is refused unless
``PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING`` is set. Storing a token then fails with
:class:`~prefect_ito.exceptions.NoUsableKeyring` (:class:`~prefect_ito.exceptions.InsecureKeyring`
for the plaintext file), and so does ``prefect-ito login``, before it starts the device flow.
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
from keyring.backend import KeyringBackend
from keyring.backends.fail import Keyring as FailKeyring
from keyring.backends.null import Keyring as NullKeyring
from pydantic import SecretStr

from prefect_ito.client import ItoClient
from prefect_ito.contract import DeviceAuthorization
from prefect_ito.exceptions import (
    AuthorizationPending,
    ExpiredToken,
    InsecureKeyring,
    ItoError,
    NotLoggedIn,
    NoUsableKeyring,
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
    "usable_keyring",
]

logger = logging.getLogger(__name__)

ENV_TOKEN = "ITO_COMPUTE_TOKEN"  # noqa: S105 (a variable name, not a secret)
ENV_API_URL = "ITO_COMPUTE_API_URL"
KEYRING_SERVICE = "prefect-ito"
_ALLOW_PLAINTEXT_ENV = "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING"
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

    A keyring that cannot be used (see :func:`usable_keyring`) is not consulted, so a missing
    token is always :class:`~prefect_ito.exceptions.NotLoggedIn`, whose message also says why the
    keyring was not used.

    Args:
        api_url: The backend the token is for.
        keyring_entry: The keyring entry to read instead of the normalised URL.

    Raises:
        NotLoggedIn: No token in the environment or the keyring.
    """
    from_env = os.environ.get(ENV_TOKEN, "").strip()
    if from_env:
        return SecretStr(from_env)
    url = normalise_api_url(api_url)
    try:
        stored = load_stored_token(url, keyring_entry=keyring_entry)
    except NoUsableKeyring as exc:
        logger.info("Not looking in the keyring for an Itô token: %s", exc.reason)
        raise NotLoggedIn(api_url=url, reason=exc.reason) from None
    if stored is None:
        raise NotLoggedIn(api_url=url)
    return stored


def load_stored_token(api_url: str, *, keyring_entry: str | None = None) -> SecretStr | None:
    """Return the token the keyring holds for ``api_url``, or None.

    Raises:
        NoUsableKeyring: There is no usable keyring, or reading it failed.
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = usable_keyring()
    try:
        value = backend.get_password(KEYRING_SERVICE, _entry(api_url, keyring_entry))
    except keyring.errors.KeyringError as exc:
        raise _unusable(f"reading the keyring failed ({type(exc).__name__})") from None
    return SecretStr(value) if value else None


def store_token(api_url: str, token: SecretStr, *, keyring_entry: str | None = None) -> None:
    """Store ``token`` in the keyring for ``api_url``, and read it back to be sure it is there.

    Raises:
        NoUsableKeyring: There is no usable keyring, or it did not keep the token.
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = usable_keyring()
    entry = _entry(api_url, keyring_entry)
    secret = token.get_secret_value()
    try:
        backend.set_password(KEYRING_SERVICE, entry, secret)
        kept = backend.get_password(KEYRING_SERVICE, entry)
    except keyring.errors.KeyringError as exc:
        raise _unusable(f"storing the token failed ({type(exc).__name__})") from None
    # A backend that accepts a secret and drops it must not make a login look successful.
    if kept != secret:
        raise _unusable(f"the keyring backend {_name(backend)} did not keep the token")


def delete_token(api_url: str, *, keyring_entry: str | None = None) -> None:
    """Delete the keyring's token for ``api_url``; nothing happens if there is none.

    Raises:
        NoUsableKeyring: There is no usable keyring, or deleting failed.
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = usable_keyring()
    try:
        backend.delete_password(KEYRING_SERVICE, _entry(api_url, keyring_entry))
    except keyring.errors.PasswordDeleteError:
        logger.debug("No stored Itô token to delete")
    except keyring.errors.KeyringError as exc:
        raise _unusable(f"deleting the token failed ({type(exc).__name__})") from None


def usable_keyring() -> KeyringBackend:
    """Return the keyring backend prefect-ito may keep a token in.

    ``prefect-ito login`` checks this before it starts the device flow, so a login never
    succeeds into a keyring that cannot keep the token.

    Raises:
        NoUsableKeyring: There is no OS keyring: keyring's ``fail`` or ``null`` backend, a chainer
            with nothing to chain, or a backend keyring could not load.
        InsecureKeyring: The backend keeps secrets in a plaintext file and
            ``PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING`` is not set.
    """
    try:
        backend = keyring.get_keyring()
    except Exception as exc:  # Loading a configured backend raises whatever its module raises.
        raise _unusable(f"keyring could not load its backend ({type(exc).__name__})") from None
    reason = _why_unusable(backend)
    if reason:
        raise _unusable(reason)
    if _is_plaintext(backend) and not ItoSettings().allow_plaintext_keyring:
        reason = (
            f"the keyring backend {_name(backend)} keeps secrets in a plaintext file and "
            f"{_ALLOW_PLAINTEXT_ENV} is not set"
        )
        raise InsecureKeyring(
            f"{reason}, so prefect-ito will not use it: configure a secure keyring, set "
            f"{ENV_TOKEN} in the worker's own environment, or set {_ALLOW_PLAINTEXT_ENV}=true on "
            "a throwaway machine",
            reason=reason,
        )
    return backend


def _unusable(reason: str) -> NoUsableKeyring:
    return NoUsableKeyring(
        f"{reason}, so prefect-ito cannot keep a token there: set {ENV_TOKEN} in the worker's own "
        f"environment instead, or, on a throwaway machine, allow a file keyring (keyrings.alt) "
        f"with {_ALLOW_PLAINTEXT_ENV}=true",
        reason=reason,
    )


def _why_unusable(backend: KeyringBackend) -> str | None:
    """Return why ``backend`` cannot keep a token, or None when it may."""
    if isinstance(backend, FailKeyring):
        return "no OS keyring is available (keyring chose its fail backend)"
    if isinstance(backend, NullKeyring):
        return "the keyring is disabled (keyring's null backend)"
    # A chainer stores through its members; with none that can, it stores nothing.
    members = getattr(backend, "backends", None)
    if isinstance(members, list | tuple) and all(_why_unusable(m) for m in members):
        return "no OS keyring is available (keyring's chainer has no backend to use)"
    return None


def _entry(api_url: str, keyring_entry: str | None) -> str:
    return keyring_entry or normalise_api_url(api_url)


def _name(backend: KeyringBackend) -> str:
    # keyring's display name ("SecretService Keyring"): most backend classes are called Keyring.
    return str(backend.name)


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
