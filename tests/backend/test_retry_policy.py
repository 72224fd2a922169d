"""Table tests of the pure retry policy, with a pinned clock and random source."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from prefect_ito.backend._retry import (
    BACKOFF_CAP_SECONDS,
    MAX_RETRY_AFTER_SECONDS,
    RetryBudget,
    backoff,
    parse_retry_after,
    should_retry,
)


@pytest.mark.parametrize(
    ("method", "idempotent", "status", "attempt", "retry_after", "expected"),
    [
        ("GET", False, 503, 0, None, True),
        ("GET", False, 429, 0, 1.0, True),
        ("GET", False, None, 0, None, True),  # transport error
        ("GET", False, 503, 3, None, False),  # out of retries
        ("POST", True, 503, 0, None, True),  # keyed POST
        ("POST", True, None, 2, None, True),
        ("POST", False, 503, 0, None, False),  # keyless POST: never
        ("POST", False, None, 0, None, False),
        ("GET", False, 409, 0, None, False),  # conflicts are final
        ("POST", True, 409, 0, None, False),
        ("GET", False, 401, 0, None, False),  # revoked or unauthenticated: stop at once
        ("GET", False, 500, 0, None, False),
        ("GET", False, 404, 0, None, False),
        ("GET", False, 200, 0, None, False),
        ("GET", False, 429, 0, MAX_RETRY_AFTER_SECONDS + 1, False),  # too long to wait out
        ("get", False, 503, 0, None, True),
    ],
)
def test_should_retry(
    method: str,
    idempotent: bool,
    status: int | None,
    attempt: int,
    retry_after: float | None,
    expected: bool,
) -> None:
    decision = should_retry(
        method=method,
        idempotent=idempotent,
        status_code=status,
        attempt=attempt,
        max_retries=3,
        retry_after=retry_after,
    )
    assert decision is expected


NOW = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("3", 3.0),
        (" 2.5 ", 2.5),
        ("0", 0.0),
        ("-4", 0.0),
        ("soon", None),
        ("", None),
        ("nan", None),
        ("inf", None),
        ("Mon, 02 Mar 2026 12:00:07 GMT", 7.0),
        ("Mon, 02 Mar 2026 11:59:00 GMT", 0.0),  # in the past
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=NOW) == expected


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (0, 0.0, 0.5),
        (1, 0.0, 1.0),
        (2, 0.0, 2.0),
        (3, 0.0, 4.0),
        (4, 0.0, 8.0),
        (10, 0.0, BACKOFF_CAP_SECONDS),
        (0, 1.0, 0.375),  # the most jitter takes a quarter off
        (4, 0.5, 7.0),
    ],
)
def test_backoff_is_exponential_capped_and_jittered(
    attempt: int, rand: float, expected: float
) -> None:
    assert backoff(attempt, rng=lambda: rand) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [(0.0, 0.0), (3.0, 3.0), (MAX_RETRY_AFTER_SECONDS * 2, MAX_RETRY_AFTER_SECONDS)],
)
def test_backoff_honours_retry_after_within_bound(retry_after: float, expected: float) -> None:
    assert backoff(5, retry_after=retry_after, rng=lambda: 0.9) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retry_budget_spends_then_refills_with_time() -> None:
    clock = Clock()
    budget = RetryBudget(capacity=2, refill_per_second=0.5, clock=clock)

    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    clock.now += 1.0  # half a token back: still not enough
    assert budget.try_spend() is False
    clock.now += 1.0
    assert budget.try_spend() is True
    clock.now += 1000.0  # refill stops at capacity
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]


def test_retry_budget_gives_back_half_a_retry_per_answer_up_to_its_capacity() -> None:
    # Before, one caller working through a storm step after step spent the budget in seconds
    # and then gave up on a backend that answered most of its calls.
    clock = Clock()
    budget = RetryBudget(capacity=2, refill_per_second=0.0, per_answer=0.5, clock=clock)

    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    budget.note_answer()
    assert budget.try_spend() is False  # half a retry: not enough
    budget.note_answer()
    assert budget.try_spend() is True
    for _ in range(10):
        budget.note_answer()
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize(
    ("method", "idempotent", "code", "expected"),
    [
        ("POST", True, "IDEMPOTENCY_KEY_IN_FLIGHT", True),  # the one transient conflict
        ("POST", True, "IDEMPOTENCY_KEY_REUSED", False),
        ("POST", True, "DECISION_CONFLICT", False),
        ("POST", True, None, False),
        ("POST", False, "IDEMPOTENCY_KEY_IN_FLIGHT", False),  # keyless: cannot be in flight
    ],
)
def test_only_a_key_in_flight_makes_a_409_worth_retrying(
    method: str, idempotent: bool, code: str | None, expected: bool
) -> None:
    decided = should_retry(
        method=method,
        idempotent=idempotent,
        status_code=409,
        attempt=0,
        max_retries=3,
        retry_after=1.0,
        error_code=code,
    )
    assert decided is expected
