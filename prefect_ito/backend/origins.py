"""Which backend origins this process trusts with a token, and which URLs from Prefect it follows.

Anyone who can reach a team's Prefect API can write a flow run's parameters, a block document or
a deferral record, and so name any backend URL. A token must never follow such a URL to a server
that is not its own. These rules, in order, keep it at home:

1. **A token belongs to one origin** (scheme, host and port; :func:`origin_of`).
   ``ITO_COMPUTE_TOKEN`` belongs to the origin of ``ITO_COMPUTE_API_URL``: the two are set
   together, and the token alone is a configuration error (:class:`TokenWithoutOrigin`). A
   keyring token is stored under its origin and read only for it (:mod:`prefect_ito.backend.auth`).
2. **A URL from Prefect is followed only to a configured origin** (:func:`admit`): the origin of
   ``ITO_COMPUTE_API_URL``, or one listed in ``ITO_COMPUTE_ALLOWED_ORIGINS`` (comma- or
   space-separated), both set in the worker's and the watcher's own environment. Any other origin
   stops before a request is made, with one line that names it and says how to allow it
   (:class:`OriginNotAllowed`). With neither variable set — a person's own machine — any origin
   is followed, but only with the token stored in the keyring for that very origin, so a URL
   nobody logged in to stops at :class:`~prefect_ito.exceptions.NotLoggedIn`, also before any
   request.
3. **The header goes only where the token belongs**: the client attaches ``Authorization`` to a
   request for its token's origin and to nothing else, and follows no redirects.
"""

from __future__ import annotations

import os
import re

import httpx

from prefect_ito.contract import shown
from prefect_ito.exceptions import ItoError, OriginNotAllowed, TokenWithoutOrigin

__all__ = [
    "ENV_ALLOWED_ORIGINS",
    "ENV_API_URL",
    "ENV_TOKEN",
    "admit",
    "configured_origins",
    "env_token_origin",
    "origin_of",
]

ENV_TOKEN = "ITO_COMPUTE_TOKEN"  # noqa: S105 (a variable name, not a secret)
ENV_API_URL = "ITO_COMPUTE_API_URL"
ENV_ALLOWED_ORIGINS = "ITO_COMPUTE_ALLOWED_ORIGINS"

_SEPARATORS = re.compile(r"[\s,]+")


def origin_of(url: str | httpx.URL) -> str:
    """Return the origin of ``url``: ``scheme://host[:port]``, lower-case, no default port.

    Raises:
        ItoError: ``url`` is not an absolute http(s) URL.
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url.strip())
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise ItoError(f"not an http(s) URL for an Itô backend: {shown(str(url))}")
    host = parsed.raw_host.decode("ascii").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets in an origin
        host = f"[{host}]"
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{host}{port}"


def env_token_origin() -> str | None:
    """Return the origin ``ITO_COMPUTE_TOKEN`` belongs to, or None when the token is not set.

    Raises:
        TokenWithoutOrigin: The token is set but ``ITO_COMPUTE_API_URL`` is not, or is no URL.
    """
    if not os.environ.get(ENV_TOKEN, "").strip():
        return None
    url = os.environ.get(ENV_API_URL, "").strip()
    if not url:
        raise TokenWithoutOrigin(
            f"{ENV_TOKEN} is set but {ENV_API_URL} is not: set both in the same environment, "
            f"so the token is sent only to the backend it belongs to"
        )
    try:
        return origin_of(url)
    except ItoError:
        raise TokenWithoutOrigin(
            f"{ENV_TOKEN} is set but {ENV_API_URL} is not an http(s) URL ({url!r}): "
            "the token is sent only to the backend that variable names"
        ) from None


def configured_origins() -> frozenset[str]:
    """Return the origins this process was configured for; empty when none was.

    Raises:
        OriginNotAllowed: An entry of ``ITO_COMPUTE_ALLOWED_ORIGINS`` is not an origin.
        TokenWithoutOrigin: ``ITO_COMPUTE_TOKEN`` is set without ``ITO_COMPUTE_API_URL``.
    """
    origins = set(_allowed_from_env())
    configured = os.environ.get(ENV_API_URL, "").strip()
    if configured:
        try:
            origins.add(origin_of(configured))
        except ItoError as error:
            raise OriginNotAllowed(f"{ENV_API_URL}: {error}", origin=configured) from None
    else:
        env_token_origin()  # a token set without its URL is an error here too
    return frozenset(origins)


def admit(url: str, *, source: str) -> None:
    """Check that a backend URL read from ``source`` may be followed from this process.

    Args:
        url: The backend URL, as a flow parameter, a block or a record named it.
        source: What named it, for the message (for example ``"the credentials block 'desk'"``).

    Raises:
        OriginNotAllowed: This process is configured for other origins only.
        TokenWithoutOrigin: ``ITO_COMPUTE_TOKEN`` is set without ``ITO_COMPUTE_API_URL``.
    """
    origins = configured_origins()
    origin = origin_of(url)
    if not origins or origin in origins:
        return
    raise OriginNotAllowed(
        f"{source} names the Itô backend {origin} — this process is configured for "
        f"{' and '.join(sorted(origins))} only; to allow it, add {origin} to "
        f"{ENV_ALLOWED_ORIGINS} in this process's own environment",
        origin=origin,
    )


def _allowed_from_env() -> list[str]:
    text = os.environ.get(ENV_ALLOWED_ORIGINS, "").strip()
    allowed = []
    for item in filter(None, _SEPARATORS.split(text)):
        try:
            parsed = httpx.URL(item)
            origin = origin_of(parsed) if parsed.path in ("", "/") else None
        except (httpx.InvalidURL, ItoError):
            origin = None
        if origin is None or parsed.query or parsed.fragment or parsed.userinfo:
            raise OriginNotAllowed(
                f"{ENV_ALLOWED_ORIGINS}: {item!r} is not an origin (scheme://host[:port], no path)",
                origin=item,
            )
        allowed.append(origin)
    return allowed
