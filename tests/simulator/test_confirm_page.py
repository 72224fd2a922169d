"""The confirm page a quote's ``confirm_url`` names, driven as a browser would: form posts."""

from __future__ import annotations

import re
from typing import Any

import httpx

HOSTILE = '<script>alert("x")</script>&'
"""A string a person could type anywhere; the page must show it, never run it."""


def _quote(desk: Any, http: httpx.Client | None = None, **changes: Any) -> dict[str, Any]:
    answer = (http or desk.http).post("/v0/training-quotes", json=desk.body(**changes))
    assert answer.status_code == 201, answer.text
    quote: dict[str, Any] = answer.json()["data"]
    return quote


def _sign_in(quote: dict[str, Any], account: str = "sim-user") -> httpx.Response:
    page = httpx.get(quote["confirm_url"])
    assert page.status_code == 200
    code = re.search(r'name="user_code" value="([^"]+)"', page.text)
    assert code is not None
    action = httpx.URL(quote["confirm_url"]).copy_with(query=None)
    return httpx.post(action, data={"user_code": code.group(1), "account": account})


def _answer(quote: dict[str, Any], decision: str, note: str = "", account: str = "sim-user"):
    action = httpx.URL(quote["confirm_url"]).copy_with(query=None)
    data = {"user_code": quote["user_code"], "account": account, "decision": decision}
    if note:
        data["note"] = note
    return httpx.post(action, data=data)


def test_a_signed_in_person_sees_the_cost_first_then_the_manifest(desk):
    quote = _quote(desk)

    page = _sign_in(quote)

    assert page.status_code == 200, page.text
    text = page.text
    cost = text.index("Estimated cost")
    assert cost < text.index("Budget ceiling") < text.index("Booking&#x27;s term")
    assert text.index("Booking&#x27;s term") < text.index("Model size") < text.index("Data")
    low, high = quote["plan"]["cost_usd"]["low"], quote["plan"]["cost_usd"]["high"]
    assert f"${low:,.2f} – ${high:,.2f}" in text
    assert "$250,000.00" in text
    assert quote["manifest_digest"] in text
    assert 'value="confirm"' in text and 'value="decline"' in text


def test_confirming_on_the_page_records_the_signed_in_principal(desk):
    quote = _quote(desk)

    answered = _answer(quote, "confirm", note="Ada Lovelace")

    assert answered.status_code == 200, answered.text
    assert "Confirmed as user:sim-user" in answered.text
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "confirmed"
    assert (stated["confirmation"]["principal"], stated["confirmation"]["note"]) == (
        "user:sim-user",
        "Ada Lovelace",
    )


def test_declining_on_the_page_is_final(desk):
    quote = _quote(desk)

    declined = _answer(quote, "decline")
    confirm = _answer(quote, "confirm")

    assert declined.status_code == 200
    assert confirm.status_code == 409
    assert "already declined" in confirm.text
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "declined"


def test_another_account_cannot_see_or_answer_the_quote(desk):
    quote = _quote(desk)

    page = _sign_in(quote, account="acme")
    answer = _answer(quote, "confirm", account="acme")

    for response in (page, answer):
        assert response.status_code == 400
        assert quote["manifest_digest"] not in response.text
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "pending"


def test_the_page_escapes_every_string_a_person_supplied(desk):
    account = f"ada{HOSTILE}"
    token = desk.sim.mint_token(account).get_secret_value()
    http = httpx.Client(base_url=desk.sim.url, headers={"Authorization": f"Bearer {token}"})
    quote = _quote(desk, http, target=f"chat {HOSTILE}", data_refs=[f"s3://bucket/{HOSTILE}"])

    pages = [
        httpx.get(quote["confirm_url"].split("?")[0], params={"user_code": HOSTILE}),
        _sign_in(quote, account=account),
        _answer(quote, "confirm", note=f"note {HOSTILE}", account=account),
        _sign_in(quote, account=account),
    ]

    for page in pages:
        assert "<script>" not in page.text
    assert "&lt;script&gt;" in pages[1].text
    assert "note &lt;script&gt;" in pages[3].text
