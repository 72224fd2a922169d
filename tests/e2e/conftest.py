"""One real Prefect server per database, with a process worker, the shipped deployments and a
simulator, shared by every end-to-end test of that database.

SQLite uses the session's server. PostgreSQL gets a server of each module's own, on a fresh
database of the cluster that ``PREFECT_ITO_POSTGRES_URL`` names (``.ci/run`` starts a throwaway
one; see ``run_databases.py``); without it that variant is skipped, unless
``PREFECT_ITO_REQUIRE_POSTGRES=1`` turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
from e2e_stack import (
    ACCOUNT,
    AUTHORIZATION_BLOCK,
    BOOKING_BLOCK,
    CHECKOUT,
    CHECKOUT_STEP,
    CREDENTIALS_BLOCK,
    INSTALLED_YAML,
    ITO_WORKER,
    PLAIN_BOOKING,
    POOL,
    PROCESS_TEMPLATE,
    SHIPPED_YAML,
    STOCK_WORKER,
    WORKLOAD,
    Stack,
    deploy,
    deployment_file,
    e2e_scenario,
    environment,
    postgres_rows,
    sqlite_rows,
    start_watcher,
    start_worker,
)
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.events.clients import PrefectEventsClient
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from processes import stop_worker
from run_databases import new_database
from spend_helpers import covering_authorization

from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.simulator import SimulatorServer

POSTGRES_URL = "PREFECT_ITO_POSTGRES_URL"
REQUIRE_POSTGRES = "PREFECT_ITO_REQUIRE_POSTGRES"
HOW_TO_RUN_POSTGRES = (
    f"PostgreSQL variant skipped: set {POSTGRES_URL}="
    "postgresql+asyncpg://USER:PASS@127.0.0.1:PORT/DB (a throwaway cluster; USER may create "
    "databases), or run .ci/run, "
    "which starts its own PostgreSQL cluster"
)


def _suite(config: pytest.Config) -> ModuleType:
    """Return the suite's root conftest module, whose server helpers these fixtures share."""
    root = Path(__file__).resolve().parents[1] / "conftest.py"
    return next(
        p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", "") == str(root)
    )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def prefect_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Path]]:
    """Yield (database, API URL, a scratch directory) with this process's client pointed there.

    The scratch directory (the worker's and the watcher's logs, the deployed file) is pytest's:
    kept for a look after a failed run, pruned with pytest's other temporary directories.
    """
    suite = _suite(request.config)
    scratch = tmp_path_factory.mktemp(f"e2e-{request.param}")
    if request.param == "sqlite":
        api_url = request.getfixturevalue("prefect_server")
        with _events_to(api_url):
            yield "sqlite", api_url, scratch
        return
    url = os.environ.get(POSTGRES_URL)
    if not url:
        if os.environ.get(REQUIRE_POSTGRES) == "1":
            pytest.fail(f"{REQUIRE_POSTGRES}=1 but {POSTGRES_URL} is not set")
        pytest.skip(HOW_TO_RUN_POSTGRES)
    # A database of this module's own: servers of other workers run beside it on the cluster.
    database_url = new_database(url, "e2e")
    process, api_url = suite.start_prefect_server(
        scratch / "server", {"PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url}
    )
    _POSTGRES_DATABASES[api_url] = database_url
    try:
        with temporary_settings({PREFECT_API_URL: api_url}), _events_to(api_url):
            yield "postgres", api_url, scratch
    finally:
        suite.stop_process(process)


_POSTGRES_DATABASES: dict[str, str] = {}
"""The database of each PostgreSQL server of this session, by its API URL."""


@contextmanager
def _events_to(api_url: str) -> Iterator[None]:
    """Send this process's events to ``api_url``.

    Prefect keeps one events worker per client type, bound to the API URL it first saw; without
    this, events of the PostgreSQL variant would go to the session's SQLite server.
    """
    EventsWorker.set_client_override(PrefectEventsClient, api_url=api_url)
    try:
        yield
    finally:
        EventsWorker.drain_all()
        EventsWorker.set_client_override(None)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, prefect_api: tuple[str, str, Path]) -> Iterator[Stack]:
    """The checkout route: deploy prefect.yaml from this checkout; the worker runs here too."""
    with _running_stack(request.config, prefect_api, SHIPPED_YAML, CHECKOUT) as running:
        yield running


@pytest.fixture(scope="module", params=[STOCK_WORKER, ITO_WORKER])
def installed_stack(
    request: pytest.FixtureRequest, prefect_api: tuple[str, str, Path]
) -> Iterator[Stack]:
    """The installed-package route: deploy prefect-installed.yaml, and run the worker, elsewhere;
    Prefect's process worker, then the prefect-ito worker.

    Elsewhere is a scratch directory outside the checkout. prefect-ito is installed in this
    environment (``uv sync`` installs it editable); nothing points the deployments or the worker
    at the checkout.
    """
    scratch = prefect_api[2] / request.param
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir(parents=True)
    with _running_stack(
        request.config, (*prefect_api[:2], scratch), INSTALLED_YAML, elsewhere, request.param
    ) as running:
        yield running


@pytest.fixture(scope="module", params=[STOCK_WORKER, ITO_WORKER])
def either_worker_stack(
    request: pytest.FixtureRequest, prefect_api: tuple[str, str, Path]
) -> Iterator[Stack]:
    """The checkout route, served by Prefect's process worker, then by the prefect-ito worker."""
    scratch = prefect_api[2] / request.param
    scratch.mkdir()
    with _running_stack(
        request.config, (*prefect_api[:2], scratch), SHIPPED_YAML, CHECKOUT, request.param
    ) as running:
        yield running


@contextmanager
def _running_stack(
    config: pytest.Config,
    prefect_api: tuple[str, str, Path],
    shipped: Path,
    workdir: Path,
    worker_type: str = STOCK_WORKER,
) -> Iterator[Stack]:
    """Start a simulator, save the blocks, deploy ``shipped`` and start a worker of
    ``worker_type``, in ``workdir``.

    The copy of ``shipped`` that is deployed (with test edits) goes to the scratch directory.
    """
    database, api_url, scratch = prefect_api
    suite = _suite(config)
    with SimulatorServer(e2e_scenario()) as simulator:
        token = simulator.mint_token(ACCOUNT, principal=WORKLOAD)  # a workload's token
        _save_blocks(simulator, ACCOUNT)
        _create_work_pool()
        deploy(
            deployment_file(scratch, shipped),
            environment(api_url, scratch / "deployer"),
            scratch / "deploy.log",
            cwd=workdir,
        )
        # The worker's own environment is the only way the token reaches flow runs. Its keyring
        # directory is empty, so nothing else could supply one.
        worker_env = environment(
            api_url,
            scratch / "worker",
            ITO_COMPUTE_API_URL=simulator.url,  # the one origin the token belongs to
            ITO_COMPUTE_TOKEN=token.get_secret_value(),
            XDG_DATA_HOME=str(scratch / "worker-keyring"),
            # Flow runs beat every 30 s (Prefect's least); 65 s of silence counts as lost.
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY="30",
            # The checkout route's one pull step, as its prefect-ito worker allows it (the
            # installed route has none; Prefect's process worker reads no such list).
            PREFECT_INTEGRATIONS_ITO_WORKER_PULL_STEPS=CHECKOUT_STEP,
        )
        worker_log = scratch / "worker.log"
        worker = start_worker(worker_env, worker_log, cwd=workdir, worker_type=worker_type)
        # The watcher is started like a worker, with the token in its own environment too.
        watcher_log = scratch / "watcher.log"
        watcher = start_watcher(worker_env, watcher_log)
        stack = None
        try:
            rows = (
                sqlite_rows(suite._SESSION_HOME / "server" / "prefect.db")
                if database == "sqlite"
                else postgres_rows(_POSTGRES_DATABASES[api_url])
            )
            stack = Stack(
                database, api_url, simulator, token, worker, rows, watcher, worker_env,
                watcher_log, worker_type, worker_log,
            )  # fmt: skip
            yield stack
        finally:
            # A test may replace the worker or the watcher (a lost machine, a restart).
            stop_worker(stack.worker if stack else worker)
            suite.stop_process(stack.watcher if stack and stack.watcher else watcher)


def _save_blocks(simulator: SimulatorServer, account: str) -> None:
    """Save the blocks the shipped prefect.yaml names, as a user does once per workspace.

    The standing authorization the deployments name is a backend object: the tests' person
    creates it at the simulator, for the worker's account, and the block only names it.
    """
    ItoCredentials(api_url=simulator.url).save(CREDENTIALS_BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]
    ItoBooking(
        booking_id=PLAIN_BOOKING, gpu_sku="H200", node_count=2, gpus_per_node=8,
        fabric="InfiniBand", region="eu-north-1",
    ).save(BOOKING_BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]  # fmt: skip
    authorization = covering_authorization(
        simulator, account, max_budget_usd=1e6, booking_id_patterns=["bk-*"]
    )
    authorization.save(AUTHORIZATION_BLOCK, overwrite=True, _sync=True)  # type: ignore[call-arg]


def _create_work_pool() -> None:
    """Create the process work pool the shipped prefect.yaml names, from the shipped template.

    Each end-to-end module starts its own stack, and the SQLite server is the session's: a later
    module finds the pool there already.
    """
    template = json.loads(PROCESS_TEMPLATE.read_text())
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(name=POOL, type="process", base_job_template=template), overwrite=True
        )
