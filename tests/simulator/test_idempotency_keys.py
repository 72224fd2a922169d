"""Idempotency keys: one in flight answers 409 with Retry-After; a key is kept for a while."""

from __future__ import annotations

import asyncio
import time

import httpx

from prefect_ito.contract import IDEMPOTENCY_HEADER, IDEMPOTENCY_KEY_RETENTION_SECONDS
from prefect_ito.simulator import Faults, Scenario, builtin_scenario


def _scenario(**changes) -> Scenario:
    return builtin_scenario("default").model_copy(update=changes)


async def test_a_second_request_while_the_first_is_in_flight_gets_409_with_retry_after(desk_for):
    desk = desk_for(_scenario(faults=Faults(commit_delay_seconds=0.5)))
    headers = {**desk.http.headers, IDEMPOTENCY_HEADER: "k-fly"}
    body = desk.confirmed(desk.body())

    async def submit(after: float) -> httpx.Response:
        await asyncio.sleep(after)
        async with httpx.AsyncClient(base_url=desk.sim.url, headers=headers) as client:
            return await client.post("/v0/training-runs", json=body, timeout=30)

    first, second = await asyncio.gather(submit(0), submit(0.15))
    third = await submit(0)

    assert first.status_code == 201
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "IDEMPOTENCY_KEY_IN_FLIGHT"
    assert second.headers["Retry-After"] == "1"
    assert third.status_code == 200 and third.json()["data"]["replayed"] is True
    assert len(desk.sim.runs()) == 1


def test_keys_are_kept_24_hours_by_default():
    assert builtin_scenario("default").idempotency_key_retention_seconds == 86_400
    assert IDEMPOTENCY_KEY_RETENTION_SECONDS == 86_400


def test_a_key_past_its_retention_is_forgotten(desk_for):
    desk = desk_for(_scenario(idempotency_key_retention_seconds=0.5))
    run = desk.finished(desk.start(key="k-old"))
    # Its key was kept before that answer came: a busy machine may have taken long to give it,
    # so the key's age is counted from here (not from before the submission).
    time.sleep(0.6)

    found = desk.http.get("/v0/training-runs", params={"idempotency_key": "k-old"})
    another = desk.submit(desk.body(target="code assistant"), key="k-old")

    assert found.json()["data"]["runs"] == []
    assert another.status_code == 201  # a new request, not IDEMPOTENCY_KEY_REUSED
    assert another.json()["data"]["run"]["run_id"] != run["run_id"]
