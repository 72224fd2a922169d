"""The built-in scenarios, by name: the default (every gate passes) and one per outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect_ito.contract import BookingStatus
from prefect_ito.simulator.scenario import (
    DeadlineSpec,
    EvalSpec,
    GateSpec,
    InterruptionSpec,
    RunScript,
    Scenario,
    SimBooking,
    SpikeSpec,
    StageSpec,
    StallSpec,
)

COMPLETED_BOOKING = "bk-h200-2x8-ib"
"""The default completed booking: H200, 2 nodes × 8 GPUs, InfiniBand."""
SECOND_COMPLETED_BOOKING = "bk-h100-1x8-ib"


def default_bookings() -> list[SimBooking]:
    """Return the documented default bookings, one per status plus a second completed one."""
    statuses = {
        COMPLETED_BOOKING: BookingStatus.COMPLETED,
        "bk-h200-pending": BookingStatus.PENDING,
        "bk-h200-expired": BookingStatus.EXPIRED,
        "bk-h200-revoked": BookingStatus.REVOKED,
        "bk-h200-released": BookingStatus.RELEASED,
    }
    bookings = [SimBooking(booking_id=key, status=value) for key, value in statuses.items()]
    bookings.append(
        SimBooking(
            booking_id=SECOND_COMPLETED_BOOKING,
            status=BookingStatus.COMPLETED,
            gpu_sku="H100",
            node_count=1,
        )
    )
    return bookings


def _gate(battery: str, *evals: tuple[str, float, float]) -> GateSpec:
    return GateSpec(
        battery=battery,
        evals=[EvalSpec(name=name, score=score, threshold=bar) for name, score, bar in evals],
    )


def _stage(
    name: str, hours: float, steps: int, loss: tuple[float, float], gate: GateSpec
) -> StageSpec:
    return StageSpec(
        name=name, hours=hours, steps=steps, loss_start=loss[0], loss_end=loss[1], gate=gate
    )


def default_script() -> RunScript:
    """Return the default run script: about three simulated weeks, every gate passes."""
    curriculum = [
        _stage("pretrain", 336, 20_000, (10.5, 2.6),
               _gate("core-v1", ("mmlu", 0.61, 0.55), ("hellaswag", 0.74, 0.70))),
        _stage("mid_train", 72, 4_000, (2.6, 2.3),
               _gate("reasoning-v1", ("gsm8k", 0.52, 0.45), ("math", 0.31, 0.25))),
        _stage("long_context", 48, 1_500, (2.3, 2.2),
               _gate("long-context-v1", ("ruler-32k", 0.81, 0.75), ("needle-128k", 0.93, 0.90))),
    ]  # fmt: skip
    post_training = [
        _stage("post_training.sft", 24, 2_000, (1.6, 1.1),
               _gate("instruct-v1", ("ifeval", 0.72, 0.65))),
        _stage("post_training.dpo", 12, 800, (0.69, 0.45),
               _gate("preference-v1", ("alpacaeval-lc", 0.34, 0.30))),
        _stage("post_training.rlvr", 48, 1_200, (0.9, 0.6),
               _gate("verifiable-v1", ("gsm8k", 0.71, 0.60), ("humaneval", 0.58, 0.50))),
    ]  # fmt: skip
    return RunScript(curriculum=curriculum, post_training=post_training)


def _scenario(name: str, description: str, **changes: Any) -> Scenario:
    """Return the default scenario with run-script fields (or ``scenario``-level ones) changed."""
    scenario_fields = changes.pop("scenario", {})
    run = RunScript.model_validate({**default_script().model_dump(), **changes})
    return Scenario(
        name=name,
        description=description,
        bookings=default_bookings(),
        run=run,
        **scenario_fields,
    )


def _failing_mid_train() -> list[dict[str, Any]]:
    curriculum = default_script().model_dump()["curriculum"]
    curriculum[1]["gate"]["evals"][0]["score"] = 0.38  # gsm8k under its 0.45 bar
    return list(curriculum)


_BUILTINS: dict[str, Callable[[], Scenario]] = {
    "default": lambda: _scenario("default", "Every gate passes; no faults."),
    "demo": lambda: _scenario(
        "demo",
        "Custom data passes the 150M ladder; every gate passes, with two interruptions and one "
        "loss spike that needs a decision.",
        interruptions=[
            InterruptionSpec(stage="pretrain", at_fraction=0.3),
            InterruptionSpec(stage="mid_train", at_fraction=0.5, detect_seconds=300),
        ],
        loss_spikes=[SpikeSpec(stage="pretrain", at_fraction=0.6)],
    ),
    "unavailable": lambda: _scenario(
        "unavailable",
        "Answers like production today: training_run is not live, submissions are refused.",
        scenario={"scaffold": True},
    ),
    "gate-failure": lambda: _scenario(
        "gate-failure", "The mid_train gate fails (gsm8k).", curriculum=_failing_mid_train()
    ),
    "refused": lambda: _scenario(
        "refused",
        "The backend refuses the parallelism plan as wasteful.",
        parallelism_refusal="tensor parallel 8 across nodes leaves most of each GPU idle",
    ),
    "ladder-rejection": lambda: _scenario(
        "ladder-rejection",
        "The 150M ladder job rejects custom data (catalog data is unaffected).",
        ladder_rejection="150M ladder: custom data underperforms the catalog mix by 4.1%",
    ),
    "budget-exhausted": lambda: _scenario(
        "budget-exhausted", "GPU hours cost so much that any budget runs out.", gpu_hour_usd=1e6
    ),
    "stall": lambda: _scenario(
        "stall",
        "The workload stops mid-pretrain: no progress and no heartbeat.",
        stall=StallSpec(stage="pretrain", at_fraction=0.4),
    ),
    "loss-spike": lambda: _scenario(
        "loss-spike",
        "One loss spike in pretrain waits for a decision.",
        loss_spikes=[SpikeSpec(stage="pretrain", at_fraction=0.6)],
    ),
    "deadline-extension": lambda: _scenario(
        "deadline-extension",
        "The run reaches its wall-clock deadline in mid_train; a later one waits for a decision.",
        deadline_extensions=[DeadlineSpec(stage="mid_train", at_fraction=0.5)],
    ),
    "two-spikes": lambda: _scenario(
        "two-spikes",
        "Loss spikes in pretrain and mid_train, each waiting for a decision.",
        loss_spikes=[
            SpikeSpec(stage="pretrain", at_fraction=0.6),
            SpikeSpec(stage="mid_train", at_fraction=0.5),
        ],
    ),
    "interruptions": lambda: _scenario(
        "interruptions",
        "Three interruptions, recovered within the backend's targets.",
        interruptions=[
            InterruptionSpec(stage="pretrain", at_fraction=0.2),
            InterruptionSpec(stage="pretrain", at_fraction=0.7, detect_seconds=420),
            InterruptionSpec(stage="mid_train", at_fraction=0.5, resume_seconds=780),
        ],
    ),
}

BUILTIN_NAMES = tuple(_BUILTINS)


def builtin_scenario(name: str) -> Scenario:
    """Return a built-in scenario.

    Args:
        name: One of :data:`BUILTIN_NAMES`.

    Returns:
        A fresh scenario.

    Raises:
        KeyError: No built-in scenario has this name.
    """
    try:
        factory = _BUILTINS[name]
    except KeyError:
        known = ", ".join(BUILTIN_NAMES)
        raise KeyError(f"no built-in scenario {name!r}; known: {known}") from None
    return factory()
