"""The loss chart: an SVG with axes in steps and loss, stages, interruptions, spikes, restarts."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

from played_runs import play

from prefect_ito.reporting.charts import LossChart, Spike, draw, loss_chart, markdown_image

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
