"""How a training run's end becomes a typed outcome, a Prefect state and an exit code.

A backend run that ended without success raises the :class:`~prefect_ito.exceptions.ItoError`
that names its outcome. Each outcome's ``state_name`` and ``exit_code`` are a row of the one
outcome table (:mod:`prefect_ito.outcomes`), which this module only reads: there is no second
table to drift.
"""

from __future__ import annotations

import math
import re
from typing import Any

from prefect import State
from prefect.states import Cancelled, Failed

from prefect_ito.contract import RunState, TrainingRun
from prefect_ito.exceptions import (
    BudgetExhausted,
    ExitCode,
    GateFailed,
    ItoError,
    ItoRunOutcome,
    RunCancelled,
    RunFailed,
    RunRefused,
)
from prefect_ito.outcomes import COMPLETED, OUTCOMES

__all__ = ["exit_code", "outcome_error", "outcome_state", "raise_for_outcome"]


def _state_exit_codes() -> dict[str, ExitCode]:
    table = {outcome.state_name: outcome.exit_code for outcome in OUTCOMES}
    return {**table, COMPLETED: ExitCode.SUCCESS}


def _state_code(state_name: str) -> str:
    """Return the code of a final state that lost its exception.

    The code of the one class that ends a flow run in that state (Cancelled: RUN_CANCELLED);
    where several do (Unauthenticated), the state's name in upper snake case.
    """
    codes = {outcome.code for outcome in OUTCOMES if outcome.state_name == state_name}
    if len(codes) == 1:
        return codes.pop()
    return re.sub(r"(?<!^)(?=[A-Z])", "_", state_name).upper()


_EXIT_CODES = _state_exit_codes()


def outcome_state(error: ItoError) -> State[Any]:
    """Return the final state for an outcome: Cancelled, or a Failed state named for it."""
    if isinstance(error, RunCancelled):
        return Cancelled(message=f"{error.state_name}: {error}")
    return Failed(name=error.state_name, message=f"{error.state_name}: {error}", data=error)


def exit_code(state: State[Any]) -> ExitCode:
    """Return the exit code of a command whose flow run ended in ``state``."""
    if state.is_cancelled():
        return ExitCode.CANCELLED
    if state.is_completed():
        return ExitCode.SUCCESS
    return _EXIT_CODES.get(state.name or "", ExitCode.ERROR)


def outcome_error(state: State[Any]) -> ItoError | None:
    """Return the outcome a flow run's final state stands for; None when it completed.

    The exception the flow ended with when the state still holds it (in the process that ran
    the flow); otherwise an error with the state's message, its code and its exit code.
    """
    if state.is_completed():
        return None
    try:
        found = state.result(raise_on_failure=False, _sync=True)  # type: ignore[call-overload]
    except Exception:  # the state holds no result, or one that cannot be read here
        found = None
    if isinstance(found, ItoError):
        return found
    name = state.name or "Failed"
    error = ItoError(state.message or f"the flow run ended {name}")
    error.code = _state_code(name)
    error.state_name, error.exit_code = name, exit_code(state)
    return error


def raise_for_outcome(run: TrainingRun) -> None:
    """Raise the typed outcome of a run that ended without success; return on success.

    A run that ended in a state prefect-ito does not know never counts as a success: it is
    :class:`RunFailed`, naming the state and the backend's outcome.
    """
    message = run.outcome.message if run.outcome else f"run {run.run_id} ended {run.state.value}"
    if not run.state.known:
        outcome = f"{run.outcome.code}: {run.outcome.message}" if run.outcome else "no outcome"
        raise RunFailed(
            f"run {run.run_id} ended in state {run.state.value!r}, which this prefect-ito does "
            f"not know ({outcome})",
            run_id=run.run_id,
        )
    if run.state is RunState.GATE_FAILED:
        raise _gate_failure(run, message)
    errors: dict[RunState, type[ItoRunOutcome]] = {
        RunState.REFUSED: RunRefused,
        RunState.BUDGET_EXHAUSTED: BudgetExhausted,
        RunState.CANCELLED: RunCancelled,
        RunState.FAILED: RunFailed,
    }
    if run.state in errors:
        raise errors[run.state](message, run_id=run.run_id)


def _gate_failure(run: TrainingRun, message: str) -> GateFailed:
    stage_name = (run.outcome.stage if run.outcome else None) or run.current_stage or "unknown"
    stage = next((stage for stage in run.stages if stage.name == stage_name), None)
    evals = stage.gate.evals if stage is not None and stage.gate is not None else []
    failed = next((result for result in evals if not result.passed), None)
    if failed is None:
        return GateFailed(
            stage_name, "unknown", math.nan, math.nan, run_id=run.run_id, message=message
        )
    return GateFailed(
        stage_name,
        failed.name,
        failed.score,
        failed.threshold,
        run_id=run.run_id,
        message=f"gate failed at stage {stage_name}: {failed.name} ({failed.metric}) scored "
        f"{failed.score:g} against a threshold of {failed.threshold:g}",
    )
