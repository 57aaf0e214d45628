"""bench.dashboard_picture's reading of the shipped dashboard, without a cluster: Grafana's
variables given the values Grafana gives them, the grid placed as Grafana places it, every
panel one the picture knows how to draw, and values shown in their units
(bench/dashboard_panels.py). The picture itself comes from a real run (docs/monitoring.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import pytest

from bench import dashboard_draw
from bench.dashboard_panels import (
    CELL_HEIGHT,
    DRAWN,
    MARGIN,
    DashboardError,
    Variables,
    board_height,
    box,
    grafana_intervals,
    label_values_query,
    legend,
    load,
    overlaps,
    panel,
    shown,
    template_values,
)


def variables() -> Variables:
    board, _ = load()
    found = {"job": ["orchestrator-zero"], "instance": ["127.0.0.229:8443"]}
    return Variables(template_values(board, found), 5.0, 20.0, 300.0)


def test_grafana_intervals_span_four_scrapes_at_least() -> None:
    # Five minutes on a wide panel: one point per scrape, a rate over four of them.
    assert grafana_intervals(300, 1000, 5) == (5, 20)
    # Six hours: 21.6 s a point, and a rate over the point and a scrape.
    interval, rate = grafana_intervals(6 * 3600, 1000, 5)
    assert interval == pytest.approx(21.6) and rate == pytest.approx(26.6)


def test_every_query_of_the_dashboard_becomes_promql_prometheus_reads() -> None:
    values = variables()
    _, panels = load()
    exprs = [values.substitute(t.expr) for p in panels for t in p.targets]
    assert len(exprs) > 30
    for expr in exprs:
        assert "$" not in expr and "[[" not in expr, expr
        promql_parser.parse(expr)  # raises on anything Prometheus would refuse
    rate = 'rate(oz0_edge_node_rereads_total{job=~"orchestrator-zero",instance=~".*"}[20s])'
    assert any(rate in expr for expr in exprs), exprs


def test_variables_take_grafanas_forms_and_an_unknown_one_is_refused() -> None:
    values = Variables({"job": "oz0", "instance": ".*"}, 5.0, 20.0, 3600.0)
    assert values.substitute('x{job=~"$job",i=~"${instance}"}[$__rate_interval]') == (
        'x{job=~"oz0",i=~".*"}[20s]'
    )
    assert values.substitute("[[job]] $__interval_ms $__interval $__range") == "oz0 5000 5s 3600s"
    with pytest.raises(DashboardError, match=r"\$tenant"):
        values.substitute('x{tenant="$tenant"}')


def test_a_variable_takes_its_all_value_or_its_first_value_escaped() -> None:
    board, _ = load()
    values = template_values(board, {"job": ["oz0.prod", "other"], "instance": []})
    assert values["job"] == "oz0.prod"  # one value: as it is (Grafana's own escaping)
    assert values["instance"] == ".*"  # All
    assert label_values_query(board["templating"]["list"][1]) == ("oz0_build_info", "job")


def test_legends_name_series_by_their_labels() -> None:
    labels = {"__name__": "oz0_db_pool_in_use", "instance": "127.0.0.229:8443", "job": "j"}
    assert legend("{{instance}} in use", labels) == "127.0.0.229:8443 in use"
    assert legend("{{ state }}", {"state": "queued"}) == "queued"
    assert legend("", labels) == 'oz0_db_pool_in_use{instance="127.0.0.229:8443", job="j"}'


def test_panels_sit_where_grafana_puts_them() -> None:
    width = 24 * 70 + 25 * MARGIN  # columns of exactly 70 px
    assert box((0, 0, 24, 1), width).w == width - 2 * MARGIN
    left, right = box((0, 1, 12, 8), width), box((12, 1, 12, 8), width)
    assert (left.x, left.y) == (MARGIN, MARGIN + CELL_HEIGHT + MARGIN)
    assert left.w == 12 * 70 + 11 * MARGIN and left.h == 8 * CELL_HEIGHT + 7 * MARGIN
    assert right.x == left.x + left.w + MARGIN  # one margin between neighbours
    below = box((0, 9, 12, 8), width)
    assert below.y == left.y + left.h + MARGIN
    _, panels = load()
    assert board_height(panels) == MARGIN + 87 * (CELL_HEIGHT + MARGIN)


def test_every_panel_of_the_shipped_dashboard_is_drawn_and_none_overlap() -> None:
    board, panels = load()
    assert {p.kind for p in panels} <= DRAWN
    assert len(panels) == len(board["panels"])
    assert overlaps(panels) == []
    for p in panels:
        assert p.kind == "row" or p.targets, p.title
        assert p.grid[0] + p.grid[2] <= 24, p.title
    timeline = next(p for p in panels if p.kind == "state-timeline")
    assert timeline.mappings == {"0": ("not serving", "red"), "1": ("serving", "green")}


def test_a_panel_the_picture_cannot_draw_is_refused() -> None:
    where = {"x": 0, "y": 0, "w": 6, "h": 8}
    raw = {"type": "piechart", "title": "Pie", "id": 99, "gridPos": where}
    with pytest.raises(DashboardError, match="piechart"):
        panel(raw)
    overlapping = [
        panel({"type": "row", "title": t, "id": i, "gridPos": {"x": x, "y": 0, "w": 12, "h": 1}})
        for i, (t, x) in enumerate((("a", 0), ("b", 6)))
    ]
    assert overlaps(overlapping) == [("a", "b")]


def test_values_show_in_their_units() -> None:
    assert shown(0.0123, "s") == "12.3 ms"
    assert shown(2.5, "s") == "2.5 s"
    assert shown(90, "s") == "1.5 min"
    assert shown(0.97, "percentunit") == "97%"
    assert shown(3, "short") == "3"
    assert shown(15000, "short") == "15 K"
    assert shown(0.25, "ops") == "0.25 ops/s"
    assert shown(0.5, "cps") == "0.5 c/s"


def test_a_drawing_of_answers_says_which_panels_had_none(tmp_path: Path) -> None:
    _, panels = load()
    start = 1_800_000_000.0
    points = [[start + 5 * i, float(i % 3)] for i in range(12)]
    answers = {
        str(p.id): [
            {"ref": t.ref, "legend": t.legend, "expr": t.expr,
             "series": [{"labels": {"instance": "a", "state": "queued"}, "points": points}]
             if p.title != "Nodes read back" else []}
            for t in p.targets
        ]
        for p in panels
        if p.kind != "row"
    }  # fmt: skip
    fetched = {"start": start, "end": start + 60, "panels": answers, "caption": "a test"}
    out = tmp_path / "board.png"
    assert dashboard_draw.draw(json.loads(json.dumps(fetched)), out) == ["Nodes read back"]
    assert out.read_bytes().startswith(b"\x89PNG")
