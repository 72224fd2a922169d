"""Shared plumbing for the benchmarks: isolation, a simulator in its own process, statistics.

Importing this module points Prefect at a throwaway home first, so a benchmark never reads or
writes the user's Prefect state. The simulator runs in a child process (see
:class:`RemoteSimulator`), so the benchmark process measures the client alone: its CPU time, its
memory, and no contention with the server for the GIL.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
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

from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization  # noqa: E402
from prefect_ito.contract import BookingStatus  # noqa: E402
from prefect_ito.jobs import ItoTrainingJob  # noqa: E402
from prefect_ito.parameters import TrainingParameters  # noqa: E402
from prefect_ito.simulator import (  # noqa: E402
    RequestLogEntry,
    RunScript,
    Scenario,
    SimBooking,
    SimulatorServer,
    builtin_scenario,
)

BOOKING = "bk-h200-2x8-ib"
"""A completed booking every built-in scenario holds."""
STARTUP_SECONDS = 60.0


# --- the simulator, in a child process ---------------------------------------------------------


def _serve(scenario_json: str, conn: Connection) -> None:
    """Child process: serve one simulator and answer admin calls until told to stop."""
    calls = {"mint_token", "load_scenario", "requests"}
    with SimulatorServer(Scenario.model_validate_json(scenario_json)) as sim:
        conn.send(sim.url)
        while (message := conn.recv()) is not None:
            name, args = message
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
    """Mint a token and put it where ``ItoCredentials`` looks first: ``ITO_COMPUTE_TOKEN``."""
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
    update: dict[str, Any] = {"run": run, "time_scale": time_scale}
    if bookings is not None:
        update["bookings"] = [
            SimBooking(booking_id=booking_id(i), status=BookingStatus.COMPLETED)
            for i in range(bookings)
        ]
    return Scenario.model_validate({**base.model_dump(), **update})


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
        authorization=standing_authorization(),
    )


def standing_authorization() -> ItoSpendAuthorization:
    """Return the standing authorization the benchmarks' runs are confirmed under (simulator)."""
    return ItoSpendAuthorization(
        authorized_by="prefect-ito benchmarks",
        max_budget_usd=1e9,
        booking_ids=["bk-*"],
        expires_at=datetime.now(UTC) + timedelta(days=1),
        note="benchmarks against the reference simulator, which spends nothing",
    )


def real_instant(at: datetime, sim: Scenario, loaded_at: float) -> float:
    """Return the monotonic instant a simulated timestamp falls on, for a scenario loaded then."""
    return loaded_at + (at - sim.start_at).total_seconds() / sim.time_scale


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
    rank = max(0, -(-9 * len(ordered) // 10) - 1)
    return Summary(len(ordered), statistics.median(ordered), ordered[rank], ordered[-1])


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
