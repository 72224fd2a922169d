"""The watcher looks for lost flow runs on a short clock of its own, whatever its sweeps do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from prefect.client.schemas.objects import FlowRun, StateType

from prefect_ito.waiting import watcher as watcher_module
from prefect_ito.waiting.recovery import Recovery
from prefect_ito.waiting.watcher import Watcher


@pytest.fixture(autouse=True)
def no_prefect_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open no Prefect client: these watchers read Prefect only through the fakes below."""

    @asynccontextmanager
    async def none() -> AsyncIterator[None]:
        yield

    monkeypatch.setattr(watcher_module, "_one_prefect_client", none)


async def run_watcher_until(
    done: Callable[[], bool], sweeping: asyncio.Event | None = None
) -> None:
    """Run a watcher that looks for lost runs every 50 ms until ``done()``; then stop it."""
    watcher = Watcher(wait=30.0, look_for_lost_every=0.05)
    stop = asyncio.Event()
    running = asyncio.ensure_future(watcher.run(stop))
    try:
        if sweeping is not None:
            await asyncio.wait_for(sweeping.wait(), 5)
        async with asyncio.timeout(5):
            while not done():
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        running.cancel()
        await asyncio.wait([running])


def sweeping_forever(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make every sweep wait as a long-poll on a backend with nothing to say; return an event
    set once one began."""
    sweeping = asyncio.Event()

    async def long_sweep(self: Watcher) -> None:
        sweeping.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(Watcher, "sweep", long_sweep)
    return sweeping


async def test_lost_runs_are_looked_for_while_a_sweep_waits_on_a_backend(
    monkeypatch: pytest.MonkeyPatch,
):
    # A sweep may wait a whole --wait (30 s) on a backend's long-poll, and a full listing comes
    # every --list-every: a run whose alive beats stopped was found up to that much past its
    # 40 s. The runs that hold a process are looked at on their own clock meanwhile.
    listed: list[tuple[StateType, ...]] = []
    judged: list[list[FlowRun]] = []

    async def watched(*states: StateType) -> list[FlowRun]:
        listed.append(states)
        return []

    async def recover(self: Recovery, seen: list[FlowRun] | None = None) -> None:
        judged.append(seen or [])

    monkeypatch.setattr(watcher_module, "watched_flow_runs", watched)
    monkeypatch.setattr(Recovery, "recover", recover)
    await run_watcher_until(lambda: len(judged) >= 3, sweeping_forever(monkeypatch))
    assert len(judged) >= 3
    # Only the states that hold a process: never every suspended run, however many wait.
    assert set(listed[0]) == {StateType.RUNNING, StateType.PENDING, StateType.CRASHED}


async def test_a_failed_look_for_lost_runs_is_followed_by_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    looks = 0

    async def unreachable(*states: StateType) -> list[FlowRun]:
        nonlocal looks
        looks += 1
        raise httpx.ConnectError("Prefect is restarting")

    monkeypatch.setattr(watcher_module, "watched_flow_runs", unreachable)
    sweeping_forever(monkeypatch)
    await run_watcher_until(lambda: looks >= 2)
    assert "A look for lost flow runs failed" in caplog.text
