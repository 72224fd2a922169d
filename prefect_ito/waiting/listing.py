"""The watcher's listings of Prefect's flow runs, each a task of its own beside the sweeps.

A listing reads every watched flow run, 200 a page: at 5,000 deferred runs, 8–11 s of the
Prefect server's time. A change the backend's feed names meanwhile is handled from the last
listing (:class:`Listing`, kept until the next one is in), so that it waits for its own run's
reads and resume, not for the listing. What a listing found is taken in between two steps of a
sweep, never in the middle of one: see ``Watcher._install``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from prefect.client.schemas.objects import FlowRun

from prefect_ito.waiting.deferral import Deferral
from prefect_ito.waiting.waiters import Waiters, Waiting
from prefect_ito.waiting.waits import WaitRecord

__all__ = ["Asking", "BackendKey", "Listed", "Listing", "Relisting"]

T = TypeVar("T")

Asking = tuple[FlowRun, WaitRecord]
BackendKey = tuple[str, str | None]
"""A backend as a record names it: its API URL, and the keyring entry of its token."""


@dataclass(frozen=True)
class Listed:
    """What one listing read: the suspended flow runs (less those it re-entered), the deferred
    ones with their records, and those asking a person with theirs."""

    paused: list[FlowRun]
    deferred: list[Waiting]
    asking: list[Asking]


@dataclass
class Listing:
    """What the last listing of suspended flow runs showed, kept until the next one.

    ``deferred`` holds, per backend, the deferred runs still to be resumed by the backend run
    each waits on; ``known`` every backend run a listed deferral names, resumed or not.
    """

    deferred: dict[BackendKey, Waiters] = field(default_factory=dict)
    asking: dict[BackendKey, list[Asking]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)

    def add_deferred(self, item: Waiting) -> None:
        self.known.add(item[1].run_id)
        self.deferred.setdefault(_backend_of(item[1]), Waiters()).add(item)

    def waiters(self, record: Deferral) -> Waiters | None:
        """Return the flow runs still waited on at ``record``'s backend."""
        return self.deferred.get(_backend_of(record))


def by_backend(asking: list[Asking]) -> dict[BackendKey, list[Asking]]:
    """Group the runs that ask a person by the backend their record names."""
    groups: dict[BackendKey, list[Asking]] = {}
    for flow_run, record in asking:
        groups.setdefault((record.api_url, record.keyring_entry), []).append((flow_run, record))
    return groups


def _backend_of(record: Deferral) -> BackendKey:
    return (record.api_url, record.keyring_entry)


@dataclass
class Relisting:
    """When the next listing is due, and the one under way.

    A listing is due ``every`` seconds after the last one started, or at once when asked for
    (:meth:`ask`: a change named a backend run no listing showed, a flow run was suspending as
    it was listed). One asked for while another is under way comes after it: the one under way
    may have read its page before what asked for it happened.
    """

    every: float
    _asked: bool = False
    _started_at: float | None = None
    _task: asyncio.Task[Listed] | None = None
    _task_asked: bool = False

    def ask(self) -> None:
        """Ask for a listing as soon as none is under way."""
        self._asked = True

    def start_if_due(self, make: Callable[[], Awaitable[Listed]]) -> None:
        """Start a listing, ``make()``, as a task of its own if one is due and none is under way."""
        if self._task is not None:
            return
        started = self._started_at
        if not self._asked and started is not None and time.monotonic() - started < self.every:
            return
        self._task_asked, self._asked = self._asked, False
        self._started_at = time.monotonic()
        self._task = asyncio.ensure_future(make())

    def take(self) -> Listed | None:
        """Return what the listing under way found once it ended (None: none ended); raise what
        it raised, and ask for the next one then."""
        task = self._task
        if task is None or not task.done():
            return None
        return self._result(task)

    async def wait(self) -> Listed:
        """Wait for the listing under way (one must be) to end; return what it found."""
        task = self._task
        assert task is not None
        await asyncio.wait([task])
        return self._result(task)

    async def ended(self) -> None:
        """Wait until the listing under way, if any, ended (what it found is left to take)."""
        if self._task is not None:
            await asyncio.wait([self._task])

    async def unless_asked_ends(self, call: Awaitable[T]) -> T | None:
        """Await ``call``; but if a listing someone asked for ends first, cancel ``call`` and
        return None, so that what the listing found is taken now, not at the end of a long-poll.

        A periodic listing interrupts nothing: it would cost a long-poll each time (and an
        idle watcher's requests are counted).
        """
        task = self._task
        if task is None or not (self._task_asked or self._asked):
            return await call
        waiting = asyncio.ensure_future(call)
        try:
            await asyncio.wait([waiting, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.wait([waiting])
        return None if waiting.cancelled() else waiting.result()

    async def stop(self) -> None:
        """Cancel the listing under way, if any."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    def _result(self, task: asyncio.Task[Listed]) -> Listed:
        self._task = None
        if task.cancelled() or task.exception() is not None:
            self._asked = True  # the next sweep lists again, as it would have without this one
        return task.result()
