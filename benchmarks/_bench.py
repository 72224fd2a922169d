"""Shared plumbing for the benchmarks: isolation, a simulator in its own process, statistics.

Importing this module points Prefect at a throwaway home first, so a benchmark never reads or
writes the user's Prefect state. The simulator runs in a child process (see
:class:`RemoteSimulator`), so the benchmark process measures the client alone: its CPU time, its
memory, and no contention with the server for the GIL.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

_HOME = tempfile.mkdtemp(prefix="prefect-ito-bench-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ.update(
    {
        "PREFECT_HOME": _HOME,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The supervision default, pinned so the caller's environment cannot change the results.
        "PREFECT_INTEGRATIONS_ITO_POLL_WAIT_SECONDS": "30",
    }
)
# Child processes (servers, workers, flow runs, watchers) use compiled bytecode, as an installed
# environment has it: where PYTHONDONTWRITEBYTECODE is set, each would compile this package (and
# whatever the install left uncompiled) from source again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import httpx  # noqa: E402

from prefect_ito.backend.client import ItoClient  # noqa: E402
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization  # noqa: E402
from prefect_ito.contract import ALL_SCOPES, BookingStatus, TrainingRun  # noqa: E402
from prefect_ito.jobs import ItoTrainingJob  # noqa: E402
from prefect_ito.parameters import BookingClaim, TrainingParameters  # noqa: E402
from prefect_ito.simulator import (  # noqa: E402
    RequestLogEntry,
    RunScript,
    Scenario,
    SimBooking,
    SimulatorServer,
    builtin_scenario,
)

PERSON = "user:benchmarks"
"""Who confirms and authorizes the benchmarks' spends, as the simulator authenticates them."""
PERSONS: dict[str, str] = {}
"""The person's token at each simulator this process started, by its URL."""
BOOKING = "bk-h200-2x8-ib"
"""A completed booking every built-in scenario holds."""
STARTUP_SECONDS = 60.0
MINUTE_HOURS = 1 / 60
EXACT_TIME_SCALE = 100.0
"""The fastest simulated clock :func:`real_instant` maps to within about a millisecond.

The simulator dates a new run from two reads of its clock a few µs apart, the second scaled by
``time_scale``, so a run's timestamps sit up to ``time_scale`` × a few µs after the real instants
they stand for: 2.4 s at 400,000.
"""


# --- the simulator, in a child process ---------------------------------------------------------


def _serve(scenario_json: str, conn: Connection) -> None:
    """Child process: serve one simulator and answer admin calls until told to stop."""
    calls = {"mint_token", "load_scenario", "requests"}
    with SimulatorServer(Scenario.model_validate_json(scenario_json)) as sim:
        conn.send(sim.url)
        while (message := conn.recv()) is not None:
            name, args = message
            if name == "person_token":  # keyword-only options do not cross the pipe as args
                conn.send(sim.mint_token(scopes=[s.value for s in ALL_SCOPES], principal=PERSON))
                continue
            assert name in calls
            conn.send(getattr(sim, name)(*args))


class RemoteSimulator:
    """A :class:`SimulatorServer` running in a child process, driven over a pipe.

    Args:
        scenario: The scenario to serve first (its ``time_scale`` included).
    """

    def __init__(self, scenario: Scenario) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(scenario.model_dump_json(), child), daemon=True
        )
        self.url = ""

    def __enter__(self) -> RemoteSimulator:
        self._process.start()
        if not self._conn.poll(STARTUP_SECONDS):
            self._stop()
            raise RuntimeError("the simulator process did not start")
        self.url = self._conn.recv()
        PERSONS[self.url] = self.person_token()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process.is_alive():
            self._conn.send(None)
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()

    def _call(self, name: str, *args: Any) -> Any:
        self._conn.send((name, args))
        return self._conn.recv()

    def mint_token(self) -> str:
        """Mint a bearer token and return its value."""
        token = self._call("mint_token")
        return str(token.get_secret_value())

    def person_token(self) -> str:
        """Mint a token of the benchmarks' person (spend scopes included); return its value."""
        token = self._call("person_token")
        return str(token.get_secret_value())

    def load_scenario(self, scenario: Scenario) -> tuple[float, float]:
        """Load a scenario (clock, runs and request log start over).

        Returns:
            The monotonic instant the simulated clock started, and how far off it may be (half
            the admin call's round trip). The system monotonic clock is shared between the
            processes of one machine, so the instant means the same in both.
        """
        before = time.monotonic()
        self._call("load_scenario", scenario)
        after = time.monotonic()
        return (before + after) / 2, (after - before) / 2

    def requests(self) -> list[RequestLogEntry]:
        """Return the simulator's request log."""
        entries: list[RequestLogEntry] = self._call("requests")
        return entries


def use_token(sim: RemoteSimulator) -> None:
    """Mint a token and put it where ``ItoCredentials`` looks first: ``ITO_COMPUTE_TOKEN``,
    beside ``ITO_COMPUTE_API_URL``, the origin it belongs to."""
    os.environ["ITO_COMPUTE_API_URL"] = sim.url
    os.environ["ITO_COMPUTE_TOKEN"] = sim.mint_token()


# --- scenarios and jobs --------------------------------------------------------------------------


def scenario(
    *, time_scale: float, segments_per_stage: int = 4, bookings: int | None = None
) -> Scenario:
    """Return the built-in ``default`` scenario (no decisions needed) with benchmark changes.

    Args:
        time_scale: Simulated seconds per real second.
        segments_per_stage: Checkpoints per training stage: more segments, more run versions.
        bookings: When given, exactly this many completed bookings, ``bk-bench-000`` onwards.
    """
    base = builtin_scenario("default")
    run = RunScript.model_validate(
        {**base.run.model_dump(), "segments_per_stage": segments_per_stage}
    )
    # A set start, about the real time of the load: real_instant maps timestamps from it.
    update: dict[str, Any] = {"run": run, "time_scale": time_scale, "start_at": datetime.now(UTC)}
    if bookings is not None:
        update["bookings"] = [
            SimBooking(booking_id=booking_id(i), status=BookingStatus.COMPLETED)
            for i in range(bookings)
        ]
    return Scenario.model_validate({**base.model_dump(), **update})


def steady_scenario(bookings: int, spacing: float) -> Scenario:
    """Return ``bookings`` bookings whose runs change evenly, each every ``spacing`` real seconds.

    Every stage of a run is four one-minute checkpoint segments, and the parallelism plan one
    minute, so a run's changes come one simulated minute apart (26 instants, 42 versions with
    post-training). Booking ``i``'s data preparation lasts ``(i + 1) / bookings`` of a minute:
    the runs' changes interleave, and all of them together change ``bookings / spacing`` times a
    second. Minutes, not hours, keep the clock slow enough for :func:`real_instant`.
    """
    base = scenario(time_scale=60 / spacing, bookings=bookings)
    stages = {
        part: [{**stage, "hours": 4 * MINUTE_HOURS} for stage in base.run.model_dump()[part]]
        for part in ("curriculum", "post_training")
    }
    changes = {**stages, "parallelism_hours": MINUTE_HOURS}
    run = RunScript.model_validate({**base.run.model_dump(), **changes})
    staggered = {
        booking_id(i): {"data_prep_hours": (i + 1) / bookings * MINUTE_HOURS}
        for i in range(bookings)
    }
    return Scenario.model_validate(
        {**base.model_dump(), "run": run, "booking_overrides": staggered}
    )


def booking_id(index: int) -> str:
    """Return the id of the ``index``-th booking of :func:`scenario` with ``bookings``."""
    return f"bk-bench-{index:03d}"


def training_job(url: str, booking: str = BOOKING) -> ItoTrainingJob:
    """Return a training job on ``booking`` through every curriculum stage and post-training."""
    training = TrainingParameters(
        booking=booking,
        model_size="8B",
        data=["catalog://ito/web-2026-10"],
        target="code-assistant",
        budget_usd=250_000.0,
        post_training="rlvr",
    )
    return ItoTrainingJob(
        credentials=ItoCredentials(api_url=url),
        training=training,
        authorization=standing_authorization(url),
    )


def standing_authorization(url: str) -> ItoSpendAuthorization:
    """Create, as the benchmarks' person, a standing authorization at the simulator at ``url``
    that covers the benchmarks' runs for a day; return the block that names it."""
    body = {
        "name": "prefect-ito benchmarks",
        "limits": {
            "max_budget_usd": 1e9,
            "booking_id_patterns": ["bk-*"],
            "data_ref_patterns": ["*"],
        },
        "expires_at": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
    }
    response = httpx.post(
        f"{url}/v0/spend-authorizations",
        json=body,
        headers={
            "Authorization": f"Bearer {PERSONS[url]}",
            "Idempotency-Key": f"bench-{uuid.uuid4()}",
        },
        timeout=30,
    )
    response.raise_for_status()
    return ItoSpendAuthorization(authorization_id=response.json()["data"]["authorization_id"])


def real_instant(at: datetime, run: TrainingRun, sim: Scenario, loaded_at: float) -> float:
    """Return the monotonic instant a timestamp of ``run`` falls on, for a scenario loaded then.

    The simulator dates a run from the real moment it was created (that long after
    ``start_at``); from there the run's own timestamps run ``time_scale`` times faster.

    Raises:
        SystemExit: the clock runs faster than :data:`EXACT_TIME_SCALE`, so the mapping would
            be off by more than a millisecond.
    """
    assert sim.start_at is not None, "scenario() sets start_at"
    if sim.time_scale > EXACT_TIME_SCALE:
        raise SystemExit(
            f"time_scale {sim.time_scale:g} is too fast to map the simulator's timestamps onto "
            f"real time (at most {EXACT_TIME_SCALE:g}; see EXACT_TIME_SCALE)"
        )
    created = loaded_at + (run.created_at - sim.start_at).total_seconds()
    return created + (at - run.created_at).total_seconds() / sim.time_scale


async def pin_load(url: str, sim: Scenario, booking: str) -> tuple[float, float]:
    """Return the monotonic instant ``sim`` was loaded, and how far off that may be.

    A quote expires ``quote_ttl_seconds`` after the simulator's unscaled wall clock, which reads
    ``start_at`` at the load; so one quote, timed, pins the load to within half its round trip,
    much closer than the admin call that loaded it (which parses the whole scenario).
    """
    job = training_job(url, booking)
    submission = job.training.to_request(BookingClaim(booking_id=booking)).to_submission()
    async with job.credentials.get_client() as client:
        await client.quote_training_run(submission)  # the connection, so the timed one is bare
        before = time.monotonic()
        quote = await client.quote_training_run(submission)
        after = time.monotonic()
    assert sim.start_at is not None, "scenario() sets start_at"
    since_load = (quote.expires_at - sim.start_at).total_seconds() - sim.quote_ttl_seconds
    return (before + after) / 2 - since_load, (after - before) / 2


async def due_instants(
    client: ItoClient, run_id: str, sim: Scenario, loaded_at: float, since: float
) -> dict[int, float]:
    """Return the monotonic instant each version of a run was due, from ``since`` on.

    Every change of a run is one event, so event ``seq`` is version ``seq + 1``, and its ``at``
    is the scripted instant of that change. A run that is still going is read until it did not
    change between the reads of it and of its events.
    """
    run, page = await client.get_training_run(run_id), await client.list_events(run_id)
    while (latest := await client.get_training_run(run_id)).version != run.version:
        run, page = latest, await client.list_events(run_id)
    if run.version != page.last_seq + 1:
        raise SystemExit("a run version is no longer one event: the delay mapping is invalid")
    instants = {e.seq + 1: real_instant(e.at, run, sim, loaded_at) for e in page.events}
    return {version: at for version, at in instants.items() if at >= since}


@dataclass
class Observer:
    """What one client following a run saw: each answer's version and when it arrived."""

    mode: str = "prefect-ito"
    seen: list[tuple[int, float]] = field(default_factory=list)

    def record(self, run: TrainingRun) -> TrainingRun:
        self.seen.append((run.version, time.monotonic()))
        return run

    def delays(self, due: dict[int, float], end: float = float("inf")) -> list[float]:
        """Return, per due version, how long after it was due this client first held it.

        A version not held by ``end`` counts as held then: a lower bound on its delay.
        """
        return [
            next((t for version, t in self.seen if version >= wanted), end) - at
            for wanted, at in due.items()
        ]


@contextlib.contextmanager
def observing() -> Iterator[defaultdict[str, Observer]]:
    """Record, per run id, every long-poll answer of ``ItoClient`` while the block runs.

    The supervision loop (``ItoTrainingRun.wait_for_completion``) reads a run only by
    long-polling it, so its answers are what the client held and when; a plain read, such as a
    fixed-interval poller's, is not recorded. The method is wrapped, not changed.
    """
    observers: defaultdict[str, Observer] = defaultdict(Observer)
    original = ItoClient.get_training_run

    async def recorded(
        self: ItoClient, run_id: str, *, after_version: int | None = None, wait: float | None = None
    ) -> TrainingRun:
        run = await original(self, run_id, after_version=after_version, wait=wait)
        if after_version is not None:
            observers[run_id].record(run)
        return run

    ItoClient.get_training_run = recorded  # type: ignore[method-assign]
    try:
        yield observers
    finally:
        ItoClient.get_training_run = original  # type: ignore[method-assign]


# --- measuring and reporting ---------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Median, 90th percentile and maximum of some samples."""

    n: int
    median: float
    p90: float
    max: float

    def spread(self) -> tuple[float, float, float]:
        """Return the median, the 90th percentile and the maximum."""
        return self.median, self.p90, self.max


def summarise(samples: Sequence[float]) -> Summary:
    """Return the :class:`Summary` of non-empty ``samples`` (p90 by nearest rank)."""
    ordered = sorted(samples)
    return Summary(len(ordered), statistics.median(ordered), percentile(ordered, 0.9), ordered[-1])


def percentile(samples: Sequence[float], q: float) -> float:
    """Return the ``q`` quantile (0 < q ≤ 1) of non-empty ``samples``, by nearest rank."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    """Format seconds as milliseconds."""
    return f"{seconds * 1000:.1f}"


def us(seconds: float) -> str:
    """Format seconds as microseconds."""
    return f"{seconds * 1e6:.0f}"


def rss_bytes() -> int:
    """Return this process's resident set size now (Linux ``/proc``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Return a markdown table."""
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


def machine() -> str:
    """Return one line naming what the numbers were measured on."""
    packages = ", ".join(f"{name} {version(name)}" for name in ("prefect", "httpx", "pydantic"))
    return (
        f"{platform.system()} {platform.machine()}, nproc {os.cpu_count()}, "
        f"Python {platform.python_version()}, {packages}"
    )


class CountingProxy:
    """A loopback reverse proxy in front of a Prefect server that counts the requests it passes:
    how many requests a process pointed at it (``PREFECT_API_URL`` = :attr:`api_url`) makes.

    Plain HTTP requests only (no websockets: the watcher's events are not counted, nor needed).
    """

    def __init__(self, upstream_api_url: str) -> None:
        import http.server
        import threading

        self.count = 0
        self._lock = threading.Lock()
        upstream = upstream_api_url.rstrip("/").removesuffix("/api")
        client = httpx.Client(base_url=upstream, timeout=120)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                with proxy._lock:
                    proxy.count += 1
                answer = client.request(self.command, self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection",
                                           "content-encoding"):  # fmt: skip
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_url = f"http://127.0.0.1:{self._server.server_address[1]}/api"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._client = client

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
