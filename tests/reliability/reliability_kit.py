"""The reliability suite's parts, imported by its tests and its ``conftest.py``.

- :class:`Sweep` gathers, over the whole session, every canary token minted, every text a test
  produced (pytest's captured output and logs, exception texts, console output), every request
  log of every simulator and every backend run; ``test_sweep.py`` runs last and checks them all.
- :class:`Backend` is one simulator of one test; :class:`Submit` is the one way to submit and
  :class:`Person` answers the flow's pauses.

A module of its own, not the conftest: a test module that imported ``conftest`` would get the
last conftest pytest loaded, another directory's when several are given on the command line.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prefect import State
from pydantic import SecretStr
from simulator_fixture import FAST
from spend_helpers import covering_authorization

from prefect_ito.backend import desk
from prefect_ito.backend.auth import store_token
from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.operations import resend
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.terminal import RestartPause
from prefect_ito.contract import (
    DecisionChoice,
    DecisionRequest,
    TrainingRequest,
    TrainingRun,
)
from prefect_ito.simulator import (
    Faults,
    RequestLogEntry,
    Scenario,
    SimBooking,
    SimulatorServer,
    builtin_scenario,
)

BOOKING = "bk-h200-2x8-ib"
DEBUG_LOGGERS = ("httpx", "prefect_ito")


# --- the session's sweep ------------------------------------------------------------------------


@dataclass
class Sweep:
    """What the whole session produced, for the checks that run last (``test_sweep.py``)."""

    canaries: set[str] = field(default_factory=set)
    texts: list[tuple[str, str]] = field(default_factory=list)
    requests: list[RequestLogEntry] = field(default_factory=list)
    runs: list[TrainingRun] = field(default_factory=list)
    """Every backend run any simulator of the suite made."""
    of_the_run: bool = False
    """Whether this session ran the run's sweep (``test_sweep.py``)."""

    def __repr__(self) -> str:
        # pytest shows a failed test's arguments, this fixture among them: its canaries would
        # be printed (and counted by the sweep as leaks of the failure's text).
        return (
            f"Sweep({len(self.canaries)} canaries, {len(self.texts)} texts, "
            f"{len(self.requests)} requests, {len(self.runs)} runs)"
        )

    def text(self, where: str, text: str) -> None:
        """Keep a text some test produced, to be searched for canaries."""
        self.texts.append((where, text))


LOGGER = logging.getLogger("tests.reliability")
SWEEP = Sweep()
"""What this session's tests produced, for the sweep."""


# --- simulators --------------------------------------------------------------------------------


def completed_bookings(count: int, prefix: str = "bk-rel") -> list[SimBooking]:
    """Return ``count`` completed bookings, so as many logical submissions can each have one."""
    return [
        SimBooking(booking_id=f"{prefix}-{index:03d}", status="completed") for index in range(count)
    ]


def training_fields(**changes: Any) -> dict[str, Any]:
    """Return the ``training`` parameter of a valid request on :data:`BOOKING`, as fields."""
    return {
        "booking": BOOKING,
        "model_size": "8B",
        "data": ["catalog://ito/web-2026-10"],
        "target": "code-assistant",
        "budget_usd": 250_000.0,
        **changes,
    }


def request_for(booking_id: str, **changes: Any) -> TrainingRequest:
    """Return a valid training request on ``booking_id``."""
    fields: dict[str, Any] = {
        "booking_id": booking_id,
        "model_size": "8B",
        "data_refs": ["catalog://ito/web-2026-10"],
        "target": "code-assistant",
        "budget_usd": 250_000.0,
        **changes,
    }
    return TrainingRequest(**fields)


class Backend:
    """One simulator of one test, its bearer token (a canary), and clients for it."""

    def __init__(self, sim: SimulatorServer, sweep: Sweep) -> None:
        self.sim = sim
        self.url = sim.url
        self.token: SecretStr = sim.mint_token("reliability")
        sweep.canaries.add(self.token.get_secret_value())
        # The standing authorization a person made at this backend, which this suite's
        # submissions name (put on file, so it is neither a request nor a retry of a test).
        AUTHORIZATIONS[self.url] = covering_authorization(sim, "reliability").authorization_id
        # Flows find the token where a login leaves it: the keyring, under the backend's URL.
        store_token(self.url, self.token)

    def client(self, **options: Any) -> ItoClient:
        """Return a client of this backend with the canary token."""
        return ItoClient(self.url, self.token, **options)

    def credentials(self) -> ItoCredentials:
        """Return the credentials block a flow uses for this backend (it holds no token)."""
        return ItoCredentials(api_url=self.url)

    def requests(self) -> list[RequestLogEntry]:
        """Return the simulator's request log."""
        return self.sim.requests()


def scenario_with(
    name: str = "default",
    *,
    faults: Faults | None = None,
    bookings: list[SimBooking] | None = None,
    time_scale: float = FAST,
    **changes: Any,
) -> Scenario:
    """Return a builtin scenario with faults, more bookings, a time scale and other changes."""
    base = builtin_scenario(name)
    update: dict[str, Any] = {"time_scale": time_scale, **changes}
    if faults is not None:
        update["faults"] = faults
    if bookings:
        update["bookings"] = [*base.bookings, *bookings]
    return Scenario.model_validate({**base.model_dump(), **update})


# --- the one way to submit, and the one way to run the flow --------------------------------------


AUTHORIZATIONS: dict[str, str] = {}
"""The standing authorization a person made at each backend of this suite, by its URL."""


class Submit:
    """Submits ``request`` once under ``key`` (and ``client_reference``, as a flow run's own
    submission does), on a fresh quote, under the standing authorization a person made at the
    backend.

    Every submission of this suite goes through here. ``calls`` counts the logical calls it made
    to the backend (a quote, then a submission), for the tests that weigh retries against calls.
    """

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(
        self,
        client: ItoClient,
        request: TrainingRequest,
        key: str,
        client_reference: str | None = None,
    ) -> TrainingRun:
        self.calls += 1
        # No new run is made without a confirmation.
        quote = await desk.quote_training_run(client, request)
        self.calls += 1
        authorization = AUTHORIZATIONS[client.base_url]
        return await desk.submit_training_run(
            client, request, quote.quote_id, authorization, key, client_reference
        )


class Person:
    """Decides each restart of a flow run at the backend, with the tests' own token (a
    person's), as ``prefect-ito decide`` does."""

    def __init__(self, approve: bool, sweep: Sweep) -> None:
        self.approve = approve
        self.sweep = sweep
        self.asked = 0

    async def __call__(self, pause: RestartPause) -> None:
        self.asked += 1
        record = pause.action
        assert record is not None, "a pause without a record: nothing to tie the answer to"
        choice = DecisionChoice.APPROVE if self.approve else DecisionChoice.REJECT
        decision = DecisionRequest(decision=choice, reason="looked at the curve")
        credentials = ItoCredentials(api_url=record.api_url, keyring_entry=record.keyring_entry)
        # A person in a storm tries again, as the flow's own steps do.
        async with credentials.get_client() as client:
            run = await resend(lambda: client.get_training_run(record.run_id), LOGGER)
            await resend(
                lambda: desk.decide_action(client, run, record.action_id, decision), LOGGER
            )


@dataclass
class Training:
    """How one flow run of ``ito-training`` ended, and what it printed."""

    state: State[Any]
    console: str
    person: Person


RunTraining = Callable[..., Awaitable[Training]]
