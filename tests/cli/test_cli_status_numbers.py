"""``status`` and ``inbox`` give the forecast and the cost held as numbers, counted when they are
shown; a progress card's numbers come from its metadata, never from its text. Against a real
Prefect server (and the simulator, where the backend is read); ``train`` in a child, ``status``
and ``inbox`` in this process."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_helpers import in_process, one_document, read_flow_run_id, start_train, worker_env
from played_runs import play
from prefect import flow, get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.states import Paused, Running

from prefect_ito.people.notices import Question
from prefect_ito.reporting.report import artifact_key, status_facts
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.waiting.keys import QUESTION_RECORD_PREFIX


@flow
def supervised_elsewhere() -> None:
    """Never run: its flow run's records stand for one a training flow left behind."""


async def flow_run_with_card(metadata: dict[str, str], *, paused_on: str | None = None) -> str:
    """Return a flow run that names no backend and carries a progress card with ``metadata``."""
    async with get_client() as client:
        flow_run = await client.create_flow_run(supervised_elsewhere)
        await client.set_flow_run_state(flow_run.id, Running(), force=True)
        if paused_on is not None:
            await client.set_flow_run_state(flow_run.id, Paused(pause_key=paused_on), force=True)
        card = ArtifactCreate(
            key=artifact_key(metadata.get("run_id", "run_x"), "progress"),
            type="progress",
            data=40.0,
            description="progress",
            flow_run_id=flow_run.id,
            metadata_=metadata,
        )
        await client.create_artifact(card)
    return str(flow_run.id)


def without_backend(prefect_server: str) -> dict[str, str]:
    """The environment of a machine that can ask Prefect but no backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_COMPUTE_")}
    return {**env, "PREFECT_API_URL": prefect_server}


async def test_from_the_card_the_numbers_are_its_metadata_and_the_hold_is_counted_to_now(
    prefect_server,
):
    waiting, _ = play("demo", decide=None)
    facts = status_facts(waiting)
    facts["spend"] = "text that is not a spend"  # the numbers never come from the text
    flow_run_id = await flow_run_with_card(facts)
    env = without_backend(prefect_server)

    shown = one_document(in_process("status", flow_run_id, "--json", env=env))
    backend_run = shown["data"]["backend_run"]

    assert backend_run["source"] == "card"
    assert (backend_run["spend_usd"], backend_run["budget_usd"]) == (11_917.73, 250_000.0)
    found = backend_run["forecast"]
    assert found["spend_usd"] == 11_917.73 and found["budget_usd"] == 250_000.0
    assert found["low_usd"] < found["median_usd"] < found["high_usd"]
    assert found["progress"] == waiting.telemetry.progress and found["at_risk"] is False
    assert found["seconds_left"] > 0
    held = backend_run["held"]
    action = waiting.pending_action
    assert held["since"] == action.held_since.isoformat()
    assert held["usd_per_hour"] == action.hold_usd_per_hour
    # Counted to when status ran, not to when the card was written.
    counted = datetime.fromisoformat(held["as_of"]) - action.held_since
    assert held["seconds"] == pytest.approx(counted.total_seconds(), abs=1)
    assert held["usd"] == pytest.approx(held["seconds"] / 3600 * held["usd_per_hour"], abs=0.05)

    text = in_process("status", flow_run_id, env=env).stdout
    assert "Spend: $11,917.73 of $250,000.00" in text
    assert "Forecast: $27,100–$36,600 at completion of $250,000 budget" in text
    assert "Held: held" not in text
    assert "\nHeld " in text and "($56 an hour while nobody decides), if still held" in text


async def test_an_older_card_shows_its_words_and_null_numbers(prefect_server):
    waiting, _ = play("demo", decide=None)
    words = ("run_id", "state", "stage", "spend", "pending_decision", "forecast", "held")
    older = {key: status_facts(waiting)[key] for key in words}  # before the numbers
    flow_run_id = await flow_run_with_card(older)
    env = without_backend(prefect_server)

    backend_run = one_document(in_process("status", flow_run_id, "--json", env=env))["data"][
        "backend_run"
    ]
    text = in_process("status", flow_run_id, env=env).stdout

    assert (backend_run["spend_usd"], backend_run["forecast"], backend_run["held"]) == (
        None,
        None,
        None,
    )
    assert backend_run["card_text"]["forecast"] == older["forecast"]
    assert f"Spend: {older['spend']}" in text
    said = older["forecast"].removeprefix("forecast: ")  # the label says it once
    assert f"Forecast: {said}" in text and "\nHeld" + older["held"].removeprefix("held") in text


def test_a_run_held_for_a_decision_shows_the_hold_and_the_forecast_from_the_backend(
    prefect_server,
):
    with SimulatorServer(builtin_scenario("demo")) as simulator:
        env = worker_env(simulator, prefect_server)
        train = start_train(env)
        try:
            flow_run_id = read_flow_run_id(train)
            while not simulator.runs() or simulator.runs()[0].run.pending_action is None:
                assert train.poll() is None, "train ended before its decision"
                time.sleep(0.3)
            read = in_process("status", flow_run_id, "--json", env=env)
            text = in_process("status", flow_run_id, env=env).stdout
        finally:
            train.kill()
            train.wait(timeout=30)
        run = simulator.runs()[0].run

    backend_run = one_document(read, env["ITO_COMPUTE_TOKEN"])["data"]["backend_run"]
    assert backend_run["source"] == "backend"
    held: dict[str, Any] = backend_run["held"]
    assert held["since"] == run.pending_action.held_since.isoformat()
    assert held["usd_per_hour"] == run.pending_action.hold_usd_per_hour
    assert isinstance(held["usd"], float) and isinstance(held["seconds"], int)
    found = backend_run["forecast"]
    assert found["budget_usd"] == 250_000 and found["low_usd"] <= found["high_usd"]
    assert isinstance(found["at_risk"], bool) and found["seconds_left"] > 0
    assert "\nHeld " in text and "an hour while nobody decides)" in text
    assert "Held: held" not in text
    assert "if still held" not in text  # the backend says it holds the run now
    assert "Forecast: $" in text and "forecast: " not in text


async def test_inbox_counts_the_cost_held_to_when_it_runs_and_says_as_of_when(prefect_server):
    since = datetime.now(UTC) - timedelta(hours=2)
    record = Question(
        kind="restart", key="restart-act-1", flow_run_id="00000000-0000-4000-8000-000000000000",
        asked="Approve or reject a loss-spike restart", evidence="loss 17.28 at step 12,000",
        asked_at=since, deadline=since + timedelta(days=1), link=None,
        command="prefect-ito decide …", held_since=since, held_usd_per_hour=600.0,
        held="held under 1 min: under $1 of GPU time", held_usd=0.5,  # as it was written
    )  # fmt: skip
    flow_run_id = await flow_run_with_card({"run_id": "run_x"}, paused_on="restart-act-1")
    async with get_client() as client:
        await client.create_flow_run_input(
            flow_run_id,  # type: ignore[arg-type]
            QUESTION_RECORD_PREFIX + "restart-act-1",
            record.model_copy(update={"flow_run_id": flow_run_id}).model_dump_json(),
        )
    env = {**os.environ, "PREFECT_API_URL": prefect_server}

    entries = one_document(in_process("inbox", "--json", env=env))["data"]
    text = in_process("inbox", env=env).stdout

    (entry,) = [entry for entry in entries if entry["flow_run_id"] == flow_run_id]
    assert entry["held_usd_per_hour"] == 600.0
    as_of = datetime.fromisoformat(entry["held_as_of"])
    assert entry["held_seconds"] == pytest.approx((as_of - since).total_seconds(), abs=1)
    assert entry["held_usd"] == pytest.approx(1200, abs=60)  # two hours at $600, not $0.50
    assert entry["held"].startswith("held 2 h 0 min: about $1,200 of GPU time as of ")
    assert "  Held 2 h 0 min: about $1,200 of GPU time as of " in text
    assert "($600 an hour while nobody decides)" in json.dumps(entry)
