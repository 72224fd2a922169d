"""Device login through the HTML form, token polling errors, whoami and revoke."""

from __future__ import annotations

import time

import httpx
import pytest
from device_login import answer_in_browser
from page_browser import PageBrowser, passphrase


def _start(desk):
    return httpx.post(f"{desk.sim.url}/v0/auth/device").json()["data"]


def _poll(desk, device):
    return httpx.post(f"{desk.sim.url}/v0/auth/token", json={"device_code": device["device_code"]})


def _approving(device):
    return {"user_code": device["user_code"], "decision": "approve"}


def _approve(device, decision="approve"):
    uri, code = device["verification_uri_complete"], device["user_code"]
    return answer_in_browser(uri, code, "ada", decision)


def test_device_flow_through_the_html_form(desk):
    device = _start(desk)
    pending = _poll(desk, device)
    page = _approve(device)
    time.sleep(device["interval"])
    granted = _poll(desk, device)

    assert pending.json()["error"]["code"] == "AUTHORIZATION_PENDING"
    assert page.status_code == 200
    assert "Approved" in page.text
    token = granted.json()["data"]["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    who = httpx.get(f"{desk.sim.url}/v0/auth/whoami", headers=headers)
    assert who.json()["data"]["account"] == "ada"
    assert token not in who.text
    revoked = httpx.post(f"{desk.sim.url}/v0/auth/revoke", headers=headers)
    after = httpx.get(f"{desk.sim.url}/v0/auth/whoami", headers=headers)
    assert revoked.json()["data"] == {"revoked": True}
    assert after.status_code == 401
    assert after.json()["error"]["code"] == "TOKEN_REVOKED"


def test_denied_device_gets_access_denied(desk):
    device = _start(desk)

    _approve(device, decision="deny")
    denied = _poll(desk, device)

    assert denied.status_code == 400
    assert denied.json()["error"]["code"] == "ACCESS_DENIED"


def test_polling_too_fast_gets_slow_down_with_the_interval_to_keep(desk):
    # Before, SLOW_DOWN said nothing of how much slower; RFC 8628 adds five seconds each time.
    device = _start(desk)

    _poll(desk, device)
    fast = _poll(desk, device)
    faster = _poll(desk, device)

    assert fast.json()["error"]["code"] == "SLOW_DOWN"
    assert fast.json()["error"]["details"] == {"interval": device["interval"] + 5}
    assert faster.json()["error"]["details"] == {"interval": device["interval"] + 10}


@pytest.mark.parametrize("device_code", ["unknown-code"])
def test_unknown_device_code_is_expired(desk, device_code):
    response = _poll(desk, {"device_code": device_code})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "EXPIRED_TOKEN"


def test_unknown_user_code_on_the_form_is_refused(desk):
    response = answer_in_browser(f"{desk.sim.url}/device", "ZZZZ-ZZZZ")

    assert response.status_code == 400
    assert "names nothing" in response.text


def test_an_account_name_alone_approves_no_device(desk):
    # Before, the account typed was the whole sign-in: anyone could log in as anyone.
    device = _start(desk)
    fields = {"user_code": device["user_code"], "account": "ada", "decision": "approve"}

    with PageBrowser(desk.sim.url) as browser:
        browser.get("/device")
        refused = browser.post("/device", fields)
        guessed = browser.post("/device", {**fields, "secret": "ada"})
    time.sleep(device["interval"])
    polled = _poll(desk, device)

    assert (refused.status_code, guessed.status_code) == (401, 401)
    assert polled.json()["error"]["code"] == "AUTHORIZATION_PENDING"


def test_a_device_approval_from_another_origin_is_refused(desk):
    device = _start(desk)

    with PageBrowser(desk.sim.url, origin="https://evil.example") as browser:
        refused = browser.sign_in_at(
            f"{desk.sim.url}/device", "ada", passphrase("ada"), **_approving(device)
        )
    time.sleep(device["interval"])
    polled = _poll(desk, device)

    assert refused.status_code == 403
    assert polled.json()["error"]["code"] == "AUTHORIZATION_PENDING"


def test_a_device_login_signs_the_browser_in_on_the_confirm_page(desk):
    quote = desk.quote().json()["data"]
    device = _start(desk)

    with PageBrowser(desk.sim.url) as browser:
        url = f"{desk.sim.url}/device"
        browser.sign_in_at(url, "sim-user", passphrase("sim-user"), **_approving(device))
        page = browser.get(quote["confirm_url"])
        shown = browser.post("/confirm", {"user_code": quote["user_code"]})

    assert "Signed in as sim-user" in page.text
    assert 'name="secret"' not in page.text
    assert shown.status_code == 200, shown.text
    assert quote["manifest_digest"] in shown.text
