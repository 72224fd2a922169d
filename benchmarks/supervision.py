"""Deferred supervision at scale: what `prefect-ito watch` costs while N training runs wait.

For N = 10, 100 and 500, on a real ``prefect server start`` and the simulator (its own process):

1. N backend runs are submitted on N bookings, with a simulated clock that runs at wall speed, so
   nothing changes by itself during the measurement (stages last hours).
2. N ``ito-training`` flow runs of a deployment are put in exactly the state a deferring flow run
   leaves behind: ``Suspended`` under a ``defer-`` pause key, with its deferral record. No worker
   runs and no flow process exists: a deferred run holds none, which the end-to-end tests check
   on a real worker (``tests/e2e/test_deferred.py``).
3. ``prefect-ito watch`` starts (a child process, like in production). After its first sweep,
   one idle minute is measured: every request the backend received, and the watcher's RSS.
4. Resume latency: 10 backend runs are cancelled at the backend, one by one (a change the flow
   must handle), and the time until their flow runs leave ``Suspended`` is taken.

Recovery (``--only recovery``): the crash trials of ``tests/e2e/test_crashes.py`` — N training
flow runs on a real server, worker and two watchers, each struck at a seeded point (its flow
process or a watcher SIGKILLed), the machine lost once (worker and every flow process), the
server restarted once — counted from the simulator's and Prefect's own records: trials,
runs completed, duplicates (runs, decisions, events, resumes), and the p95 time from a lost flow
process to its flow run running again.

Writes its sections into ``benchmarks/results.json`` (the other sections are kept); figures go to
``docs/benchmarks.md``. In-process supervision at scale is ``supervision_scale.py``; long-poll
against fixed-interval polling is ``longpoll_latency.py``.
Run: ``uv run python benchmarks/supervision.py`` (about twenty minutes on 2 cores), or one section:
``--only deferred`` or ``--only recovery`` (``BENCH_TRIALS``, default 20; ``BENCH_SEED``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PORT = 0
with socket.socket() as _sock:
    _sock.bind(("127.0.0.1", 0))
    PORT = _sock.getsockname()[1]
API_URL = f"http://127.0.0.1:{PORT}/api"
os.environ["PREFECT_API_URL"] = API_URL

from _bench import RemoteSimulator, booking_id, machine, scenario, table  # noqa: E402
from prefect import get_client  # noqa: E402
from prefect.client.schemas.actions import WorkPoolCreate  # noqa: E402
from prefect.states import Running, Suspended  # noqa: E402
from prefect.types.entrypoint import EntrypointType  # noqa: E402

from prefect_ito.blocks import ItoCredentials  # noqa: E402
from prefect_ito.contract import (  # noqa: E402
    ConfirmationVia,
    SpendConfirmation,
    TrainingRun,
)
from prefect_ito.deferral import Deferral, deferral_key  # noqa: E402
from prefect_ito.flows import ito_training  # noqa: E402
from prefect_ito.parameters import BookingClaim, TrainingParameters  # noqa: E402

SIZES = tuple(int(n) for n in os.environ.get("BENCH_SIZES", "10,100,500").split(","))
IDLE_SECONDS = float(os.environ.get("BENCH_IDLE_SECONDS", "60"))
LATENCY_TRIALS = 10
TRIALS = int(os.environ.get("BENCH_TRIALS", "20"))
SEED = int(os.environ.get("BENCH_SEED", "20261201"))
RESULTS = Path(__file__).with_name("results.json")
E2E = Path(__file__).resolve().parents[1] / "tests" / "e2e"
"""Where the crash trials' harness lives, shared with the end-to-end test."""
WATCHER_LOG = Path(tempfile.gettempdir()) / "prefect-ito-bench-watcher.log"


def start_server(home: Path) -> subprocess.Popen[bytes]:
    """Start ``prefect server start`` on PORT and wait until it answers."""
    env = {**os.environ, "PREFECT_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(PORT), "--no-ui"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import httpx

    for _ in range(480):
        try:
            if httpx.get(f"{API_URL}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    server.terminate()
    raise RuntimeError("prefect server did not start")


def rss_mb(pid: int) -> float:
    """Return a process's resident set size in MB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
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


async def submit_runs(url: str, n: int) -> list[TrainingRun]:
    async with ItoCredentials(api_url=url).get_client() as client:
        runs = []
        for i in range(n):
            request = training_for(booking_id(i)).to_request(BookingClaim(booking_id=booking_id(i)))
            quote = await client.quote_training_run(request.to_submission())
            confirmation = SpendConfirmation(
                quote_id=quote.quote_id,
                confirmed_by="prefect-ito benchmarks",
                via=ConfirmationVia.PERSON,
            )
            submission = await client.submit_training_run(
                request.to_submission().confirmed(confirmation), idempotency_key=f"bench-{n}-{i}"
            )
            runs.append(submission.run)
        return runs


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
            fresh = [await client.get_training_run(run.run_id) for run in runs]
            if all(run.current_stage for run in fresh):
                return fresh
            await asyncio.sleep(0.5)


async def defer_flow_runs(deployment: str, url: str, runs: list[TrainingRun]) -> list[str]:
    """Create one suspended flow run per backend run, as a deferring flow run leaves it."""
    ids = []
    async with get_client() as client:
        for run in await settled(url, runs):
            training = training_for(run.booking_id).model_dump(mode="json")
            flow_run = await client.create_flow_run_from_deployment(
                deployment,  # type: ignore[arg-type]
                parameters={"training": training},
            )
            await client.set_flow_run_state(flow_run.id, Running(), force=True)
            key = deferral_key(run)
            record = Deferral(
                api_url=url, run_id=run.run_id, version=run.version, stage=run.current_stage,
                events_seen=0, heartbeat_at=run.heartbeat_at, heartbeat_seen_at=time.time(),
                stall_timeout=None, deadline_at=None,
            )  # fmt: skip
            await client.create_flow_run_input(flow_run.id, key, record.model_dump_json())
            await client.set_flow_run_state(flow_run.id, Suspended(pause_key=key), force=True)
            ids.append(str(flow_run.id))
    return ids


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
        for flow_run in flow_runs:
            await client.delete_flow_run(flow_run)  # type: ignore[arg-type]


def measure(n: int, deployment: str, token: str, sim: RemoteSimulator) -> dict[str, float]:
    runs = asyncio.run(submit_runs(sim.url, n))
    flow_runs = asyncio.run(defer_flow_runs(deployment, sim.url, runs))
    # Nothing resumes before the measurement: every run waits, as it would for hours.
    assert all(asyncio.run(still_suspended(flow_run)) for flow_run in flow_runs[:3])
    env = {**os.environ, "ITO_COMPUTE_TOKEN": token}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "prefect_ito.cli", "watch", "--wait", "30"],
        env=env, stdout=WATCHER_LOG.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # The first sweep reads every deferred run once; then the watcher is idle.
        first = len(sim.requests())
        while (
            sum(1 for r in sim.requests()[first:] if r.path.startswith("/v0/training-runs/run_"))
            < n
        ):
            time.sleep(0.5)
        time.sleep(2)
        before = len(sim.requests())
        time.sleep(IDLE_SECONDS)
        idle = (len(sim.requests()) - before) / (IDLE_SECONDS / 60)
        rss = rss_mb(watcher.pid)
        if os.environ.get("BENCH_DEBUG"):
            for entry in sim.requests()[-12:]:
                print(entry.time.isoformat(), entry.method, entry.path, entry.status)
        latencies = asyncio.run(resume_latencies(sim.url, runs, flow_runs))
    finally:
        watcher.terminate()
        watcher.wait(timeout=60)
    asyncio.run(clear_flow_runs(flow_runs))
    processes = subprocess.run(
        ["pgrep", "-f", "prefect.engine"], capture_output=True, text=True
    ).stdout.split()
    ordered = sorted(latencies)
    return {
        "flow_processes": float(len(processes)),
        "watcher_rss_mb": round(rss, 1),
        "idle_requests_per_minute": round(idle, 2),
        "resume_p50_s": round(statistics.median(ordered), 3),
        "resume_p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
    }


def deferred() -> dict[str, dict[str, float]]:
    """Measure deferred supervision at every size of ``BENCH_SIZES``; see the docstring."""
    home = Path(tempfile.mkdtemp(prefix="prefect-ito-bench-server-"))
    server = start_server(home)
    figures: dict[str, dict[str, float]] = {}
    try:
        deployment = asyncio.run(deployment_id())
        for n in SIZES:
            with RemoteSimulator(scenario(time_scale=1.0, bookings=n)) as sim:
                token = sim.mint_token()
                os.environ["ITO_COMPUTE_TOKEN"] = token
                figures[str(n)] = measure(n, deployment, token, sim)
                print(f"N={n}: {figures[str(n)]}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    rows = [[n, *values.values()] for n, values in figures.items()]
    print(table(["N", *next(iter(figures.values())).keys()], rows))
    return figures


def recovery() -> dict[str, float]:
    """Play the crash trials (``tests/e2e/crash_trials.py``) and return their figures."""
    sys.path.insert(0, str(E2E))
    # The harness is test code (type-checked as tests are), found on sys.path at run time.
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
    figures: dict[str, float] = tally.figures()
    print(table(list(figures), [list(figures.values())]))
    return figures


SECTIONS = {"deferred": deferred, "recovery": recovery}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    chosen = parser.parse_args().only or list(SECTIONS)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in chosen:
        results[name] = SECTIONS[name]()
        # Written after each section, so a long run keeps what it measured.
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(machine())
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
