"""The loss chart: a small hand-written SVG, shown as a ``data:`` image in markdown.

The Prefect UI renders ``data:image/svg+xml;base64,…`` images in markdown artifacts and in the
form a paused flow run shows, but not inline ``<svg>`` markup, and its image artifact needs a
public URL; so the chart travels inside the markdown. It needs no plotting library: a polyline,
two axes and a few markers are all a person needs to read a loss curve.

:func:`loss_chart` reads a backend run: the loss history (steps and loss, in the order the
backend reported them), stage boundaries (from the checkpoints each stage saved), interruptions,
loss spikes and restarts. A restart shows in the history as a step back; the stretch it threw
away is drawn dashed. :func:`draw` draws any :class:`LossChart`.

The chart's model and its drawing stay together, which is why the module is past ~400 lines: what
the chart shows and where it is drawn are read side by side, and no SVG library is worth a
dependency for one line chart.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from xml.sax.saxutils import escape

from prefect_ito.contract import DecisionChoice, PendingAction, TrainingRun

__all__ = ["LossChart", "Spike", "StageSpan", "draw", "loss_chart", "markdown_image"]

WIDTH, HEIGHT = 720, 330
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 24, 34, 70
_LEGEND_ROW = 16
_CHAR_WIDTH = 7
"""Room a character of a stage's name takes, generously, at the chart's font size."""
FORM_WIDTH = 440
"""Fits the Prefect UI's Resume dialog, whose markdown column is about 470 pixels wide."""
_INK, _GRID, _LINE = "#1f2937", "#e5e7eb", "#2563eb"
_SPIKE, _RESTART, _DISCARDED, _INTERRUPTION = "#dc2626", "#ea580c", "#9ca3af", "#b45309"
_BASELINE = "#047857"
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="11"'


@dataclass(frozen=True)
class StageSpan:
    """The steps a stage covered."""

    name: str
    start: int
    end: int


@dataclass(frozen=True)
class Spike:
    """A loss spike, and the step the run restarted from: proposed, approved or neither."""

    step: int
    loss: float
    restart_step: int | None = None
    decision: str = "pending"
    """``pending`` (a restart is proposed), ``approve`` or ``reject``."""
    baseline: float | None = None
    """The loss the backend measured the spike against (``PendingAction.baseline_loss``)."""


@dataclass(frozen=True)
class LossChart:
    """What the chart shows; every step is a training step, every loss as reported."""

    points: Sequence[tuple[int, float]]
    stages: Sequence[StageSpan] = ()
    interruptions: Sequence[int] = ()
    spikes: Sequence[Spike] = ()
    restarts: Sequence[int] = ()
    """Steps the run went back to, read from the history (it steps back on a restart)."""
    title: str = "Training loss by step"


def markdown_image(svg: str, alt: str) -> str:
    """Return markdown that shows ``svg`` as an image (a base64 ``data:`` URI)."""
    encoded = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f"![{alt}](data:image/svg+xml;base64,{encoded})"


def loss_chart(run: TrainingRun, actions: Mapping[str, PendingAction] | None = None) -> LossChart:
    """Return the chart of ``run``'s loss history.

    Args:
        run: The backend run.
        actions: Pending actions seen earlier, by id: a decided action is no longer on the run,
            so its spike and checkpoint come from here.
    """
    points = [(point.step, point.loss) for point in run.telemetry.loss_history]
    stages = _stage_spans(run, points)
    return LossChart(
        points=points,
        stages=stages,
        interruptions=_interruption_steps(run, stages),
        spikes=_spikes(run, actions or {}),
        restarts=[points[i][0] for i in range(1, len(points)) if points[i][0] < points[i - 1][0]],
    )


def _stage_spans(run: TrainingRun, points: list[tuple[int, float]]) -> list[StageSpan]:
    """Return the steps of each training stage, from the checkpoints it saved."""
    reached: dict[str, int] = {}
    for checkpoint in run.fault_tolerance.checkpoints:
        reached[checkpoint.stage] = max(reached.get(checkpoint.stage, 0), checkpoint.step)
    if run.current_stage and points and not run.state.terminal:
        latest = max(step for step, _ in points)
        reached[run.current_stage] = max(reached.get(run.current_stage, 0), latest)
    spans, start = [], 0
    for stage in run.stages:
        end = reached.get(stage.name)
        if end is not None and end > start:
            spans.append(StageSpan(stage.name, start, end))
            start = end
    return spans


def _interruption_steps(run: TrainingRun, stages: list[StageSpan]) -> list[int]:
    """Return the step of each interruption, interpolated in time between the checkpoints."""
    times = sorted((c.at, c.step) for c in run.fault_tolerance.checkpoints)
    starts = {span.name: span.start for span in stages}
    return [
        _step_at(times, item.at, default=starts.get(item.stage, 0))
        for item in run.fault_tolerance.interruptions
    ]


def _step_at(times: list[tuple[datetime, int]], at: datetime, default: int) -> int:
    before = [(t, step) for t, step in times if t <= at]
    after = [(t, step) for t, step in times if t > at]
    if not before:
        return default if not after else min(default, after[0][1])
    (t0, s0), nxt = before[-1], after[0] if after else None
    if nxt is None or nxt[1] < s0:
        return s0
    span = (nxt[0] - t0).total_seconds()
    share = (at - t0).total_seconds() / span if span else 0.0
    return round(s0 + share * (nxt[1] - s0))


def _spikes(run: TrainingRun, actions: Mapping[str, PendingAction]) -> list[Spike]:
    known = dict(actions)
    if run.pending_action is not None:
        known[run.pending_action.action_id] = run.pending_action
    decided = {d.action_id: d.decision for d in run.decisions}
    spikes = []
    for action_id, action in known.items():
        if action.loss is None or action.proposed_checkpoint is None:
            continue  # not a loss spike: a kind of action added to the contract later
        decision = decided.get(action_id)
        checkpoint = action.proposed_checkpoint.step
        spikes.append(
            Spike(
                step=action.step,
                loss=action.loss,
                restart_step=None if decision is DecisionChoice.REJECT else checkpoint,
                decision=decision.value if decision else "pending",
                baseline=action.baseline_loss,
            )
        )
    return spikes


# --- drawing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    """Maps steps and losses onto the plot area."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def bottom(self) -> int:
        """The y of the step axis."""
        return self.height - _BOTTOM

    @property
    def right(self) -> int:
        """The x where the plot ends."""
        return self.width - _RIGHT

    def x(self, step: float) -> float:
        share = (step - self.x0) / ((self.x1 - self.x0) or 1)
        return round(_LEFT + share * (self.right - _LEFT), 1)

    def y(self, loss: float) -> float:
        share = (loss - self.y0) / ((self.y1 - self.y0) or 1)
        return round(self.bottom - share * (self.bottom - _TOP), 1)


def draw(chart: LossChart, width: int = WIDTH, height: int = HEIGHT) -> str:
    """Return the chart as an SVG document, ``width`` wide and (legend rows aside) ``height`` high.

    Draw it at the width it is shown at: a browser scales a wider SVG down, text and all.
    """
    steps = [step for step, _ in chart.points] + [s.step for s in chart.spikes]
    losses = [loss for _, loss in chart.points] + [s.loss for s in chart.spikes]
    losses += [baseline for _, baseline in _baselines(chart)]
    x_ticks = _ticks(0, max(steps, default=1))
    y_ticks = _ticks(0.0, max(losses, default=1.0))
    frame = _Frame(x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1], width, height)
    legend, rows = _legend(chart, frame)
    total = height + _LEGEND_ROW * (rows - 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" '
        f'viewBox="0 0 {width} {total}" role="img" {_FONT}>',
        f"<title>{escape(chart.title)}</title>",
        f'<rect width="{width}" height="{total}" rx="6" fill="#ffffff" stroke="{_GRID}"/>',
        *_stage_bands(chart.stages, frame),
        *_axes(frame, x_ticks, y_ticks),
        *_lines(chart.points, frame),
        *_restart_marks(chart, frame),
        *_interruption_marks(chart.interruptions, frame),
        *_baseline_marks(chart, frame),
        *_spike_marks(chart.spikes, frame),
        *legend,
        "</svg>",
    ]
    return "\n".join(parts)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Return round tick values from at most ``low`` to at least ``high``."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = [first]
    while ticks[-1] < high - 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _number(value: float) -> str:
    """Return a tick label: 12k, 1.5M, 2.5, 10."""
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _stage_bands(stages: Sequence[StageSpan], frame: _Frame) -> list[str]:
    parts = []
    for index, span in enumerate(stages):
        left, right = frame.x(span.start), frame.x(span.end)
        parts.append(
            f'<rect x="{left}" y="{_TOP}" width="{round(right - left, 1)}" '
            f'height="{frame.bottom - _TOP}" fill="{"#f3f4f6" if index % 2 else "#ffffff"}">'
            f"<title>{escape(span.name)}: steps {span.start:,} to {span.end:,}</title></rect>"
        )
        if index:
            parts.append(
                f'<line x1="{left}" y1="{_TOP}" x2="{left}" y2="{frame.bottom}" '
                f'stroke="{_DISCARDED}" stroke-dasharray="2 3"/>'
            )
        parts.append(_stage_label(span.name.rsplit(".", 1)[-1], left, right, frame))
    return parts


def _stage_label(label: str, left: float, right: float, frame: _Frame) -> str:
    """Name a stage over its band, or, when the band is too narrow for the name, up its side.

    Every band is named: short late stages (``long_context``, ``dpo``) are as much a part of
    the run as ``pretrain``. A name too long even for the plot's height is cut with an ellipsis.
    """
    middle = round((left + right) / 2, 1)
    if right - left >= _CHAR_WIDTH * len(label):
        return (
            f'<text x="{middle}" y="{_TOP - 8}" text-anchor="middle" fill="{_INK}">'
            f"{escape(label)}</text>"
        )
    room = max(int((frame.bottom - _TOP - 12) // _CHAR_WIDTH), 2)
    if len(label) > room:
        label = label[: room - 1] + "…"
    # Rotated a quarter turn back, the text reads upwards and ends at the plot's top edge; the
    # glyphs lie left of x, so x sits half a line right of the band's middle.
    x, y = round(middle + 4, 1), _TOP + 6
    return (
        f'<text x="{x}" y="{y}" text-anchor="end" transform="rotate(-90 {x} {y})" '
        f'fill="{_INK}">{escape(label)}</text>'
    )


def _axes(frame: _Frame, x_ticks: list[float], y_ticks: list[float]) -> list[str]:
    bottom, right = frame.bottom, frame.right
    parts = []
    for value in y_ticks:
        y = frame.y(value)
        parts.append(f'<line x1="{_LEFT}" y1="{y}" x2="{right}" y2="{y}" stroke="{_GRID}"/>')
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4}" text-anchor="end" fill="{_INK}">'
            f"{_number(value)}</text>"
        )
    for value in x_ticks:
        x = frame.x(value)
        parts.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}" stroke="{_INK}"/>')
        parts.append(
            f'<text x="{x}" y="{bottom + 16}" text-anchor="middle" fill="{_INK}">'
            f"{_number(value)}</text>"
        )
    parts += [
        f'<line x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{_INK}"/>',
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="{_INK}"/>',
        f'<text x="{(_LEFT + right) / 2}" y="{bottom + 32}" text-anchor="middle" '
        f'fill="{_INK}">step</text>',
        f'<text x="14" y="{(_TOP + bottom) / 2}" text-anchor="middle" fill="{_INK}" '
        f'transform="rotate(-90 14 {(_TOP + bottom) / 2})">loss</text>',
    ]
    return parts


def _segments(points: Sequence[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """Split the history where the step goes back (a restart)."""
    segments: list[list[tuple[int, float]]] = []
    for point in points:
        if not segments or point[0] < segments[-1][-1][0]:
            segments.append([])
        segments[-1].append(point)
    return segments


def _polyline(points: Sequence[tuple[int, float]], frame: _Frame, style: str) -> str:
    coords = " ".join(f"{frame.x(step)},{frame.y(loss)}" for step, loss in points)
    return f'<polyline points="{coords}" fill="none" {style}/>'


def _lines(points: Sequence[tuple[int, float]], frame: _Frame) -> list[str]:
    """Draw the kept curve solid and what each restart threw away dashed."""
    solid = f'stroke="{_LINE}" stroke-width="2" stroke-linejoin="round"'
    dashed = f'stroke="{_DISCARDED}" stroke-width="1.5" stroke-dasharray="5 4"'
    segments, parts = _segments(points), []
    for index, segment in enumerate(segments):
        restart = segments[index + 1][0][0] if index + 1 < len(segments) else None
        kept = [p for p in segment if restart is None or p[0] <= restart]
        thrown = segment[len(kept) - 1 :] if restart is not None and kept else []
        if len(kept) > 1:
            parts.append(_polyline(kept, frame, solid))
        elif kept:
            step, loss = kept[0]
            parts.append(
                f'<circle cx="{frame.x(step)}" cy="{frame.y(loss)}" r="2.5" fill="{_LINE}"/>'
            )
        if len(thrown) > 1:
            parts.append(_polyline(thrown, frame, dashed))
    return parts


def _restart_marks(chart: LossChart, frame: _Frame) -> list[str]:
    """Mark every step the run went back to, and a restart still only proposed."""
    marks = {step: "restarted from" for step in chart.restarts}
    for spike in chart.spikes:
        if spike.decision == "pending" and spike.restart_step is not None:
            marks.setdefault(spike.restart_step, "proposed restart from")
    parts, bottom = [], frame.bottom
    for step, words in sorted(marks.items()):
        x = frame.x(step)
        right_side = x < frame.width * 0.6  # else the words would run off the chart
        parts += [
            f'<line x1="{x}" y1="{_TOP}" x2="{x}" y2="{bottom}" stroke="{_RESTART}" '
            'stroke-width="1.5" stroke-dasharray="6 3"/>',
            f'<text x="{x + 4 if right_side else x - 4}" y="{_TOP + 12}" '
            f'text-anchor="{"start" if right_side else "end"}" fill="{_RESTART}">'
            f"{words} step {step:,}</text>",
        ]
    return parts


def _interruption_marks(steps: Sequence[int], frame: _Frame) -> list[str]:
    bottom = frame.bottom
    return [
        f'<path d="M{frame.x(step)} {bottom - 9} l-5 8 h10 z" fill="{_INTERRUPTION}">'
        f"<title>interruption at about step {step:,}</title></path>"
        for step in steps
    ]


def _baselines(chart: LossChart) -> list[tuple[int, float]]:
    """Return each proposed restart's spike step and the baseline loss it was measured against."""
    return [
        (spike.step, spike.baseline)
        for spike in chart.spikes
        if spike.decision == "pending" and spike.baseline is not None
    ]


def _baseline_marks(chart: LossChart, frame: _Frame) -> list[str]:
    """Draw the baseline a pending spike is measured against across the plot, labelled.

    The restart form says "baseline 5.76": this is that number as a line, so the spike's height
    above it can be read off the chart.
    """
    parts = []
    for step, baseline in _baselines(chart):
        y = frame.y(baseline)
        parts += [
            f'<line x1="{_LEFT}" y1="{y}" x2="{frame.right}" y2="{y}" stroke="{_BASELINE}" '
            f'stroke-width="1.5" stroke-dasharray="8 3 2 3">'
            f"<title>baseline loss {baseline:g}: the spike at step {step:,} is measured "
            "against it</title></line>",
            f'<text x="{_LEFT + 4}" y="{y - 4}" fill="{_BASELINE}">baseline {baseline:.2f}</text>',
        ]
    return parts


def _spike_marks(spikes: Sequence[Spike], frame: _Frame) -> list[str]:
    parts = []
    for spike in spikes:
        x, y = frame.x(spike.step), frame.y(spike.loss)
        anchor = "end" if x > frame.width * 0.6 else "start"
        shift = -8 if anchor == "end" else 8
        parts += [
            f'<circle cx="{x}" cy="{y}" r="5" fill="{_SPIKE}" stroke="#ffffff" stroke-width="1.5">'
            f"<title>loss spike {spike.loss:g} at step {spike.step:,} ({spike.decision})</title>"
            "</circle>",
            f'<text x="{x + shift}" y="{y + 4}" text-anchor="{anchor}" fill="{_SPIKE}">'
            f"spike {spike.loss:.2f} at step {spike.step:,}</text>",
        ]
    return parts


def _legend(chart: LossChart, frame: _Frame) -> tuple[list[str], int]:
    """Return the legend, wrapped to the chart's width, and how many rows it takes."""
    entries = [(f'<line x1="0" y1="0" x2="18" y2="0" stroke="{_LINE}" stroke-width="2"/>', "loss")]
    if chart.spikes:
        entries.append((f'<circle cx="9" cy="0" r="5" fill="{_SPIKE}"/>', "loss spike"))
    if _baselines(chart):
        entries.append(
            (
                f'<line x1="0" y1="0" x2="18" y2="0" stroke="{_BASELINE}" stroke-width="1.5" '
                'stroke-dasharray="8 3 2 3"/>',
                "baseline loss",
            )
        )
    if any(s.decision == "pending" for s in chart.spikes) or chart.restarts:
        entries.append(
            (
                f'<line x1="9" y1="-7" x2="9" y2="7" stroke="{_RESTART}" stroke-width="1.5" '
                'stroke-dasharray="4 2"/>',
                "restart from a checkpoint",
            )
        )
    if chart.restarts:
        entries.append(
            (
                f'<line x1="0" y1="0" x2="18" y2="0" stroke="{_DISCARDED}" stroke-width="1.5" '
                'stroke-dasharray="5 4"/>',
                "steps the restart threw away",
            )
        )
    if chart.interruptions:
        entries.append((f'<path d="M9 -5 l-5 8 h10 z" fill="{_INTERRUPTION}"/>', "interruption"))
    if len(chart.stages) > 1:
        entries.append(
            (
                f'<line x1="9" y1="-7" x2="9" y2="7" stroke="{_DISCARDED}" '
                'stroke-dasharray="2 3"/>',
                "stage boundary",
            )
        )
    parts, x, y, rows = [], float(_LEFT), frame.height - 14, 1
    for symbol, words in entries:
        size = 34 + 6.2 * len(words)
        if x > _LEFT and x + size > frame.width:
            x, y, rows = float(_LEFT), y + _LEGEND_ROW, rows + 1
        parts.append(
            f'<g transform="translate({x} {y})">{symbol}'
            f'<text x="24" y="4" fill="{_INK}">{escape(words)}</text></g>'
        )
        x += size
    return parts, rows
