"""Which deferred flow run waits on which backend run, kept between listings of Prefect's flow runs.

A watcher lists every suspended flow run only now and then; between listings a change on the
backend names a run, and the watcher must find the flow runs waiting on it, and the runs whose
watchdog limit comes due, without looking at every deferred run: at thousands of them, that look
was the cost of every change.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from uuid import UUID

from prefect.client.schemas.objects import FlowRun

from prefect_ito.waiting.deferral import Deferral

__all__ = ["Waiters", "Waiting"]

Waiting = tuple[FlowRun, Deferral]
"""A deferred flow run, and the record it wrote of the backend run it waits on."""


@dataclass
class Waiters:
    """The deferred flow runs of one backend still to be resumed, by the backend run each waits
    on, and when each backend run is next to be read though no change named it (a watchdog limit,
    or a resume another watcher claimed going stale).

    The times are kept in a heap: an entry whose run was scheduled again since is stale, and
    skipped when it comes up.
    """

    by_run: dict[str, list[Waiting]] = field(default_factory=dict)
    _scheduled: dict[str, float] = field(default_factory=dict)
    _heap: list[tuple[float, str]] = field(default_factory=list)

    def add(self, item: Waiting) -> None:
        """Wait on ``item``'s backend run for its flow run too."""
        self.by_run.setdefault(item[1].run_id, []).append(item)

    def drop(self, flow_run_id: UUID, run_id: str) -> None:
        """Stop waiting for a flow run (resumed, or gone); a run nobody waits on is forgotten."""
        left = [item for item in self.by_run.get(run_id, []) if item[0].id != flow_run_id]
        if left:
            self.by_run[run_id] = left
            return
        self.by_run.pop(run_id, None)
        self._scheduled.pop(run_id, None)

    def waiting_on(self, run_ids: Iterable[str]) -> list[Waiting]:
        """Return the flow runs that wait on any of ``run_ids``."""
        return [item for run_id in run_ids for item in self.by_run.get(run_id, [])]

    def every(self) -> list[Waiting]:
        """Return every flow run still waited on."""
        return [item for items in self.by_run.values() for item in items]

    def schedule(self, run_id: str, at: float) -> None:
        """Read ``run_id`` at ``at`` (wall-clock seconds) unless a change names it first; an
        infinite ``at`` reads it only on a change."""
        if run_id not in self.by_run or self._scheduled.get(run_id) == at:
            return
        if math.isinf(at):
            self._scheduled.pop(run_id, None)
            return
        self._scheduled[run_id] = at
        heapq.heappush(self._heap, (at, run_id))

    def pop_due(self, now: float) -> list[str]:
        """Return the runs scheduled at or before ``now``, no longer scheduled."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            at, run_id = heapq.heappop(self._heap)
            if self._scheduled.get(run_id) == at:
                del self._scheduled[run_id]
                due.append(run_id)
        return due

    def next_at(self) -> float:
        """Return when the next run is scheduled (infinity: none is)."""
        while self._heap and self._scheduled.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else math.inf
