"""The account-wide change feed: every version move once, long-poll, per account, advertised."""

from __future__ import annotations

import asyncio

import httpx

from prefect_ito.blocks import ItoCredentials
from prefect_ito.exceptions import NotFound
from prefect_ito.simulator import builtin_scenario


def feed(desk, **params) -> dict:
    response = desk.http.get("/v0/training-runs/changes", params=params, timeout=90)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_without_a_cursor_the_feed_answers_at_once_with_a_starting_point(desk):
    assert desk.http.get("/v0/capabilities").json()["data"]["change_feed"] is True
    start = feed(desk)
    assert start["changes"] == [] and start["cursor"] >= 0


def test_a_run_that_moved_is_named_with_its_version_and_the_cursor_advances(desk_for):
    desk = desk_for("loss-spike")
    start = feed(desk)
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")

    page = feed(desk, after=start["cursor"])

    (change,) = page["changes"]
    assert change["run_id"] == run["run_id"]
    assert change["version"] >= run["version"] and change["pending_action"] is True
    assert page["cursor"] > start["cursor"]
    assert feed(desk, after=page["cursor"])["changes"] == []  # nothing new: nothing named


async def test_the_feed_long_polls_until_a_run_moves(desk_for):
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    cursor = feed(desk, after=0)["cursor"]
    order: list[str] = []

    async def poll() -> dict:
        async with httpx.AsyncClient(base_url=desk.sim.url, headers=desk.http.headers) as client:
            response = await client.get(
                "/v0/training-runs/changes", params={"after": cursor, "wait": 30}, timeout=60
            )
        order.append("feed answered")
        return response.json()["data"]

    task = asyncio.create_task(poll())
    await asyncio.sleep(0.3)
    order.append("decision sent")
    await asyncio.to_thread(desk.decide, run, "approve")
    page = await task

    assert order == ["decision sent", "feed answered"]
    assert [c["run_id"] for c in page["changes"]] == [run["run_id"]]


def test_another_account_sees_none_of_its_changes(desk_for):
    desk = desk_for("loss-spike")
    desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    other = desk.sim.mint_token("another-account").get_secret_value()
    response = desk.http.get(
        "/v0/training-runs/changes",
        params={"after": 0},
        headers={"Authorization": f"Bearer {other}"},
    )
    assert response.json()["data"]["changes"] == []


async def test_the_client_reads_the_feed_and_a_backend_without_one_is_not_found(
    desk_for, monkeypatch
):
    desk = desk_for("loss-spike")
    monkeypatch.setenv("ITO_COMPUTE_API_URL", desk.sim.url)
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", desk.token)
    async with ItoCredentials(api_url=desk.sim.url).get_client() as client:
        start = await client.list_changes()
        run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
        page = await client.list_changes(after=start.cursor, wait=5)
    assert [change.run_id for change in page.changes] == [run["run_id"]]

    without = desk_for(builtin_scenario("default").model_copy(update={"change_feed": False}))
    monkeypatch.setenv("ITO_COMPUTE_API_URL", without.sim.url)
    monkeypatch.setenv("ITO_COMPUTE_TOKEN", without.token)
    assert without.http.get("/v0/capabilities").json()["data"]["change_feed"] is False
    async with ItoCredentials(api_url=without.sim.url).get_client() as client:
        try:
            await client.list_changes()
        except NotFound:
            pass
        else:
            raise AssertionError("a backend without a change feed answered one")
