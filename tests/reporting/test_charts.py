"""The loss chart: an SVG with axes in steps and loss, stages, interruptions, spikes, restarts."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

from played_runs import play

from prefect_ito.reporting.charts import (
    LossChart,
    Spike,
    StageSpan,
    draw,
    loss_chart,
    markdown_image,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def titles(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}title")]


def polylines(root: ET.Element) -> list[tuple[list[tuple[float, float]], bool]]:
    """Return each polyline's points and whether it is dashed."""
    found = []
    for line in root.iter(f"{SVG}polyline"):
        pairs = [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
        found.append((pairs, line.get("stroke-dasharray") is not None))
    return found


def test_the_approved_demo_run_shows_its_story():
    run, seen = play("demo", decide="approve")
    root = parse(draw(loss_chart(run, seen)))
    words = texts(root)

    assert root.get("viewBox") and "Training loss by step" in titles(root)
    assert {"step", "loss"} <= set(words)  # the axes say what they measure
    assert {"0", "10k", "20k", "30k"} <= set(words)  # steps, not the index of a point
    assert {"0", "10", "20"} <= set(words)
    assert {"pretrain", "mid_train"} <= set(words)  # stage names over their steps
    assert "spike 17.28 at step 12,000" in words
    assert "loss spike 17.28 at step 12,000 (approve)" in titles(root)
    assert "restarted from step 10,000" in words
    assert len([t for t in titles(root) if t.startswith("interruption")]) == 2


def test_the_steps_a_restart_threw_away_are_dashed_and_the_kept_curve_never_goes_back():
    # Step 10,000 is in the history twice: before the spike, and again after the restart.
    run, seen = play("demo", decide="approve")
    lines = polylines(parse(draw(loss_chart(run, seen))))

    solid = [points for points, dashed in lines if not dashed]
    thrown = [points for points, dashed in lines if dashed]
    for points in solid:
        xs = [x for x, _ in points]
        assert xs == sorted(xs)
    assert len(thrown) == 1
    (restart_x, _), (spike_x, spike_y) = thrown[0][0], thrown[0][-1]
    assert restart_x < spike_x
    assert spike_y < min(y for points in solid for _, y in points)  # the highest loss drawn


def test_a_pending_spike_shows_the_proposed_restart():
    run, seen = play("demo", decide=None)
    words = texts(parse(draw(loss_chart(run, seen))))

    assert "proposed restart from step 10,000" in words
    assert "spike 17.28 at step 12,000" in words
    assert "restarted from step 10,000" not in words


def test_a_rejected_spike_stays_on_the_curve_without_a_restart():
    run, seen = play("two-spikes", decide="reject")
    root = parse(draw(loss_chart(run, seen)))
    words = texts(root)

    assert [w for w in words if w.startswith("spike ")] == [
        "spike 17.28 at step 12,000",
        "spike 7.35 at step 22,000",
    ]
    assert not [w for w in words if "restart" in w and "from step" in w]
    assert all(not dashed for _, dashed in polylines(root))


def test_names_are_escaped_and_an_empty_history_still_draws():
    chart = LossChart(points=[], spikes=[Spike(step=5, loss=1.0)])
    root = parse(draw(chart))
    assert "spike 1.00 at step 5" in texts(root)
    odd = LossChart(points=[(0, 2.0), (10, 1.0)], title="a <b> & c")
    assert "a <b> & c" in titles(parse(draw(odd)))


def test_markdown_image_is_a_base64_svg_data_uri():
    svg = draw(LossChart(points=[(0, 2.0), (100, 1.0)]))
    image = markdown_image(svg, "Training loss by step")

    found = re.fullmatch(r"!\[Training loss by step\]\(data:image/svg\+xml;base64,(.+)\)", image)
    assert found and base64.b64decode(found.group(1)).decode() == svg
    assert len(image) < 20_000  # small enough to ride in every version of the card


def test_a_chart_for_the_narrow_approval_form_wraps_its_legend_inside_its_width():
    run, seen = play("demo", decide=None)
    root = parse(draw(loss_chart(run, seen), width=440, height=280))

    assert root.get("width") == "440"
    assert int(root.get("height")) > 280  # a second legend row
    for group in root.iter(f"{SVG}g"):
        x = float(group.get("transform").split("(")[1].split()[0])
        words = "".join(group.itertext())
        assert x + 24 + 6.2 * len(words) <= 440, words


def _loss_at(root: ET.Element):
    """Return the y a loss is drawn at, read from the loss axis's own tick labels."""
    ticks = {}
    for text in root.iter(f"{SVG}text"):
        if text.get("text-anchor") == "end" and text.get("transform") is None:
            try:
                ticks[float("".join(text.itertext()))] = float(text.get("y")) - 4
            except ValueError:
                continue
    (low, y_low), (high, y_high) = min(ticks.items()), max(ticks.items())
    return lambda loss: y_low + (loss - low) * (y_high - y_low) / (high - low)


def test_the_restart_form_chart_draws_the_baseline_the_form_names():
    # The form says "baseline 5.76"; before, the chart had no line or point for it. Drawn as
    # approval.py draws it: the run alone, at the form's width.
    run, _ = play("demo", decide=None)
    assert run.pending_action is not None and run.pending_action.baseline_loss is not None
    baseline = run.pending_action.baseline_loss
    root = parse(draw(loss_chart(run), width=440, height=280))

    lines = [
        line
        for line in root.iter(f"{SVG}line")
        if "".join(t.text or "" for t in line.iter(f"{SVG}title")).startswith("baseline loss")
    ]
    assert len(lines) == 1
    (line,) = lines
    assert line.get("y1") == line.get("y2")
    assert abs(float(line.get("y1")) - _loss_at(root)(baseline)) < 0.5
    assert f"baseline {baseline:.2f}" in texts(root)
    assert "baseline loss" in texts(root)  # the legend names it


def test_a_decided_spike_draws_no_baseline():
    run, seen = play("demo", decide="approve")
    root = parse(draw(loss_chart(run, seen)))

    assert not [w for w in texts(root) if w.startswith("baseline")]


def test_every_stage_of_the_full_curriculum_is_named_on_the_chart():
    # Before, long_context, dpo and rlvr were too narrow for their names and went unlabelled.
    run, seen = play("demo", decide="approve", post_training="rlvr")
    chart = loss_chart(run, seen)
    names = [stage.name.rsplit(".", 1)[-1] for stage in chart.stages]
    assert names == ["pretrain", "mid_train", "long_context", "sft", "dpo", "rlvr"]

    for width, height in ((720, 330), (440, 280)):
        words = texts(parse(draw(chart, width=width, height=height)))
        for name in names:
            assert name in words, (width, name)


def test_a_stage_name_too_long_for_the_plot_is_cut_not_dropped():
    chart = LossChart(
        points=[(0, 2.0), (1000, 1.0)],
        stages=[StageSpan("pretrain", 0, 990), StageSpan("x" * 80, 990, 1000)],
    )
    words = texts(parse(draw(chart)))

    cut = [w for w in words if w.startswith("xxx")]
    assert len(cut) == 1 and cut[0].endswith("…") and len(cut[0]) < 80
