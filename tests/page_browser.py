"""A browser, as far as the simulator's pages can tell: for the tests that sign a person in.

It keeps the session cookie, reads each form's hidden fields (the CSRF token among them) and
sends them back, and says its own origin on every POST, as a browser does for a form it posts.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from prefect_ito.simulator import Scenario, builtin_scenario

_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


def passphrase(account: str, scenario: Scenario | None = None) -> str:
    """Return the passphrase ``scenario`` (default: the built-in default) gives ``account``."""
    people = (scenario or builtin_scenario("default")).people
    return next(p.secret.get_secret_value() for p in people if p.account == account)


class PageBrowser:
    """One browser with its own cookies, at one simulator.

    Attributes:
        http: The client: its cookies are the browser's.
        hidden: The hidden fields of the last page read, sent back with the next POST.
    """

    def __init__(self, base_url: str, origin: str | None = None) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30)
        self.origin = origin or base_url
        self.hidden: dict[str, str] = {}

    def __enter__(self) -> PageBrowser:
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()

    def get(self, url: str, **params: Any) -> httpx.Response:
        """Open a page, and keep its form's hidden fields."""
        return self._read(self.http.get(url, params=params))

    def post(
        self, url: str, data: dict[str, str], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """Post a form: the last page's hidden fields, then ``data``, from this browser's origin.

        A header given as ``""`` is not sent (``{"Origin": ""}``: a post that says no origin).
        """
        sent = {k: v for k, v in {"Origin": self.origin, **(headers or {})}.items() if v}
        return self._read(self.http.post(url, data={**self.hidden, **data}, headers=sent))

    def sign_in_at(self, url: str, account: str, secret: str, **fields: str) -> httpx.Response:
        """Open the page at ``url`` and post its sign-in form as ``account``, with ``fields``."""
        page = self.get(url)
        assert page.status_code == 200, page.text
        action = httpx.URL(url).copy_with(query=None)
        return self.post(str(action), {"account": account, "secret": secret, **fields})

    def answer(
        self,
        url: str,
        user_code: str,
        decision: str,
        headers: dict[str, str] | None = None,
        **fields: str,
    ) -> httpx.Response:
        """Post the answer form of the page at ``url`` (its link, with or without the code):
        the code, the ``decision`` and the page's other ``fields``."""
        action = httpx.URL(url).copy_with(query=None)
        data = {"user_code": user_code, "decision": decision, **fields}
        return self.post(str(action), data, headers)

    def _read(self, page: httpx.Response) -> httpx.Response:
        self.hidden = dict(_HIDDEN.findall(page.text))
        return page
