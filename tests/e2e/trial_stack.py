"""The crash trials' stack: a Prefect server of its own, a worker, two watchers, a simulator.

Its own server, so that a trial can restart it on the same port. Its database is a fresh one on
the suite's PostgreSQL cluster when ``PREFECT_ITO_POSTGRES_URL`` names one (as under ``.ci/run``:
two dozen flow runs at once are what PostgreSQL is for), else SQLite in a scratch directory.
Every process it starts is stopped by its own PID. See ``crash_trials.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from e2e_stack import (
    AUTHORIZATION_BLOCK,
    CREDENTIALS_BLOCK,
    POOL,
    PROCESS_TEMPLATE,
    SHIPPED_YAML,
    deploy,
    deployment_file,
    environment,
    start_worker,
)
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_homes import server_home
from processes import kill, stop_process, stop_worker, wait_until_serving
from pydantic import SecretStr
from run_databases import new_database

from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import NewSpendLimits, SpendAuthorization, SpendAuthorizationRequest
from prefect_ito.simulator import AdminRun, RequestLogEntry

POSTGRES_URL = "PREFECT_ITO_POSTGRES_URL"
ACCOUNT = "trials"
"""The backend account of the worker's token, and of the standing authorization."""
PERSON = "user:ada"
"""The person who made the standing authorization, as the backend knows them."""
WORKLOAD = "service:trials-worker"
"""The principal of the worker's token: a workload's."""
HEARTBEAT_SECONDS = "30"
"""Prefect's heartbeats every 30 s (its least), as the shipped files set them."""
WATCH = ["watch", "--wait", "2"]
"""The watchers' options: no ``--lost-after``, so a run is found lost as shipped (three of its
process's 10 s alive beats missed, plus slack); short long-polls keep the trials' pace."""


class Simulator(Protocol):
    """What the trials need of a simulator: a thread in this process, or a child process."""

    @property
    def url(self) -> str: ...

    def mint_token(self, account: str = ..., *, principal: str | None = ...) -> SecretStr: ...

    def runs(self) -> list[AdminRun]: ...

    def requests(self) -> list[RequestLogEntry]: ...

    def add_spend_authorization(
        self, authorization: SpendAuthorizationRequest, *, account: str, principal: str
    ) -> SpendAuthorization: ...


@dataclass
class TrialStack:
    """A Prefect server of its own, a worker, two watchers and a simulator; see the docstring."""

    scratch: Path
    simulator: Simulator
    port: int
    env: dict[str, str] = field(default_factory=dict)
    server: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    watchers: list[subprocess.Popen[bytes] | None] = field(default_factory=lambda: [None, None])
    database: dict[str, str] = field(default_factory=dict)
    """The server's database settings; empty for SQLite in its home."""
    workers_started: int = 0
    worker_started_at: float = 0.0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start_server(self) -> None:
        """Start ``prefect server start`` on this stack's port and home; wait until it answers."""
        home = self.scratch / "server"
        server_home(home, self.database)  # a restart finds its own database there
        env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **self.database,
        }
        command = ["server", "start", "--host", "127.0.0.1", "--port", str(self.port), "--no-ui"]
        with (home / "server.log").open("ab") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "prefect", *command],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait_until_serving(self.server, self.api_url):
            return
        raise RuntimeError(f"prefect server did not start: see {home / 'server.log'}")

    def restart_server(self) -> None:
        """Stop the Prefect server (as an operator does) and start it again on the same port."""
        stop_process(self.server, timeout=30)  # an operator's restart: it may take a while
        self.start_server()

    def start_worker(self) -> None:
        self.workers_started += 1
        self.worker = start_worker(self.env, self.worker_log)
        self.worker_started_at = time.time()

    @property
    def worker_log(self) -> Path:
        return self.scratch / f"worker-{self.workers_started}.log"

    def check_worker(self) -> None:
        """Raise if the worker exited: the trials need one throughout."""
        if self.worker is not None and self.worker.poll() is not None:
            tail = self.worker_log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the worker exited ({self.worker.returncode}): {tail}")

    def lose_machine(self) -> None:
        """SIGKILL the worker and every process under it at once, then start another worker."""
        assert self.worker is not None
        stop_worker(self.worker)
        self.start_worker()

    def start_watcher(self, index: int) -> None:
        with (self.scratch / f"watcher-{index}.log").open("ab") as out:
            self.watchers[index] = subprocess.Popen(
                [sys.executable, "-m", "prefect_ito.cli", *WATCH],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill_watcher(self, index: int) -> bool:
        """SIGKILL one watcher; tell whether it was running."""
        watcher = self.watchers[index]
        if watcher is None or watcher.poll() is not None:
            return False
        kill(watcher.pid)
        watcher.wait(timeout=30)
        return True

    def log_text(self, pattern: str) -> str:
        return "".join(path.read_text(errors="replace") for path in self.scratch.glob(pattern))

    def close(self) -> None:
        """Stop everything this stack started, each by its own PID."""
        stop_worker(self.worker)
        for process in [*self.watchers, self.server]:
            stop_process(process)


@contextmanager
def trial_stack(simulator: Simulator, scratch: Path | None = None) -> Iterator[TrialStack]:
    """Start a stack for ``simulator``, deploy the shipped deployments; point this process at it."""
    scratch = scratch or Path(tempfile.mkdtemp(prefix="prefect-ito-trials-"))
    stack = TrialStack(scratch, simulator, free_port(), database=_database())
    try:
        stack.start_server()
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            _prepare(stack)
            yield stack
    finally:
        stack.close()


def save_blocks_and_pool(stack: TrialStack, account: str, name: str) -> None:
    """Save the blocks the shipped deployment files name, and create their process pool from the
    shipped template.

    The shipped deployments name a standing authorization, which a person (``user:ada``) made
    at the backend for ``account``, the worker's: a trial's spend is covered.
    """
    ItoCredentials(api_url=stack.simulator.url).save(CREDENTIALS_BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]
    authorization = stack.simulator.add_spend_authorization(
        SpendAuthorizationRequest(
            name=name,
            limits=NewSpendLimits(
                max_budget_usd=1e7, booking_id_patterns=["bk-*"], data_ref_patterns=["*"]
            ),
            expires_at=datetime.now(UTC) + timedelta(days=1),
        ),
        account=account,
        principal=PERSON,
    )
    block = ItoSpendAuthorization(authorization_id=authorization.authorization_id)
    block.save(AUTHORIZATION_BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]
    template = json.loads(PROCESS_TEMPLATE.read_text())
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(name=POOL, type="process", base_job_template=template), overwrite=True
        )


def _prepare(stack: TrialStack) -> None:
    """Save the credentials block, create the pool, deploy, start a worker and two watchers."""
    save_blocks_and_pool(stack, ACCOUNT, "crash trials")
    deployer = environment(stack.api_url, stack.scratch / "deployer")
    deploy(deployment_file(stack.scratch, SHIPPED_YAML), deployer, stack.scratch / "deploy.log")
    token = stack.simulator.mint_token(ACCOUNT, principal=WORKLOAD)  # a workload's token
    # The token reaches flow runs and watchers through their own environment, nothing else.
    stack.env = environment(
        stack.api_url,
        stack.scratch / "worker",
        ITO_COMPUTE_API_URL=stack.simulator.url,  # the one origin the token belongs to
        ITO_COMPUTE_TOKEN=token.get_secret_value(),
        XDG_DATA_HOME=str(stack.scratch / "worker-keyring"),
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY=HEARTBEAT_SECONDS,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        # Long-polls return at a change whatever their wait; waits of a few seconds keep two
        # cores from answering idle polls of two dozen flow runs every second.
        PREFECT_INTEGRATIONS_ITO_POLL_WAIT_SECONDS="5",
        PREFECT_INTEGRATIONS_ITO_STATE_POLL_SECONDS="5",
    )
    # The worker starts once the trials' flow runs exist (TrialStack.start_worker).
    for index in range(len(stack.watchers)):
        stack.start_watcher(index)


def _database() -> dict[str, str]:
    """Return a fresh PostgreSQL database's settings on the suite's cluster, if it has one."""
    url = os.environ.get(POSTGRES_URL)
    if not url:
        return {}
    return {"PREFECT_SERVER_DATABASE_CONNECTION_URL": new_database(url, "trials")}


# --- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
