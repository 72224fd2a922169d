"""The reliability ledger refuses figures that cannot be counts."""

from __future__ import annotations

import pytest
from ledger import Ledger


@pytest.mark.parametrize(
    "figures",
    [
        {"duplicates": -1},
        {"leaks": -1},
        {"faults": {"503": -2}},
        {"outcomes": {"job succeeded": -1}},
    ],
    ids=["duplicates", "leaks", "a fault", "an outcome"],
)
def test_a_count_below_zero_is_refused_naming_the_test(figures):
    # A storm test once reported "-1 duplicates" for a job that made no run at all.
    with pytest.raises(ValueError, match=r"test_x\.py::test_y counted below zero"):
        Ledger().record("storms", "test_x.py::test_y", trials=1, **figures)


def test_counts_of_zero_and_more_are_kept():
    ledger = Ledger()
    ledger.record("storms", "test_x.py::test_y", trials=2, duplicates=0, outcomes={"ok": 2})
    assert "storms" in ledger.categories
