"""A quote as a person reads it opens on the cost: the estimate, the ceiling and the term come
before the manifest and the plan (the Resume dialog shows the first ~290 px of it)."""

from __future__ import annotations

from typing import Any

import pytest

from prefect_ito.contract import CostRange, TrainingRequest
from prefect_ito.reporting import quote_card
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.engine import Engine


def quote_and_request(**cost: float) -> tuple[Any, Any]:
    engine = Engine(builtin_scenario("default"))
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["catalog://ito/web"],
        target="chat", budget_usd=250_000.0,
    ).to_submission()  # fmt: skip
    quote = engine.quote("acct", request)
    if cost:
        plan = quote.plan.model_copy(update={"cost_usd": CostRange(**cost)})
        quote = quote.model_copy(update={"plan": plan})
    return quote, request


def test_the_form_opens_on_the_estimate_the_ceiling_and_the_term():
    quote, request = quote_and_request(low=23_400.0, high=34_100.0)

    shown = quote_card.describe(quote, request)

    opening = shown[: shown.index("| estimate |")]  # what shows before any table
    assert "$23k–$34k estimated" in opening
    assert "$250,000 at most" in opening
    assert "The booking's term ends" in opening and "This quote expires" in opening
    assert shown.index("| cost |") < shown.index("model size") < shown.index("backend's plan")


@pytest.mark.parametrize(
    ("amount", "said"),
    [(950.0, "$950"), (9_999.0, "$9,999"), (23_400.0, "$23k"), (1_240_000.0, "$1.2M")],
)
def test_amounts_are_said_as_a_person_says_them(amount, said):
    assert quote_card.short_usd(amount) == said


def test_an_estimate_without_a_range_is_one_amount_and_the_question_names_it():
    quote, _ = quote_and_request(low=30_000.0, high=30_200.0)

    assert quote_card.estimate(quote) == "$30k"
    assert quote_card.spend_question(quote) == "confirm the spend of $30k on booking bk-h200-2x8-ib"


def test_the_opening_says_what_the_booking_costs_while_the_question_waits():
    quote, request = quote_and_request(low=23_400.0, high=34_100.0)
    quote = quote.model_copy(update={"booking_usd_per_hour": 604.8})

    shown = quote_card.describe(quote, request)

    opening = shown[: shown.index("| estimate |")]
    assert "While this question waits, the booking costs $605 an hour." in opening
    without = quote_card.describe(quote.model_copy(update={"booking_usd_per_hour": None}), request)
    assert "an hour" not in without
