"""One artifact per card on the flow run, updated in place when — and only when — it changed.

The Prefect UI's Artifacts tab of a flow run shows every artifact row attached to the run, one
card per row, so a new version for every report made a wall of near-identical cards (checked in
Prefect 3.9.1's UI). Here each card key has exactly one artifact per flow run: the first report
creates it, attached to the flow run (never to a task run, even when published from inside one of
the flow's tasks); later reports update it in place, and a report that changes nothing sends
nothing. A re-entered flow run (a resumed suspension runs the flow again in a new process) finds
its artifact by key and flow run and goes on updating it. Another flow run supervising the same
backend run (a re-run after a crash, ``prefect-ito attach``) adds a version of the key attached to
itself, so the key's timeline lists one version per supervising flow run, and its latest is the
truth.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.client.schemas.sorting import ArtifactSort
from prefect.context import FlowRunContext

__all__ = ["Card", "Publisher"]

_REMEMBERED = 512
"""Cards remembered per process; a long-lived worker process supervises many flow runs."""


@dataclass(frozen=True)
class Card:
    """An artifact's content: what Prefect stores for its key.

    ``metadata`` holds short machine-readable facts (Prefect keeps up to 500 characters a value)
    for ``prefect-ito status``, which reads them back without asking the backend.
    """

    key: str
    type: Literal["markdown", "table", "progress"]
    data: str | float | list[dict[str, Any]]
    description: str
    metadata: dict[str, str] = field(default_factory=dict)

    def stored_data(self) -> str | float:
        """Return the data as Prefect stores it: a table travels as a JSON string."""
        if isinstance(self.data, list):
            return json.dumps(self.data)
        return self.data

    def fingerprint(self) -> str:
        """Return what tells two versions of the card apart."""
        return _fingerprint(self.stored_data(), self.description, self.metadata)


def _fingerprint(data: Any, description: str | None, metadata: dict[str, str] | None) -> str:
    if isinstance(data, int | float):
        data = float(data)  # a progress of 25.0 comes back from Prefect as 25
    return json.dumps([data, description or "", metadata or {}], sort_keys=True, default=str)


class Publisher:
    """Keeps each card as one artifact on the current flow run; see the module docstring."""

    def __init__(self) -> None:
        # (flow run, key) → (artifact id, fingerprint of what it holds)
        self._known: OrderedDict[tuple[UUID, str], tuple[UUID, str]] = OrderedDict()

    async def publish(self, cards: list[Card]) -> int:
        """Create or update each card's artifact on this flow run; return how many were written.

        Outside a flow run nothing is written: Prefect keeps artifacts of runs.
        """
        context = FlowRunContext.get()
        if context is None or context.flow_run is None:
            return 0
        flow_run_id = context.flow_run.id
        async with get_client() as client:
            writes = [await self._publish(client, flow_run_id, card) for card in cards]
        return sum(writes)

    async def _publish(self, client: PrefectClient, flow_run_id: UUID, card: Card) -> bool:
        slot = (flow_run_id, card.key)
        known = self._known.get(slot) or await _find(client, flow_run_id, card.key)
        fingerprint = card.fingerprint()
        if known is not None and known[1] == fingerprint:
            self._remember(slot, known)
            return False
        if known is None:
            created = await client.create_artifact(
                ArtifactCreate(
                    key=card.key,
                    type=card.type,
                    description=card.description,
                    data=card.stored_data(),
                    metadata_=card.metadata,
                    flow_run_id=flow_run_id,
                    task_run_id=None,
                )
            )
            self._remember(slot, (created.id, fingerprint))
            return True
        await client.update_artifact(
            known[0],
            ArtifactUpdate(
                data=card.stored_data(), description=card.description, metadata_=card.metadata
            ),
        )
        self._remember(slot, (known[0], fingerprint))
        return True

    def _remember(self, slot: tuple[UUID, str], known: tuple[UUID, str]) -> None:
        self._known[slot] = known
        self._known.move_to_end(slot)
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)


async def _find(client: PrefectClient, flow_run_id: UUID, key: str) -> tuple[UUID, str] | None:
    """Return the artifact this flow run already holds under ``key``, as a re-entry finds it."""
    found = await client.read_artifacts(
        artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
        ),
        sort=ArtifactSort.CREATED_DESC,
        limit=1,
    )
    if not found:
        return None
    artifact = found[0]
    return artifact.id, _fingerprint(artifact.data, artifact.description, artifact.metadata_)
