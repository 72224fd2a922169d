"""Long-poll wake latency, and a long-poll loop against a 1 s short-poll loop on the same run.

Two clients follow one simulated run at the same time: one long-polls (``after_version``,
``wait=10``), the other reads the run once a second. Every change of the run is one event, so
event ``seq`` is version ``seq + 1``, and its ``at`` is the scripted instant of that change. The
simulated clock is mapped onto the shared monotonic clock from the moment the scenario was
loaded, so each change's delay is measured as: when a client first held that version (or a later
one), minus when the change was due. The simulator publishes changes on a 20 ms tick, so the
delay includes up to 20 ms of that tick: it is an upper bound on the wake latency.

Two phases: ``dense`` (a change every ~0.2 s, far more often than the short poll) and ``sparse``
(a change every ~1.5 s). Run: ``uv run python benchmarks/longpoll_latency.py`` (about 70 s).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from _bench import (
    Observer,
    RemoteSimulator,
    Summary,
    due_instants,
    machine,
    ms,
    scenario,
    summarise,
    table,
    training_job,
    use_token,
)

from prefect_ito.backend.client import ItoClient

WAIT_SECONDS = 10.0
SHORT_POLL_SECONDS = 1.0
TARGET_MEDIAN_SECONDS = 0.100


@dataclass(frozen=True)
class Phase:
    """How often the run changes: checkpoints per stage, and how fast simulated time runs."""

    name: str
    segments_per_stage: int
    time_scale: float


PHASES = (Phase("dense", 20, 80_000.0), Phase("sparse", 1, 50_000.0))


async def long_poll(client: ItoClient, run_id: str, observer: Observer) -> None:
    """Follow the run by long-polling on its version until it finishes."""
    run = observer.record(await client.get_training_run(run_id))
    while not run.state.terminal:
        run = observer.record(
            await client.get_training_run(run_id, after_version=run.version, wait=WAIT_SECONDS)
        )


async def short_poll(
    client: ItoClient, run_id: str, observer: Observer, every: float = SHORT_POLL_SECONDS
) -> None:
    """Follow the run by reading it every ``every`` seconds until it finishes."""
    next_read = time.monotonic()
    while not observer.record(await client.get_training_run(run_id)).state.terminal:
        next_read += every
        await asyncio.sleep(max(0.0, next_read - time.monotonic()))


@dataclass(frozen=True)
class Result:
    """How one loop fared over one phase."""

    phase: str
    mode: str
    requests: int
    changes: int
    delay: Summary

    def row(self) -> list[object]:
        per_change = f"{self.requests / self.changes:.2f}"
        delay = self.delay
        return [self.phase, self.mode, self.requests, per_change, *map(ms, delay.spread())]


async def run_phase(sim: RemoteSimulator, phase: Phase) -> list[Result]:
    """Follow one run with both loops; return how each fared."""
    sim_scenario = scenario(
        time_scale=phase.time_scale, segments_per_stage=phase.segments_per_stage
    )
    loaded_at, uncertainty = sim.load_scenario(sim_scenario)
    job = training_job(sim.url)
    run = (await job.trigger()).run
    observers = Observer("long-poll (wait 10 s)"), Observer("short-poll (every 1 s)")
    async with job.credentials.get_client() as longs, job.credentials.get_client() as shorts:
        since = time.monotonic()
        await asyncio.gather(
            long_poll(longs, run.run_id, observers[0]), short_poll(shorts, run.run_id, observers[1])
        )
        due = await due_instants(longs, run.run_id, sim_scenario, loaded_at, since)
    duration = time.monotonic() - since
    served = sum(e.path == f"/v0/training-runs/{run.run_id}" for e in sim.requests())
    print(
        f"- {phase.name}: {len(due)} changes in {duration:.1f} s (one every "
        f"{duration / len(due) * 1000:.0f} ms on average); clock mapping ±{ms(uncertainty)} ms; "
        f"reads of the run served: {served}"
    )
    return [
        Result(phase.name, o.mode, len(o.seen), len(due), summarise(o.delays(due)))
        for o in observers
    ]


async def main() -> None:
    """Run both phases and print the table and the verdict."""
    print(f"# Long-poll wake latency\n\n{machine()}\n")
    results: list[Result] = []
    with RemoteSimulator(scenario(time_scale=PHASES[0].time_scale)) as sim:
        use_token(sim)
        for phase in PHASES:
            results.extend(await run_phase(sim, phase))
    headers = ["phase", "client", "requests", "requests/change", "delay median ms", "p90 ms"]
    print("\n" + table([*headers, "max ms"], [result.row() for result in results]))
    long_polls = [r for r in results if r.mode.startswith("long")]
    met = all(r.delay.median < TARGET_MEDIAN_SECONDS for r in long_polls)
    print(
        f"\nTarget: long-poll median delay < 100 ms in every phase: {'met' if met else 'NOT met'}."
    )
    for short, long in zip(results[1::2], long_polls, strict=True):
        print(
            f"- {short.phase}: short-poll / long-poll: requests "
            f"{short.requests / long.requests:.2f}x, "
            f"median staleness {short.delay.median / long.delay.median:.1f}x"
        )


if __name__ == "__main__":
    asyncio.run(main())
