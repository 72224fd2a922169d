"""Every answer of the contract says `Cache-Control: no-store`: it may carry a token or a quote."""

from __future__ import annotations

import time

import httpx
from device_login import approve_in_browser


def _token_exchange(desk) -> list[httpx.Response]:
    """Walk a device login through the form; return the answers of its contract routes."""
    url = desk.sim.url
    started = httpx.post(f"{url}/v0/auth/device")
    device = started.json()["data"]
    body = {"device_code": device["device_code"]}
    pending = httpx.post(f"{url}/v0/auth/token", json=body)
    approve_in_browser(device["verification_uri_complete"], device["user_code"])
    time.sleep(device["interval"])
    granted = httpx.post(f"{url}/v0/auth/token", json=body)
    return [started, pending, granted]


def test_every_answer_says_no_store(desk):
    # Before, no answer said Cache-Control: a cache could keep a token, a quote or a run.
    run = desk.start()
    answers = [
        *_token_exchange(desk),
        desk.http.get("/v0/capabilities"),
        desk.http.get("/v0/auth/whoami"),
        desk.quote(),
        desk.http.get(f"/v0/training-runs/{run['run_id']}"),
        desk.http.get("/v0/training-runs"),
        desk.http.get(f"/v0/training-runs/{run['run_id']}/events"),
        desk.http.get("/v0/training-runs/run_missing"),  # 404 RUN_NOT_FOUND
        desk.http.get("/v0/no-such-route"),  # 404 NOT_FOUND
        httpx.get(f"{desk.sim.url}/v0/capabilities"),  # 401 UNAUTHENTICATED
        desk.http.post("/v0/training-runs", json={}),  # 422: no Idempotency-Key
    ]

    assert answers[2].status_code == 200, answers[2].text  # the token exchange gave a token
    for answer in answers:
        assert answer.headers.get("Cache-Control") == "no-store", answer.request.url
