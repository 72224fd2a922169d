"""The confirm page a quote's ``confirm_url`` names, driven as a browser would: form posts."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from page_browser import PageBrowser, passphrase

from prefect_ito.simulator import Scenario, builtin_scenario

HOSTILE = '<script>alert("x")</script>&'
"""A string a person could type anywhere; the page must show it, never run it."""
FRAME_HEADERS = {
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Referrer-Policy": "same-origin",
}


def _quote(desk: Any, http: httpx.Client | None = None, **changes: Any) -> dict[str, Any]:
    answer = (http or desk.http).post("/v0/training-quotes", json=desk.body(**changes))
    assert answer.status_code == 201, answer.text
    quote: dict[str, Any] = answer.json()["data"]
    return quote


def _state(desk: Any, quote: dict[str, Any]) -> str:
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    state: str = stated["state"]
    return state


def _action(quote: dict[str, Any]) -> str:
    return str(httpx.URL(quote["confirm_url"]).copy_with(query=None))


def _sign_in(
    browser: PageBrowser,
    quote: dict[str, Any],
    account: str = "sim-user",
    *,
    code: str | None = None,
    scenario: Scenario | None = None,
) -> httpx.Response:
    """Sign in on the quote's page with the person's passphrase; return the quote's page."""
    secret = passphrase(account, scenario)
    code = code or quote["user_code"]
    return browser.sign_in_at(quote["confirm_url"], account, secret, user_code=code)


def _answer(
    browser: PageBrowser,
    quote: dict[str, Any],
    decision: str,
    headers: dict[str, str] | None = None,
    **fields: str,
) -> httpx.Response:
    return browser.answer(quote["confirm_url"], quote["user_code"], decision, headers, **fields)


def _show(browser: PageBrowser, quote: dict[str, Any], code: str | None = None) -> httpx.Response:
    """Open the page again, signed in, and ask for the quote a code names."""
    browser.get(quote["confirm_url"])
    return browser.post(_action(quote), {"user_code": code or quote["user_code"]})


def _with_people(*people: tuple[str, str], **changes: Any) -> Scenario:
    base = builtin_scenario("default")
    listed = [*base.model_dump()["people"], *({"account": a, "secret": s} for a, s in people)]
    return Scenario.model_validate({**base.model_dump(), "people": listed, **changes})


def test_a_signed_in_person_sees_the_cost_first_then_the_manifest(desk):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, quote)

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
    # Who asked: the principal whose token asked for the quote, and for which flow run.
    assert text.index("Quote expires") < text.index("Asked by") < text.index("For flow run")
    assert "<td>user:sim-user</td>" in text


def test_the_page_names_who_asked_and_for_which_flow_run_escaped(desk):
    asker, reference = 'user:<b>"mallory"</b>&', "<i>flow-run-1</i>&"
    with desk.person(principal=asker) as person:
        asked = person.post(
            "/v0/training-quotes", json={**desk.body(), "client_reference": reference}
        )
    assert asked.status_code == 201, asked.text

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, asked.json()["data"])

    assert page.status_code == 200, page.text
    assert "<td>user:&lt;b&gt;&quot;mallory&quot;&lt;/b&gt;&amp;</td>" in page.text
    assert "<td>&lt;i&gt;flow-run-1&lt;/i&gt;&amp;</td>" in page.text
    assert "<b>" not in page.text and "<i>" not in page.text


def test_confirming_on_the_page_records_the_signed_in_principal(desk):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, quote)
        answered = _answer(browser, quote, "confirm", note="Ada Lovelace")

    assert answered.status_code == 200, answered.text
    assert "Confirmed as user:sim-user" in answered.text
    # A deployment's flow run asks with no terminal: the page sends nobody back to one.
    assert "goes on by itself" in answered.text and "terminal" not in answered.text
    stated = desk.http.get(f"/v0/training-quotes/{quote['quote_id']}").json()["data"]
    assert stated["state"] == "confirmed"
    assert (stated["confirmation"]["principal"], stated["confirmation"]["note"]) == (
        "user:sim-user",
        "Ada Lovelace",
    )


def test_declining_on_the_page_is_final(desk):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, quote)
        declined = _answer(browser, quote, "decline")
        _show(browser, quote)  # the page again, as a person who changed their mind opens it
        confirm = _answer(browser, quote, "confirm")

    assert declined.status_code == 200
    assert confirm.status_code == 409
    assert "already declined" in confirm.text
    assert _state(desk, quote) == "declined"


def test_another_account_cannot_see_or_answer_the_quote(desk):
    # ada is a person of the default scenario, of another account than sim-user's quote.
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        page = _sign_in(browser, quote, account="ada")
        answer = _answer(browser, quote, "confirm")

    for response in (page, answer):
        assert response.status_code == 400
        assert quote["manifest_digest"] not in response.text
    assert _state(desk, quote) == "pending"


def test_an_account_name_alone_signs_nobody_in(desk):
    # Before, typing an account's name was the whole sign-in: anyone could confirm as anyone.
    quote = _quote(desk)
    fields = {"user_code": quote["user_code"], "account": "sim-user"}

    with PageBrowser(desk.sim.url) as browser:
        browser.get(quote["confirm_url"])
        shown = browser.post(_action(quote), fields)
        confirmed = browser.post(_action(quote), {**fields, "decision": "confirm"})
        guessed = browser.post(
            _action(quote), {**fields, "secret": "sim-user", "decision": "confirm"}
        )

    for response in (shown, confirmed, guessed):
        assert response.status_code == 401, response.text
        assert quote["manifest_digest"] not in response.text
    assert _state(desk, quote) == "pending"


def test_a_post_from_another_origin_confirms_nothing(desk):
    # Before, a page of any site could post the form, and the person's browser confirmed.
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, quote)
        foreign = _answer_from(browser, quote, {"Origin": "https://evil.example"})
        null = _answer_from(browser, quote, {"Origin": "null"})
        referred = _answer_from(
            browser, quote, {"Origin": "", "Referer": "https://evil.example/confirm"}
        )

    for response in (foreign, null, referred):
        assert response.status_code == 403, response.text
    assert _state(desk, quote) == "pending"


def _answer_from(
    browser: PageBrowser, quote: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    hidden = dict(browser.hidden)
    refused = _answer(browser, quote, "confirm", headers=headers)
    browser.hidden = hidden  # the next post carries the form's fields again
    return refused


def test_a_post_from_the_page_itself_by_its_referer_is_taken(desk):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, quote)
        own = f"{desk.sim.url}/confirm?user_code={quote['user_code']}"
        answered = _answer_from(browser, quote, {"Origin": "", "Referer": own})

    assert answered.status_code == 200, answered.text
    assert _state(desk, quote) == "confirmed"


@pytest.mark.parametrize("csrf", [None, "", "not-the-sessions-token"])
def test_a_post_without_the_sessions_csrf_token_confirms_nothing(desk, csrf):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        _sign_in(browser, quote)
        assert browser.hidden.get("csrf_token"), "the page's form carries a CSRF token"
        if csrf is None:
            del browser.hidden["csrf_token"]
        else:
            browser.hidden["csrf_token"] = csrf
        refused = _answer(browser, quote, "confirm")

    assert refused.status_code == 403, refused.text
    assert _state(desk, quote) == "pending"


def test_another_sessions_csrf_token_confirms_nothing(desk):
    # A token is the session's: one from the attacker's own visit to the page is no use.
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as attacker, PageBrowser(desk.sim.url) as person:
        attacker.get(quote["confirm_url"])
        _sign_in(person, quote)
        person.hidden["csrf_token"] = attacker.hidden["csrf_token"]
        refused = _answer(person, quote, "confirm")

    assert refused.status_code == 403
    assert _state(desk, quote) == "pending"


def test_every_page_says_no_frame_and_no_cache(desk):
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        pages = [
            browser.get(quote["confirm_url"]),
            browser.post(_action(quote), {"user_code": quote["user_code"]}),  # 401
            _answer(browser, quote, "confirm", headers={"Origin": "null"}),  # 403
            _sign_in(browser, quote),
            _answer(browser, quote, "confirm"),
            _show(browser, quote, "ZZZZ-ZZZZ"),  # 400
            browser.get("/device"),
        ]

    assert [page.status_code for page in pages] == [200, 401, 403, 200, 200, 400, 200]
    for page in pages:
        for header, value in FRAME_HEADERS.items():
            assert page.headers.get(header) == value, (page.request.url, header)
        policy = page.headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in policy, page.request.url


def test_wrong_codes_are_throttled_and_a_right_code_works_once_the_window_passes(desk_for):
    desk = desk_for(_with_people(page_attempt_limit=3, page_attempt_window_seconds=0.5))
    quote = _quote(desk)

    with PageBrowser(desk.sim.url) as browser:
        first = _sign_in(browser, quote, code="ZZZZ-ZZZZ")
        wrong = [first, *(_show(browser, quote, code) for code in ("ZZZZ-ZZZB", "ZZZZ-ZZZC"))]
        throttled = _show(browser, quote)
        time.sleep(0.6)  # the window passes
        right = _show(browser, quote)

    assert [page.status_code for page in wrong] == [400, 400, 400]
    assert throttled.status_code == 429, throttled.text
    assert throttled.headers["Retry-After"] == "1"  # whole seconds, rounded up
    assert quote["manifest_digest"] not in throttled.text
    assert right.status_code == 200, right.text
    assert quote["manifest_digest"] in right.text


def test_a_new_session_does_not_escape_the_throttle(desk_for):
    # Counted per client and per account too: a fresh cookie is free to get.
    desk = desk_for(_with_people(page_attempt_limit=2))
    quote = _quote(desk)

    for code in ("ZZZZ-ZZZB", "ZZZZ-ZZZC"):
        with PageBrowser(desk.sim.url) as browser:
            assert _sign_in(browser, quote, code=code).status_code == 400
    with PageBrowser(desk.sim.url) as fresh:
        throttled = _sign_in(fresh, quote)

    assert throttled.status_code == 429


def test_wrong_passphrases_are_throttled(desk_for):
    desk = desk_for(_with_people(page_attempt_limit=3))
    quote = _quote(desk)
    fields = {"user_code": quote["user_code"], "account": "sim-user"}

    with PageBrowser(desk.sim.url) as browser:
        browser.get(quote["confirm_url"])
        wrong = [
            browser.post(_action(quote), {**fields, "secret": f"guess {n}"}) for n in (1, 2, 3)
        ]
        right = browser.post(_action(quote), {**fields, "secret": passphrase("sim-user")})

    assert [page.status_code for page in wrong] == [401, 401, 401]
    assert right.status_code == 429
    assert quote["manifest_digest"] not in right.text


def test_the_passphrase_shows_in_no_page_and_no_log(desk):
    quote = _quote(desk)
    secret = passphrase("sim-user")

    with PageBrowser(desk.sim.url) as browser:
        pages = [_sign_in(browser, quote), _answer(browser, quote, "confirm")]
        browser.get(quote["confirm_url"])
        pages.append(browser.post(_action(quote), {"account": "sim-user", "secret": secret}))

    for page in pages:
        assert secret not in page.text
    assert secret not in str(desk.sim.requests())
    assert secret not in repr(builtin_scenario("default"))


def test_the_page_escapes_every_string_a_person_supplied(desk_for):
    account = f"ada{HOSTILE}"
    scenario = _with_people((account, "a passphrase of ada's"))
    desk = desk_for(scenario)
    token = desk.sim.mint_token(account).get_secret_value()
    http = httpx.Client(base_url=desk.sim.url, headers={"Authorization": f"Bearer {token}"})
    quote = _quote(desk, http, target=f"chat {HOSTILE}", data_refs=[f"s3://bucket/{HOSTILE}"])

    with PageBrowser(desk.sim.url) as browser:
        pages = [
            browser.get(_action(quote), user_code=HOSTILE),
            _sign_in(browser, quote, account=account, scenario=scenario),
            _answer(browser, quote, "confirm", note=f"note {HOSTILE}"),
            _show(browser, quote),
        ]

    for page in pages:
        assert "<script>" not in page.text
    assert "&lt;script&gt;" in pages[1].text
    assert "note &lt;script&gt;" in pages[3].text
