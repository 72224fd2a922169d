"""The sweep's own material never shows a canary, not even where pytest prints it."""

from __future__ import annotations

from reliability_kit import Sweep
from sweeping import TOKEN_SHAPE

from prefect_ito.simulator import SimulatorServer, builtin_scenario


def test_the_sweep_shows_no_canary_in_a_failed_test_report():
    # A failed test's report shows its arguments with repr(), the sweep fixture among them.
    with SimulatorServer(builtin_scenario("default")) as simulator:
        sweep = Sweep()
        sweep.canaries.add(simulator.mint_token("repr").get_secret_value())
        sweep.text("somewhere", "a text")

    shown = repr(sweep)

    assert not TOKEN_SHAPE.search(shown)
    assert shown == "Sweep(1 canaries, 1 texts, 0 requests, 0 runs)"
