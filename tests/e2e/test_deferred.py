"""Deferred supervision end to end: a real server, a process worker and `prefect-ito watch`.

A deployment run waits on the backend with no process of its own, is resumed by the watcher when
its run moves, survives the watcher's restart, goes through a person's approval at the backend,
and ends with exactly one backend run. Lost flow processes and lost machines are the crash trials'
(``test_crashes.py``): twenty at once on one stack, where one test of each took as long.
"""

from __future__ import annotations

import pytest
from e2e_stack import (
    ACCOUNT,
    DEFER_BOOKING,
    Stack,
    backend_runs,
    completed,
    decide_as_the_person,
    flow_run_processes,
    on_booking,
    start_training,
    start_watcher,
    wait_for,
    wait_for_flow_run,
)
from prefect import get_client
from processes import stop_process

from prefect_ito.contract import DecisionChoice, DecisionRequest, RunState

SUBMIT = ("POST", "/v0/training-runs")


# SQLite only: a deferral's records and resumes are suspensions and flow-run inputs, which
# test_deployments.py runs on PostgreSQL too.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True),
]


def deferred(flow_run) -> bool:
    return paused_under(flow_run, "defer-")


def awaiting_person(flow_run) -> bool:
    return paused_under(flow_run, "restart-")


def paused_under(flow_run, prefix: str) -> bool:
    state = flow_run.state
    key = state.state_details.pause_key if state else None
    return bool(state and state.is_paused() and key and key.startswith(prefix))


async def test_a_deferred_run_holds_no_process_goes_through_an_approval_and_ends_with_one_run(
    stack: Stack,
):
    flow_run = await start_training(on_booking(DEFER_BOOKING, defer_after=1))

    waiting = await wait_for_flow_run(flow_run.id, deferred)
    await wait_for(lambda: not flow_run_processes(flow_run.id))  # nobody holds a process

    # The watcher may go away and come back at any time: it keeps no state of its own.
    stop_process(stack.watcher, timeout=30)  # mid-test: let it end its sweep
    assert stack.watcher_env is not None and stack.watcher_log is not None
    stack.watcher = start_watcher(stack.watcher_env, stack.watcher_log)

    # Resumed by the watcher at the loss spike, the flow run asks a person, who decides at the
    # backend as themselves (contract v0.5); the watcher resumes it once the backend says so.
    await wait_for_flow_run(flow_run.id, awaiting_person, timeout=300)
    approved = DecisionRequest(decision=DecisionChoice.APPROVE, reason="a bad data shard")
    await decide_as_the_person(stack, DEFER_BOOKING, approved, "deferred-decision")

    done = await wait_for_flow_run(flow_run.id, completed, timeout=300)

    (run,) = backend_runs(stack, DEFER_BOOKING)
    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, d.principal) for d in run.decisions] == [
        (DecisionChoice.APPROVE, f"user:{ACCOUNT}")
    ]
    assert len(decisions_relayed(stack, run.run_id)) == 1
    async with get_client() as client:
        history = [state.name for state in await client.read_flow_run_states(done.id)]
        keys = [
            state.state_details.pause_key or ""
            for state in await client.read_flow_run_states(done.id)
            if state.name == "Suspended"
        ]
    assert waiting.state_name == "Suspended"
    assert "Running" in history[history.index("Suspended") :]  # resumed, by the new watcher
    # Deferred before the person was asked: the approval came to a deferred run.
    asked = [i for i, key in enumerate(keys) if key.startswith("restart-")]
    assert asked and any(key.startswith("defer-") for key in keys[: asked[0]]), keys
    assert f"Resumed flow run {done.id}" in stack.watcher_log.read_text()
    assert submitted_once(stack, DEFER_BOOKING)


def submitted_once(stack: Stack, booking_id: str) -> bool:
    """Tell whether the booking's one backend run was submitted by one request.

    The simulator serves the whole module, so submissions are told apart by the run's key.
    """
    (admin,) = [a for a in stack.simulator.runs() if a.run.booking_id == booking_id]
    keys = [
        r.idempotency_key
        for r in stack.simulator.requests()
        if (r.method, r.path) == SUBMIT and r.status < 300
    ]
    return keys.count(admin.idempotency_key) == 1


def decisions_relayed(stack: Stack, run_id: str) -> list[str]:
    """Return the paths of the decisions the backend accepted for ``run_id``, from its log."""
    return [
        r.path
        for r in stack.simulator.requests()
        if r.method == "POST"
        and r.path.startswith(f"/v0/training-runs/{run_id}/actions/")
        and r.status < 300
    ]
