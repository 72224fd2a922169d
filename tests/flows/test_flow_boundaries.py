"""What the flow must never do, checked against what really happened.

The demo's flow runs in this process; afterwards no ML framework is in ``sys.modules``, every
request the simulator saw is a contract v0 endpoint (nothing books, buys or overrides a gate; the
one quote prices training on the booking already held),
and every Prefect event the flow sent can be read back through the API.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from flow_helpers import Person, backend_events, prefect_events
from rich.console import Console
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.demo import DEMO_TRAINING
from prefect_ito.cli.terminal import run_training
from prefect_ito.flows import ito_training

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {"torch", "transformers", "accelerate", "deepspeed", "jax", "vllm", "trl", "lightning"}
FORBIDDEN = re.compile(
    r"book(?!ings/[^/]+/training-eligibility)|reserv|purchas|(?<!training-)quote|release|overrid"
)


def contract_routes() -> list[tuple[str, re.Pattern[str]]]:
    document = json.loads((ROOT / "docs/contract/ito-training-v0.openapi.json").read_text())
    routes = []
    for path, operations in document["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
        routes += [(method.upper(), pattern) for method in operations]
    return routes


async def test_the_demo_flow_stays_within_its_boundaries(start_simulator):
    simulator = start_simulator("demo")
    params = {
        "training": DEMO_TRAINING,
        "credentials": ItoCredentials(api_url=simulator.url),
        "authorization": covering_authorization(simulator),
    }
    state = await run_training(
        ito_training, params, Person(approve=True), Console(quiet=True), poll=0.3
    )
    assert state.is_completed(), state.message

    assert not {name.split(".")[0] for name in sys.modules} & FRAMEWORKS

    routes = contract_routes()
    requests = simulator.requests()
    assert requests
    for entry in requests:
        assert any(m == entry.method and p.match(entry.path) for m, p in routes), entry
        assert not FORBIDDEN.search(entry.path), entry
    posts = [(entry.method, re.sub(r"run_\w+|act_\w+", "*", entry.path)) for entry in requests
             if entry.method == "POST"]  # fmt: skip
    assert posts == [
        ("POST", "/v0/training-quotes"),  # a price for training on the booking held; buys nothing
        ("POST", "/v0/training-runs"),
        ("POST", "/v0/training-runs/*/actions/*/decision"),
    ]

    run = simulator.runs()[0].run
    expected = await backend_events(simulator, run.run_id)
    events = await prefect_events(run.run_id, lambda events: len(events) >= len(expected))
    seen = {event["id"]: event["event"] for event in events}
    assert seen == expected
