"""Fixtures: a simulator on a real loopback port per test, and a plain httpx client for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from simulator_fixture import FAST

from prefect_ito.contract import ALL_SCOPES, IDEMPOTENCY_HEADER, TrainingRequest
from prefect_ito.simulator import Scenario, SimulatorServer, builtin_scenario

BOOKING = "bk-h200-2x8-ib"


def submission(**changes: Any) -> dict[str, Any]:
    """Return a valid submission body (digest included), with fields changed."""
    fields: dict[str, Any] = {
        "booking_id": BOOKING,
        "model_size": "8B",
        "data_refs": ["catalog://fineweb-edu"],
        "target": "chat assistant",
        "budget_usd": 250_000.0,
    }
    fields.update(changes)
    return TrainingRequest(**fields).to_submission().model_dump(mode="json")


class Desk:
    """A test's view of one simulator: the server, a token, and an httpx client."""

    body = staticmethod(submission)

    def __init__(self, sim: SimulatorServer) -> None:
        self.sim = sim
        self.token = sim.mint_token().get_secret_value()
        self.http = httpx.Client(
            base_url=sim.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )

    def quote(self, body: dict[str, Any] | None = None) -> httpx.Response:
        """POST a request for a training quote."""
        return self.http.post("/v0/training-quotes", json=body or submission())

    def person(self, account: str = "sim-user", principal: str = "user:ada") -> httpx.Client:
        """Return an httpx client with a person's token of ``account``: every scope."""
        token = self.sim.mint_token(
            account, scopes=[scope.value for scope in ALL_SCOPES], principal=principal
        ).get_secret_value()
        return httpx.Client(
            base_url=self.sim.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def confirm_quote(self, quote_id: str, principal: str = "user:ada") -> httpx.Response:
        """Confirm ``quote_id`` at the backend as the person ``principal``."""
        with self.person(principal=principal) as person:
            return person.post(
                f"/v0/training-quotes/{quote_id}/confirmations",
                json={},
                headers={IDEMPOTENCY_HEADER: f"confirm-{quote_id}-{principal}"},
            )

    def confirmed(self, body: dict[str, Any], principal: str = "user:ada") -> dict[str, Any]:
        """Return ``body`` naming a fresh quote for it, which a person confirmed at the backend.

        When the backend gives no quote (a booking it cannot train, say), ``body`` is returned
        as it is: its submission then meets the same refusal.
        """
        quoted = self.quote(body)
        if quoted.status_code != 201:
            return body
        quote_id = quoted.json()["data"]["quote_id"]
        assert self.confirm_quote(quote_id, principal).status_code == 200
        return {**body, "quote_id": quote_id}

    def submit(
        self, body: dict[str, Any] | None = None, key: str = "key-1", *, confirm: bool = True
    ) -> httpx.Response:
        """POST a submission with an idempotency key, on a quote a person confirmed if
        ``confirm``."""
        body = body or submission()
        if confirm and body.get("quote_id") is None:
            body = self.confirmed(body)
        return self.http.post("/v0/training-runs", json=body, headers={IDEMPOTENCY_HEADER: key})

    def start(self, body: dict[str, Any] | None = None, key: str = "key-1") -> dict[str, Any]:
        """Submit and return the new run."""
        response = self.submit(body, key)
        assert response.status_code == 201, response.text
        run: dict[str, Any] = response.json()["data"]["run"]
        return run

    def run(self, run_id: str, **params: Any) -> dict[str, Any]:
        """GET a run (optionally long-polling) and return it."""
        response = self.http.get(f"/v0/training-runs/{run_id}", params=params)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data

    def wait_for(
        self, run: dict[str, Any], done: Callable[[dict[str, Any]], bool], polls: int = 40
    ) -> dict[str, Any]:
        """Long-poll (1 s at most each) until ``done(run)``; fail after ``polls`` reads."""
        for _ in range(polls):
            if done(run):
                return run
            run = self.run(run["run_id"], after_version=run["version"], wait=1)
        raise AssertionError(f"run never got there: {run['state']} v{run['version']}")

    def finished(self, run: dict[str, Any]) -> dict[str, Any]:
        """Wait until the run leaves accepted/running."""
        return self.wait_for(run, lambda r: r["state"] not in ("accepted", "running"))

    def decide(self, run: dict[str, Any], decision: str, **headers: str) -> httpx.Response:
        """Answer the run's pending action."""
        action = run["pending_action"]["action_id"]
        return self.http.post(
            f"/v0/training-runs/{run['run_id']}/actions/{action}/decision",
            json={"decision": decision, "decided_by": "Ada", "reason": "looked at the curve"},
            headers=headers,
        )


@pytest.fixture
def desk_for() -> Iterator[Callable[..., Desk]]:
    """Start simulators on demand (``desk_for("stall")`` or a Scenario); stop them all after."""
    started: list[tuple[SimulatorServer, Desk]] = []

    def start(scenario: str | Scenario = "default", **options: Any) -> Desk:
        chosen = builtin_scenario(scenario) if isinstance(scenario, str) else scenario
        options.setdefault("time_scale", FAST)
        sim = SimulatorServer(chosen, **options)
        sim.start()
        desk = Desk(sim)
        started.append((sim, desk))
        return desk

    yield start
    for sim, desk in started:
        desk.http.close()
        sim.stop()


@pytest.fixture
def desk(desk_for: Callable[..., Desk]) -> Desk:
    """A simulator with the default scenario."""
    return desk_for()
