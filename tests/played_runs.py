"""Backend runs as the simulator plays them, on a clock the test moves: no server, no sleeping."""

from __future__ import annotations

from datetime import UTC, datetime

from spend_helpers import confirmed_on

from prefect_ito.contract import DecisionRequest, PendingAction, TrainingRequest, TrainingRun
from prefect_ito.simulator import builtin_scenario
from prefect_ito.simulator.engine import Engine

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def play(
    scenario: str = "demo",
    *,
    decide: str | None = "approve",
    post_training: str | None = "rlvr",
    reason: str = "the spike follows a bad shard",
) -> tuple[TrainingRun, dict[str, PendingAction]]:
    """Play a run until it ends, or until a spike waits when ``decide`` is None.

    Returns the run and every pending action seen on it, as supervision would have seen them.
    """
    clock = _Clock()
    engine = Engine(builtin_scenario(scenario).model_copy(update={"start_at": START}), clock)
    request = TrainingRequest(
        booking_id="bk-h200-2x8-ib", model_size="8B", data_refs=["s3://acme/custom/"],
        target="code-assistant", budget_usd=250_000.0, post_training=post_training,
    ).to_submission()  # fmt: skip
    run_id = engine.submit("acct", "key-1", confirmed_on(engine, "acct", request)).run.run_id
    seen: dict[str, PendingAction] = {}
    record = engine.runs[run_id]
    while not record.state.terminal:
        clock.now += 0.05
        engine.advance()
        action = record.pending_action
        if action is not None:
            seen[action.action_id] = action
            if decide is None:
                break
            body = DecisionRequest(decision=decide, decided_by="Ada", reason=reason)
            engine.decide("acct", run_id, action.action_id, body, None, principal="user:acct")
    return record.snapshot(), seen
