"""The simulator's side of forward compatibility: runs say whether they ended."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefect_ito.simulator import Scenario, builtin_scenario


def test_a_run_says_whether_it_has_ended(desk):
    run = desk.start()

    assert run["terminal"] is False
    assert desk.finished(run)["terminal"] is True


def test_a_scenario_must_spell_a_booking_status_right():
    # The contract's enums are open for answers from a backend, not for the simulator's own files.
    data = builtin_scenario("default").model_dump(mode="json")
    data["bookings"][0]["status"] = "complete"

    with pytest.raises(ValidationError, match="unknown booking status"):
        Scenario.model_validate(data)


def test_the_simulator_speaks_contract_v0_5(desk):
    capabilities = desk.http.get("/v0/capabilities").json()["data"]

    assert capabilities["schema_version"] == "ito.training.v0.5"
    assert capabilities["spend_confirmation"] is True
