"""Retry policy: pure functions and the client's defaults, in one place.

The client retries seconds-scale transient faults only: transport errors, 429 (honouring
``Retry-After`` up to a bound), 503, and the one transient 409, ``IDEMPOTENCY_KEY_IN_FLIGHT``
(an earlier request with the same key is still being processed; it is resent after
``Retry-After`` with the same key, never a new one). It retries a request only when repeating it
is safe: a GET, or a POST that carries an idempotency key. Every other 409 is final
(``IDEMPOTENCY_KEY_REUSED``, ``DECISION_CONFLICT``…) and 401 stops at once.

A :class:`RetryBudget` caps how hard a failing backend is hit. There is **one budget per process
and backend**: :func:`retry_budget_for` hands every client of the same backend URL (without a
budget of its own) the same budget. A per-client budget would bound nothing, because the flows
make a fresh client for every task call; the shared one means that a backend that keeps failing
sees a short burst of retries from this process and then only a trickle, however many calls,
tasks and threads are at work.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

# --- defaults -------------------------------------------------------------------------------------

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
"""Per-request timeouts: 5 s to connect, 30 s for each read, write and pool wait."""
DEFAULT_MAX_RETRIES = 3
"""Retries after the first attempt of one logical call."""
LONG_POLL_MARGIN_SECONDS = 10.0
"""Added to a long-poll's ``wait`` to get its read timeout, so a slow answer is not cut off."""
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 8.0
BACKOFF_JITTER = 0.25
"""Up to this fraction is taken off each delay at random, so clients do not retry in step."""
MAX_RETRY_AFTER_SECONDS = 60.0
"""A longer ``Retry-After`` is not waited out: the call fails with ``RateLimited`` instead."""
RETRY_BUDGET_CAPACITY = 10.0
"""Retries this process may make to one backend in a burst."""
RETRY_BUDGET_REFILL_PER_SECOND = 0.5
"""Retries the budget regains per second once spent."""
RETRY_BUDGET_PER_ANSWER = 0.5
"""Retries the budget regains for each answer the backend gave (any answer that ends a call):
retries stay at most about half the calls answered, plus the refill, so that one caller working
through a storm in turn keeps its retries, while many at once still run the budget dry."""
RETRYABLE_STATUS = frozenset({429, 503})
IN_FLIGHT_CODE = "IDEMPOTENCY_KEY_IN_FLIGHT"
"""The error code of the one 409 worth retrying: the same key is still being processed."""


def should_retry(
    *,
    method: str,
    idempotent: bool,
    status_code: int | None,
    attempt: int,
    max_retries: int,
    retry_after: float | None = None,
    error_code: str | None = None,
) -> bool:
    """Decide whether a failed attempt may be repeated.

    Args:
        method: The HTTP method.
        idempotent: Whether the request carries an idempotency key.
        status_code: The answer's status, or None after a transport error.
        attempt: How many retries were already made (0 after the first attempt).
        max_retries: The most retries allowed.
        retry_after: The answer's ``Retry-After`` in seconds, if any.
        error_code: The error envelope's ``error.code``, for a 409.

    Returns:
        True if the request may be sent again.
    """
    if attempt >= max_retries:
        return False
    if method.upper() != "GET" and not idempotent:
        return False
    if status_code is None:
        return True
    if retry_after is not None and retry_after > MAX_RETRY_AFTER_SECONDS:
        return False
    return status_code in RETRYABLE_STATUS or (status_code == 409 and error_code == IN_FLIGHT_CODE)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Parse a ``Retry-After`` header: delay seconds or an HTTP date.

    Args:
        value: The header's value, or None when absent.
        now: The current time, for an HTTP date (defaults to the system clock).

    Returns:
        Seconds to wait (never negative), or None when absent or unreadable.
    """
    if value is None:
        return None
    text = value.strip()
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        seconds = _seconds_until(text, now)
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _seconds_until(http_date: str, now: datetime | None) -> float | None:
    try:
        when = parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - (now or datetime.now(UTC))).total_seconds()


def backoff(
    attempt: int,
    *,
    retry_after: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Return how long to wait before retry number ``attempt + 1``.

    Args:
        attempt: How many retries were already made.
        retry_after: The backend's ``Retry-After`` in seconds; honoured when given (up to
            :data:`MAX_RETRY_AFTER_SECONDS`).
        rng: A source of floats in [0, 1), for the jitter.

    Returns:
        Seconds to sleep: exponential from :data:`BACKOFF_BASE_SECONDS`, capped at
        :data:`BACKOFF_CAP_SECONDS`, with up to :data:`BACKOFF_JITTER` taken off at random.
    """
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_AFTER_SECONDS)
    delay = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2.0**attempt)
    return delay * (1.0 - BACKOFF_JITTER * rng())


class RetryBudget:
    """A token bucket of retries: each retry spends one; tokens come back over time, and with
    each call the backend answered (:meth:`note_answer`).

    Time alone is not enough: one command calling step after step through a storm (30 % 503s)
    spent the bucket in seconds and then gave up on a backend that was answering most calls.
    A refund per answer bounds retries by the calls that got through, as a retry ratio does.

    Thread-safe: the budget for a backend is shared by every client of it in the process (see
    :func:`retry_budget_for`), and Prefect may run those clients' calls on several threads.

    Args:
        capacity: The most retries in a burst.
        refill_per_second: Retries regained per second.
        per_answer: Retries regained per call answered.
        clock: A monotonic clock in seconds.
    """

    def __init__(
        self,
        capacity: float = RETRY_BUDGET_CAPACITY,
        refill_per_second: float = RETRY_BUDGET_REFILL_PER_SECOND,
        *,
        per_answer: float = RETRY_BUDGET_PER_ANSWER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._capacity = capacity
        self._refill = refill_per_second
        self._per_answer = per_answer
        self._clock = clock
        self._tokens = capacity
        self._updated = clock()
        self._lock = threading.Lock()

    def try_spend(self) -> bool:
        """Take one retry from the budget.

        Returns:
            True if a retry was available (and is now spent), False if the budget is empty.
        """
        with self._lock:
            self._catch_up()
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def note_answer(self) -> None:
        """Give back part of a retry for a call the backend answered (see the class)."""
        with self._lock:
            self._catch_up()
            self._tokens = min(self._capacity, self._tokens + self._per_answer)

    def _catch_up(self) -> None:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._refill)
        self._updated = now


_budgets: dict[str, RetryBudget] = {}
_budgets_lock = threading.Lock()


def retry_budget_for(base_url: str) -> RetryBudget:
    """Return this process's retry budget for a backend, made on first use.

    Args:
        base_url: The backend's root URL. Spellings of one URL (a trailing slash, the case of
            the scheme and host) share one budget.

    Returns:
        The budget every client of this backend draws on unless it was given its own.
    """
    key = _backend_key(base_url)
    with _budgets_lock:
        budget = _budgets.get(key)
        if budget is None:
            budget = _budgets[key] = RetryBudget()
        return budget


def _backend_key(base_url: str) -> str:
    text = base_url.strip().rstrip("/")
    try:
        return str(httpx.URL(text))
    except httpx.InvalidURL:
        return text
