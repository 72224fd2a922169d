"""The pages' throttle on wrong codes and passphrases, on a pinned clock."""

from __future__ import annotations

import pytest

from prefect_ito.simulator.person_session import PageRefusal, WrongAttempts

KEYS = ["session:s", "client:127.0.0.1", "account:ada"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refused(attempts: WrongAttempts, keys: list[str]) -> PageRefusal:
    with pytest.raises(PageRefusal) as refused:
        attempts.check(keys)
    return refused.value


def test_the_limit_th_wrong_attempt_refuses_the_next_until_the_first_leaves_the_window():
    clock = Clock()
    attempts = WrongAttempts(limit=3, window=60, clock=clock)
    for step in (0, 10, 20):
        clock.now = 1000 + step
        attempts.check(KEYS)
        attempts.wrong(KEYS)

    refusal = _refused(attempts, KEYS)
    clock.now = 1059.5
    later = _refused(attempts, KEYS)
    clock.now = 1060
    attempts.check(KEYS)  # the first wrong attempt has left the window

    assert (refusal.status_code, refusal.headers) == (429, {"Retry-After": "40"})
    assert later.headers == {"Retry-After": "1"}  # rounded up: never "0"


def test_any_one_key_past_the_limit_refuses():
    # A new session, same client: the client's count still holds.
    clock = Clock()
    attempts = WrongAttempts(limit=2, window=60, clock=clock)
    attempts.wrong(KEYS)
    attempts.wrong(["session:other", "client:127.0.0.1", "account:ana"])

    refusal = _refused(attempts, ["session:new", "client:127.0.0.1", "account:bob"])
    attempts.check(["session:new", "client:10.0.0.2", "account:bob"])

    assert refusal.status_code == 429
