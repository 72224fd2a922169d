"""End to end: the shipped deployments on a real Prefect server and process worker.

Runs once per database (SQLite, and PostgreSQL when available; see conftest.py). The tests share
one server, worker and simulator per database and run in this order.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from capture_server import CaptureServer
from e2e_stack import (
    ACCOUNT,
    AFTER_BOOKING,
    APPROVE_BOOKING,
    AUTHORIZATION_BLOCK,
    BOOKING_BLOCK,
    CANCEL_BOOKING,
    CANCEL_ON_CANCELLED,
    CHECKOUT,
    CONFIRM_BOOKING,
    CREDENTIALS_BLOCK,
    NIGHTLY,
    PLAIN_BOOKING,
    POOL,
    SHIPPED_YAML,
    STALLED_BOOKING,
    Stack,
    backend_runs,
    completed,
    deploy,
    environment,
    flow_run_log_messages,
    flow_run_processes,
    named,
    on_booking,
    shipped_parameters,
    start_training,
    suspend_on_spike,
    train_until_stalled,
    wait_for,
    wait_for_deployment_run,
    wait_for_flow_run,
)
from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import PrefectHTTPStatusError
from prefect.states import Cancelled, Cancelling, Running, Suspended
from processes import descendants
from spend_helpers import PERSON, confirm_at_backend

from prefect_ito.backend.client import ItoClient
from prefect_ito.blocks import ItoBooking, ItoSpendAuthorization
from prefect_ito.contract import DecisionChoice, DecisionRequest, RunState
from prefect_ito.parameters import BookingClaim, TrainingParameters
from prefect_ito.reporting.chaining import emit_booking_completed
from prefect_ito.waiting.waits import QuoteWait, latest_wait

pytestmark = pytest.mark.e2e

SQLITE_ONLY = pytest.mark.parametrize("prefect_api", ["sqlite"], indirect=True)
"""For what the database cannot change: events, cancellation, templates and secrets are the same
on both. What a database holds across processes — schedules, suspensions and their inputs,
resumes, the spend wait — runs on PostgreSQL too."""


async def test_a_scheduled_deployment_runs_to_completion(stack: Stack):
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(NIGHTLY)
    assert [s.schedule.cron for s in deployment.schedules] == ["0 2 * * *"]  # type: ignore[union-attr]

    flow_run = await start_training()
    done = await wait_for_flow_run(flow_run.id, completed)

    assert done.parameters["training"]["booking_block"] == BOOKING_BLOCK
    assert done.parameters["credentials"] == CREDENTIALS_BLOCK
    (run,) = backend_runs(stack, PLAIN_BOOKING)
    assert run.state is RunState.SUCCEEDED


@SQLITE_ONLY
async def test_a_booking_event_triggers_a_training_run(stack: Stack):
    booking = ItoBooking(
        booking_id=PLAIN_BOOKING, gpu_sku="H200", node_count=2, gpus_per_node=8,
        fabric="InfiniBand", region="eu-north-1",
    )  # fmt: skip
    event = emit_booking_completed(booking)
    assert event is not None

    triggered = await wait_for_deployment_run(AFTER_BOOKING, lambda run: True)
    done = await wait_for_flow_run(triggered.id, completed)

    assert done.parameters["training"]["booking"] == PLAIN_BOOKING
    assert done.parameters["training"]["model_size"] == "8B"  # the deployment's default
    runs = backend_runs(stack, PLAIN_BOOKING)
    assert len(runs) == 2 and all(r.state is RunState.SUCCEEDED for r in runs)


async def test_a_suspended_restart_goes_on_once_a_person_decides_at_the_backend(stack: Stack):
    suspended = await suspend_on_spike(APPROVE_BOOKING)
    keyset = suspended.state.state_details.run_input_keyset  # type: ignore[union-attr]
    assert keyset is not None
    _SUSPENSIONS[suspended.id] = {suspended.state.id}  # type: ignore[union-attr]

    async with get_client() as client:
        # An approval through Prefect's API, as the form took before v0.5: refused.
        forged = {"decision": "approve", "decided_by": "Ada", "reason": "the spike was a blip"}
        refused = await client.resume_flow_run(suspended.id, run_input=forged)
        assert refused.status.value == "REJECT", refused.details
        # A recheck before anyone decided: the flow reads the backend and asks again.
        early = {"decision": "recheck", "reason": "pressed early"}
        taken = await client.resume_flow_run(suspended.id, run_input=early)
        assert taken.status.value == "ACCEPT", taken.details
    await wait_for_flow_run(suspended.id, lambda run: _suspended_times(run) == 2, timeout=120)

    (waiting,) = backend_runs(stack, APPROVE_BOOKING)
    assert waiting.pending_action is not None and waiting.decisions == []
    person = stack.simulator.mint_token(ACCOUNT, principal=f"user:{ACCOUNT}")  # a person's
    async with ItoClient(stack.simulator.url, person) as client:
        await client.decide(
            waiting.run_id,
            waiting.pending_action.action_id,
            DecisionRequest(decision=DecisionChoice.APPROVE, reason="the spike was a blip"),
            idempotency_key="e2e-decision",
        )
    await wait_for_flow_run(suspended.id, completed)  # the watcher resumed it
    logs = await flow_run_log_messages(suspended.id, until="succeeded through")
    assert any(f"user:{ACCOUNT} approved the restart at the backend" in m for m in logs), logs

    (run,) = backend_runs(stack, APPROVE_BOOKING)
    assert run.state is RunState.SUCCEEDED
    assert [(d.decision, d.principal) for d in run.decisions] == [
        (DecisionChoice.APPROVE, f"user:{ACCOUNT}")
    ]
    posted = [
        r
        for r in stack.simulator.requests()
        if r.method == "POST" and r.path.endswith("/decision") and r.status < 300
    ]
    assert len(posted) == 1  # the person's: the flow decides nothing


_SUSPENSIONS: dict[object, set[object]] = {}


def _suspended_times(flow_run: FlowRun) -> int:
    """Count the distinct suspensions seen of a flow run (by state id), as it is polled."""
    seen = _SUSPENSIONS.setdefault(flow_run.id, set())
    if flow_run.state is not None and flow_run.state.name == "Suspended":
        seen.add(flow_run.state.id)
    return len(seen)


async def test_cancelling_a_suspended_run_cancels_the_backend_workload(stack: Stack):
    suspended = await suspend_on_spike(CANCEL_BOOKING)

    async with get_client() as client:
        await client.set_flow_run_state(suspended.id, Cancelling())  # as the UI's Cancel does
    await wait_for_flow_run(suspended.id, named("Cancelled"))

    # Prefect runs no hook for a suspended run; the cancel-on-cancelled Automation does the work.
    canceller = await wait_for_deployment_run(
        CANCEL_ON_CANCELLED, lambda run: run.parameters.get("flow_run_id") == str(suspended.id)
    )
    await wait_for_flow_run(canceller.id, completed)
    (run,) = backend_runs(stack, CANCEL_BOOKING)
    assert run.state is RunState.CANCELLED
    assert run.decisions == []


@SQLITE_ONLY
async def test_cancelling_a_running_deployment_run_cancels_the_backend_workload(stack: Stack):
    flow_run = await train_until_stalled(stack)

    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Cancelling())  # as the UI's Cancel does
    await wait_for_flow_run(flow_run.id, named("Cancelled"))

    # The worker killed the flow's process and ran its on_cancellation hook, which cancelled the
    # workload it found by booking and manifest digest.
    await wait_for(lambda: backend_runs(stack, STALLED_BOOKING)[0].state is RunState.CANCELLED)
    assert len(backend_runs(stack, STALLED_BOOKING)) == 1


@SQLITE_ONLY
async def test_no_token_is_stored_with_deployments_or_flow_runs(stack: Stack):
    canary = stack.token.get_secret_value()
    async with get_client() as client:
        read_back = [
            *(d.model_dump_json() for d in await client.read_deployments()),
            *(r.model_dump_json() for r in await client.read_flow_runs()),
            *(p.model_dump_json() for p in await client.read_work_pools()),
        ]
    rows = await asyncio.to_thread(stack.rows)

    assert len(read_back) >= 3 + 5 and rows  # the runs above are all there
    assert not [text for text in read_back if canary in text]
    assert not [row for row in rows if canary in row]


@SQLITE_ONLY
def test_the_stack_s_logs_are_kept_where_pytest_prunes_them(stack: Stack, tmp_path_factory):
    # They were left in the system's temporary directory for good, one directory a module.
    assert stack.watcher_log is not None
    assert stack.watcher_log.is_relative_to(tmp_path_factory.getbasetemp())


@SQLITE_ONLY
async def test_a_flow_run_cannot_choose_the_command_its_worker_runs(stack: Stack, tmp_path: Path):
    """Anyone who can reach the Prefect API can give a flow run job variables.

    With Prefect's default process template, this command ran in place of the flow, with the
    worker's environment (its token included). The pool's template (deployments/
    process-base-job-template.json) has no `command` to set.
    """
    stolen = tmp_path / "stolen-environment"
    hostile = {"command": f"sh -c 'env > {stolen}'", "env": {"PYTHONPATH": str(tmp_path)}}
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(NIGHTLY)
        with pytest.raises(PrefectHTTPStatusError, match="422"):
            await client.create_flow_run_from_deployment(deployment.id, job_variables=hostile)
        # Prefect checks job variables against the template on the route above, not when a flow
        # run is created directly: this one reaches the worker with them.
        response = await client._client.post(
            "/flow_runs/",
            json={
                "flow_id": str(deployment.flow_id), "deployment_id": str(deployment.id),
                "work_pool_name": POOL, "job_variables": hostile,
                "parameters": shipped_parameters(SHIPPED_YAML, "nightly"),
                "state": {"type": "SCHEDULED"},
            },
        )  # fmt: skip
        response.raise_for_status()

    # The worker ran the flow itself, to the end.
    await wait_for_flow_run(response.json()["id"], completed)
    assert not stolen.exists()


@SQLITE_ONLY
async def test_a_prefect_user_cannot_send_the_workers_token_anywhere(stack: Stack):
    """The canary sweep of a full deployment run: server, worker and watcher.

    A colleague with Prefect API access names their own server in a flow run's ``credentials``
    and in a deferral record they forge. The worker and the watcher hold the token in their own
    environment; it must reach nothing of theirs, and be held by no process it was not given to.
    """
    canary = stack.token.get_secret_value()
    with CaptureServer() as theirs:
        lured = await start_training(
            {**on_booking(PLAIN_BOOKING), "credentials": {"api_url": theirs.url}}
        )
        forged = await forge_deferral(theirs.url)
        ended = await wait_for_flow_run(lured.id, named("OriginNotAllowed"))
        assert theirs.url in (ended.state.message or "")
        assert stack.watcher_log is not None
        await wait_for(
            lambda: f"Not watching runs recorded for {theirs.url}" in stack.watcher_log.read_text()
        )
    assert theirs.received == []  # not one request, with or without the token

    under = [stack.worker, *([stack.watcher] if stack.watcher else [])]
    given = {pid for process in under for pid in (process.pid, *descendants(process.pid))}
    assert set(processes_holding(canary)) <= given
    scratch = stack.watcher_log.parent
    assert [path for path in files_under(scratch) if canary.encode() in path.read_bytes()] == []
    async with get_client() as client:
        await client.delete_flow_run(forged)


async def forge_deferral(api_url: str) -> Any:
    """Suspend a new flow run under a defer- key, beside a record naming ``api_url``."""
    key = "defer-1-forged-by-a-prefect-user"
    record = {
        "api_url": api_url, "run_id": "run_forged", "version": 1, "stage": "pretrain",
        "events_seen": 0, "heartbeat_at": "2026-12-01T00:00:00Z", "heartbeat_seen_at": 0.0,
        "stall_timeout": None, "deadline_at": None,
    }  # fmt: skip
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(NIGHTLY)
        flow_run = await client.create_flow_run_from_deployment(
            deployment.id, parameters=on_booking(PLAIN_BOOKING), state=Running()
        )
        await client.create_flow_run_input(flow_run.id, key, json.dumps(record))
        await client.set_flow_run_state(flow_run.id, Suspended(pause_key=key), force=True)
    return flow_run.id


def processes_holding(secret: str) -> list[int]:
    """Every process whose environment holds ``secret``."""
    holding = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if secret.encode() in environ.read_bytes():
                holding.append(int(environ.parent.name))
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return holding


def files_under(root: Path) -> list[Path]:
    """Every regular file below ``root``: logs, databases, deployment copies, results."""
    return [path for path in root.rglob("*") if path.is_file() and not path.is_symlink()]


async def test_a_spend_nobody_authorized_suspends_until_a_person_confirms_it(stack: Stack):
    """A person confirms at the backend, with a token of their own; the watcher resumes the run.

    Nothing answers the flow run in Prefect: it reads the quote again once resumed, and the
    backend records who confirmed it.
    """
    params = {**on_booking(CONFIRM_BOOKING), "authorization": None}
    digest = (
        TrainingParameters.model_validate(params["training"])
        .to_request(BookingClaim(booking_id=CONFIRM_BOOKING))
        .digest()
    )

    flow_run = await start_training(params)
    suspended = await wait_for_flow_run(flow_run.id, named("Suspended"))
    assert suspended.state is not None
    assert (suspended.state.state_details.pause_key or "").startswith("spend-")
    await wait_for(lambda: not flow_run_processes(flow_run.id))  # holds no process meanwhile
    assert backend_runs(stack, CONFIRM_BOOKING) == []
    record = await latest_wait(flow_run.id, QuoteWait)
    assert record is not None and record.manifest_digest == digest
    await asyncio.to_thread(confirm_at_backend, stack.simulator, record.quote_id, ACCOUNT)
    await wait_for_flow_run(flow_run.id, completed)

    (run,) = backend_runs(stack, CONFIRM_BOOKING)
    assert run.confirmation is not None
    assert (run.confirmation.confirmed_by, run.confirmation.via) == (PERSON, "person")
    assert (run.confirmation.quote_id, run.manifest_digest) == (record.quote_id, digest)
    logs = await flow_run_log_messages(flow_run.id, until="succeeded through")
    assert len([m for m in logs if "Waiting for a person to confirm" in m]) == 1, logs
    # Resumed by the watcher, the flow run takes up the quote it recorded, as the backend states it.
    assert f"Resumed: the quote {record.quote_id} is confirmed at the backend." in logs, logs
    assert any(m.endswith(f"confirmed at the backend by {PERSON}.") for m in logs), logs


@SQLITE_ONLY
async def test_a_shipped_training_deployment_without_a_spend_block_asks_a_person(
    stack: Stack, tmp_path: Path
):
    """docs/deployments.md: leave the standing authorization out to confirm every run yourself.

    Before, both files named the block `ito-spend`, and without it every run failed
    InvalidParameters. Deployed as shipped (only the code's path, a name of its own and the
    schedule off), with no such block saved, a run reaches the spend question.
    """
    config = yaml.safe_load(SHIPPED_YAML.read_text())
    config["pull"] = [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(CHECKOUT)}}
    ]
    nightly = next(d for d in config["deployments"] if d["name"] == "nightly")
    nightly["name"], nightly["schedules"][0]["active"] = "nightly-as-shipped", False
    config["deployments"] = [nightly]
    shipped = tmp_path / "prefect.yaml"
    shipped.write_text(yaml.safe_dump(config, sort_keys=False))
    deploy(shipped, environment(stack.api_url, tmp_path / "deployer"), tmp_path / "deploy.log")

    saved = await ItoSpendAuthorization.aload(AUTHORIZATION_BLOCK)
    async with get_client() as client:
        await client.delete_block_document(saved._block_document_id)
    try:
        flow_run = await run_deployment("ito-training/nightly-as-shipped", timeout=0)
        waiting = await wait_for_flow_run(flow_run.id, named("Suspended"))
    finally:
        await saved.asave(AUTHORIZATION_BLOCK, overwrite=True)

    assert waiting.parameters.get("authorization") is None
    assert waiting.state is not None
    assert (waiting.state.state_details.pause_key or "").startswith("spend-")
    async with get_client() as client:
        await client.set_flow_run_state(flow_run.id, Cancelled(), force=True)
