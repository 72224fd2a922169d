"""Supervising N runs at once in one process: wall time, backend requests and memory per run.

For each N, a scenario with N completed bookings is loaded, one ``ItoTrainingJob`` per booking is
triggered, and every ``ItoTrainingRun.wait_for_completion()`` is awaited with ``asyncio.gather``:
the path a user takes, with the default 30 s long-poll wait. Runs need no decision (the built-in
``default`` script), so no Prefect server is involved.

Each N is run twice: once timed, sampling this process's RSS every 10 ms, and once under
``tracemalloc`` (which slows Python down, so its times are not reported). The simulator runs in
its own process, so the memory is the client's alone.
Run: ``uv run python benchmarks/supervision_scale.py`` (about 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass

from _bench import (
    RemoteSimulator,
    booking_id,
    machine,
    ms,
    real_instant,
    rss_bytes,
    scenario,
    summarise,
    table,
    training_job,
    use_token,
)

from prefect_ito.contract import RunState
from prefect_ito.jobs import ItoTrainingRun

SIZES = (1, 10, 50)
WARMUP_SIZE = 2
TIME_SCALE = 400_000.0
KIB = 1024
TARGET_KIB_PER_RUN = 1024
RSS_SAMPLE_SECONDS = 0.01


@dataclass
class Supervised:
    """What supervising N runs at once took."""

    n: int
    wall: float
    duration: float
    lags: list[float]
    requests: int
    reads: list[int]
    memory: int = 0


@contextlib.asynccontextmanager
async def peak_rss() -> AsyncIterator[list[int]]:
    """Sample RSS while the block runs; yield a one-item list holding the growth at the peak."""
    baseline = rss_bytes()
    growth = [0]

    async def sample() -> None:
        while True:
            growth[0] = max(growth[0], rss_bytes() - baseline)
            await asyncio.sleep(RSS_SAMPLE_SECONDS)

    sampler = asyncio.create_task(sample())
    try:
        yield growth
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        growth[0] = max(growth[0], rss_bytes() - baseline)


async def supervise(sim: RemoteSimulator, n: int) -> Supervised:
    """Trigger N jobs and wait for them all; return timings and the backend's request count."""
    sim_scenario = scenario(time_scale=TIME_SCALE, bookings=n)
    loaded_at, _ = sim.load_scenario(sim_scenario)
    jobs = [training_job(sim.url, booking_id(i)) for i in range(n)]
    done: dict[str, float] = {}

    async def wait(handle: ItoTrainingRun) -> None:
        await handle.wait_for_completion()
        done[handle.run_id] = time.monotonic()

    started = time.monotonic()
    handles = await asyncio.gather(*(job.trigger() for job in jobs))
    await asyncio.gather(*(wait(handle) for handle in handles))
    wall = time.monotonic() - started
    runs = [handle.run for handle in handles]
    if sum(run.state is RunState.SUCCEEDED for run in runs) != n:
        raise SystemExit(f"not every run succeeded with N={n}")
    log = sim.requests()
    return Supervised(
        n=n,
        wall=wall,
        duration=statistics.median(
            (run.updated_at - run.created_at).total_seconds() / TIME_SCALE for run in runs
        ),
        lags=[
            done[r.run_id] - real_instant(r.updated_at, r, sim_scenario, loaded_at) for r in runs
        ],
        requests=sum(entry.path.startswith("/v0/") for entry in log),
        reads=[sum(e.path == f"/v0/training-runs/{r.run_id}" for e in log) for r in runs],
    )


async def timed(sim: RemoteSimulator, n: int) -> Supervised:
    """Supervise N runs, recording the peak RSS growth."""
    async with peak_rss() as growth:
        result = await supervise(sim, n)
    result.memory = growth[0]
    return result


async def traced(sim: RemoteSimulator, n: int) -> int:
    """Supervise N runs under ``tracemalloc``; return the peak traced growth in bytes."""
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        await supervise(sim, n)
        return tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()


def row(result: Supervised, traced_bytes: int) -> list[object]:
    """Return the table row of one N."""
    lag = summarise(result.lags)
    return [
        result.n,
        f"{result.wall:.2f}",
        f"{result.duration:.2f}",
        f"{result.wall / result.duration:.2f}",
        f"{ms(lag.median)} / {ms(lag.p90)}",
        f"{result.requests / result.n:.1f}",
        f"{statistics.median(result.reads):g}",
        f"{result.memory / result.n / KIB:.0f}",
        f"{traced_bytes / result.n / KIB:.0f}",
    ]


async def main() -> None:
    """Run every N and print the table and the verdict."""
    print(f"# Supervision at scale\n\n{machine()}\n")
    rows: list[list[object]] = []
    per_run: list[float] = []
    with RemoteSimulator(scenario(time_scale=TIME_SCALE)) as sim:
        use_token(sim)
        await supervise(sim, WARMUP_SIZE)  # imports, caches and pools, so N=1 starts warm
        for n in SIZES:
            result = await timed(sim, n)
            traced_bytes = await traced(sim, n)
            rows.append(row(result, traced_bytes))
            per_run.append(max(result.memory, traced_bytes) / n / KIB)
    headers = ["N", "wall s", "run s", "wall/run", "finish→return ms (median / p90)"]
    more = ["/v0 requests per run", "reads of its run per run", "peak RSS KiB/run"]
    print(table([*headers, *more, "tracemalloc peak KiB/run"], rows))
    met = max(per_run[1:]) < TARGET_KIB_PER_RUN
    print(
        f"\nTarget: < 1 MiB per supervised run (N ≥ 10, the larger of RSS and tracemalloc): "
        f"{'met' if met else 'NOT met'}."
    )


if __name__ == "__main__":
    asyncio.run(main())
