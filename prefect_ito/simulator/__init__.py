"""The reference Itô desk simulator: the whole contract v0 over real HTTP, for tests and demos.

It simulates the control plane only: it runs no trainer, loads no model, and is never a fallback
for a real backend. It binds to loopback by default. See ``docs/simulator.md``.

Example:
    >>> from prefect_ito.simulator import SimulatorServer, builtin_scenario
    >>> with SimulatorServer(builtin_scenario("loss-spike")) as sim:
    ...     token = sim.mint_token()
"""

from __future__ import annotations

from prefect_ito.simulator.admin import AdminRun
from prefect_ito.simulator.app import SimulatorApp, create_app
from prefect_ito.simulator.builtins import BUILTIN_NAMES, builtin_scenario
from prefect_ito.simulator.scenario import (
    Faults,
    RunScript,
    Scenario,
    SimBooking,
    load_scenario,
)
from prefect_ito.simulator.server import SimulatorServer
from prefect_ito.simulator.state import RequestLogEntry

__all__ = [
    "BUILTIN_NAMES",
    "AdminRun",
    "Faults",
    "RequestLogEntry",
    "RunScript",
    "Scenario",
    "SimBooking",
    "SimulatorApp",
    "SimulatorServer",
    "builtin_scenario",
    "create_app",
    "load_scenario",
]
