"""What each artifact card says: pure functions from a backend run to markdown, tables, numbers.

Nothing here talks to Prefect or the backend; :mod:`prefect_ito.reporting` publishes the cards.
"""

from __future__ import annotations

from typing import Any

from prefect_ito.contract import Telemetry, TrainingRun

_SPARKS = "▁▂▃▄▅▆▇█"


def progress_percent(run: TrainingRun) -> float:
    """Return the share of the planned stages that are behind the run, as a percentage."""
    if not run.stages:
        return 0.0
    done = sum(stage.status.done for stage in run.stages)
    return 100.0 * done / len(run.stages)


def gate_rows(run: TrainingRun) -> list[dict[str, Any]]:
    """Return one table row per eval of every gate that has results."""
    return [
        {
            "stage": stage.name,
            "battery": stage.gate.battery,
            "eval": result.name,
            "metric": result.metric,
            "score": result.score,
            "threshold": result.threshold,
            "pass": result.passed,
        }
        for stage in run.stages
        if stage.gate is not None
        for result in stage.gate.evals
    ]


def sparkline(values: list[float]) -> str:
    """Return ``values`` as a Unicode sparkline."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(_SPARKS[round((value - low) / span * (len(_SPARKS) - 1))] for value in values)


def telemetry_markdown(run: TrainingRun) -> str:
    """Return the telemetry report: goodput, fault tolerance, spend and the loss curve."""
    t: Telemetry = run.telemetry
    ft = run.fault_tolerance
    lines = [
        f"## Itô training run `{run.run_id}` — {run.state.value}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| goodput | {t.goodput:.1%} |",
        f"| interruption rate | {t.interruption_rate_per_day:.2f} per day |",
        f"| checkpoint bandwidth | {t.checkpoint_bandwidth_gbps:.1f} GB/s |",
        f"| spend | ${t.spend_usd:,.2f} of ${t.budget_usd:,.2f} "
        f"({t.spend_usd / t.budget_usd:.0%} of the ceiling) |",
        f"| tokens processed | {t.tokens_processed:,} |",
        f"| step | {t.step:,} |",
    ]
    lines += _staleness_rows(run)
    lines += ["", "### Interruptions", ""]
    lines += _interruption_lines(run) or ["None so far."]
    lines += [
        "",
        f"Targets: detect < {ft.detect_target_seconds // 60} min, "
        f"resume < {ft.resume_target_seconds // 60} min. Checkpoints saved: {len(ft.checkpoints)}.",
    ]
    lines += ["", "### Loss", "", *_loss_lines(t)]
    return "\n".join(lines)


def _staleness_rows(run: TrainingRun) -> list[str]:
    return [
        f"| post-training staleness bound | {stage.details.rlvr.staleness_bound_steps} steps "
        f"({stage.details.rlvr.algorithm}) |"
        for stage in run.stages
        if stage.details.rlvr is not None
    ]


def _interruption_lines(run: TrainingRun) -> list[str]:
    ft = run.fault_tolerance
    lines = []
    for item in ft.interruptions:
        detect_ok = "✓" if item.detect_seconds < ft.detect_target_seconds else "✗"
        if item.resume_seconds is None:
            resumed = "recovering"
        else:
            resume_ok = "✓" if item.resume_seconds < ft.resume_target_seconds else "✗"
            resumed = f"resumed in {item.resume_seconds / 60:.1f} min {resume_ok}"
        lines.append(
            f"- `{item.stage}` at {item.at.isoformat()}: detected in "
            f"{item.detect_seconds / 60:.1f} min {detect_ok}, {resumed}"
        )
    return lines


def _loss_lines(t: Telemetry) -> list[str]:
    if not t.loss_history:
        return ["No loss reported yet."]
    losses = [point.loss for point in t.loss_history]
    return [
        f"`{sparkline(losses)}`",
        "",
        f"steps {t.loss_history[0].step:,} → {t.loss_history[-1].step:,}; "
        f"loss {losses[0]:.3f} → {losses[-1]:.3f} (min {min(losses):.3f}, max {max(losses):.3f})",
        "",
        "Points: " + ", ".join(f"{p.step}: {p.loss:.3f}" for p in t.loss_history),
    ]
