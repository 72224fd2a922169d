"""``prefect-ito decide``: approve or reject, at the backend and as yourself, what it proposes.

Contract v0.5: whatever a backend holds a run for (a restart after a loss spike, a later
deadline: see :mod:`prefect_ito.questions`) is decided by a person the backend authenticated —
with this command (which sends the person's own token, from their login or
``ITO_COMPUTE_TOKEN``), at the terminal ``train`` runs in, or on the backend's decide page. The
backend records their principal; a workload's token may not decide, and is told where a person
does.

Which backend run the flow run follows is the backend's answer (see
:func:`~prefect_ito.waiting.cancellation.followed_run`), never a record in Prefect. Once the
backend took the decision, a flow run paused for it is resumed with ``recheck`` — which decides
nothing; the flow reads the run from the backend — so that it goes on even with no
``prefect-ito watch`` running.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from cyclopts import Parameter
from prefect.client.schemas.objects import FlowRun
from rich.console import Console

from prefect_ito.backend import desk
from prefect_ito.cli.errors import respond
from prefect_ito.cli.flow_runs import backend_client, read_flow_run, require_server
from prefect_ito.cli.output import JsonOption
from prefect_ito.contract import DecisionChoice, DecisionRequest, TrainingRun
from prefect_ito.exceptions import InvalidParameters, NothingToDecide
from prefect_ito.people import answers
from prefect_ito.people.approval import decision_on
from prefect_ito.questions import question_for
from prefect_ito.waiting.cancellation import followed_run
from prefect_ito.waiting.keys import is_action_pause
from prefect_ito.waiting.waits import recheck_answer

__all__ = ["decide"]

_console = Console()


def decide(
    flow_run_id: UUID,
    *,
    approve: bool = False,
    reject: bool = False,
    reason: str,
    note: Annotated[str | None, Parameter(name=["--note", "--name"])] = None,
    json_output: JsonOption = False,
) -> None:
    """Approve or reject, as yourself, what a training flow run waits for: a proposed restart or
    deadline extension.

    The decision is made at the backend with your own login; the backend records who you are.

    Args:
        flow_run_id: The training flow run that waits for the decision.
        approve: Approve it: a restart restarts from the proposed checkpoint; an extension lets
            the run go on to the later deadline.
        reject: Reject it: after a loss spike the run goes on without restarting; at a deadline
            it stops there.
        reason: Why; recorded at the backend with the decision.
        note: Anything to keep beside it at the backend, such as your name (``--name``, as
            before contract v0.5); who decided is your login.
    """
    command = _decide(flow_run_id, approve=approve, reject=reject, reason=reason, note=note)
    respond(json_output, command, _show)


async def _decide(
    flow_run_id: UUID, *, approve: bool, reject: bool, reason: str, note: str | None
) -> dict[str, Any]:
    require_server("decide")
    if approve == reject:
        raise InvalidParameters("give exactly one of --approve and --reject")
    decision = DecisionRequest(
        decision=DecisionChoice.APPROVE if approve else DecisionChoice.REJECT,
        reason=reason,
        decided_by=note or None,
    )
    flow_run = await read_flow_run(flow_run_id)
    async with await backend_client(flow_run) as client:
        run = await followed_run(client, flow_run)
        action = run.pending_action if run is not None else None
        if run is None or action is None:
            raise NothingToDecide(_nothing_pending(flow_run, run))
        decided = await desk.decide_action(client, run, action.action_id, decision)
    record = decision_on(decided, action)
    await _recheck(flow_run_id, action.action_id)
    return {
        "flow_run_id": str(flow_run_id),
        "run_id": run.run_id,
        "action_id": action.action_id,
        "kind": question.name if (question := question_for(action)) else action.kind.value,
        "subject": question.subject if question else f"the {action.kind.value}",
        "decision": decision.decision.value,
        "decided_by": record.principal if record is not None else None,
        "reason": record.reason if record is not None else reason,
    }


def _nothing_pending(flow_run: FlowRun, run: TrainingRun | None) -> str:
    if run is None:
        return f"flow run {flow_run.id} follows no backend run the backend knows of"
    return (
        f"backend run {run.run_id} of flow run {flow_run.id} waits for no decision "
        f"(it is {run.state.value})"
    )


async def _recheck(flow_run_id: UUID, action_id: str) -> None:
    """Resume the flow run if it is paused for the action, with ``recheck``: it reads the run."""
    flow_run = await read_flow_run(flow_run_id)
    state = flow_run.state
    key = state.state_details.pause_key if state is not None else None
    if state is None or not state.is_paused() or not is_action_pause(key):
        return  # not waiting (or a watcher resumed it first): it reads the backend itself
    why = f"{action_id} was decided at the backend"
    try:
        await answers.resume_with(flow_run_id, state, recheck_answer(why))
    except RuntimeError:  # resumed, cancelled or timed out meanwhile: nothing to undo
        return


def _show(sent: dict[str, Any]) -> None:
    done = "Approved" if sent["decision"] == "approve" else "Rejected"
    _console.print(
        f"{done} at the backend as {sent['decided_by'] or 'you'}: {sent['subject']} of backend run "
        f"{sent['run_id']} ({sent['action_id']}). The flow run goes on.",
        markup=False,
        soft_wrap=True,
    )
