"""Scenario files (JSON and YAML), built-in names, and the CLI's scenario resolution."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from prefect_ito.cli.simulator import resolve_scenario
from prefect_ito.contract import BookingStatus
from prefect_ito.simulator import BUILTIN_NAMES, builtin_scenario, load_scenario
from prefect_ito.simulator.scenario import SimBooking

REQUIRED = {
    "default",
    "demo",
    "gate-failure",
    "refused",
    "ladder-rejection",
    "budget-exhausted",
    "stall",
    "loss-spike",
    "two-spikes",
    "interruptions",
}


def test_builtin_scenarios_cover_every_outcome():
    assert set(BUILTIN_NAMES) >= REQUIRED
    for name in BUILTIN_NAMES:
        assert builtin_scenario(name).name == name


def test_default_bookings_hold_one_of_each_status():
    bookings = builtin_scenario("default").bookings

    assert {b.status for b in bookings} == set(BookingStatus)
    completed = next(b for b in bookings if b.booking_id == "bk-h200-2x8-ib")
    assert (completed.gpu_sku, completed.node_count, completed.gpus_per_node) == ("H200", 2, 8)
    assert completed.fabric == "InfiniBand"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_scenario_files_round_trip(tmp_path, suffix):
    scenario = builtin_scenario("two-spikes")
    data = scenario.model_dump(mode="json")
    path = tmp_path / f"scenario{suffix}"
    path.write_text(json.dumps(data) if suffix == ".json" else yaml.safe_dump(data))

    assert load_scenario(path) == scenario
    assert resolve_scenario(str(path)) == scenario


def test_a_typo_in_a_scenario_file_is_an_error(tmp_path):
    data = builtin_scenario("default").model_dump(mode="json")
    data["run"]["loss_spikez"] = []
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))

    with pytest.raises(ValidationError):
        load_scenario(path)


def test_unknown_builtin_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="gate-failure"):
        builtin_scenario("nope")


def test_cli_resolves_builtin_names_and_defaults():
    assert resolve_scenario(None).name == "default"
    assert resolve_scenario("stall").name == "stall"


def test_added_bookings_are_listed(desk):
    desk.sim.add_booking(SimBooking(booking_id="bk-new", status=BookingStatus.COMPLETED))

    listed = {b.booking_id: b.status for b in desk.sim.bookings()}
    eligibility = desk.http.get("/v0/bookings/bk-new/training-eligibility").json()["data"]

    assert listed["bk-new"] is BookingStatus.COMPLETED
    assert eligibility["eligible"] is True
