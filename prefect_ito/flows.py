"""The training flow: verify the booking, check the capability, delegate, supervise, report.

``ito_training`` models one training request as Prefect tasks. It never trains: the one task that
creates work hands the request to the Itô desk backend, and the rest read, ask a person, relay
the person's decision, and report. Re-entry is normal — a resumed suspension runs the flow from
the top and a crashed run is run again — so every step is safe to repeat: the backend run is
re-attached by booking and manifest digest, decisions and cancels carry stable idempotency keys,
events stable ids and artifacts keys.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import Flow, State, flow, get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.states import Cancelled

from prefect_ito import approval, tasks
from prefect_ito.auth import resolve_api_url
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.contract import TrainingRequest, TrainingRun
from prefect_ito.exceptions import (
    InvalidParameters,
    ItoError,
)
from prefect_ito.operations import (
    CANCEL_CONFIRM_SECONDS,
    Watchdog,
    cancel_workload,
    find_attachable_run,
)
from prefect_ito.outcomes import outcome_state, raise_for_outcome
from prefect_ito.reporting import TrainingSummary, stage_changes
from prefect_ito.request import (
    BookingClaim,
    build_request,
    derive_idempotency_key,
    resolve_booking,
)
from prefect_ito.runtime import cancellation_requested, current_flow_run_id
from prefect_ito.settings import ItoSettings

__all__ = ["cancel_for_flow_run", "ito_cancel_training", "ito_training"]

PostTrainingRecipe = Literal["sft", "dpo", "rlvr"]


class _CancelRequested(Exception):
    """A person asked Prefect to cancel this flow run while it supervised."""

    def __init__(self, run: TrainingRun) -> None:
        super().__init__(run.run_id)
        self.run = run


async def resolve_credentials(credentials: ItoCredentials | str | None) -> ItoCredentials:
    """Return the credentials block: given, loaded by name, or for ``ITO_COMPUTE_API_URL``."""
    if isinstance(credentials, ItoCredentials):
        return credentials
    if isinstance(credentials, str):
        try:
            return await ItoCredentials.aload(credentials)
        except ValueError as exc:
            raise InvalidParameters(
                f"credentials: no ItoCredentials block named {credentials!r}"
            ) from exc
    return ItoCredentials(api_url=resolve_api_url(None))


async def cancel_for_flow_run(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Cancel the backend workload that a cancelled ``ito-training`` flow run supervised.

    Used as the flow's ``on_cancellation`` hook (which Prefect runs in the worker after it killed
    the flow's process) and by :func:`ito_cancel_training`. It finds the workload from the flow
    run's own parameters — booking and manifest digest — so it needs no state of its own. A
    crashed or evicted flow run is never cancelled this way: it is re-attached instead.
    """
    params = flow.validate_parameters(dict(flow_run.parameters or {}))
    creds = await resolve_credentials(params.get("credentials"))
    _, request = await resolve_request(params)
    async with creds.get_client() as client:
        run = await find_attachable_run(client, request)
        if run is not None:
            await cancel_workload(
                client, run.run_id, reason=f"Prefect flow run {flow_run.id} was cancelled"
            )


async def resolve_request(params: dict[str, Any]) -> tuple[BookingClaim, TrainingRequest]:
    """Return the booking claim and the validated request that ``ito-training`` parameters ask for.

    The flow and its cancellation paths both call this, so they derive the same manifest digest.
    """
    claim = await resolve_booking(params.get("booking"), params.get("booking_block"))
    request = build_request(
        claim,
        model_size=params["model_size"],
        data=params["data"],
        target=params["target"],
        budget_usd=params["budget_usd"],
        post_training=params.get("post_training"),
    )
    return claim, request


@flow(
    name="ito-training",
    description="Run ML training on a completed Itô compute booking by delegating it to the "
    "Itô desk backend, gate by gate, with people deciding restarts.",
    persist_result=True,
    on_cancellation=[cancel_for_flow_run],
)
async def ito_training(
    model_size: str,
    data: list[str],
    target: str,
    budget_usd: float,
    booking: ItoBooking | str | None = None,
    booking_block: str | None = None,
    post_training: PostTrainingRecipe | None = None,
    credentials: ItoCredentials | str | None = None,
    approval_timeout: int = 86_400,
    deadline: float | None = None,
    stall_timeout: float | None = 3_600,
    idempotency_key: str | None = None,
) -> TrainingSummary | State[Any]:
    """Train on a completed Itô compute booking, supervised stage by stage.

    Args:
        model_size: Parameter count such as ``150M``, ``8B`` or ``70B``.
        data: Data references to train on (at least one).
        target: The capability to train for.
        budget_usd: Spend ceiling in US dollars: finite and positive.
        booking: The completed booking, as an ``ItoBooking`` or a booking id.
        booking_block: Instead of ``booking``, the name of a saved ``ItoBooking`` block.
        post_training: ``sft``, ``dpo`` or ``rlvr`` (the pipeline SFT → DPO → RLVR up to it).
        credentials: An ``ItoCredentials`` block or its name; default: ``ITO_COMPUTE_API_URL``.
        approval_timeout: Seconds a person has to decide on a proposed restart.
        deadline: Seconds supervision may last before it stops (the backend run goes on).
        stall_timeout: Seconds without a backend heartbeat before supervision stops as Stalled.
        idempotency_key: Overrides the submission key derived from booking, digest and flow run.

    Returns:
        A :class:`TrainingSummary` on success; otherwise a named Failed state (see
        :attr:`~prefect_ito.exceptions.ItoError.state_name`) or a Cancelled state.
    """
    logger = get_run_logger()
    try:
        creds = await resolve_credentials(credentials)
        claim, request = await resolve_request(
            {
                "booking": booking,
                "booking_block": booking_block,
                "model_size": model_size,
                "data": data,
                "target": target,
                "budget_usd": budget_usd,
                "post_training": post_training,
            }
        )
        run = await _start(creds, claim, request, idempotency_key)
        run = await _supervise(
            creds,
            run,
            Watchdog(stall_timeout=stall_timeout, deadline=deadline),
            approval_timeout=approval_timeout,
        )
        raise_for_outcome(run)
    except _CancelRequested as cancel:
        return await _cancel(creds, cancel.run)
    except ItoError as error:
        logger.error("%s", error)
        return outcome_state(error)
    logger.info("Run %s succeeded through %d stages.", run.run_id, len(run.stages))
    return TrainingSummary.of(run)


async def _start(
    creds: ItoCredentials,
    claim: BookingClaim,
    request: TrainingRequest,
    idempotency_key: str | None,
) -> TrainingRun:
    """Re-attach first; otherwise verify, check and delegate — each step its own task.

    The same order as :func:`prefect_ito.operations.start`, split into tasks so every step shows.
    """
    logger = get_run_logger()
    run = await tasks.reattach_training_run(creds, request)
    if run is not None:
        logger.info("Re-attached to unfinished backend run %s.", run.run_id)
        return run
    eligibility = await tasks.verify_booking(creds, claim)
    logger.info(
        "Booking %s verified: %s × %d nodes × %d GPUs on %s.",
        eligibility.booking_id,
        eligibility.gpu_sku,
        eligibility.node_count,
        eligibility.gpus_per_node,
        eligibility.fabric,
    )
    await tasks.check_training_capability(creds, request)
    key = idempotency_key or derive_idempotency_key(request, current_flow_run_id())
    run = await tasks.delegate_training_run(creds, request, key)
    logger.info("Delegated to the Itô desk backend as run %s.", run.run_id)
    return run


async def _supervise(
    creds: ItoCredentials, run: TrainingRun, watchdog: Watchdog, *, approval_timeout: int
) -> TrainingRun:
    """Follow the backend's own stage plan until the run ends; ask people to decide restarts."""
    settings = ItoSettings()
    flow_run_id = current_flow_run_id()
    seen, before = 0, None
    while True:
        seen = await tasks.report_progress(creds, run, seen)
        for line in stage_changes(before, run):
            get_run_logger().info("%s", line)
        before = run
        if run.state.terminal:
            return run
        if flow_run_id is not None and await cancellation_requested(flow_run_id):
            raise _CancelRequested(run)
        if run.pending_action is not None:
            run = await _decide(creds, run, approval_timeout)
            continue
        run = await tasks.await_stage_gate(
            creds,
            run,
            run.current_stage or "start",
            watchdog=watchdog,
            wait=settings.poll_wait_seconds,
            flow_run_id=flow_run_id,
            state_poll_seconds=settings.state_poll_seconds,
        )


async def _decide(creds: ItoCredentials, run: TrainingRun, timeout: int) -> TrainingRun:
    decision = await approval.ask_person(
        run, timeout=timeout, poll_interval=ItoSettings().state_poll_seconds
    )
    if decision is None:
        raise _CancelRequested(run)
    get_run_logger().info(
        "%s %s the restart: %s",
        decision.decided_by,
        "approved" if decision.approve else "rejected",
        decision.reason,
    )
    assert run.pending_action is not None
    return await tasks.relay_decision(
        creds, run, run.pending_action.action_id, decision.to_request()
    )


async def _cancel(creds: ItoCredentials, run: TrainingRun) -> State[Any]:
    logger = get_run_logger()
    logger.info("Cancellation requested: cancelling backend workload %s.", run.run_id)
    final = await tasks.cancel_training_workload(
        creds, run.run_id, "the Prefect flow run was cancelled", CANCEL_CONFIRM_SECONDS
    )
    if final.state.terminal:
        return Cancelled(message=f"Backend workload {run.run_id} cancelled ({final.state.value}).")
    return Cancelled(
        message=f"Cancel of backend workload {run.run_id} is unconfirmed: it was still "
        f"{final.state.value} after {CANCEL_CONFIRM_SECONDS:g} s."
    )


@flow(
    name="ito-cancel-training",
    description="Cancel the backend workload of a cancelled ito-training flow run "
    "(for suspended runs, which Prefect cancels without running any hook).",
)
async def ito_cancel_training(flow_run_id: str) -> str:
    """Cancel the backend workload supervised by the ``ito-training`` flow run ``flow_run_id``.

    Point an Automation at it: on ``prefect.flow-run.Cancelled`` for the ``ito-training`` flow,
    run this deployment with ``flow_run_id`` from the event. It is idempotent.
    """
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
    await cancel_for_flow_run(ito_training, flow_run, flow_run.state)  # type: ignore[arg-type]
    return f"cancelled the backend workload of flow run {flow_run_id}"
