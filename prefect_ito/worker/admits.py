"""How a prefect-ito worker takes a flow run: judged by its own lists before Prefect starts it.

Both worker types (:mod:`~prefect_ito.worker.process`, :mod:`~prefect_ito.worker.kubernetes`)
take flow runs this one way: before Prefect's submission reads anything of the flow run's
deployment, the worker judges it by :class:`~prefect_ito.worker.allowed.AllowedFlows`; an
admitted run is started with what the worker judged (:class:`Admission`), any other ends
``Failed``, named :data:`REFUSED`, with the reason as its message, and nothing of it starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefect.exceptions import Abort, ObjectNotFound
from prefect.states import Failed
from prefect.utilities.engine import propose_state

from prefect_ito.worker.allowed import Admission, AllowedFlows

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.schemas.objects import FlowRun
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.workers.base import BaseWorker

    _Worker = BaseWorker[Any, Any, Any]
else:
    _Worker = object  # a mixin: the worker class it is mixed into is the BaseWorker

__all__ = ["REFUSED", "Admits"]

REFUSED = "Refused"
"""The name of the Failed state a refused flow run ends in."""


class Admits(_Worker):
    """Mixed into a Prefect worker (before it): judge each flow run, then submit or refuse it."""

    allowed: AllowedFlows
    _admitted: dict[UUID, Admission]

    def _configure_admission(
        self, flows: Sequence[str] | None, pull_steps: Sequence[str] | None
    ) -> None:
        """Read the worker's lists (arguments, else environment, else defaults)."""
        self.allowed = AllowedFlows.configured(flows, pull_steps)
        # A flow that does not import stops the worker now, not each flow run it takes later.
        self.allowed.check_importable()
        self._admitted = {}

    def _admission(self, flow_run: FlowRun) -> Admission:
        """Return what the worker admitted for a flow run it is starting, having said so first
        in the flow run's log (each worker type's ``run`` starts here)."""
        admission = self._admitted.get(flow_run.id)
        if admission is None:
            raise RuntimeError(f"flow run {flow_run.id} was not admitted by this worker")
        self._say_admitted(flow_run, admission)
        return admission

    def _say_admitted(self, flow_run: FlowRun, admission: Admission) -> None:
        """Say first in the flow run's log which worker runs it, and what: a flow run without
        this line ran on another worker (docs/security.md)."""
        steps = admission.pull_step_names
        self.get_flow_run_logger(flow_run).info(
            "The prefect-ito worker runs the installed %s%s.",
            admission.entrypoint,
            f" after the deployment's pull steps it allows ({', '.join(steps)})" if steps else "",
        )

    async def _submit_run(self, flow_run: FlowRun) -> None:
        """Judge the flow run by the worker's own lists before Prefect's submission starts it."""
        try:
            verdict = await self._judge(flow_run)
        except ObjectNotFound:
            verdict = None  # its deployment is gone: Prefect's own submission says so
        except Exception:
            self._logger.exception("Could not judge flow run %s; it stays scheduled", flow_run.id)
            self._forget(flow_run)  # still Scheduled: the next poll judges it again
            return
        if verdict is None or isinstance(verdict, Admission):
            if verdict is not None:
                self._admitted[flow_run.id] = verdict
            try:
                await super()._submit_run(flow_run)
            finally:
                self._admitted.pop(flow_run.id, None)
            return
        try:
            if await self._propose_pending_state(flow_run):
                await self._refuse(flow_run, verdict)
        finally:
            self._forget(flow_run)

    async def _judge(self, flow_run: FlowRun) -> Admission | str:
        deployment: DeploymentResponse | None = None
        if flow_run.deployment_id is not None:
            deployment = await self.client.read_deployment(flow_run.deployment_id)
        flow = await self.client.read_flow(flow_run.flow_id)
        return self.allowed.judge(deployment, flow.name)

    async def _refuse(self, flow_run: FlowRun, message: str) -> None:
        # Failed, not Crashed: nothing broke, and a crashed training run is one the watcher
        # re-enters. Not Cancelled either: that reads as a person's choice.
        self.get_flow_run_logger(flow_run).warning(message)
        with contextlib.suppress(Abort):  # already final
            await propose_state(
                self.client, Failed(name=REFUSED, message=message), flow_run_id=flow_run.id
            )

    def _forget(self, flow_run: FlowRun) -> None:
        """Release what the poll took for a flow run that is not started (as Prefect does)."""
        self._release_limit_slot(flow_run.id)
        self._submitting_flow_run_ids.discard(flow_run.id)
        if self._cancelling_observer is not None:
            self._cancelling_observer.remove_in_flight_flow_run_id(flow_run.id)
