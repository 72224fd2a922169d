"""Where answers come from, and what the backend says about its own API, reported once.

Every envelope says whether a live production backend produced it (``live_api_contacted``) and
may carry a ``notice`` (the reference simulator says it is one). Every answer may carry
``Deprecation`` and ``Sunset`` headers. :class:`ResponseNotes` reads both for one client and logs
them on the ``prefect_ito.backend.client`` logger: the notice once per client, a deprecation once
per
endpoint per client, and a warning naming the URL when a backend that is not on loopback says it
is not live — someone pointed prefect-ito at a simulator or a staging backend they may have taken
for production.

The process also keeps the last :class:`Provenance` seen per backend URL (:func:`last_seen`),
because the flows make a client per task: the training summary and ``prefect-ito train`` read it
from there.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from prefect_ito.backend._retry import _backend_key
from prefect_ito.contract import DEPRECATION_HEADER, SUNSET_HEADER

__all__ = ["Provenance", "ResponseNotes", "is_loopback", "last_seen", "seen"]

logger = logging.getLogger("prefect_ito.backend.client")

_MAX_NOTE = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")

_last: dict[str, Provenance] = {}
_last_lock = threading.Lock()


def is_loopback(url: str) -> bool:
    """Tell whether ``url`` names this machine: ``localhost``, 127.0.0.0/8 or ``[::1]``."""
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _clean(text: str) -> str:
    """Return backend text fit for one log line: no control characters, bounded."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= _MAX_NOTE else text[: _MAX_NOTE - 1] + "…"


class Provenance(BaseModel):
    """What a backend's last answer said about where it came from.

    Attributes:
        api_url: The backend's root URL.
        live_api_contacted: True only when a live production backend produced the answer.
        notice: The backend's human note, if any (cleaned of control characters).
    """

    model_config = ConfigDict(frozen=True)

    api_url: str
    live_api_contacted: bool
    notice: str | None = None

    @property
    def surprising(self) -> bool:
        """True when a backend that is not on loopback says it is not a live backend."""
        return not self.live_api_contacted and not is_loopback(self.api_url)

    def describe(self) -> str:
        """Return one plain sentence: the backend, whether it is live, and its notice."""
        live = "yes" if self.live_api_contacted else "no"
        text = f"Itô backend {self.api_url}: live API contacted: {live}."
        return text + (f" Notice: {self.notice}" if self.notice else "")

    def warning(self) -> str:
        """Return the warning for a :attr:`surprising` backend, naming its URL."""
        return (
            f"The Itô backend at {self.api_url} is not on loopback, yet answered "
            "live_api_contacted: false: its answers do not come from a live production backend. "
            "Check that this is the backend you meant."
        )


def last_seen(api_url: str) -> Provenance | None:
    """Return the last provenance any client in this process saw from ``api_url``."""
    with _last_lock:
        return _last.get(_backend_key(api_url))


def seen() -> list[Provenance]:
    """Return the last provenance of every backend this process talked to."""
    with _last_lock:
        return list(_last.values())


class ResponseNotes:
    """One client's reading of provenance and deprecations, each logged once.

    Args:
        api_url: The backend's root URL.
    """

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self.provenance: Provenance | None = None
        self._announced: set[Provenance] = set()
        self._deprecated: set[str] = set()

    def observe_envelope(self, body: Mapping[str, Any]) -> None:
        """Read an envelope's ``live_api_contacted`` and ``notice``; log each new pair once."""
        live = body.get("live_api_contacted")
        if not isinstance(live, bool):
            return  # the parser reports the malformed envelope
        notice = body.get("notice")
        cleaned = _clean(notice) if isinstance(notice, str) else ""
        provenance = Provenance(
            api_url=self.api_url, live_api_contacted=live, notice=cleaned or None
        )
        self.provenance = provenance
        with _last_lock:
            _last[_backend_key(self.api_url)] = provenance
        if provenance in self._announced:
            return
        self._announced.add(provenance)
        if provenance.surprising:
            logger.warning("%s", provenance.warning())
        if provenance.notice:
            logger.info("%s", provenance.describe())

    def observe_headers(self, endpoint: str, response: httpx.Response) -> None:
        """Log, once per endpoint, that the backend deprecates it (``Deprecation``/``Sunset``)."""
        deprecation = response.headers.get(DEPRECATION_HEADER)
        sunset = response.headers.get(SUNSET_HEADER)
        if not (deprecation or sunset) or endpoint in self._deprecated:
            return
        self._deprecated.add(endpoint)
        link = response.links.get("deprecation", {}).get("url")
        logger.warning(
            "The Itô backend at %s deprecates %s (Deprecation: %s; Sunset: %s)%s. It keeps "
            "working until the sunset; a newer prefect-ito may no longer need it.",
            self.api_url,
            endpoint,
            _clean(deprecation) if deprecation else "not given",
            _clean(sunset) if sunset else "not given",
            f"; see {_clean(link)}" if link else "",
        )
