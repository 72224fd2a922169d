"""What ``ItoClient`` costs over raw httpx: auth, the retry loop, envelope and model parsing.

Each read is made both ways, alternating which goes first so drift on a shared machine hits both
equally: ``ItoClient.get_training_run`` / ``get_capabilities`` (parsed into contract models),
and ``httpx.AsyncClient.get`` with the bearer header plus ``json.loads`` on the same URL.

Two transports: the simulator over loopback (end to end), and ``httpx.MockTransport`` replaying
the very same answer bytes, which leaves only the client-side CPU cost.
Run: ``uv run python benchmarks/client_overhead.py`` (about 40 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from _bench import (
    RemoteSimulator,
    machine,
    scenario,
    summarise,
    table,
    training_job,
    us,
    use_token,
)
from pydantic import SecretStr

from prefect_ito.backend.client import ItoClient

LOOPBACK_CALLS = 150
IN_MEMORY_CALLS = 2_000
WARMUP_CALLS = 20
TARGET_RATIO = 1.5

Call = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Endpoint:
    """One read, made through ``ItoClient`` and through raw httpx."""

    name: str
    path: str
    read: Callable[[ItoClient], Awaitable[object]]


def raw_read(http: httpx.AsyncClient, path: str) -> Call:
    """Return a raw read: GET and ``json.loads``, nothing else."""

    async def call() -> object:
        return json.loads((await http.get(path)).content)

    return call


async def alternate(first: Call, second: Call, calls: int) -> tuple[list[float], list[float]]:
    """Time ``calls`` of each, alternating which one goes first; return both sets of seconds."""
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(WARMUP_CALLS + calls):
        order = (0, 1) if index % 2 else (1, 0)
        for side in order:
            started = time.perf_counter()
            await (first, second)[side]()
            if index >= WARMUP_CALLS:
                times[side].append(time.perf_counter() - started)
    return times


async def compare(
    label: str, endpoint: Endpoint, ito: ItoClient, http: httpx.AsyncClient, calls: int
) -> tuple[list[object], float]:
    """Time one endpoint both ways; return its table row and the ratio of medians."""
    raw, wrapped = await alternate(raw_read(http, endpoint.path), lambda: endpoint.read(ito), calls)
    size = len((await http.get(endpoint.path)).content)
    raw_stats, ito_stats = summarise(raw), summarise(wrapped)
    ratio = ito_stats.median / raw_stats.median
    row: list[object] = [
        label,
        endpoint.name,
        f"{size / 1024:.1f}",
        f"{us(raw_stats.median)} / {us(raw_stats.p90)}",
        f"{us(ito_stats.median)} / {us(ito_stats.p90)}",
        f"{ratio:.2f}x",
    ]
    return row, ratio


def replay(url: str, token: str, endpoints: list[Endpoint]) -> httpx.MockTransport:
    """Return a transport answering each endpoint with the bytes the simulator sent for it."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        answers = {e.path: http.get(e.path) for e in endpoints}

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers[request.url.path]
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    return httpx.MockTransport(handler)


async def measure(
    label: str, url: str, token: str, endpoints: list[Endpoint], calls: int, mock: bool
) -> list[tuple[list[object], float]]:
    """Compare every endpoint over the simulator, or over a replay of its answers."""
    transport = replay(url, token, endpoints) if mock else None
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        ItoClient(url, SecretStr(token), transport=transport) as ito,
        httpx.AsyncClient(base_url=url, headers=auth, transport=transport) as http,
    ):
        return [await compare(label, endpoint, ito, http, calls) for endpoint in endpoints]


async def main() -> None:
    """Measure both transports and print the table and the verdict."""
    print(f"# Client overhead: ItoClient vs raw httpx\n\n{machine()}\n")
    with RemoteSimulator(scenario(time_scale=4e6)) as sim:
        use_token(sim)
        job = training_job(sim.url)
        handle = await job.trigger()
        await handle.wait_for_completion()
        run_id = handle.run_id
        endpoints = [
            Endpoint(
                "finished run", f"/v0/training-runs/{run_id}", lambda c: c.get_training_run(run_id)
            ),
            Endpoint("capabilities", "/v0/capabilities", lambda c: c.get_capabilities()),
        ]
        token = sim.mint_token()
        loopback = await measure("loopback", sim.url, token, endpoints, LOOPBACK_CALLS, False)
        in_memory = await measure("in memory", sim.url, token, endpoints, IN_MEMORY_CALLS, True)
    headers = ["transport", "endpoint", "answer KiB", "raw httpx µs (median / p90)"]
    rows = [row for row, _ in loopback + in_memory]
    print(table([*headers, "ItoClient µs (median / p90)", "ratio of medians"], rows))
    worst = max(ratio for _, ratio in loopback)
    verdict = "met" if worst <= TARGET_RATIO else "NOT met"
    print(f"\nTarget: ItoClient ≤ {TARGET_RATIO}x raw httpx end to end (loopback): {verdict}.")
    print(f"Client-side only (in memory), worst ratio: {max(r for _, r in in_memory):.2f}x.")


if __name__ == "__main__":
    asyncio.run(main())
