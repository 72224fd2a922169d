"""A canary leaked on purpose, for ``test_sweep_across_workers.py`` only.

Its name keeps pytest from collecting it with the suite; that test names it on the command line
of a run of its own.
"""

from __future__ import annotations

from reliability_kit import Sweep

from prefect_ito.simulator import SimulatorServer, builtin_scenario


def test_a_canary_leaks_into_the_captured_output(sweep: Sweep) -> None:
    with SimulatorServer(builtin_scenario("default")) as simulator:
        token = simulator.mint_token("probe").get_secret_value()
        sweep.canaries.add(token)
        # The leak: pytest captures it for the sweep (this run's output never shows it).
        print(f"leaked {token}")
