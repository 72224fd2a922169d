"""Simulators of one process share their routes, never their state.

Every simulator answers through one FastAPI app built once per process (``shared_routes``), told
apart by the state each request carries: tokens, runs, faults and request logs stay each its own.
"""

from __future__ import annotations

import httpx
from simulator_fixture import with_faults

from prefect_ito.simulator.app import shared_routes


def test_two_simulators_at_once_keep_their_tokens_runs_faults_and_logs_apart(desk_for):
    first = desk_for()
    second = desk_for(with_faults(unavailable_rate=1.0))

    started = first.start(key="only-in-first")
    foreign = httpx.get(
        f"{second.sim.url}/v0/capabilities",
        headers={"Authorization": f"Bearer {first.token}"},
    )

    assert first.http.get("/v0/capabilities").status_code == 200
    assert second.http.get("/v0/capabilities").json()["error"]["code"] == "BACKEND_UNAVAILABLE"
    assert foreign.status_code in (401, 503)  # either way, the first one's token is not known
    assert [run.run_id for run in first.sim.runs()] == [started["run_id"]]
    assert second.sim.runs() == []
    assert "/v0/training-runs" in {entry.path for entry in first.sim.requests()}
    assert "/v0/training-runs" not in {entry.path for entry in second.sim.requests()}


def test_a_token_minted_at_one_simulator_is_unknown_at_another(desk_for):
    first, second = desk_for(), desk_for()

    foreign = httpx.get(
        f"{second.sim.url}/v0/capabilities",
        headers={"Authorization": f"Bearer {first.token}"},
    )

    assert foreign.status_code == 401
    assert foreign.json()["error"]["code"] == "UNAUTHENTICATED"


def test_every_simulator_of_the_process_answers_through_one_app(desk_for):
    routes = shared_routes()

    desk_for().http.get("/v0/capabilities")
    desk_for().http.get("/v0/capabilities")

    assert shared_routes() is routes
