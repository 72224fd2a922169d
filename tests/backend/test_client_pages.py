"""The client follows ``next`` through every page of runs and events, with the filters kept."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from ito_fakes import NOW, Script, mock_client, ok, sample_run

from prefect_ito import exceptions as exc


def event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "run_id": "run-1", "type": "checkpoint_saved", "at": NOW.isoformat(),
            "message": f"event {seq}"}  # fmt: skip


def runs_page(*run_ids: str, next: str | None) -> httpx.Response:
    runs = [sample_run(run_id).model_dump(mode="json") for run_id in run_ids]
    return ok({"runs": runs, "next": next})


async def test_listing_a_booking_s_runs_follows_every_page() -> None:
    script = Script(runs_page("run-1", "run-2", next="c-2"), runs_page("run-3", next=None))
    async with mock_client(script) as client:
        runs = await client.list_active_runs("bk-1")

    assert [run.run_id for run in runs] == ["run-1", "run-2", "run-3"]
    first, second = (dict(r.url.params) for r in script.requests)
    assert first == {"booking_id": "bk-1", "active": "true"}
    assert second == {"booking_id": "bk-1", "active": "true", "cursor": "c-2"}


async def test_listing_every_run_of_a_booking_follows_every_page() -> None:
    # What `prefect-ito runs show --booking` reads: finished runs too, so no `active` filter.
    script = Script(runs_page("run-1", next="c-2"), runs_page("run-2", "run-3", next=None))
    async with mock_client(script) as client:
        runs = await client.list_runs(booking_id="bk-1")

    assert [run.run_id for run in runs] == ["run-1", "run-2", "run-3"]
    first, second = (dict(r.url.params) for r in script.requests)
    assert first == {"booking_id": "bk-1"}
    assert second == {"booking_id": "bk-1", "cursor": "c-2"}
    assert {r.method for r in script.requests} == {"GET"}


async def test_reading_events_follows_every_page_and_keeps_the_last_seq() -> None:
    script = Script(
        ok({"events": [event(4), event(5)], "last_seq": 5, "next": "5"}),
        ok({"events": [event(6)], "last_seq": 6, "next": None}),
    )
    async with mock_client(script) as client:
        page = await client.list_events("run-1", after=3)

    assert [e.seq for e in page.events] == [4, 5, 6]
    assert (page.last_seq, page.next) == (6, None)
    first, second = (dict(r.url.params) for r in script.requests)
    assert first == {"after": "3"}
    assert second == {"cursor": "5"}  # the cursor carries the position, not `after`


async def test_a_v0_backend_without_next_is_one_page() -> None:
    script = Script(ok({"events": [event(1)], "last_seq": 1}))
    async with mock_client(script) as client:
        page = await client.list_events("run-1")

    assert [e.seq for e in page.events] == [1] and len(script.requests) == 1


async def test_a_backend_that_repeats_a_cursor_is_a_protocol_error() -> None:
    script = Script(runs_page("run-1", next="same"), runs_page("run-2", next="same"))
    async with mock_client(script) as client:
        with pytest.raises(exc.ItoProtocolError) as caught:
            await client.list_active_runs("bk-1")

    assert caught.value.field == "data.next"
    assert len(script.requests) == 2
