"""Prefect's job conventions for Itô training: ``ItoTrainingJob`` → ``ItoTrainingRun``.

``trigger()`` goes through the very checks and delegating code the flow's tasks use (see
:mod:`prefect_ito.operations`): re-attach, verify the booking, check the capability, submit once.
The run handle adds what Prefect's abstract ``JobRun`` lacks: :meth:`ItoTrainingRun.cancel` and
:meth:`ItoTrainingRun.attach`.
"""

from __future__ import annotations

from typing import Literal

from prefect.blocks.abstract import JobBlock, JobRun
from pydantic import Field

from prefect_ito import approval, operations
from prefect_ito.blocks import ItoBooking, ItoCredentials
from prefect_ito.client import ItoClient
from prefect_ito.contract import TrainingRun
from prefect_ito.exceptions import DecisionRequired, ItoRunOutcome
from prefect_ito.outcomes import raise_for_outcome
from prefect_ito.reporting import TrainingSummary
from prefect_ito.request import BookingClaim, build_request, derive_idempotency_key
from prefect_ito.runtime import current_flow_run_id
from prefect_ito.settings import ItoSettings

__all__ = ["ItoTrainingJob", "ItoTrainingRun"]

_JOB_DOCS_URL = "https://github.com/prefect-ito/prefect-ito/blob/main/docs/flows.md"


class ItoTrainingJob(JobBlock[TrainingSummary]):
    """A training request for a completed Itô compute booking, delegated to the desk backend.

    Example:
        Trigger a saved job and wait for it:
        ```python
        from prefect_ito.jobs import ItoTrainingJob

        job = ItoTrainingJob.load("BLOCK_NAME")
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
    booking: ItoBooking | str = Field(description="The completed booking, or its id.")
    model_size: str = Field(description="Parameter count such as 150M, 8B or 70B.")
    data: list[str] = Field(description="Data references to train on.")
    target: str = Field(description="The capability to train for.")
    budget_usd: float = Field(description="Spend ceiling in US dollars.")
    post_training: Literal["sft", "dpo", "rlvr"] | None = Field(
        default=None, description="Post-training up to and including this recipe."
    )
    approval_timeout: int = Field(
        default=86_400, description="Seconds a person has to decide on a proposed restart."
    )
    stall_timeout: float | None = Field(
        default=3_600, description="Seconds without a backend heartbeat before waiting stops."
    )
    idempotency_key: str | None = Field(
        default=None, description="Overrides the derived submission idempotency key."
    )

    async def trigger(self) -> ItoTrainingRun:
        """Re-attach to this request's unfinished run, or verify, check and submit it once.

        Raises:
            InvalidParameters: a field breaks a rule; nothing was sent.
            BookingNotEligible, BookingBusy, CapabilityNotAvailable: nothing was submitted.
        """
        claim = BookingClaim.from_booking(self.booking)
        request = build_request(
            claim,
            model_size=self.model_size,
            data=self.data,
            target=self.target,
            budget_usd=self.budget_usd,
            post_training=self.post_training,
        )
        key = self.idempotency_key or derive_idempotency_key(request, current_flow_run_id())
        async with self.credentials.get_client() as client:
            run = await operations.start(client, claim, request, key)
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
        """Supervise the run until it finishes.

        Inside a flow run, a proposed restart is put to a person exactly as the training flow
        does; outside one, :class:`DecisionRequired` is raised instead of pausing.

        Raises:
            DecisionRequired: outside a flow run, when a person must decide.
            AwaitingDecision: inside one, when nobody decided in time.
            RunStalled: the backend heartbeat stopped for ``stall_timeout``.
        """
        settings = ItoSettings()
        watchdog = operations.Watchdog(stall_timeout=self.job.stall_timeout)
        async with self.job.credentials.get_client() as client:
            while not self.run.state.terminal:
                if self.run.pending_action is not None:
                    self.run = await self._decide(client)
                    continue
                self.run = await operations.await_gate(
                    client, self.run, wait=settings.poll_wait_seconds, watchdog=watchdog
                )

    async def _decide(self, client: ItoClient) -> TrainingRun:
        action = self.run.pending_action
        assert action is not None
        if current_flow_run_id() is None:
            raise DecisionRequired(action, run_id=self.run_id)
        decision = await approval.ask_person(
            self.run,
            timeout=self.job.approval_timeout,
            poll_interval=ItoSettings().state_poll_seconds,
        )
        if decision is None:
            return await self.cancel("the Prefect flow run was cancelled")
        return await operations.relay_decision(
            client, self.run, action.action_id, decision.to_request()
        )

    async def fetch_result(self) -> TrainingSummary:
        """Return the summary of a succeeded run.

        Raises:
            ItoRunOutcome: the run ended without success (``GateFailed``, ``RunRefused``…), or
                has not finished yet.
        """
        if not self.run.state.terminal:
            raise ItoRunOutcome(f"run {self.run_id} has not finished", run_id=self.run_id)
        raise_for_outcome(self.run)
        return TrainingSummary.of(self.run)

    async def cancel(self, reason: str = "cancelled through prefect-ito") -> TrainingRun:
        """Cancel the backend workload (never the booking) and wait until it is terminal."""
        async with self.job.credentials.get_client() as client:
            self.run = await operations.cancel_workload(client, self.run_id, reason=reason)
        return self.run
