"""Each step as a plain call over one client, for :class:`~prefect_ito.jobs.ItoTrainingRun`."""

from __future__ import annotations

from prefect_ito.backend.client import ItoClient
from prefect_ito.backend.operations import Operation, P, R, resend
from prefect_ito.backend.provenance import Provenance
from prefect_ito.backend.refusals import Uncovered
from prefect_ito.blocks import ItoCredentials, ItoSpendAuthorization
from prefect_ito.contract import TrainingQuote, TrainingRequest, TrainingRun
from prefect_ito.exceptions import ConfirmationRequired, DecisionRequired
from prefect_ito.parameters import SupervisionParameters
from prefect_ito.reporting import report as reporting
from prefect_ito.supervision.steps import Logger, Steps
from prefect_ito.waiting.flow_run import current_flow_run_id

__all__ = ["ClientSteps"]


class ClientSteps(Steps):
    """Each operation as a plain call over one client, retried as the flow's tasks are.

    Inside a flow run a spend or a proposed restart is put to a person exactly as the flow does;
    outside one :class:`ConfirmationRequired` or :class:`DecisionRequired` is raised instead, since
    nobody could answer a pause.
    """

    def __init__(
        self,
        client: ItoClient,
        supervision: SupervisionParameters,
        logger: Logger,
        authorization: ItoSpendAuthorization | None = None,
        credentials: ItoCredentials | None = None,
    ) -> None:
        super().__init__(supervision, logger, authorization)
        self.client = client
        self.credentials = credentials

    async def perform(self, operation: Operation[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if not operation.resendable:
            return await operation.call(self.client, *args, **kwargs)
        return await resend(lambda: operation.call(self.client, *args, **kwargs), self.logger)

    async def await_person(
        self,
        quote: TrainingQuote,
        request: TrainingRequest,
        *,
        again: bool,
        why: str,
        refused: Uncovered | None = None,
    ) -> TrainingQuote:
        if current_flow_run_id() is None:
            where = f" at {quote.confirm_url} (code {quote.user_code})" if quote.confirm_url else ""
            raise ConfirmationRequired(
                f"the spend on booking {request.booking_id} (quote {quote.quote_id}) needs a "
                f"person's confirmation at the backend{where} ({why}), and outside a flow run "
                "nobody can be waited for: confirm it there and run the job again, give the job a "
                "standing authorization that covers it, or trigger it in a flow run"
            )
        return await super().await_person(quote, request, again=again, why=why, refused=refused)

    async def report(self, run: TrainingRun, after_seq: int) -> int:
        # Reads and re-sent events (Prefect keeps one of each id): safe to make again.
        return await resend(lambda: reporting.report(self.client, run, after_seq), self.logger)

    async def await_decision(self, run: TrainingRun) -> TrainingRun | None:
        action = run.pending_action
        assert action is not None
        if current_flow_run_id() is None:
            raise DecisionRequired(action, run_id=run.run_id)
        return await super().await_decision(run)

    def provenance(self) -> Provenance | None:
        return self.client.provenance
