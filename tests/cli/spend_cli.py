"""Shared pieces of the tests of the spend commands (`confirm`, `authorizations`): a person at a
simulator, the environment of a command that asks no Prefect, and a one-line error."""

from __future__ import annotations

import os
import subprocess

from pydantic import SecretStr

from prefect_ito.backend.client import ItoClient
from prefect_ito.contract import ALL_SCOPES, TrainingRequest
from prefect_ito.exceptions import ExitCode
from prefect_ito.simulator import SimulatorServer
from prefect_ito.simulator.builtins import COMPLETED_BOOKING

NOWHERE = "http://127.0.0.1:9/api"  # nothing listens on the discard port
PERSON = "user:ada"
REQUEST = TrainingRequest(
    booking_id=COMPLETED_BOOKING,
    model_size="8B",
    data_refs=["catalog://ito/web-2026-10"],
    target="code-assistant",
    budget_usd=250_000,
)


def person(simulator: SimulatorServer) -> str:
    """A person's token: every scope, the spend scopes included."""
    scopes = [scope.value for scope in ALL_SCOPES]
    return simulator.mint_token("cli", scopes=scopes, principal=PERSON).get_secret_value()


def client(simulator: SimulatorServer) -> ItoClient:
    """A client of the simulator with :func:`person`'s token, which never retries."""
    return ItoClient(simulator.url, SecretStr(person(simulator)), max_retries=0)


def env_for(simulator: SimulatorServer, token: str, columns: int = 200) -> dict[str, str]:
    """The environment of a command run with ``token``, ``PREFECT_API_URL`` where nothing
    listens (none of these commands asks Prefect), and a terminal ``columns`` wide."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ITO_COMPUTE_")}
    env.update(
        ITO_COMPUTE_API_URL=simulator.url,
        ITO_COMPUTE_TOKEN=token,
        PREFECT_API_URL=NOWHERE,
        PREFECT_INTEGRATIONS_ITO_MAX_RETRIES="0",
        COLUMNS=str(columns),
    )
    return env


def one_line_error(result: subprocess.CompletedProcess, code: ExitCode) -> str:
    """Check the command failed with ``code`` and one ``error:`` line, and return that line."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == code, output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]
