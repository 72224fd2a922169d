"""How a supervisor does each step of supervision.

Every backend operation is an :class:`~prefect_ito.backend.operations.Operation` of one table; a
:class:`Steps` performs any of them — :class:`~prefect_ito.supervision.tasks.TaskSteps` as the
Prefect task made from it (the ``ito-training`` flow), and
:class:`~prefect_ito.supervision.plain.ClientSteps` as a plain call over one client
(:class:`~prefect_ito.jobs.ItoTrainingRun`), retried the same way. Beside the operations, a
``Steps`` says how a supervisor keeps its records, asks people and reports: what differs between
a flow run and a plain job.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from prefect_ito.backend import desk
from prefect_ito.backend.gates import Watchdog
from prefect_ito.backend.operations import AWAIT_STAGE_GATE, Operation, P, R
from prefect_ito.backend.provenance import Provenance
from prefect_ito.backend.refusals import Uncovered
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import PendingAction, TrainingQuote, TrainingRequest, TrainingRun
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.people import approval, spend
from prefect_ito.settings import current_settings
from prefect_ito.waiting import waits
from prefect_ito.waiting.cancellation import stop_requested
from prefect_ito.waiting.flow_run import current_flow_run_id

Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[logging.Logger]

__all__ = ["Logger", "Steps"]


class Steps(ABC):
    """How a supervisor does each step; see the module docstring."""

    cancel_confirm_seconds: float = desk.CANCEL_CONFIRM_SECONDS
    """How long a cancel waits for the backend to report the workload terminal."""
    credentials: ItoCredentials | None = None
    """The backend's credentials block, which a record of a question names (never a token)."""

    def __init__(
        self,
        supervision: SupervisionParameters,
        logger: Logger,
        authorization: ItoSpendAuthorization | None = None,
    ) -> None:
        self.supervision = supervision
        self.logger = logger
        self.authorization = authorization

    @abstractmethod
    async def perform(self, operation: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Do ``operation`` with these arguments (after the client) and return its result."""

    async def await_gate(
        self, run: TrainingRun, watchdog: Watchdog, events_seen: int
    ) -> TrainingRun:
        """Return the run once its current stage's gate settled (or it must stop waiting)."""
        flow_run_id = current_flow_run_id()
        return await self.perform(
            AWAIT_STAGE_GATE, run, watchdog, lambda: stop_requested(flow_run_id)
        )

    async def await_person(
        self,
        quote: TrainingQuote,
        request: TrainingRequest,
        *,
        again: bool,
        why: str,
        refused: Uncovered | None = None,
    ) -> TrainingQuote:
        """Wait for a person to confirm or decline the quote at the backend; see
        :func:`prefect_ito.people.spend.wait_for_person`."""
        return await spend.wait_for_person(
            self,
            quote,
            request,
            again=again,
            why=why,
            timeout=self.supervision.approval_timeout,
            poll_interval=current_settings().state_poll_seconds,
            refused=refused,
        )

    async def recorded_quote(self, request: TrainingRequest) -> TrainingQuote | None:
        """Return the quote an earlier process of this supervisor asked a person about."""
        return None

    async def record_quote(  # noqa: B027 (optional hook)
        self, quote: TrainingQuote, refused: Uncovered | None = None
    ) -> None:
        """Record the quote a person is asked about, and the authorization that did not cover
        it, for a watcher and for a re-entry."""

    async def recorded_run_id(self) -> str | None:
        """Return the backend run this supervisor recorded before (in an earlier process)."""
        return None

    async def record_run(self, run: TrainingRun) -> None:  # noqa: B027 (optional hook)
        """Record the backend run this supervisor follows, so a re-entry never submits again."""

    async def settle(self, run: TrainingRun, events_seen: int) -> None:  # noqa: B027 (optional hook)
        """Make sure the finished run's relayed events arrived; by default, trust the sending."""

    async def resume_point(self, run: TrainingRun) -> tuple[int, Watchdog]:
        """Return the events already relayed and the watchdog to carry on with."""
        limits = self.supervision
        return 0, Watchdog(stall_timeout=limits.stall_timeout, deadline=limits.deadline)

    @abstractmethod
    async def report(self, run: TrainingRun, after_seq: int) -> int:
        """Relay events after ``after_seq`` and refresh artifacts; return the last seq seen."""

    async def await_decision(self, run: TrainingRun) -> TrainingRun | None:
        """Wait for a person to decide the run's pending action at the backend; return the run
        then, or None if the flow run was cancelled (see
        :func:`prefect_ito.people.approval.wait_for_decision`)."""
        return await approval.wait_for_decision(
            self,
            run,
            timeout=self.supervision.approval_timeout,
            poll_interval=current_settings().state_poll_seconds,
        )

    async def await_owner(
        self, run: TrainingRun, owner: str, still_asks: Callable[[], Awaitable[str | None]]
    ) -> TrainingRun | None:
        """Wait, asking nobody, for the decision ``owner`` asks about while it still does;
        return the run then, or None if the flow run was cancelled (see
        :func:`prefect_ito.people.approval.wait_for_owner`)."""
        return await approval.wait_for_owner(
            self,
            run,
            owner,
            still_asks,
            timeout=self.supervision.approval_timeout,
            poll_interval=current_settings().state_poll_seconds,
        )

    async def record_action(self, run: TrainingRun, action: PendingAction) -> None:
        """Record, inside a flow run, the action a person is asked about: which backend, run and
        action the pause is about, for a watcher and for a terminal."""
        flow_run_id = current_flow_run_id()
        if flow_run_id is None or self.credentials is None:
            return
        record = waits.ActionWait(
            api_url=self.credentials.api_url,
            keyring_entry=self.credentials.keyring_entry,
            run_id=run.run_id,
            action_id=action.action_id,
            action=action,
        )
        await waits.record_wait(flow_run_id, record)

    @abstractmethod
    def provenance(self) -> Provenance | None:
        """Return what the backend last said of its answers' origin; None before any answer."""

    async def interrupted(self) -> bool:
        """Tell whether a person cancelled the flow run; raise ``Detached`` on a detach."""
        return await stop_requested(current_flow_run_id())
