"""A person's session on the backend's own pages: sign-in, CSRF, origin check, throttle, headers.

The reference for every page a person answers on (the confirm page, the decide page, the
device-login page), as ``docs/contract.md`` states its MUSTs:

1. **Sign-in proves the person.** The account's passphrase from the scenario, compared in
   constant time; an account name alone signs nobody in. A session signed in on one page (a
   device login, say) is signed in on every page of the same simulator.
2. **Every POST is the page's own.** Its ``Origin`` (or, with none, its ``Referer``) is the
   page's own origin, and it carries the session's CSRF token in a hidden field; else 403.
3. **Guesses are throttled.** Wrong codes and wrong passphrases are counted per session, per
   client address and per account; past the scenario's limit within its window, every attempt
   is answered 429 with ``Retry-After``, a right one included.
4. **No other site frames a page, and no cache keeps one:** :data:`PAGE_HEADERS` goes on every
   answer (``middleware.py``), with ``Cache-Control: no-store``.

The session cookie is ``HttpOnly`` and ``SameSite=Lax`` (sent when a person follows a link to
the page from elsewhere, as they do from a terminal or Prefect's UI; never on another site's
POST). The passphrase is never kept in a session, shown on a page or written to a log.
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html import escape
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

from fastapi import Depends, Form, Request
from fastapi.responses import HTMLResponse

from prefect_ito.simulator.scenario import Scenario

SESSION_COOKIE = "ito_sim_session"
CSRF_FIELD = "csrf_token"
"""The hidden form field every POST carries the session's CSRF token in."""
SESSION_TTL_SECONDS = 3600.0
"""How long, in real seconds, a session lasts after it began: a sign-in is good for an hour."""
MAX_SESSIONS = 10_000
"""Sessions kept at most: anyone may start one with a GET, so the oldest go first."""
PAGE_HEADERS = {
    # No script, style or image of anyone's; forms post only here; no frame, no <base>.
    "Content-Security-Policy": (
        "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it, browsers send `Origin: null` on the page's own form posts,
    # which the origin check must then refuse. same-origin keeps the code in the URL at home.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
"""The headers on every page (and every other answer: a framed JSON answer is no use either)."""
MAX_COUNTED_KEYS = 100_000
"""Keys the throttle keeps at most before it forgets those with no attempt in the window."""
_SIGN_IN_FIELDS = """<label>Account <input name="account" autocomplete="username" required></label>
<label>Passphrase <input name="secret" type="password" autocomplete="current-password" required>
</label>"""
T = TypeVar("T")
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Itô desk simulator: {title}</title>
</head><body><h1>{heading}</h1><p>{message}</p>{body}</body></html>
"""


def page(
    request: Request,
    session: PageSession,
    what: tuple[str, str],
    message: str,
    body: str = "",
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """Answer with one of the person's pages: ``what`` is its title and heading, ``message``
    (escaped here) what it says, ``body`` its forms and tables (escaped by their builder)."""
    title, heading = what
    html = _PAGE.format(title=title, heading=heading, message=escape(message), body=body)
    return respond(request, session, html, status, headers)


class PageRefusal(Exception):
    """A page's answer of refusal: its status, what the person is told, and ``Retry-After``."""

    def __init__(self, status_code: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        """Return the headers the refusal's answer carries."""
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


@dataclass
class PageSession:
    """One browser's session: its cookie's id, its CSRF token and, once signed in, the account."""

    session_id: str
    csrf_token: str
    started: float
    account: str | None = None


class WrongAttempts:
    """Counts wrong codes and passphrases by key (session, client, account) in a sliding window."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._seen: dict[str, deque[float]] = {}

    def check(self, keys: Iterable[str]) -> None:
        """Raise a 429 :class:`PageRefusal` if any key has reached the limit in the window."""
        now = self._clock()
        waits = [self._wait(key, now) for key in keys]
        wait = max(waits, default=0.0)
        if wait > 0:
            raise PageRefusal(
                429, "Too many wrong codes or passphrases: try again later.", math.ceil(wait)
            )

    def wrong(self, keys: Iterable[str]) -> None:
        """Count one wrong attempt against every key."""
        now = self._clock()
        if len(self._seen) > MAX_COUNTED_KEYS:  # anyone may name any account: bound the memory
            self._seen = {k: v for k, v in self._seen.items() if v and v[-1] > now - self.window}
        for key in keys:
            self._seen.setdefault(key, deque()).append(now)

    def _wait(self, key: str, now: float) -> float:
        seen = self._seen.get(key)
        if not seen:
            return 0.0
        while seen and seen[0] <= now - self.window:
            seen.popleft()
        if len(seen) < self.limit:
            return 0.0
        # Free again when enough of the window's attempts have aged out of it.
        return seen[len(seen) - self.limit] + self.window - now


class PersonSessions:
    """The sessions of one simulator's pages, its people's passphrases and the throttle."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.configure(scenario)

    def configure(self, scenario: Scenario) -> None:
        """Apply a newly loaded scenario: its people; every session and count starts over."""
        self._secrets = {p.account: p.secret.get_secret_value().encode() for p in scenario.people}
        self._sessions: OrderedDict[str, PageSession] = OrderedDict()
        self.attempts = WrongAttempts(
            scenario.page_attempt_limit, scenario.page_attempt_window_seconds, self._clock
        )

    def open(self, request: Request) -> PageSession:
        """Return the session the request's cookie names, or a new one, not signed in."""
        session = self._sessions.get(request.cookies.get(SESSION_COOKIE, ""))
        if session is not None and self._clock() - session.started < SESSION_TTL_SECONDS:
            return session
        return self._new()

    def _new(self, account: str | None = None) -> PageSession:
        session = PageSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock())
        session.account = account
        self._sessions[session.session_id] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def check_post(self, request: Request, session: PageSession, csrf_token: str) -> None:
        """Refuse (403) a POST from another origin, or without the session's CSRF token."""
        if _claimed_origin(request) != _own_origin(request):
            raise PageRefusal(403, "This form was not sent from this page: nothing was done.")
        if not hmac.compare_digest(csrf_token.encode(), session.csrf_token.encode()):
            raise PageRefusal(403, "This form has expired or is not this page's: nothing was done.")

    def sign_in(
        self, request: Request, session: PageSession, account: str, secret: str
    ) -> PageSession:
        """Sign the person in by their passphrase, as a new session (a new cookie and token).

        Raises:
            PageRefusal: 401 for a wrong account or passphrase; 429 past the throttle.
        """
        keys = self._keys(request, session, account)
        self.attempts.check(keys)
        known = self._secrets.get(account)
        # Compared whether or not the account is known, so the time taken tells neither.
        right = hmac.compare_digest(secret.encode(), known or b"\0" * len(secret.encode()))
        if known is None or not right:
            self.attempts.wrong(keys)
            raise PageRefusal(401, "That account and passphrase do not match: not signed in.")
        self._sessions.pop(session.session_id, None)  # no fixation: the old id is worth nothing
        return self._new(account)

    def require_person(self, session: PageSession) -> str:
        """Return the signed-in account, or raise a 401 :class:`PageRefusal`."""
        if session.account is None:
            raise PageRefusal(401, "Sign in with your account and passphrase first.")
        return session.account

    def try_code(
        self, request: Request, session: PageSession, look_up: Callable[[], T | None]
    ) -> T:
        """Return what a code names for the signed-in person, counting a wrong code.

        Raises:
            PageRefusal: 401 if nobody is signed in; 400 for a code naming nothing of the
                person's; 429 past the throttle, whatever the code.
        """
        account = self.require_person(session)
        keys = self._keys(request, session, account)
        self.attempts.check(keys)
        found = look_up()
        if found is None:
            self.attempts.wrong(keys)
            raise PageRefusal(400, "That code names nothing of this account's.")
        return found

    def _keys(self, request: Request, session: PageSession, account: str) -> list[str]:
        client = request.client.host if request.client else "unknown"
        return [f"session:{session.session_id}", f"client:{client}", f"account:{account}"]

    def admit(self, request: Request, session: PageSession, form: PersonForm) -> PageSession:
        """Check a POST and sign in if it carries an account and passphrase; return the session.

        Raises:
            PageRefusal: 403 for another origin or a missing or wrong CSRF token; 401 for a
                wrong passphrase; 429 past the throttle.
        """
        self.check_post(request, session, form.csrf_token)
        if form.account or form.secret:
            return self.sign_in(request, session, form.account, form.secret)
        return session


class PersonForm:
    """The fields every page's form posts: the CSRF token, and the sign-in when it signs in."""

    def __init__(
        self,
        csrf_token: Annotated[str, Form(max_length=128)] = "",
        account: Annotated[str, Form(max_length=128)] = "",
        secret: Annotated[str, Form(max_length=256)] = "",
    ) -> None:
        self.csrf_token = csrf_token
        self.account = account
        self.secret = secret

    def __repr__(self) -> str:  # never the passphrase
        return f"PersonForm(account={self.account!r})"


PersonFormDep = Annotated[PersonForm, Depends()]
"""A page's form fields, as a route parameter."""


def form_fields(session: PageSession) -> str:
    """Return the HTML every page's form holds: the CSRF token, then the sign-in or who is in."""
    csrf = f'<input type="hidden" name="{CSRF_FIELD}" value="{escape(session.csrf_token)}">'
    if session.account is None:
        return csrf + _SIGN_IN_FIELDS
    return csrf + f"<p>Signed in as {escape(session.account)}.</p>"


def respond(
    request: Request,
    session: PageSession,
    html: str,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """Return a page, setting the session's cookie (the headers come from the middleware)."""
    response = HTMLResponse(html, status_code=status, headers=headers)
    response.set_cookie(
        SESSION_COOKIE,
        session.session_id,
        max_age=int(SESSION_TTL_SECONDS),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}".lower()


def _claimed_origin(request: Request) -> str | None:
    """Return the origin a POST says it came from: its Origin, or its Referer's origin."""
    origin = request.headers.get("origin")
    if origin:
        return origin.lower()
    referer = urlsplit(request.headers.get("referer", ""))
    return f"{referer.scheme}://{referer.netloc}".lower() if referer.netloc else None
