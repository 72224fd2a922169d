"""What a person does in the browser during a device login, for the tests that log in."""

from __future__ import annotations

import httpx
from page_browser import PageBrowser, passphrase


def answer_in_browser(
    verification_uri: str, user_code: str, account: str = "ana", decision: str = "approve"
) -> httpx.Response:
    """Do what a person does: open the page, sign in, enter the code, press Approve (or Deny).

    ``account`` is a person of the default scenario; they sign in with its passphrase.
    """
    origin = str(httpx.URL(verification_uri).copy_with(path="/", query=None)).rstrip("/")
    with PageBrowser(origin) as browser:
        fields = {"user_code": user_code, "decision": decision}
        return browser.sign_in_at(verification_uri, account, passphrase(account), **fields)


def approve_in_browser(verification_uri: str, user_code: str, account: str = "ana") -> None:
    """Approve the device login as ``account``, and check the page said so."""
    answer = answer_in_browser(verification_uri, user_code, account)
    assert answer.status_code == 200, answer.text
