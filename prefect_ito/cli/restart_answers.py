"""What a terminal does about a proposed restart besides asking: read the run, and decide.

:func:`prefect_ito.cli.terminal.ask_at_terminal` asks the person; these act at the backend with
this terminal's own token (contract v0.5: only a person's token decides, and the backend records
its principal). What a person decides is the action of the run a record names, as the backend
states it — the record is Prefect's, which anyone with API access may have written, so the
person reads the evidence from the backend before answering.
"""

from __future__ import annotations

from rich.console import Console

from prefect_ito.backend import desk
from prefect_ito.blocks import ItoCredentials
from prefect_ito.cli.stated import read_stated
from prefect_ito.contract import DecisionRequest, TrainingRun
from prefect_ito.exceptions import InsufficientScope, ItoAPIError
from prefect_ito.people.approval import decision_on
from prefect_ito.waiting.waits import ActionWait

__all__ = ["decide_here", "stated_run"]

_DONE = {"approve": "Approved", "reject": "Rejected"}


async def stated_run(record: ActionWait) -> TrainingRun | None:
    """Return the run ``record`` names, as the backend states it; None if it cannot be read."""
    return await read_stated(record, lambda client: client.get_training_run(record.run_id))


async def decide_here(
    record: ActionWait, run: TrainingRun, decision: DecisionRequest, console: Console
) -> TrainingRun | None:
    """Decide the recorded action at the backend with this terminal's token; say what happened.

    Returns the run as the backend states it after the decision, or None if it took none. A
    token that may not decide (a workload's) is told where a person decides instead.
    """
    credentials = ItoCredentials(api_url=record.api_url, keyring_entry=record.keyring_entry)
    try:
        async with credentials.get_client() as client:
            decided = await desk.decide_action(client, run, record.action_id, decision)
    except InsufficientScope as error:
        console.print(f"[yellow]{error.message}[/]", soft_wrap=True, highlight=False)
        return None
    except ItoAPIError as error:
        console.print(f"The backend refused the decision: {error}", markup=False)
        return None
    said = decision_on(decided, run.pending_action) if run.pending_action else None
    who = said.principal if said is not None and said.principal else "you"
    console.print(
        f"{_DONE[decision.decision.value]} at the backend as {who} (run {run.run_id}, "
        f"action {record.action_id}).",
        markup=False,
        soft_wrap=True,
    )
    return decided
