"""``prefect-ito demo``: the real training flow, end to end, on the built-in reference simulator.

The demo starts the simulator on a free loopback port, mints a demo token that never leaves this
process (it lives in an in-memory keyring, never in the environment a child process inherits),
and runs the real ``ito-training`` flow in Prefect's ephemeral mode. At a terminal, a person
confirms the spend and decides the restart. Without one, the demo confirms the spend under a
standing authorization it makes in memory for its own simulator booking and budget (the simulator
spends nothing), and a scripted demo operator decides the restart at the backend as the demo's
person, exactly as a person's own login would — refusing to answer for any backend but the demo's
own simulator. Real runs always wait for a person, or an authorization a person created.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import keyring
from prefect import State
from rich.console import Console
from rich.markdown import Markdown

from prefect_ito.backend.auth import store_token
from prefect_ito.backend.memory_keyring import MemoryKeyring
from prefect_ito.backend.origins import ENV_ALLOWED_ORIGINS, ENV_API_URL, ENV_TOKEN
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.cli import terminal
from prefect_ito.cli.restart_answers import decide_here, stated_run
from prefect_ito.contract import (
    ALL_SCOPES,
    DecisionChoice,
    DecisionRequest,
    NewSpendLimits,
    SpendAuthorizationRequest,
)
from prefect_ito.exceptions import InvalidParameters
from prefect_ito.flows import ito_training
from prefect_ito.parameters import TrainingParameters
from prefect_ito.simulator import SimulatorServer, builtin_scenario
from prefect_ito.simulator.builtins import BUILTIN_NAMES

BACKEND_VARIABLES = (ENV_TOKEN, ENV_API_URL, ENV_ALLOWED_ORIGINS)
"""The shell's Itô backend settings, which the demo leaves unused."""

DEMO_BOOKING = "bk-h200-2x8-ib"
DEMO_PERSON = "user:demo"
"""Who the demo's token speaks for: the person trying the demo."""
DEMO_TRAINING = TrainingParameters(
    booking=DEMO_BOOKING,
    model_size="8B",
    data=["s3://acme-corpus/web-2026-10/", "catalog://ito/code-mix-v3"],
    target="code-assistant",
    budget_usd=250_000.0,
    post_training="rlvr",
    approval_timeout=600,
)


class ScriptedOperator:
    """The demo's stand-in for a person; it answers only for the demo's own simulator."""

    def __init__(self, simulator_url: str, console: Console) -> None:
        self._simulator_url = simulator_url
        self._console = console

    async def __call__(self, pause: terminal.RestartPause) -> None:
        record = pause.action
        if record is None or record.api_url != self._simulator_url:
            self._console.print("[red]The demo operator acts only on the demo's own simulator.[/]")
            return
        run = await stated_run(record)
        if run is None or run.pending_action is None:
            return  # decided meanwhile, or gone: nothing to do
        self._console.print(Markdown(terminal.without_images(pause.description)))
        self._console.print(
            f"[bold]No terminal: the scripted demo operator approves at the backend as the "
            f"demo's person ({DEMO_PERSON}), with the demo's own login. Real runs wait for a "
            "person's decision.[/]"
        )
        decision = DecisionRequest(
            decision=DecisionChoice.APPROVE,
            reason="scripted approval in the demo; real runs wait for a person",
        )
        await decide_here(record, run, decision, self._console)


async def demo_authorization(api_url: str) -> ItoSpendAuthorization:
    """Create, as the demo's person, the standing authorization the demo runs under without a
    terminal, at its own simulator, and return the block that names it.

    It covers one run on the demo's one booking and data, up to the demo's budget, for an hour.
    """
    request = SpendAuthorizationRequest(
        name="prefect-ito demo",
        limits=NewSpendLimits(
            max_budget_usd=DEMO_TRAINING.budget_usd,
            booking_id_patterns=[DEMO_BOOKING],
            data_ref_patterns=list(DEMO_TRAINING.data),
            max_runs=1,
        ),
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )
    async with ItoCredentials(api_url=api_url).get_client() as client:
        created = await client.create_spend_authorization(
            request, idempotency_key=f"demo-{uuid.uuid4()}"
        )
    return ItoSpendAuthorization(authorization_id=created.authorization_id)


def run_demo(
    scenario: str = "demo", *, interactive: bool | None = None, verbose: bool = False
) -> State[Any]:
    """Run the demo and return its flow run's final state; ``verbose`` shows Prefect's task lines.

    Raises:
        InvalidParameters: ``scenario`` names no built-in scenario.
    """
    if scenario not in BUILTIN_NAMES:
        raise InvalidParameters(
            f"scenario: no built-in scenario {scenario!r}; known: {', '.join(BUILTIN_NAMES)}",
            field="scenario",
        )
    console = Console()
    person = terminal.interactive() if interactive is None else interactive
    if _forget_shell_backend():
        console.print(
            "The demo talks only to its own simulator: it leaves the Itô backend settings of "
            "your shell (ITO_COMPUTE_*) unused, and sends their token nowhere.",
            soft_wrap=True,
        )
    with SimulatorServer(builtin_scenario(scenario)) as simulator:
        console.print(f"Reference desk simulator on {simulator.url} (scenario [bold]{scenario}[/])")
        keyring.set_keyring(MemoryKeyring())
        # The demo's person: a token of theirs may confirm a spend and authorize one, at the
        # demo's own simulator only (a workload token never could).
        store_token(
            simulator.url,
            simulator.mint_token("demo", scopes=ALL_SCOPES, principal=DEMO_PERSON),
        )
        authorization = None if person else asyncio.run(demo_authorization(simulator.url))
        with terminal.prefect_api():
            operator = (
                terminal.ask_at_terminal if person else ScriptedOperator(simulator.url, console)
            )
            parameters = {
                "training": DEMO_TRAINING,
                "credentials": ItoCredentials(api_url=simulator.url),
                "authorization": _announced(authorization, console) if authorization else None,
            }
            confirmer = terminal.confirm_at_terminal if person else None
            return asyncio.run(
                terminal.run_training(
                    ito_training,
                    parameters,
                    operator,
                    console,
                    confirmer=confirmer,
                    verbose=verbose,
                )
            )


def _forget_shell_backend() -> bool:
    """Drop the shell's backend settings from this process; tell whether there were any.

    The demo's token is for its own simulator, and the shell's token is for a real backend: one
    must never reach the other, nor any child process this demo starts (its Prefect server).
    """
    found = [name for name in BACKEND_VARIABLES if os.environ.pop(name, None) is not None]
    return bool(found)


def _announced(authorization: ItoSpendAuthorization, console: Console) -> ItoSpendAuthorization:
    console.print(
        "[bold]No terminal: the demo's person created a standing authorization at the "
        f"simulator ({authorization.authorization_id}: one run on booking {DEMO_BOOKING}, up to "
        f"${DEMO_TRAINING.budget_usd:,.0f}, for an hour; the simulator spends nothing). Real "
        "runs wait for a person's confirmation at the backend, or an authorization a person "
        "created there.[/]"
    )
    return authorization
