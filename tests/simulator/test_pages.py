"""Run listings and event logs come in pages: cursor and limit in, ``next`` out."""

from __future__ import annotations

import pytest

from prefect_ito.simulator.builtins import SECOND_COMPLETED_BOOKING


def _pages(desk, path, params, key):
    """Read every page of a listing, following ``next``; return the items and the pages."""
    items, pages = [], []
    page = desk.http.get(path, params=params).json()["data"]
    while True:
        pages.append(page)
        items += page[key]
        if page["next"] is None:
            return items, pages
        following = {k: v for k, v in params.items() if k != "after"} | {"cursor": page["next"]}
        page = desk.http.get(path, params=following).json()["data"]


def test_runs_are_listed_in_pages_oldest_first(desk):
    started = [desk.finished(desk.start(key=f"k-{n}"))["run_id"] for n in range(3)]
    desk.finished(desk.start(desk.body(booking_id=SECOND_COMPLETED_BOOKING), key="other"))

    runs, pages = _pages(
        desk, "/v0/training-runs", {"booking_id": "bk-h200-2x8-ib", "limit": 2}, "runs"
    )

    assert [run["run_id"] for run in runs] == started  # the filter holds on every page
    assert [len(page["runs"]) for page in pages] == [2, 1]
    assert pages[-1]["next"] is None


def test_one_page_holds_everything_when_it_fits(desk):
    desk.start()

    page = desk.http.get("/v0/training-runs").json()["data"]

    assert len(page["runs"]) == 1 and page["next"] is None


def test_events_are_read_in_pages_and_last_seq_says_where_to_read_on(desk):
    run = desk.finished(desk.start())
    path = f"/v0/training-runs/{run['run_id']}/events"
    whole = desk.http.get(path, params={"limit": 500}).json()["data"]

    events, pages = _pages(desk, path, {"after": 2, "limit": 4}, "events")

    assert len(whole["events"]) > 10 and whole["next"] is None
    assert [e["seq"] for e in events] == [e["seq"] for e in whole["events"]][2:]
    assert all(len(page["events"]) == 4 for page in pages[:-1])
    assert [page["last_seq"] for page in pages[:2]] == [6, 10]
    assert pages[-1]["last_seq"] == whole["last_seq"] == len(whole["events"])
    later = desk.http.get(path, params={"after": whole["last_seq"]}).json()["data"]
    assert (later["events"], later["last_seq"], later["next"]) == ([], whole["last_seq"], None)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v0/training-runs", {"cursor": "run_not_a_real_one"}),
        ("/v0/training-runs", {"limit": 0}),
        ("/v0/training-runs", {"limit": 501}),
        ("EVENTS", {"cursor": "not-a-cursor"}),
        ("EVENTS", {"cursor": "3", "after": 2}),
        ("EVENTS", {"limit": 0}),
    ],
)
def test_a_bad_cursor_or_limit_is_a_validation_error(desk, path, params):
    run = desk.start()
    if path == "EVENTS":
        path = f"/v0/training-runs/{run['run_id']}/events"

    response = desk.http.get(path, params=params)

    assert response.status_code == 422
    assert response.json()["error"]["field"] in {"cursor", "limit"}
