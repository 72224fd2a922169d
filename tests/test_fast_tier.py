"""``--fast`` keeps the tests that start no Prefect server and no process, and holds them to it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
MODULE = "tests/cli/test_cli_json.py"


def test_in_the_fast_tier_starting_a_process_fails_naming_the_mark(pytestconfig):
    started = [sys.executable, "-c", "pass"]
    if pytestconfig.getoption("fast"):
        with pytest.raises(RuntimeError, match=r"@pytest\.mark\.slow"):
            subprocess.run(started, check=False)
    else:  # the whole suite starts processes as it needs
        assert subprocess.run(started, check=False).returncode == 0


@pytest.mark.slow
def test_the_fast_tier_leaves_out_the_server_s_tests_the_marked_ones_and_the_end_to_end_ones():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--fast", "--collect-only", "-q", "-n", "0",
         "-p", "no:cacheprovider", MODULE, "tests/e2e/test_deferred.py", "tests/test_fast_tier.py"],
        cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    names = {
        line.split("::")[1].split("[")[0] for line in collected.stdout.splitlines() if "::" in line
    }

    assert "test_bad_input_is_one_error_document_naming_the_field_and_nothing_is_sent" in names
    assert "test_in_the_fast_tier_starting_a_process_fails_naming_the_mark" in names
    # Asks for the session's Prefect server:
    assert "test_train_with_the_same_idempotency_key_twice_makes_one_backend_run" not in names
    # Marked slow, here and in the CLI's module:
    assert (
        "test_the_fast_tier_leaves_out_the_server_s_tests_the_marked_ones_and_the_end_to_end_ones"
        not in names
    )
    assert "test_login_whoami_logout_answer_in_json" not in names
    # End to end:
    assert not any("deferred" in name for name in names), names


@pytest.mark.slow
def test_the_fast_tier_s_order_is_shuffled_by_a_seed_that_repeats_it():
    # A test that passed only after another one (for the block type it had registered) passed in
    # the suite's fixed order for good; the fast tier's order changes from run to run instead.
    def collected(seed: int) -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--fast", "--collect-only", "-q", "-n", "0",
             "-p", "no:cacheprovider", f"--order-seed={seed}", MODULE, "tests/test_fast_tier.py",
             "tests/simulator/test_long_poll.py"],
            cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return [line for line in result.stdout.splitlines() if "::" in line]

    first, again, other = collected(7), collected(7), collected(8)

    assert first == again and len(first) > 20
    assert other != first and sorted(other) == sorted(first)
    modules = [line.split("::")[0] for line in first]
    assert len(set(modules)) == 3
    assert [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m] == list(
        dict.fromkeys(modules)
    )  # each module's tests together
