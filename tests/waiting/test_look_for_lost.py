"""The watcher looks for lost flow runs on a short clock of its own, whatever its sweeps do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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


async def test_lost_runs_are_looked_for_while_a_sweep_waits_on_a_backend(
    monkeypatch: pytest.MonkeyPatch,
):
    # A sweep may wait a whole --wait (30 s) on a backend's long-poll, and a full listing comes
    # every --list-every: a run whose alive beats stopped was found up to that much past its
    # 40 s. The runs that hold a process are looked at on their own clock meanwhile.
    listed: list[tuple[StateType, ...]] = []
    judged: list[list[FlowRun]] = []
    sweeping = asyncio.Event()

    async def watched(*states: StateType) -> list[FlowRun]:
        listed.append(states)
        return []

    async def recover(self: Recovery, seen: list[FlowRun] | None = None) -> None:
        judged.append(seen or [])

    async def long_sweep(self: Watcher) -> None:
        sweeping.set()
        await asyncio.sleep(3600)  # a long-poll on a backend that has nothing to say

    monkeypatch.setattr(watcher_module, "watched_flow_runs", watched)
    monkeypatch.setattr(Recovery, "recover", recover)
    monkeypatch.setattr(Watcher, "sweep", long_sweep)
    watcher = Watcher(wait=30.0, look_for_lost_every=0.05)
    stop = asyncio.Event()
    running = asyncio.ensure_future(watcher.run(stop))
    try:
        await asyncio.wait_for(sweeping.wait(), 5)
        async with asyncio.timeout(5):
            while len(judged) < 3:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        running.cancel()
        await asyncio.wait([running])
    assert len(judged) >= 3
    # Only the states that hold a process: never every suspended run, however many wait.
    assert set(listed[0]) == {StateType.RUNNING, StateType.PENDING, StateType.CRASHED}


async def test_a_failed_look_for_lost_runs_is_followed_by_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import httpx

    looks = 0

    async def unreachable(*states: StateType) -> list[FlowRun]:
        nonlocal looks
        looks += 1
        raise httpx.ConnectError("Prefect is restarting")

    async def long_sweep(self: Watcher) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(watcher_module, "watched_flow_runs", unreachable)
    monkeypatch.setattr(Watcher, "sweep", long_sweep)
    watcher = Watcher(wait=30.0, look_for_lost_every=0.05)
    stop = asyncio.Event()
    running = asyncio.ensure_future(watcher.run(stop))
    try:
        async with asyncio.timeout(5):
            while looks < 2:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        running.cancel()
        await asyncio.wait([running])
    assert "A look for lost flow runs failed" in caplog.text
