"""The training flows: verify the booking, check the capability, delegate, supervise, report.

``ito_training`` models one training request as Prefect tasks. It never trains: the one task that
creates work hands the request to the Itô desk backend, and the rest read, ask a person, relay
the person's decision, and report. Re-entry is normal — a resumed suspension runs the flow from
the top and a crashed run is run again — so every step is safe to repeat: the backend run is
re-attached by booking and manifest digest, decisions and cancels carry stable idempotency keys,
events stable ids and artifacts keys.

``ito_attach_training`` supervises a backend run that already exists, by its id. It has no way to
submit anything: attaching never spends.
"""

from __future__ import annotations

from typing import Any

from prefect import State, flow, get_client, get_run_logger
from prefect.states import Cancelled

from prefect_ito.backend import ownership
from prefect_ito.backend.operations import READ_TRAINING_RUN
from prefect_ito.blocks import (
    ItoCredentials,
    ItoSpendAuthorization,
    resolve_authorization,
    resolve_credentials,
)
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import ItoError, RunNotFound
from prefect_ito.parameters import (
    SupervisionParameters,
    TrainingParameters,
    check_id,
    resolve_booking,
    submission_key,
)
from prefect_ito.reporting import report as reporting
from prefect_ito.reporting.report import TrainingSummary
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.outcomes import outcome_state, raise_for_outcome
from prefect_ito.supervision.tasks import TaskSteps
from prefect_ito.waiting.alive import beat_while_running
from prefect_ito.waiting.cancellation import (
    CancelOutcome,
    cancel_asked,
    cancel_for_flow_run,
    cancel_workload_of,
)
from prefect_ito.waiting.flow_run import current_flow_run_id, has_ended

__all__ = ["ito_attach_training", "ito_cancel_training", "ito_training"]


# Prefect would validate parameters before the flow runs and fail it as plain "Failed"; the flow
# validates them itself instead, so a broken rule ends as InvalidParameters naming the field.
@flow(
    name="ito-training",
    description="Run ML training on a completed Itô compute booking by delegating it to the "
    "Itô desk backend, gate by gate, with people confirming the spend and deciding restarts.",
    persist_result=True,
    validate_parameters=False,
    on_cancellation=[cancel_for_flow_run],
)
async def ito_training(
    training: TrainingParameters,
    credentials: ItoCredentials | str | None = None,
    authorization: ItoSpendAuthorization | str | None = None,
) -> TrainingSummary | State[Any]:
    """Train on a completed Itô compute booking, supervised stage by stage.

    Nothing is submitted unless the backend says a person confirmed the quote there (after
    seeing its cost, plan and manifest) or that a standing authorization covers it.

    Args:
        training: What to train on which booking, and how long to supervise it.
        credentials: An ``ItoCredentials`` block or its name; default: ``ITO_COMPUTE_API_URL``.
        authorization: An ``ItoSpendAuthorization`` block or its name, naming a standing
            authorization at the backend, for runs nobody watches (schedules, triggers); a
            request the backend says it does not cover is put to a person.

    Returns:
        A :class:`TrainingSummary` on success; otherwise a Failed state named for the outcome
        (:attr:`~prefect_ito.exceptions.ItoError.state_name`) or a Cancelled state.
    """
    # Lost with its machine, the run is found by this beat's silence within a minute (Prefect's
    # own heartbeat would take three of its 30 s at least): prefect_ito.waiting.alive.
    beat_while_running()
    try:
        parameters = TrainingParameters.parse(training)
        steps = TaskSteps(
            await resolve_credentials(credentials),
            parameters,
            await resolve_authorization(authorization),
        )
        claim = await resolve_booking(parameters)
        request = parameters.to_request(claim)
        flow_run_id = current_flow_run_id()
        # The flow run's id: re-entered, it finds its run by this before anything is quoted.
        reference = str(flow_run_id) if flow_run_id is not None else None
        run = await supervision.start(
            steps,
            claim,
            request,
            lambda: submission_key(parameters, request, flow_run_id),
            client_reference=reference,
        )
    except ItoError as error:
        return _failed(error)
    return await _supervise(steps, run, other_asker=_other_asker(run, reference))


def _other_asker(run: TrainingRun, reference: str | None) -> supervision.OtherAsker | None:
    """Return who else asks ``run``'s questions, when the backend says another flow run made
    it (one idempotency key given to two flow runs): that flow run, for as long as Prefect
    holds it unfinished. A hint only, which at worst has a question asked twice or left to the
    backend's page: which run is followed, and every answer, are the backend's."""
    made_by = run.client_reference
    if ownership.asks_its_questions(run, reference) or made_by is None:
        return None

    async def other_asker() -> str | None:
        return None if await has_ended(made_by) else ownership.owner_of(run)

    return other_asker


@flow(
    name="ito-attach-training",
    description="Supervise an existing Itô desk training run by its id, to its end. "
    "Never submits anything.",
    persist_result=True,
    validate_parameters=False,
)
async def ito_attach_training(
    run_id: str,
    limits: SupervisionParameters | None = None,
    credentials: ItoCredentials | str | None = None,
) -> TrainingSummary | State[Any]:
    """Follow the backend run ``run_id`` to its end; report at once if it already ended.

    The one flow that follows a run by its id: it never made that run, so cancelling it only
    detaches (the backend run goes on; ``prefect-ito cancel`` on the flow run that made it, or
    the backend itself, stops it).

    Args:
        run_id: The backend's training run id.
        limits: Approval timeout, deadline and stall timeout.
        credentials: An ``ItoCredentials`` block or its name; default: ``ITO_COMPUTE_API_URL``.
    """
    beat_while_running()  # as ito_training does
    try:
        check_id(run_id, "run_id")
        steps = TaskSteps(
            await resolve_credentials(credentials), SupervisionParameters.parse(limits)
        )
        run = await steps.perform(READ_TRAINING_RUN, run_id)
    except RunNotFound:
        return _failed(RunNotFound(f"the backend has no training run {run_id!r}"))
    except ItoError as error:
        return _failed(error)
    get_run_logger().info("Attached to backend run %s (%s).", run.run_id, run.state.value)
    return await _supervise(steps, run, made_it=False)


async def _supervise(
    steps: TaskSteps,
    run: TrainingRun,
    *,
    made_it: bool = True,
    other_asker: supervision.OtherAsker | None = None,
) -> TrainingSummary | State[Any]:
    """Supervise ``run`` to its end and return the flow's result or final state; a cancel
    stops the backend run only when this flow run ``made_it``."""
    try:
        run = await supervision.supervise(steps, run, other_asker)
        raise_for_outcome(run)
    except supervision.CancelRequested as cancel:
        if not made_it:
            return Cancelled(message=_detached(cancel.run))
        final, message = await supervision.stop_for_cancel(steps, cancel.run)
        # The cards and the terminal's summary end in the state the cancel left, not the last
        # one supervision saw before it.
        await reporting.publish(final)
        return Cancelled(message=message)
    except ItoError as error:
        return _failed(error)
    get_run_logger().info("Run %s succeeded through %d stages.", run.run_id, len(run.stages))
    return TrainingSummary.of(run, steps.provenance())


def _detached(run: TrainingRun) -> str:
    message = (
        f"Detached from backend run {run.run_id}, which goes on: this flow run only followed "
        "it, so its cancel stops nothing at the backend."
    )
    get_run_logger().info("%s", message)
    return message


def _failed(error: ItoError) -> State[Any]:
    get_run_logger().error("%s", error)
    return outcome_state(error)


@flow(
    name="ito-cancel-training",
    description="Cancel the backend workload of a cancelled ito-training flow run "
    "(for suspended runs, which Prefect cancels without running any hook).",
)
async def ito_cancel_training(flow_run_id: str) -> str:
    """Cancel the backend workload of the ``ito-training`` flow run ``flow_run_id``, once
    Prefect's server says that flow run is cancelled.

    Point an Automation at it: on ``prefect.flow-run.Cancelled`` for the ``ito-training`` flow,
    run this deployment with ``flow_run_id`` from the event. An event is anyone's to write, so
    only the flow run's state as the server holds it counts, and only the run the backend says
    that flow run made is cancelled. It is idempotent.
    """
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
    if not cancel_asked(flow_run):
        said = (
            f"Flow run {flow_run_id} is {flow_run.state.name if flow_run.state else 'stateless'}"
            ", not cancelled, in Prefect: nothing to cancel."
        )
    else:
        said = _what_was_cancelled(flow_run_id, await cancel_workload_of(flow_run))
    get_run_logger().info("%s", said)
    return said


def _what_was_cancelled(flow_run_id: str, outcome: CancelOutcome) -> str:
    """Say what a cancel did at the backend, naming the backend run and its state after."""
    run = outcome.run
    if run is None:
        return f"Flow run {flow_run_id} has no backend run: nothing to cancel."
    if outcome.cancelled_now:
        return (
            f"Cancelled backend run {run.run_id} of flow run {flow_run_id}: "
            f"it is now {run.state.value}."
        )
    return (
        f"Backend run {run.run_id} of flow run {flow_run_id} had already ended "
        f"({run.state.value}): nothing to cancel."
    )
