"""Where the backend URL and the bearer token come from, and the device login that gets a token.

A token belongs to one backend origin (scheme, host and port; see
:mod:`prefect_ito.backend.origins`)
and is found by these rules, in order, and by nothing else:

1. The environment variable ``ITO_COMPUTE_TOKEN``, for headless workers whose orchestrator injects
   a secret into the worker's own environment (never through deployment job variables, which
   Prefect stores in plain text). It belongs to the origin of ``ITO_COMPUTE_API_URL``, set beside
   it, and is used for that origin only; set alone it is
   :class:`~prefect_ito.exceptions.TokenWithoutOrigin`.
2. The OS keyring: service ``prefect-ito``, entry named by the backend's origin (or
   ``<origin>#<label>`` for an ``ItoCredentials`` block's ``keyring_entry`` label, a second
   login at the same backend). ``prefect-ito login`` writes it there. No entry of one origin is
   ever read for another. A keyring that cannot be used (:func:`usable_keyring`) is not consulted.
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
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import SecretStr

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.origins import ENV_API_URL, ENV_TOKEN, env_token_origin, origin_of
from prefect_ito.contract import DeviceAuthorization, shown
from prefect_ito.exceptions import (
    AuthorizationPending,
    ExpiredToken,
    InsecureKeyring,
    ItoError,
    NotLoggedIn,
    NoUsableKeyring,
    SlowDown,
)
from prefect_ito.settings import current_settings

if TYPE_CHECKING:
    from keyring.backend import KeyringBackend

__all__ = [
    "ENV_API_URL",
    "ENV_TOKEN",
    "KEYRING_SERVICE",
    "check_keyring_label",
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

KEYRING_SERVICE = "prefect-ito"
_ALLOW_PLAINTEXT_ENV = "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING"
SLOW_DOWN_STEP_SECONDS = 5
"""RFC 8628: on ``slow_down`` the polling interval grows by five seconds."""

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A keyring label: names a second login at one backend, and can never spell another origin."""

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
        raise ItoError(f"not an http(s) URL for an Itô backend: {shown(text)}")
    if parsed.userinfo or parsed.query or parsed.fragment:
        raise ItoError(
            "an Itô backend URL has no user, query or fragment: "
            f"{shown(str(parsed.copy_with(userinfo=b'')))}"
        )
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
    """Return the bearer token for ``api_url``'s origin, by the rules in this module's docstring.

    A keyring that cannot be used (see :func:`usable_keyring`) is not consulted, so a missing
    token is always :class:`~prefect_ito.exceptions.NotLoggedIn`, whose message also says why the
    keyring was not used.

    Args:
        api_url: The backend the token is for.
        keyring_entry: A label for a second login at the same backend (see
            :func:`check_keyring_label`).

    Raises:
        NotLoggedIn: No token for that origin in the environment or the keyring.
        TokenWithoutOrigin: ``ITO_COMPUTE_TOKEN`` is set without ``ITO_COMPUTE_API_URL``.
    """
    url = normalise_api_url(api_url)
    origin, env_origin = origin_of(url), env_token_origin()
    if env_origin == origin:
        return SecretStr(os.environ[ENV_TOKEN].strip())
    elsewhere = f"{ENV_TOKEN} belongs to {env_origin} only" if env_origin else None
    try:
        stored = load_stored_token(url, keyring_entry=keyring_entry)
    except NoUsableKeyring as exc:
        logger.info("Not looking in the keyring for an Itô token: %s", exc.reason)
        reason = f"{exc.reason}; {elsewhere}" if elsewhere else exc.reason
        raise NotLoggedIn(api_url=url, reason=reason) from None
    if stored is None and elsewhere:
        raise NotLoggedIn(
            f"not logged in to {url} ({elsewhere}, and the keyring holds no token for {origin}): "
            f"run `prefect-ito login --api-url {url}`, or set {ENV_API_URL} to this backend "
            "beside its token"
        )
    if stored is None:
        raise NotLoggedIn(api_url=url)
    return stored


def check_keyring_label(label: str | None, api_url: str) -> str | None:
    """Return the keyring label to use beside ``api_url``'s origin; None for the origin's own.

    A label names a second login at the same backend (entry ``<origin>#<label>``). A label that
    is a URL of the same origin means the origin's own entry; one of another origin is refused,
    so no block or record can point one backend's token at another backend.

    Raises:
        ItoError: ``label`` names another origin, or is not a label (letters, digits, ``.``,
            ``_`` and ``-``; at most 64).
    """
    if label is None or not label.strip():
        return None
    label = label.strip()
    if "://" in label:
        if origin_of(label) != origin_of(api_url):
            raise ItoError(
                f"keyring_entry names another backend ({origin_of(label)}) than api_url "
                f"({origin_of(api_url)}): a token is read only for its own backend"
            )
        return None
    if not _LABEL.fullmatch(label):
        raise ItoError(
            f"keyring_entry {label!r} is not a label (letters, digits, '.', '_', '-'; at most 64)"
        )
    return label


def load_stored_token(api_url: str, *, keyring_entry: str | None = None) -> SecretStr | None:
    """Return the token the keyring holds for ``api_url``, or None.

    Raises:
        NoUsableKeyring: There is no usable keyring, or reading it failed.
        InsecureKeyring: The keyring backend is a plaintext file and that was not allowed.
    """
    backend = usable_keyring()
    try:
        value = backend.get_password(KEYRING_SERVICE, _entry(api_url, keyring_entry))
    except _keyring_errors().KeyringError as exc:
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
    except _keyring_errors().KeyringError as exc:
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
    except _keyring_errors().PasswordDeleteError:
        logger.debug("No stored Itô token to delete")
    except _keyring_errors().KeyringError as exc:
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
    import keyring  # here, not at import: a command given its token in the environment skips it

    try:
        backend = keyring.get_keyring()
    except Exception as exc:  # Loading a configured backend raises whatever its module raises.
        raise _unusable(f"keyring could not load its backend ({type(exc).__name__})") from None
    reason = _why_unusable(backend)
    if reason:
        raise _unusable(reason)
    if _is_plaintext(backend) and not current_settings().allow_plaintext_keyring:
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
    from keyring.backends.fail import Keyring as FailKeyring
    from keyring.backends.null import Keyring as NullKeyring

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
    # The origin is always part of the entry's name: no label can reach another origin's token.
    label = check_keyring_label(keyring_entry, api_url)
    origin = origin_of(normalise_api_url(api_url))
    return origin if label is None else f"{origin}#{label}"


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


def _keyring_errors() -> Any:
    """Return ``keyring.errors``, imported when a keyring is first used (about 0.1 s)."""
    import keyring.errors

    return keyring.errors
