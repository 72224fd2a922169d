"""What a person does in the browser during a device login, for the tests that log in."""

from __future__ import annotations

import httpx


def approve_in_browser(verification_uri: str, user_code: str) -> None:
    """Do what a person does: open the page, enter the code, press Approve."""
    with httpx.Client(follow_redirects=True) as browser:
        page = browser.get(verification_uri)
        assert page.status_code == 200
        assert "<form" in page.text
        answer = browser.post(
            verification_uri,
            data={"user_code": user_code, "account": "ana", "decision": "approve"},
        )
        assert answer.status_code == 200, answer.text
