"""Prefect's job conventions for Itô training: ``ItoTrainingJob`` → ``ItoTrainingRun``.

``trigger()`` goes through the very checks and delegating code the flow's tasks use (see
:mod:`prefect_ito.backend.desk`): re-attach, verify the booking, check the capability, quote, have
the
spend confirmed, submit once.
The run handle adds what Prefect's abstract ``JobRun`` lacks: :meth:`ItoTrainingRun.cancel` and
:meth:`ItoTrainingRun.attach`.
"""

from __future__ import annotations

from prefect.blocks.abstract import JobBlock, JobRun
from pydantic import Field

from prefect_ito.backend import desk
from prefect_ito.backend.provenance import last_seen
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import ItoRunOutcome
from prefect_ito.parameters import TrainingParameters, resolve_booking, submission_key
from prefect_ito.reporting.report import TrainingSummary
from prefect_ito.supervision import loop as supervision
from prefect_ito.supervision.outcomes import raise_for_outcome
from prefect_ito.supervision.plain import ClientSteps
from prefect_ito.waiting.flow_run import current_flow_run_id

__all__ = ["ItoTrainingJob", "ItoTrainingRun"]

_JOB_DOCS_URL = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/flows.md"


class ItoTrainingJob(JobBlock[TrainingSummary]):
    """A training request for a completed Itô compute booking, delegated to the desk backend.

    Example:
        Trigger a saved job and wait for it:
        ```python
        from prefect_ito.jobs import ItoTrainingJob

        job = ItoTrainingJob.load("BLOCK_NAME")  # credentials + training parameters
        run = await job.trigger()
        await run.wait_for_completion()
        summary = await run.fetch_result()
        ```
    """

    _block_type_name = "Itô Training Job"
    _block_type_slug = "ito-training-job"
    _logo_url = None
    _description = (
        "A training request on a completed Itô compute booking, delegated to the Itô desk "
        "backend; trigger() returns a run handle to wait on, cancel or re-attach to."
    )
    _documentation_url = _JOB_DOCS_URL  # type: ignore[assignment]

    credentials: ItoCredentials = Field(description="Which backend, and where its token is.")
    training: TrainingParameters = Field(
        description="What to train on which booking, and how to supervise it."
    )
    authorization: ItoSpendAuthorization | None = Field(
        default=None,
        description="Names a standing spend authorization at the backend; the backend decides "
        "whether it covers the request. Without one (or outside it) a person confirms at the "
        "backend, inside a flow run.",
    )

    async def trigger(self) -> ItoTrainingRun:
        """Re-attach to the run this request's idempotency key made, or verify, check, quote,
        confirm and submit it once.

        Outside a flow run each trigger is a submission of its own unless ``training`` names an
        ``idempotency_key``: give one to trigger the same submission again (after a crash, say),
        or attach to a run by its id with :meth:`ItoTrainingRun.attach`.

        Raises:
            InvalidParameters: a field breaks a rule; nothing was sent.
            BookingNotEligible, CapabilityNotAvailable: nothing was submitted.
            BookingBusy: the booking has an unfinished run this submission did not make (named,
                with how to attach to it); nothing was submitted.
            ConfirmationRequired: outside a flow run, when no person confirmed the quote at the
                backend and no standing authorization covers it; nothing was submitted.
            SpendDeclined, AwaitingConfirmation: inside one, a person declined or did not
                answer; nothing was submitted.
        """
        training = self.training
        claim = await resolve_booking(training)
        request = training.to_request(claim)
        async with self.credentials.get_client() as client:
            run = await supervision.start(
                ClientSteps(
                    client, training, self.logger, self.authorization, credentials=self.credentials
                ),
                claim,
                request,
                lambda: submission_key(training, request, current_flow_run_id()),
            )
        self.logger.info("Itô training run %s is %s.", run.run_id, run.state.value)
        return ItoTrainingRun(self, run)


class ItoTrainingRun(JobRun[TrainingSummary]):
    """A handle on one backend training run: wait for it, fetch its result, cancel it."""

    def __init__(self, job: ItoTrainingJob, run: TrainingRun) -> None:
        self.job = job
        self.run = run

    @property
    def run_id(self) -> str:
        """The backend's run id."""
        return self.run.run_id

    @classmethod
    async def attach(cls, job: ItoTrainingJob, run_id: str) -> ItoTrainingRun:
        """Return a handle on an existing backend run, e.g. after the supervisor restarted."""
        async with job.credentials.get_client() as client:
            return cls(job, await client.get_training_run(run_id))

    async def wait_for_completion(self) -> None:  # type: ignore[override]
        """Supervise the run until it finishes, exactly as the training flow does.

        Events and artifacts are reported, the deadline and stall watchdogs hold, and inside a
        flow run a proposed restart is put to a person and a cancellation of the flow run
        cancels the backend workload; outside one, :class:`DecisionRequired` is raised instead
        of pausing.

        Raises:
            DecisionRequired: outside a flow run, when a person must decide.
            AwaitingDecision: inside one, when nobody decided in time.
            RunStalled, DeadlineExceeded: a watchdog limit passed; the backend run goes on.
        """
        async with self.job.credentials.get_client() as client:
            steps = ClientSteps(
                client, self.job.training, self.logger, credentials=self.job.credentials
            )
            try:
                self.run = await supervision.supervise(steps, self.run)
            except supervision.CancelRequested as cancel:
                self.run, message = await supervision.stop_for_cancel(steps, cancel.run)
                self.logger.info("%s", message)

    async def fetch_result(self) -> TrainingSummary:
        """Return the summary of a succeeded run.

        Raises:
            ItoRunOutcome: the run ended without success (``GateFailed``, ``RunRefused``…), or
                has not finished yet.
        """
        if not self.run.finished:
            raise ItoRunOutcome(f"run {self.run_id} has not finished", run_id=self.run_id)
        raise_for_outcome(self.run)
        return TrainingSummary.of(self.run, last_seen(self.job.credentials.api_url))

    async def cancel(self, reason: str = "cancelled through prefect-ito") -> TrainingRun:
        """Cancel the backend workload (never the booking) and wait until it is terminal."""
        async with self.job.credentials.get_client() as client:
            self.run = await desk.cancel_training_workload(client, self.run_id, reason=reason)
        return self.run
