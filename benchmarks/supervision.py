"""Supervision at scale: deferred runs, crash recovery, N runs in one process, a 10 s poller.

Deferred (``--only deferred``): what ``prefect-ito watch`` costs while N training runs wait, for
each N of ``BENCH_SIZES`` (100, 500, 5,000 in the figures), on a real ``prefect server start``
(SQLite, or ``--database postgres``: a throwaway PostgreSQL cluster) and the simulator (its own
process), with ``--watchers`` watchers (1, or 2 sharing the runs):

1. N backend runs are submitted on N bookings, with a simulated clock that runs at wall speed, so
   nothing changes by itself during the measurement (stages last hours).
2. N ``ito-training`` flow runs of a deployment are put in exactly the state a deferring flow run
   leaves behind: ``Suspended`` under a ``defer-`` pause key, with its deferral record. No worker
   runs and no flow process exists: a deferred run holds none, which the end-to-end tests check
   on a real worker (``tests/e2e/test_deferred.py``). The first ``BENCH_THROUGH_API`` (20) are
   made through Prefect's API; the rest are copies of their rows in the server's database, each
   for its own backend run (``_rows.py``: at thousands, the API took the server hours), and one
   copy is read back through the API to check it reads as one made there.
3. ``prefect-ito watch`` starts (a child process, like in production). After its first sweep,
   one idle minute is measured: every request the backend received, and the watcher's RSS.
4. Resume latency: 10 backend runs are cancelled at the backend, one by one (a change the flow
   must handle), and the time until their flow runs leave ``Suspended`` is taken; the Prefect
   requests of every watcher over those changes are counted by a proxy.
5. A burst: ``BENCH_BURST`` (200) more runs are cancelled at once; the time until all their flow
   runs left ``Suspended``, and how many suspensions Prefect's state history shows resumed more
   than once (with two watchers, both see every change).

Recovery (``--only recovery``): the crash trials of ``tests/e2e/test_crashes.py`` — N training
flow runs on a real server, worker and two watchers, each struck at a seeded point (its flow
process or a watcher SIGKILLed), the machine lost once (worker and every flow process), the
server restarted once — counted from the simulator's and Prefect's own records: trials,
runs completed, duplicates (runs, decisions, events, resumes), and the p95 time from a lost flow
process to its flow run running again.

In-process (``--only inprocess``): for each N of ``BENCH_SIZES``, a fresh process triggers N
jobs (``ItoTrainingJob``) and runs every ``ItoTrainingRun.wait_for_completion()`` at once (the
long-poll client) for ``BENCH_WINDOW_SECONDS`` (60), its events going to a real Prefect server.
The runs change evenly (``_bench.steady_scenario``): all N together ``BENCH_CHANGES_PER_SECOND``
(5) times a second, whatever N. Figures: the process's peak RSS, and the detection latency of each
change due in the window (but its last 10 s): when the supervisor first held that version, or a
later one, minus when the change was due — the simulated clock mapped onto real time, pinned by a
timed quote (``_bench.pin_load``). The simulator publishes changes on a 20 ms tick, included.
Detection is counted once all N supervisors are following (each holds its first answer); the
start-up before that — N supervisions begun in the same instant, each reading its run and its
events first — is its own figure: how long it took, and the delay of the changes due during it.

Baseline (``--only baseline``): one run changing every ``BENCH_BASELINE_SPACING`` seconds (3.5;
26 change instants, 40 versions after its start), followed at the same time by
``wait_for_completion()`` and by a poller in the style of peers that reads the run every 10 s:
the detection latency of each, and its requests per hour (the backend's count for prefect-ito,
the poller's own reads for the poller).

Writes its sections into ``benchmarks/results.json`` (the other sections are kept); figures go to
``docs/benchmarks.md``. ``supervision_scale.py`` and ``longpoll_latency.py`` measure memory per run
and wake latency in finer detail.
Run: ``uv run python benchmarks/supervision.py`` (about half an hour on 2 cores), or some sections:
``--only deferred``, ``--only recovery`` (``BENCH_TRIALS``, default 20; ``BENCH_SEED``),
``--only inprocess --only baseline`` (about seven minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID


def pick_port() -> int:
    """Return a loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# A process this script spawns (multiprocessing) runs this module again, before Prefect reads its
# settings: the port is chosen once and handed down, so every process talks to the same server.
PORT = int(os.environ.setdefault("PREFECT_ITO_BENCH_PORT", str(pick_port())))
API_URL = f"http://127.0.0.1:{PORT}/api"
os.environ["PREFECT_API_URL"] = API_URL

from _bench import (  # noqa: E402
    CountingProxy,
    Observer,
    RemoteSimulator,
    booking_id,
    due_instants,
    machine,
    observing,
    percentile,
    pin_load,
    scenario,
    steady_scenario,
    table,
    training_job,
    use_token,
)
from _rows import copy_deferred, listing_profile, server_profile  # noqa: E402
from longpoll_latency import short_poll  # noqa: E402
from prefect import get_client  # noqa: E402
from prefect.client.schemas.actions import WorkPoolCreate  # noqa: E402
from prefect.client.schemas.filters import (  # noqa: E402
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType  # noqa: E402
from prefect.exceptions import PrefectHTTPStatusError  # noqa: E402
from prefect.states import Suspended  # noqa: E402
from prefect.types.entrypoint import EntrypointType  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from prefect_ito.backend.client import ItoClient  # noqa: E402
from prefect_ito.blocks import ItoCredentials  # noqa: E402
from prefect_ito.contract import (  # noqa: E402
    TrainingRun,
)
from prefect_ito.flows import ito_training  # noqa: E402
from prefect_ito.jobs import ItoTrainingRun  # noqa: E402
from prefect_ito.parameters import BookingClaim, TrainingParameters  # noqa: E402
from prefect_ito.simulator import Scenario  # noqa: E402
from prefect_ito.waiting.deferral import Deferral, deferral_key  # noqa: E402

Figures = dict[str, float]
T = TypeVar("T")

SIZES = tuple(int(n) for n in os.environ.get("BENCH_SIZES", "10,100,500").split(","))
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "60"))
LATENCY_TRIALS = 10
LIST_EVERY = os.environ.get("BENCH_LIST_EVERY", "")
"""The watchers' ``--list-every`` (empty: its default, ``--wait``)."""
THROUGH_API = int(os.environ.get("BENCH_THROUGH_API", "20"))
"""Deferred flow runs made through Prefect's API at each N; the rest are copies of their rows."""
BURST = int(os.environ.get("BENCH_BURST", "200"))
CONCURRENCY = 8
"""Requests at once while setting up thousands of runs: Prefect's server on SQLite writes one at a
time anyway."""
PREFECT_CONCURRENCY = 4
"""Flow runs set up at once: more, and Prefect's server on SQLite answered ``503`` (a locked
database) past its client's retries."""
PG_USER = "prefect-ito-pg"
"""PostgreSQL refuses to run as root: run it as this user when we are root (as ``.ci/run``)."""
TRIALS = int(os.environ.get("BENCH_TRIALS", "20"))
SEED = int(os.environ.get("BENCH_SEED", "20261201"))
RESULTS = Path(__file__).with_name("results.json")
E2E = Path(__file__).resolve().parents[1] / "tests" / "e2e"
"""Where the crash trials' harness lives, shared with the end-to-end test."""
WATCHER_LOG = Path(tempfile.gettempdir()) / "prefect-ito-bench-watcher.log"
CHANGES_PER_SECOND = float(os.environ.get("BENCH_CHANGES_PER_SECOND", "5"))
WINDOW_SECONDS = float(os.environ.get("BENCH_WINDOW_SECONDS", "60"))
GRACE_SECONDS = 10.0
"""Changes due this close to the window's end are not counted: they may not have come round."""
INPROCESS_LOG = Path(tempfile.gettempdir()) / "prefect-ito-bench-inprocess.log"
BASELINE_SPACING = float(os.environ.get("BENCH_BASELINE_SPACING", "3.5"))
POLL_EVERY = 10.0
"""The fixed interval of the peers' pollers the baseline stands for."""
TARGET_RSS_MB = 300.0
WATCHERS: tuple[int, ...] = (1,)
"""Watchers at once in ``deferred`` (``--watchers``), turn by turn over the same runs."""
DATABASE = "sqlite"
"""The database of Prefect's server in ``deferred`` (``--database``)."""
TARGET_DETECTION_P95_MS = 250.0
TARGET_BASELINE_RATIO = 50.0


def start_server(home: Path, database_url: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``prefect server start`` on PORT (on ``database_url``, else SQLite) and wait until
    it answers."""
    env = {**os.environ, "PREFECT_HOME": str(home)}
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(PORT), "--no-ui"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # The suite's own wait (one client for every look), found on sys.path as recovery() finds it.
    sys.path[:0] = [str(E2E.parent)]
    from processes import wait_until_serving  # type: ignore[import-not-found]

    if wait_until_serving(server, API_URL):
        return server
    server.terminate()
    raise RuntimeError("prefect server did not start")


@contextlib.contextmanager
def prefect_server(database_url: str | None = None) -> Iterator[str]:
    """Run ``prefect server start`` on PORT, with a throwaway home, while the block runs; yield
    the URL of its database."""
    home = Path(tempfile.mkdtemp(prefix="prefect-ito-bench-server-"))
    server = start_server(home, database_url)
    try:
        yield database_url or f"sqlite+aiosqlite:///{home}/prefect.db"
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[str]:
    """Run a throwaway PostgreSQL cluster on loopback while the block runs; yield the URL of a
    database for Prefect's server on it."""
    tools = Path(os.path.realpath(shutil.which("initdb") or "initdb")).parent
    as_user = ["runuser", "-u", PG_USER, "--"] if os.getuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="prefect-ito-bench-pg-"))
    if as_user:
        shutil.chown(home, PG_USER)
    port, data = pick_port(), home / "data"

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True)

    try:
        run(str(tools / "initdb"), "-D", str(data), "--username=prefect", "--auth=trust")
        run(str(tools / "pg_ctl"), "-D", str(data), "-l", str(home / "postgres.log"), "-w",
            "-o", f"-k {home} -h 127.0.0.1 -p {port}", "start")  # fmt: skip
        run(str(tools / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "prefect")
        yield f"postgresql+asyncpg://prefect@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run([*as_user, str(tools / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                        "stop"], capture_output=True)  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Return a process's resident set size in MB (from /proc); ``VmHWM`` for its peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def deployment_id() -> str:
    async with get_client() as client:
        await client.create_work_pool(
            WorkPoolCreate(name="bench-pool", type="process"), overwrite=True
        )
    deployed = await ito_training.adeploy(
        name="bench",
        work_pool_name="bench-pool",
        entrypoint_type=EntrypointType.MODULE_PATH,
        print_next_steps=False,
    )
    return str(deployed)


async def submit_runs(url: str, n: int, person: str) -> list[TrainingRun]:
    """Submit ``n`` runs, each on a quote the benchmarks' person confirmed at the backend."""
    async with (
        ItoCredentials(api_url=url).get_client() as client,
        ItoClient(url, SecretStr(person)) as confirmer,
    ):

        async def submit(i: int) -> TrainingRun:
            request = training_for(booking_id(i)).to_request(BookingClaim(booking_id=booking_id(i)))
            quote = await client.quote_training_run(request.to_submission())
            await confirmer.confirm_quote(quote.quote_id, idempotency_key=f"confirm-{n}-{i}")
            submission = await client.submit_training_run(
                request.to_submission().spending(quote.quote_id), idempotency_key=f"bench-{n}-{i}"
            )
            return submission.run

        return await at_most(CONCURRENCY, [submit(i) for i in range(n)])


async def at_most(limit: int, calls: list[Awaitable[T]]) -> list[T]:
    """Await ``calls``, ``limit`` at a time; return their results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))


def training_for(booking: str) -> TrainingParameters:
    """Return the training parameters of the benchmark's run on ``booking``."""
    return TrainingParameters(
        booking=booking, model_size="8B", data=["catalog://ito/web"], target="chat",
        budget_usd=1e5,
    )  # fmt: skip


async def settled(url: str, runs: list[TrainingRun]) -> list[TrainingRun]:
    """Return the runs once each is in its first stage (hours long at wall speed)."""
    async with ItoCredentials(api_url=url).get_client() as client:
        while True:
            fresh = await at_most(
                CONCURRENCY, [client.get_training_run(run.run_id) for run in runs]
            )
            if all(run.current_stage for run in fresh):
                return fresh
            await asyncio.sleep(0.5)


async def defer_flow_runs(
    deployment: str, url: str, runs: list[TrainingRun], database_url: str
) -> list[str]:
    """Create one suspended flow run per backend run, as a deferring flow run leaves it: the
    first ``THROUGH_API`` through Prefect's API, the rest copied from them row by row in the
    server's database (``_rows.copy_deferred``)."""
    async with get_client() as client:

        async def defer(run: TrainingRun) -> str:
            training = training_for(run.booking_id).model_dump(mode="json")
            flow_run = await client.create_flow_run_from_deployment(
                deployment,  # type: ignore[arg-type]
                parameters={"training": training},
            )
            key = deferral_key(run)
            record = deferral_record(url, run)
            await client.create_flow_run_input(flow_run.id, key, record.model_dump_json())
            await client.set_flow_run_state(flow_run.id, Suspended(pause_key=key), force=True)
            return str(flow_run.id)

        ready = await settled(url, runs)
        made = await at_most(
            PREFECT_CONCURRENCY, [patiently(defer, run) for run in ready[:THROUGH_API]]
        )
    copies = [
        (deferral_key(run), {"training": training_for(run.booking_id).model_dump(mode="json")},
         deferral_record(url, run).model_dump_json())
        for run in ready[THROUGH_API:]
    ]  # fmt: skip
    return made + await copy_deferred(database_url, made, copies)


def deferral_record(url: str, run: TrainingRun) -> Deferral:
    """Return the record a flow run deferring on ``run`` writes (no stall limit, no deadline)."""
    return Deferral(
        api_url=url, run_id=run.run_id, version=run.version, stage=run.current_stage,
        events_seen=0, heartbeat_at=run.heartbeat_at, heartbeat_seen_at=time.time(),
        stall_timeout=None, deadline_at=None,
    )  # fmt: skip


async def patiently(call: Callable[[TrainingRun], Awaitable[T]], run: TrainingRun) -> T:
    """Await ``call(run)``, again while Prefect's server answers ``503`` (its database busy)."""
    for _ in range(20):
        try:
            return await call(run)
        except PrefectHTTPStatusError as error:
            if error.response.status_code != 503:
                raise
            await asyncio.sleep(2)
    return await call(run)


async def still_suspended(flow_run_id: str) -> bool:
    async with get_client() as client:
        state = (await client.read_flow_run(flow_run_id)).state  # type: ignore[arg-type]
    return state is not None and state.is_paused()


async def resume_latencies(url: str, runs: list[TrainingRun], flow_runs: list[str]) -> list[float]:
    latencies = []
    async with ItoCredentials(api_url=url).get_client() as client:
        for run, flow_run in list(zip(runs, flow_runs, strict=True))[:LATENCY_TRIALS]:
            start = time.monotonic()
            await client.cancel_training_run(run.run_id, reason="bench", idempotency_key=run.run_id)
            while await still_suspended(flow_run):
                await asyncio.sleep(0.02)
            latencies.append(time.monotonic() - start)
            assert latencies[-1] > 0.001
    return latencies


async def clear_flow_runs(flow_runs: list[str]) -> None:
    async with get_client() as client:
        await at_most(
            CONCURRENCY,
            [client.delete_flow_run(flow_run) for flow_run in flow_runs],  # type: ignore[arg-type]
        )


async def burst(url: str, runs: list[TrainingRun], flow_runs: list[str]) -> tuple[float, int]:
    """Cancel every one of ``runs`` at once; return the seconds until all their flow runs left
    ``Suspended``, and how many of those flow runs Prefect shows resumed more than once."""
    start = time.monotonic()
    async with ItoCredentials(api_url=url).get_client() as client:
        await at_most(CONCURRENCY, [
            client.cancel_training_run(run.run_id, reason="bench", idempotency_key=run.run_id)
            for run in runs
        ])  # fmt: skip
    async with get_client() as client:
        while await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[UUID(flow_run) for flow_run in flow_runs]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
            ),
            limit=1,
        ):
            await asyncio.sleep(0.2)
    took = time.monotonic() - start
    async with get_client() as client:
        histories = await at_most(CONCURRENCY, [
            client.read_flow_run_states(flow_run)  # type: ignore[arg-type]
            for flow_run in flow_runs
        ])  # fmt: skip
    twice = sum([s.name for s in history].count("Resuming") > 1 for history in histories)
    return took, twice


async def listing_seconds() -> float:
    """Return how long one listing of the watched flow runs takes, every page of them."""
    from prefect_ito.waiting.recovery import JUDGED
    from prefect_ito.waiting.watched import watched_flow_runs

    start = time.monotonic()
    await watched_flow_runs(*JUDGED)
    return time.monotonic() - start


def watched_filters(offset: int) -> dict[str, Any]:
    """Return the body of the watcher's request for one page of its listing
    (:func:`prefect_ito.waiting.watched.watched_flow_runs`)."""
    from prefect_ito.waiting.recovery import JUDGED
    from prefect_ito.waiting.watched import FLOW_NAMES

    flows = FlowFilter(name=FlowFilterName(any_=list(FLOW_NAMES)))
    flow_runs = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(JUDGED))),
        deployment_id=FlowRunFilterDeploymentId(is_null_=False),
    )
    return {
        "flows": flows.model_dump(mode="json"), "flow_runs": flow_runs.model_dump(mode="json"),
        "sort": "ID_DESC", "offset": offset, "limit": 200,
    }  # fmt: skip


async def same_as_made(url: str, runs: list[TrainingRun], flow_runs: list[str]) -> None:
    """Check that the last flow run (copied, past ``THROUGH_API``) reads through Prefect's API
    as the first (made through it) does: suspended under its own run's pause key, rescheduled on
    resume, from the deployment, with its own deferral record."""
    from prefect_ito.waiting.deferral import read_deferral

    async with get_client() as client:
        made, copied = [await client.read_flow_run(UUID(f)) for f in (flow_runs[0], flow_runs[-1])]
    like = made.state
    assert like is not None
    for flow_run, run in ((made, runs[0]), (copied, runs[-1])):
        state = flow_run.state
        assert state is not None
        assert state.is_paused()
        assert state.name == like.name
        assert state.state_details.pause_reschedule == like.state_details.pause_reschedule
        assert flow_run.deployment_id == made.deployment_id
        key = state.state_details.pause_key
        assert key is not None
        record = await read_deferral(flow_run.id, key)
        assert record is not None
        assert record.run_id == run.run_id
        assert key == deferral_key(run.model_copy(update={"version": record.version}))


def start_watcher(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``prefect-ito watch`` as in production, its log appended to WATCHER_LOG."""
    every = ["--list-every", LIST_EVERY] if LIST_EVERY else []
    return subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "watch", "--wait", "30", *every],
        env=env, stdout=WATCHER_LOG.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def measure(
    n: int, deployment: str, token: str, sim: RemoteSimulator, database_url: str
) -> dict[str, Figures]:
    """Defer N flow runs; measure them under each number of watchers of ``WATCHERS`` in turn,
    each on runs of its own for its changes; return the figures by :func:`deferred_name`."""
    setup = time.monotonic()
    runs = asyncio.run(submit_runs(sim.url, n, sim.person_token()))
    print(f"N={n}: {n} backend runs in {time.monotonic() - setup:.0f} s", flush=True)
    setup = time.monotonic()
    flow_runs = asyncio.run(defer_flow_runs(deployment, sim.url, runs, database_url))
    print(f"N={n}: {n} flow runs deferred in {time.monotonic() - setup:.0f} s", flush=True)
    # Nothing resumes before the measurement: every run waits, as it would for hours.
    assert all(asyncio.run(still_suspended(flow_run)) for flow_run in flow_runs[:3])
    asyncio.run(same_as_made(sim.url, runs, flow_runs))
    listing = asyncio.run(listing_seconds())
    profile = {
        **asyncio.run(listing_profile(API_URL, watched_filters)),
        **asyncio.run(server_profile(database_url, watched_filters(0))),
    }
    print(f"N={n}: listing {listing:.2f} s; profile {profile}", flush=True)
    figures = {}
    for turn, watchers in enumerate(WATCHERS):
        used = slice(turn * (LATENCY_TRIALS + BURST), (turn + 1) * (LATENCY_TRIALS + BURST))
        waiting = n - turn * (LATENCY_TRIALS + BURST)
        figures[deferred_name(n, watchers)] = {
            **watch(waiting, watchers, token, sim, runs[used], flow_runs[used]),
            "listing_s": round(listing, 2),
            **{f"listing_{k}": v for k, v in profile.items()},
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
        print(f"{deferred_name(n, watchers)}: {figures[deferred_name(n, watchers)]}", flush=True)
    if n != SIZES[-1]:  # the server goes with the last size
        asyncio.run(clear_flow_runs(flow_runs))
    return figures


def watch(
    n: int,
    watchers: int,
    token: str,
    sim: RemoteSimulator,
    runs: list[TrainingRun],
    flow_runs: list[str],
) -> Figures:
    """Start ``watchers`` watchers over N deferred runs; measure them, changing ``runs``."""
    proxy = CountingProxy(API_URL).__enter__()  # counts the watchers' requests to Prefect
    env = {
        **os.environ, "ITO_COMPUTE_API_URL": sim.url, "ITO_COMPUTE_TOKEN": token,
        "PREFECT_API_URL": proxy.api_url,
    }  # fmt: skip
    started = [start_watcher(env) for _ in range(watchers)]
    since = time.monotonic()
    try:
        # The first sweep reads every deferred run once (each watcher); then they are idle.
        first = len(sim.requests())
        while (
            sum(1 for r in sim.requests()[first:] if r.path.startswith("/v0/training-runs/run_"))
            < n * watchers
        ):
            time.sleep(5)  # the request log crosses a pipe: tens of thousands of entries
        first_sweep = time.monotonic() - since
        time.sleep(2)
        before = len(sim.requests())
        time.sleep(IDLE_SECONDS)
        idle = (len(sim.requests()) - before) / (IDLE_SECONDS / 60)
        rss = max(rss_mb(watcher.pid) for watcher in started)
        if os.environ.get("BENCH_DEBUG"):
            for entry in sim.requests()[-12:]:
                print(entry.time.isoformat(), entry.method, entry.path, entry.status)
        counted = proxy.count
        latencies = asyncio.run(resume_latencies(sim.url, runs, flow_runs))
        per_change = (proxy.count - counted) / len(latencies)
        bursting = slice(LATENCY_TRIALS, LATENCY_TRIALS + BURST)
        burst_s, twice = asyncio.run(burst(sim.url, runs[bursting], flow_runs[bursting]))
        _, twice_one_by_one = asyncio.run(burst(sim.url, [], flow_runs[:LATENCY_TRIALS]))
    finally:
        for watcher in started:
            watcher.terminate()
        for watcher in started:
            watcher.wait(timeout=60)
        proxy.__exit__(None, None, None)
    return {
        "flow_processes": float(len(flow_processes())),
        "watcher_rss_mb": round(rss, 1),
        "idle_requests_per_minute": round(idle, 2),
        "resume_p50_s": round(statistics.median(latencies), 3),
        "resume_p95_s": round(percentile(latencies, 0.95), 3),
        "prefect_requests_per_change": round(per_change, 1),
        "first_sweep_s": round(first_sweep, 1),
        "burst_runs": float(len(flow_runs[bursting])),
        "burst_all_resumed_s": round(burst_s, 1),
        "resumed_twice": float(twice + twice_one_by_one),
    }


def flow_processes() -> list[str]:
    """Return the flow processes that run against this benchmark's server (the machine may run
    others' at the same time)."""
    found = subprocess.run(
        ["pgrep", "-f", "prefect.engine"], capture_output=True, text=True
    ).stdout.split()
    ours = []
    for pid in found:
        with contextlib.suppress(OSError):
            if f"127.0.0.1:{PORT}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                ours.append(pid)
    return ours


def deferred() -> dict[str, dict[str, Figures]]:
    """Measure deferred supervision at every size of ``BENCH_SIZES``; see the docstring."""
    figures: dict[str, Figures] = {}
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(postgres_cluster()) if DATABASE == "postgres" else None
        database_url = stack.enter_context(prefect_server(database))
        deployment = asyncio.run(deployment_id())
        for n in SIZES:
            with RemoteSimulator(scenario(time_scale=1.0, bookings=n)) as sim:
                token = sim.mint_token()
                os.environ["ITO_COMPUTE_API_URL"] = sim.url
                os.environ["ITO_COMPUTE_TOKEN"] = token
                figures.update(measure(n, deployment, token, sim, database_url))
    print_rows(figures)
    return {"deferred": figures}


def deferred_name(n: int, watchers: int) -> str:
    """Return the key of a measurement of N deferred runs: N, with what is not the default."""
    variants = [f"{watchers} watchers"] if watchers > 1 else []
    variants += ["PostgreSQL"] if DATABASE == "postgres" else []
    variants += [f"--list-every {LIST_EVERY}"] if LIST_EVERY else []
    return f"{n} ({', '.join(variants)})" if variants else str(n)


def print_rows(figures: dict[str, Figures]) -> None:
    """Print one table row per N."""
    rows = [[n, *values.values()] for n, values in figures.items()]
    print(table(["N", *next(iter(figures.values())).keys()], rows))


def recovery() -> dict[str, Figures]:
    """Play the crash trials (``tests/e2e/crash_trials.py``) and return their figures."""
    # The harness is test code (type-checked as tests are), found on sys.path at run time: the
    # end-to-end helpers, and the suite's own beside them (a migrated home, stopping processes).
    sys.path[:0] = [str(E2E), str(E2E.parent)]
    from crash_tally import record_figures  # type: ignore[import-not-found]
    from crash_trials import plan, run_trials, trial_scenario  # type: ignore[import-not-found]
    from trial_stack import trial_stack  # type: ignore[import-not-found]

    from prefect_ito.simulator import SimulatorServer

    with (
        SimulatorServer(trial_scenario(plan(TRIALS, SEED))) as sim,
        trial_stack(sim) as stack,
    ):
        tally = asyncio.run(run_trials(stack, TRIALS, SEED, timeout=1800))
    print(f"tally: {tally}")
    print(f"wrote {record_figures(tally)}")
    figures: Figures = tally.figures()
    print(table(list(figures), [list(figures.values())]))
    return {"recovery": figures}


# --- in-process supervision of N runs ---------------------------------------------------------


def inprocess() -> dict[str, dict[str, Figures]]:
    """Supervise N runs in one process, for every N of ``BENCH_SIZES``; see the docstring."""
    figures: dict[str, Figures] = {}
    with prefect_server():
        for n in SIZES:
            # A fresh process per N, so its RSS is that of a process supervising N runs.
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                figures[str(n)] = pool.submit(supervise_in_process, n).result()
            print(f"N={n}: {figures[str(n)]}", flush=True)
    print_rows(figures)
    n, largest = max(SIZES), figures[str(max(SIZES))]
    print_verdict(f"peak RSS < {TARGET_RSS_MB:g} MB at N = {n}", largest["rss_mb"] < TARGET_RSS_MB)
    p95 = largest["detection_p95_ms"]
    print_verdict(
        f"detection p95 ≤ {TARGET_DETECTION_P95_MS:g} ms at N = {n}, all following",
        p95 <= TARGET_DETECTION_P95_MS,
    )
    print(
        f"Start-up at N = {n}: all following after {largest['startup_s']:g} s; the "
        f"{largest['startup_changes']:g} changes due before had a p95 delay of "
        f"{largest['startup_detection_p95_ms']:g} ms."
    )
    return {"inprocess": figures}


def supervise_in_process(n: int) -> Figures:
    """Child process: supervise N runs through the window; return its peak RSS and detection."""
    # N runs' log lines go to a file, written as they would be, so the report stays readable.
    with INPROCESS_LOG.open("ab") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
    return asyncio.run(follow_window(n))


async def follow_window(n: int) -> Figures:
    """Trigger N jobs, supervise them all for the window, and measure; see the docstring."""
    sim_scenario = steady_scenario(n, n / CHANGES_PER_SECOND)
    with RemoteSimulator(sim_scenario) as sim:
        use_token(sim)
        sim.load_scenario(sim_scenario)
        loaded_at, uncertainty = await pin_load(sim.url, sim_scenario, booking_id(0))
        handles = await asyncio.gather(
            *(training_job(sim.url, booking_id(i)).trigger() for i in range(n))
        )
        with observing() as observers:
            since = time.monotonic()
            end = await supervise_for(handles, WINDOW_SECONDS)
        peak = rss_mb(os.getpid(), "VmHWM")
        # Start-up ends when the last of the N supervisors holds its first answer.
        following = max((observers[h.run_id].seen or [(0, end)])[0][1] for h in handles)
        starting: list[float] = []
        delays: list[float] = []
        async with handles[0].job.credentials.get_client() as client:
            for handle in handles:
                due = await due_instants(client, handle.run_id, sim_scenario, loaded_at, since)
                counted = {v: at for v, at in due.items() if at <= end - GRACE_SECONDS}
                observer = observers[handle.run_id]
                starting += observer.delays(
                    {v: at for v, at in counted.items() if at < following}, end
                )
                delays += observer.delays(
                    {v: at for v, at in counted.items() if at >= following}, end
                )
    return {
        "rss_mb": round(peak, 1),
        **summarise_detection(delays, uncertainty),
        "startup_s": round(following - since, 2),
        "startup_changes": float(len(starting)),
        "startup_detection_p95_ms": round(percentile(starting, 0.95) * 1000, 1)
        if starting
        else 0.0,
    }


async def supervise_for(handles: list[ItoTrainingRun], seconds: float) -> float:
    """Run every ``wait_for_completion()`` for ``seconds`` (or until all return); return the end."""
    waits = [asyncio.create_task(handle.wait_for_completion()) for handle in handles]
    done, _ = await asyncio.wait(waits, timeout=seconds)
    end = time.monotonic()
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    for finished in done:
        finished.result()  # a supervision that failed fails the benchmark
    return end


def summarise_detection(delays: list[float], uncertainty: float) -> Figures:
    """Return the median and p95 of detection delays and how many there were.

    ``uncertainty`` is how far off the simulated clock's mapping onto real time may be: every
    delay may be off by as much, either way.
    """
    return {
        "detection_p50_ms": round(percentile(delays, 0.5) * 1000, 1),
        "detection_p95_ms": round(percentile(delays, 0.95) * 1000, 1),
        "changes": float(len(delays)),
        "clock_uncertainty_ms": round(uncertainty * 1000, 1),
    }


def print_verdict(target: str, met: bool) -> None:
    """Print whether a target was met, as the other benchmarks do."""
    print(f"Target: {target}: {'met' if met else 'NOT met'}.")


# --- a fixed-interval poller beside prefect-ito ------------------------------------------------


def baseline() -> dict[str, Figures]:
    """Follow one run with prefect-ito and with a 10 s poller at once; see the docstring."""
    sim_scenario = steady_scenario(1, BASELINE_SPACING)
    with prefect_server(), RemoteSimulator(sim_scenario) as sim:
        use_token(sim)
        figures = asyncio.run(follow_side_by_side(sim, sim_scenario))
    print(table(["client", *figures["baseline"]], [[k, *v.values()] for k, v in figures.items()]))
    ratio = figures["baseline"]["detection_p50_ms"] / figures["prefect_ito"]["detection_p95_ms"]
    print_verdict(
        f"prefect-ito's detection p95 ≥ {TARGET_BASELINE_RATIO:g}x smaller than the poller's p50 "
        f"({ratio:.0f}x)",
        ratio >= TARGET_BASELINE_RATIO,
    )
    return figures


async def follow_side_by_side(sim: RemoteSimulator, sim_scenario: Scenario) -> dict[str, Figures]:
    """Trigger one run; follow it by ``wait_for_completion()`` and by the poller together."""
    sim.load_scenario(sim_scenario)
    loaded_at, uncertainty = await pin_load(sim.url, sim_scenario, booking_id(0))
    job = training_job(sim.url, booking_id(0))
    handle = await job.trigger()
    poller = Observer(f"poll every {POLL_EVERY:g} s")
    first = len(sim.requests())
    async with job.credentials.get_client() as client:
        with observing() as observers:
            since = time.monotonic()
            ended, _ = await asyncio.gather(
                await_end(handle.wait_for_completion()),
                await_end(short_poll(client, handle.run_id, poller, every=POLL_EVERY)),
            )
        served = sum(e.path.startswith(f"/v0/training-runs/{handle.run_id}")
                     for e in sim.requests()[first:])  # fmt: skip
        due = await due_instants(client, handle.run_id, sim_scenario, loaded_at, since)
    # The poller's reads cover one interval each, the last one included.
    polled = poller.seen[-1][1] + POLL_EVERY - since
    return {
        "baseline": {
            **summarise_detection(poller.delays(due), uncertainty),
            "requests_per_hour": round(len(poller.seen) / polled * 3600, 1),
        },
        "prefect_ito": {
            **summarise_detection(observers[handle.run_id].delays(due), uncertainty),
            "requests_per_hour": round((served - len(poller.seen)) / (ended - since) * 3600, 1),
        },
    }


async def await_end(waiting: Awaitable[None]) -> float:
    """Await ``waiting``; return the monotonic instant it ended."""
    await waiting
    return time.monotonic()


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "deferred": deferred,
    "recovery": recovery,
    "inprocess": inprocess,
    "baseline": baseline,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    parser.add_argument(
        "--watchers", default="1", help="deferred: watchers at once, or several turns: 1,2"
    )
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    global WATCHERS, DATABASE
    WATCHERS = tuple(int(w) for w in args.watchers.split(","))
    DATABASE = args.database
    chosen = args.only or list(SECTIONS)
    for name in chosen:
        figures = SECTIONS[name]()
        # Read just before writing: another run of this script may have written meanwhile.
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        # A section writes its own keys: ``baseline`` writes ``baseline`` and ``prefect_ito``;
        # ``deferred`` its sizes and variants, beside those measured before.
        for key, value in figures.items():
            kept = results.get(key) if name == "deferred" else None
            results[key] = {**kept, **value} if isinstance(kept, dict) else value
        # Written after each section, so a long run keeps what it measured.
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(machine())
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
