"""Device login through the HTML form, token polling errors, whoami and revoke."""

from __future__ import annotations

import re
import time

import httpx
import pytest


def _start(desk):
    return httpx.post(f"{desk.sim.url}/v0/auth/device").json()["data"]


def _poll(desk, device):
    return httpx.post(f"{desk.sim.url}/v0/auth/token", json={"device_code": device["device_code"]})


def _approve(device, decision="approve"):
    page = httpx.get(device["verification_uri_complete"])
    action = re.search(r'action="([^"]+)"', page.text).group(1)
    code = re.search(r'name="user_code" value="([^"]+)"', page.text).group(1)
    return httpx.post(
        httpx.URL(device["verification_uri"]).join(action),
        data={"user_code": code, "account": "ada", "decision": decision},
    )


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
    response = httpx.post(
        f"{desk.sim.url}/device", data={"user_code": "ZZZZ-ZZZZ", "decision": "approve"}
    )

    assert response.status_code == 400
    assert "unknown" in response.text
