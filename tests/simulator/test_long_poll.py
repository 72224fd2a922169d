"""Long-poll: answers as soon as the version moves, and holds for ``wait`` when nothing does."""

from __future__ import annotations

import asyncio

import httpx


async def _poll(desk, run, wait, order, label):
    async with httpx.AsyncClient(base_url=desk.sim.url, headers=desk.http.headers) as client:
        response = await client.get(
            f"/v0/training-runs/{run['run_id']}",
            params={"after_version": run["version"], "wait": wait},
            timeout=wait + 30,
        )
    order.append(label)
    return response.json()["data"]


async def test_long_poll_answers_after_a_change_well_before_wait(desk_for):
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    order: list[str] = []

    poll = asyncio.create_task(_poll(desk, run, 60, order, "poll answered"))
    await asyncio.sleep(0.2)  # let the poll reach the server and start holding
    order.append("decision sent")
    await asyncio.to_thread(desk.decide, run, "approve")
    changed = await poll

    assert order == ["decision sent", "poll answered"]
    assert changed["version"] > run["version"]
    assert changed["state"] == "running"


async def test_long_poll_holds_for_wait_when_nothing_changes(desk_for):
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    order: list[str] = []

    poll = asyncio.create_task(_poll(desk, run, 1, order, "poll answered"))
    await asyncio.sleep(0.2)
    quick = await asyncio.to_thread(desk.run, run["run_id"])
    order.append("plain read answered")
    unchanged = await poll

    assert order == ["plain read answered", "poll answered"]
    assert unchanged["version"] == run["version"] == quick["version"]
    assert unchanged["state"] == "awaiting_decision"


def test_wait_above_the_cap_is_accepted(desk):
    run = desk.finished(desk.start())

    again = desk.run(run["run_id"], after_version=run["version"] - 1, wait=3600)

    assert again["version"] == run["version"]


def test_version_only_grows_and_heartbeat_is_not_a_change(desk):
    run = desk.start()
    versions = [run["version"]]
    while run["state"] not in ("succeeded",):
        run = desk.run(run["run_id"], after_version=run["version"], wait=1)
        versions.append(run["version"])

    assert versions == sorted(set(versions))


async def test_the_request_log_says_when_a_held_poll_arrived_as_well_as_when_it_was_answered(
    desk_for,
):
    # The log is in the order answers were done: a poll held for ``wait`` comes after a read that
    # arrived later. Read as arrival order, it made a concurrent poll look like a resend sent
    # within a second of a 429 (the storm test's measure of Retry-After failed on it).
    desk = desk_for("loss-spike")
    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")
    path = f"/v0/training-runs/{run['run_id']}"

    poll = asyncio.create_task(_poll(desk, run, 1, [], "poll answered"))
    await asyncio.sleep(0.2)
    await asyncio.to_thread(desk.run, run["run_id"])
    await poll

    held, plain = [entry for entry in desk.sim.requests() if entry.path == path][-2:][::-1]
    assert held.time > plain.time  # answered last, so logged last
    assert held.received < plain.received < plain.time
    assert (held.time - held.received).total_seconds() >= 0.9
