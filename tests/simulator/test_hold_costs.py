"""The simulator says what a wait for a person costs: the booking's rate, and when a hold began."""

from __future__ import annotations

from datetime import UTC, datetime


def test_a_quote_says_what_the_booking_costs_an_hour(desk):
    quote = desk.quote().json()["data"]

    # The default booking: 2 nodes × 8 H200 at the scenario's $3.50 per GPU-hour.
    assert quote["booking_usd_per_hour"] == 56.0


def test_a_held_run_says_since_when_and_at_what_rate(desk_for):
    desk = desk_for("loss-spike")
    before = datetime.now(UTC)

    run = desk.wait_for(desk.start(), lambda r: r["state"] == "awaiting_decision")

    action = run["pending_action"]
    assert action["hold_usd_per_hour"] == 56.0
    # Real time: the scaled clock would date the hold days after the submission.
    held_since = datetime.fromisoformat(action["held_since"])
    assert before <= held_since <= datetime.now(UTC)
