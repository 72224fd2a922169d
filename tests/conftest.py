"""Session-wide isolation: every test runs against throwaway Prefect and keyring state.

Prefect reads its settings once, at import, so the environment is set here before any test module
imports it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from pathlib import Path

# One run of the suite may be several sessions: pytest-xdist's workers (see ``addopts``) inherit
# the run's id from the process that started them, which makes a new one. Run-wide things are
# keyed by it: a directory the workers share, and the PostgreSQL databases of the run.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["PREFECT_ITO_TEST_RUN"] = uuid.uuid4().hex[:12]
RUN = os.environ["PREFECT_ITO_TEST_RUN"]
RUN_DIRECTORY = Path(tempfile.gettempdir()) / f"prefect-ito-run-{RUN}"
RUN_DIRECTORY.mkdir(exist_ok=True)
if "PYTEST_XDIST_WORKER" not in os.environ:
    # Gone with the process that made it, however the run ends: pytest stops at a usage error
    # before any hook that would remove it (``pytest_unconfigure`` does, sooner, in a whole run).
    atexit.register(shutil.rmtree, RUN_DIRECTORY, True)
os.environ["PREFECT_ITO_TEST_RUN_DIRECTORY"] = str(RUN_DIRECTORY)
# Where the run's migrated Prefect database is kept (see ``prefect_homes.py``); a run of the suite
# that a test starts (test_sweep_across_workers.py) copies the same one.
os.environ.setdefault("PREFECT_ITO_TEST_MIGRATED_HOME", str(RUN_DIRECTORY / "migrated-home"))

# Prefect's own API authentication is on for every server the run starts, as the shipped recipes
# turn it on: each server takes the run's string, and every client (this process, the CLI, workers,
# watchers and flow processes the tests start) sends it. A test that means to go without it says
# so by leaving it out of its child's environment.
if "PYTEST_XDIST_WORKER" not in os.environ:
    _API_AUTH = f"prefect-ito-tests:{uuid.uuid4().hex}"
    os.environ["PREFECT_SERVER_API_AUTH_STRING"] = _API_AUTH
    os.environ["PREFECT_API_AUTH_STRING"] = _API_AUTH

# Each session's Prefect home and keyring, in the run's directory: it goes when the run ends.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="session-", dir=RUN_DIRECTORY))
(_SESSION_HOME / "prefect").mkdir()
(_SESSION_HOME / "xdg-data").mkdir()

os.environ.update(
    {
        "PREFECT_HOME": str(_SESSION_HOME / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        # With registration off, a server still imports every installed collection at start to
        # decide whether to register (prefect-kubernetes among them): 1-1.5 s of CPU a server.
        "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
        # A file keyring in a temporary directory: never the developer's own keyring.
        "XDG_DATA_HOME": str(_SESSION_HOME / "xdg-data"),
        "PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring",
        "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING": "true",
        "PREFECT_INTEGRATIONS_ITO_POLL_WAIT_SECONDS": "1",
        "PREFECT_INTEGRATIONS_ITO_STATE_POLL_SECONDS": "1",
        # A flow run ends once Prefect holds its events (prefect_ito.reporting.event_relay); the
        # suite's servers write the events they receive every half second, not every five.
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "0.5",
        # Two workers, each with servers of its own, share two cores: a busy server answers 503
        # for a while, and Prefect's client waits longer for it than its default five tries.
        "PREFECT_CLIENT_MAX_RETRIES": "10",
    }
)
# The suite starts hundreds of Python processes (pytest-xdist's workers, the CLI, prefect server,
# workers, flow runs). Where the environment says PYTHONDONTWRITEBYTECODE, each would compile from
# source all it imports that no install compiled: uv compiles nothing unless asked, and Prefect's
# modules alone take 8 s of CPU to compile for a server here. The run's processes write bytecode as
# Python does by default instead, beside the sources (`__pycache__/`, ignored by git); set here,
# in the process that starts the workers, so that they too compile each module once.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
for _name in (
    "ITO_COMPUTE_TOKEN",
    "ITO_COMPUTE_API_URL",
    "ITO_COMPUTE_ALLOWED_ORIGINS",
    "PREFECT_API_URL",
    "PREFECT_API_KEY",
):
    os.environ.pop(_name, None)

import inspect  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import trial_counts  # noqa: E402
from ledger import Ledger, Provenance, read_figures, render, write_figures  # noqa: E402
from prefect_homes import server_home  # noqa: E402
from processes import stop_process, wait_until_serving  # noqa: E402


def free_port() -> int:
    """Return a loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prefect_server(
    home: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``prefect server start`` on a free loopback port; return it and its API URL.

    Unless ``env`` names a database of its own, the server's SQLite database starts migrated.
    """
    server_home(home, env or {})
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    # `--port` does not reach the UI's settings, which would otherwise send the browser to :4200.
    # The shipped Automations build their links from the server's PREFECT_UI_URL.
    server_env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_UI_API_URL": api_url,
        "PREFECT_UI_URL": api_url.removesuffix("/api"),
    }
    server_env.update(env or {})
    log = (home / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=server_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if wait_until_serving(process, api_url):
        return process, api_url
    if process.poll() is not None:
        raise RuntimeError(f"prefect server exited: see {home / 'server.log'}")
    stop_process(process)
    raise RuntimeError(f"prefect server did not answer within 120 s: see {home / 'server.log'}")


@pytest.fixture(autouse=True)
def _fresh_retry_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test with unspent retry budgets.

    A process shares one budget per backend on purpose; tests that meet the same URL (a mock
    backend, a session simulator) must not spend each other's.
    """
    from prefect_ito.backend import _retry

    monkeypatch.setattr(_retry, "_budgets", {})


@pytest.fixture(autouse=True)
def _keyring_left_as_found() -> Iterator[None]:
    """Leave the session's keyring file as this test found it.

    Tokens are kept by origin, and a later test's server may get the same loopback port: a token
    one test left under its simulator's origin was sent by a later test meant to have none
    (``train`` answered UNAUTHENTICATED where it should have said NOT_LOGGED_IN).
    """
    from keyrings.alt.file import PlaintextKeyring

    path = Path(PlaintextKeyring().file_path)  # where this session's CLI children look too
    before = path.read_bytes() if path.exists() else None
    yield
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(before)


@pytest.fixture(scope="session")
def prefect_server(pytestconfig: pytest.Config) -> Iterator[str]:
    """One real Prefect server (SQLite) for the whole session; yields its API URL.

    Prefect's client in this process is pointed at it; child processes get ``PREFECT_API_URL``
    from the tests that start them. Once the session's tests are done, and before the server
    stops, ``pytest_ito_server_closing`` lets plugins read what it holds.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    process, api_url = start_prefect_server(_SESSION_HOME / "server")
    try:
        with temporary_settings({PREFECT_API_URL: api_url}):
            yield api_url
            drain_prefect_workers()
            pytestconfig.hook.pytest_ito_server_closing(api_url=api_url)
    finally:
        stop_process(process)


class _Hooks:
    @staticmethod
    def pytest_ito_server_closing(api_url: str) -> None:
        """The session's Prefect server at ``api_url`` is about to stop: its session is done."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(_Hooks)


def drain_prefect_workers() -> None:
    """Send the logs and events still queued in this process before their server goes away."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for pending in (APILogWorker.instance().drain(), EventsWorker.drain_all()):
            if inspect.isawaitable(pending):
                await pending

    run_coro_as_sync(drain())


# --- the reliability ledger ----------------------------------------------------------------------
# Any test may record figures (the reliability suite, the crash trials of the end-to-end tests);
# ``--reliability-report PATH`` renders them (see ``ledger.py``).

LEDGER = Ledger()
"""Every figure this session's tests recorded."""
_STARTED = (time.monotonic(), os.getloadavg()[0])
"""When this plumbing was loaded (as its session started), and how busy the machine was."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="Run only the fast tier: the tests that start no Prefect server and no process (the "
        "quick loop after each change); a test of it that starts a process fails.",
    )
    parser.addoption(
        "--order-seed",
        type=int,
        default=None,
        metavar="N",
        help="Shuffle the fast tier's order with this seed (by default a new one each run, shown "
        "in the header): the same seed gives the same order.",
    )
    parser.addoption(
        "--reliability-report",
        metavar="PATH",
        default=None,
        help="Write the reliability figures of this run to PATH (Markdown), and beside it as "
        "JSON (PATH with the suffix .json); categories not measured keep their earlier figures.",
    )


SLOW_FIRST = (
    "test_deployments.py",
    "test_notifications.py",
    "test_crashes.py",
    "test_storms.py",
    "test_browser_approval.py",
    "test_lost_machine_defaults.py",
    "test_watcher.py",
    "test_worker_routes.py",
    "test_installed_package.py",
    "test_watcher_spend.py",
    "test_readme_quick_start.py",
    "test_deferred.py",
    "test_spend_attempts.py",
    "test_lost_answers.py",
    "test_deployment_files.py",
)
"""The longest modules, longest first: the workers take whole modules in the order of the
collection (``addopts``), and long ones started late would leave one worker running alone."""
LAST = "test_sweep.py"
"""The sweep checks what every other test of the run left behind."""


SPAWNING = frozenset({"cli", "e2e"})
"""Directories whose modules mostly start processes and keep a core busy; the others' mostly wait
on a Prefect server. Spread among the others, so that the two workers seldom wait at once: run as
a block, the waiting ones left both cores about half idle for the last six minutes of a run."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("fast"):
        _keep_the_fast_tier(config, items)
        _shuffle(items, order_seed(config))
        return
    order = {path: rank for rank, path in enumerate(_module_order(list(dict.fromkeys(
        item.path for item in items
    ))))}  # fmt: skip
    items.sort(key=lambda item: order[item.path])  # stable: each module's tests keep their order


def pytest_report_header(config: pytest.Config) -> str | None:
    return _order_said(config)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    said = _order_said(config)  # at the end too: ``-q`` leaves the header out
    if said:
        terminalreporter.write_line(said)


def _order_said(config: pytest.Config) -> str | None:
    """Say how to run the fast tier in this order again; None for the whole suite's fixed one."""
    if not config.getoption("fast"):
        return None
    return f"fast tier in a shuffled order: --order-seed {order_seed(config)} repeats it"


# --- the fast tier -------------------------------------------------------------------------------
# ``--fast`` keeps the tests that need neither the session's Prefect server nor a process of their
# own: a test is left out when it (or a fixture it uses) asks for ``prefect_server``, when it is
# marked ``slow``, or when it is an end-to-end test (``tests/e2e/``: each starts a stack).
# Which tests start a process is not guessed: in the fast tier, starting one fails the test
# (``_no_process_in_the_fast_tier``), so a test that does is marked or moved.

SERVER_FIXTURES = frozenset({"prefect_server"})
"""Fixtures that start the session's Prefect server: every test using one is out of the tier."""


def _keep_the_fast_tier(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = [item for item in items if not _is_fast(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if _is_fast(item)]


# The fast tier runs its modules, and each module's tests, in an order shuffled by a seed: a test
# that passes only after another (for state that one left behind) fails in some order, where the
# whole suite's fixed order would hide it for good. One seed for the run: pytest-xdist's workers
# must each collect the same order, so the process that starts them picks it.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["PREFECT_ITO_TEST_ORDER_SEED"] = str(random.randrange(100_000))


def order_seed(config: pytest.Config) -> int:
    """Return the seed the fast tier's order is shuffled with: ``--order-seed``, else the run's."""
    chosen = config.getoption("order_seed", default=None)
    return int(chosen if chosen is not None else os.environ["PREFECT_ITO_TEST_ORDER_SEED"])


def _shuffle(items: list[pytest.Item], seed: int) -> None:
    """Put ``items`` in an order drawn from ``seed``: the modules, and each module's tests."""
    rng = random.Random(seed)
    modules = sorted(dict.fromkeys(str(item.path) for item in items))
    rng.shuffle(modules)
    by_module: dict[str, list[pytest.Item]] = {module: [] for module in modules}
    for item in items:
        by_module[str(item.path)].append(item)
    for tests in by_module.values():
        rng.shuffle(tests)
    items[:] = [item for module in modules for item in by_module[module]]


def _is_fast(item: pytest.Item) -> bool:
    if item.path.parent.name == "e2e" or item.get_closest_marker("slow") is not None:
        return False
    return not SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session", autouse=True)
def _no_process_in_the_fast_tier(pytestconfig: pytest.Config) -> Iterator[None]:
    # Session-wide, so that it is in place before any module's fixtures start.
    if not pytestconfig.getoption("fast"):
        yield
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "a test of the fast tier (--fast) started a process: mark it "
            "@pytest.mark.slow (or its module: pytestmark), or call it in-process"
        )

    # Refused where the child would be started, so that Popen cleans up after itself.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        yield


def _module_order(paths: list[Path]) -> list[Path]:
    """The longest modules first, the sweep last, and between them the modules that start
    processes spread evenly among those that wait."""
    slow = sorted(
        (p for p in paths if p.name in SLOW_FIRST), key=lambda p: SLOW_FIRST.index(p.name)
    )
    last = [p for p in paths if p.name == LAST]
    rest = [p for p in paths if p not in slow and p not in last]
    spawning = [p for p in rest if p.parent.name in SPAWNING]
    waiting = [p for p in rest if p.parent.name not in SPAWNING]
    spread: list[Path] = []
    for index, path in enumerate(waiting):
        spread += [p for k, p in enumerate(spawning) if k * len(waiting) // len(spawning) == index]
        spread.append(path)
    if not waiting:
        spread = spawning
    return slow + spread + last


def pytest_configure(config: pytest.Config) -> None:
    trial_counts.FULL = bool(config.getoption("reliability_report", default=None))
    if config.getoption("reliability_report", default=None) and _workers(config):
        raise pytest.UsageError(
            "--reliability-report gathers the figures of one process: add -n 0 to run the "
            "tests without pytest-xdist's workers"
        )


def _workers(config: pytest.Config) -> int:
    """Return how many pytest-xdist workers this run has (0 for one process)."""
    return int(getattr(config.option, "numprocesses", 0) or 0)


def pytest_unconfigure(config: pytest.Config) -> None:
    # The run ends with the process that started it (every worker's session is over by then).
    if "PYTEST_XDIST_WORKER" not in os.environ:
        _drop_run_databases()
        shutil.rmtree(RUN_DIRECTORY, ignore_errors=True)


def _drop_run_databases() -> None:
    """Drop the PostgreSQL databases of this run (``prefect_<run>_…``; the sweep has read them)."""
    url = os.environ.get("PREFECT_ITO_POSTGRES_URL")
    if not url:
        return
    import asyncio

    import asyncpg

    async def drop() -> None:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            query = "SELECT datname FROM pg_database WHERE starts_with(datname, $1)"
            for row in await connection.fetch(query, f"prefect_{RUN}_"):
                await connection.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
        finally:
            await connection.close()

    asyncio.run(drop())


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = session.config.getoption("reliability_report", default=None)
    if not target or not LEDGER.categories:
        return
    if session.testsfailed:
        # The report states what held; a run where something did not is not one to publish.
        print(f"\n{target} left as it was: {session.testsfailed} test(s) failed")
        return
    path = Path(target)
    json_path = path.with_suffix(".json")
    args = " ".join(session.config.invocation_params.args)
    started, load = _STARTED
    took = time.monotonic() - started
    run = f"the session took {took:.0f} s; load average {load:.1f} at its start"
    LEDGER.stamp(Provenance.here(f"uv run pytest {args}", os.cpu_count(), run))
    figures = LEDGER.merged_over(read_figures(json_path))
    write_figures(json_path, figures)
    path.write_text(render(figures, json_path.name), encoding="utf-8")


class TestLedger:
    """The ledger as one test sees it: what it records is credited to that test."""

    __test__ = False

    def __init__(self, ledger: Ledger, test: str) -> None:
        self._ledger = ledger
        self._test = test

    def record(self, category: str, **figures: Any) -> None:
        """Record figures of ``category``; see :meth:`ledger.Ledger.record`."""
        self._ledger.record(category, self._test, **figures)


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> TestLedger:
    """Record this test's figures for the reliability report."""
    # Credited to the test function, not to each of its parameters.
    return TestLedger(LEDGER, f"{request.node.path.name}::{request.node.originalname}")
