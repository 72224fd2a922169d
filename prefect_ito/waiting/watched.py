"""The flow runs a watcher looks after: training flow runs from deployments."""

from __future__ import annotations

from prefect import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort

__all__ = ["FLOW_NAMES", "in_state", "watched_flow_runs"]

FLOW_NAMES = ("ito-training", "ito-attach-training")
"""The flows whose runs a watcher looks after."""

_PAGE = 200


async def watched_flow_runs(*states: StateType) -> list[FlowRun]:
    """Return the training flow runs from deployments in any of ``states``, every page of them.

    Prefect's server answers at most a page (200 by default) per request, whatever is asked.
    """
    found: list[FlowRun] = []
    async with get_client() as client:
        while True:
            page = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOW_NAMES))),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(states))),
                    # Only a run from a deployment suspends, and only a worker re-enters one.
                    deployment_id=FlowRunFilterDeploymentId(is_null_=False),
                ),
                sort=FlowRunSort.ID_DESC,
                offset=len(found),
                limit=_PAGE,
            )
            found += page
            if len(page) < _PAGE:
                return found


def in_state(flow_runs: list[FlowRun], state: StateType) -> list[FlowRun]:
    """Return those of ``flow_runs`` in ``state``, in their order."""
    return [run for run in flow_runs if run.state is not None and run.state.type == state]
