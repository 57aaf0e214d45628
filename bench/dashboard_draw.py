"""Draw the shipped Grafana dashboard from what Prometheus answered to its panels' own
queries (bench.dashboard_picture fetches them): each panel at its own place on Grafana's
grid, with its title, legend, unit, thresholds and value mappings, in Grafana's dark
theme, with matplotlib (Grafana itself could not be installed where this was written).

    python -m bench.dashboard_draw FETCHED.json --out PNG

draws again from the answers a run kept (`bench.dashboard_picture --keep-data`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from bench.dashboard_panels import Panel, board_height, box, legend, load, shown
from bench.prometheus import Series

# Grafana 10's dark theme (packages/grafana-data/src/themes).
CANVAS = "#111217"
PANEL = "#181b1f"
BORDER = "#2c2f35"
TEXT = "#ccccdc"
DIM = "#8e8e9f"
GRID = "#25272c"
# The named colours of thresholds and mappings, and the classic palette of series.
NAMED = {
    "green": "#73bf69", "red": "#f2495c", "yellow": "#fade2a", "orange": "#ff9830",
    "blue": "#5794f2", "purple": "#b877d9", "text": TEXT, "transparent": PANEL,
}  # fmt: skip
CLASSIC = (
    "#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a6",
    "#705da0", "#508642", "#cca300", "#447ebc", "#c15c17", "#890f02", "#0a437c",
)  # fmt: skip

WIDTH = 1800  # pixels: a wide browser window
HEADER = 64  # the dashboard's title bar and variables
FOOTER = 40
DPI = 100
TITLE_PX = 14
TEXT_PX = 12
LEGEND_ROW = 20
PAD = 8


@dataclass(frozen=True)
class Drawn:
    """One query's answer as the picture shows it: the target and its series."""

    ref: str
    legend: str
    series: list[Series]


def pt(px: float) -> float:
    """Pixels as font points at DPI."""
    return px * 72 / DPI


def color(name: str) -> str:
    return NAMED.get(name, name)


class Board:
    """The figure, and pixel boxes (from the top left, as Grafana's) placed in it."""

    def __init__(self, height: float, width: float = WIDTH) -> None:
        self.width, self.height = width, height
        # A Figure of its own, not pyplot's: no backend, no window, nothing global.
        self.figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
        self.figure.patch.set_facecolor(CANVAS)

    def rect(self, x: float, y: float, w: float, h: float) -> tuple[float, float, float, float]:
        """A pixel box (top-left X, Y) in figure fractions (left, bottom, width, height)."""
        return (x / self.width, 1 - (y + h) / self.height, w / self.width, h / self.height)

    def axes(self, x: float, y: float, w: float, h: float) -> Axes:
        return self.figure.add_axes(self.rect(x, y, w, h))

    def text(self, x: float, y: float, s: str, px: float = TEXT_PX, **kw: Any) -> None:
        """S with its top left (or as HA/VA say) at pixel X, Y."""
        kw.setdefault("va", "top")
        kw.setdefault("color", TEXT)
        self.figure.text(x / self.width, 1 - y / self.height, s, fontsize=pt(px), **kw)

    def frame(self, x: float, y: float, w: float, h: float) -> None:
        self.figure.add_artist(
            Rectangle(
                (x / self.width, 1 - (y + h) / self.height), w / self.width, h / self.height,
                transform=self.figure.transFigure, facecolor=PANEL, edgecolor=BORDER,
                linewidth=1, zorder=-1,  # under the panel's axes (zorder 0)
            )
        )  # fmt: skip

    def swatch(self, x: float, y: float, c: str) -> None:
        """A legend's short line of colour C, its left end at X, at height Y."""
        self.figure.add_artist(
            Line2D(
                [x / self.width, (x + 14) / self.width], [1 - y / self.height] * 2,
                transform=self.figure.transFigure, color=c, linewidth=3,
            )
        )  # fmt: skip


def draw(fetched: dict[str, Any], out: Path, dashboard: Path | None = None) -> list[str]:
    """Draw FETCHED (bench.dashboard_picture's answers) to OUT (PNG); the titles of the
    panels that had no data."""
    board_json, panels = load(dashboard) if dashboard else load()
    answers = {int(k): v for k, v in fetched["panels"].items()}
    start, end = float(fetched["start"]), float(fetched["end"])
    top = HEADER
    board = Board(top + board_height(panels) + FOOTER)
    _header(board, board_json, fetched)
    empty = []
    for p in panels:
        place = box(p.grid, board.width)
        x, y, w, h = place.x, place.y + top, place.w, place.h
        if p.kind == "row":
            board.text(x, y + 4, f"\u25be {p.title}", TITLE_PX + 2, weight="bold")
            continue
        drawn = [
            Drawn(a["ref"], a["legend"], [Series.from_json(s) for s in a["series"]])
            for a in answers.get(p.id, [])
        ]
        board.frame(x, y, w, h)
        board.text(x + PAD, y + PAD, p.title, TITLE_PX, weight="bold")
        body = (x + PAD, y + 32, w - 2 * PAD, h - 32 - PAD)
        if not any(s.has_data for d in drawn for s in d.series):
            empty.append(p.title)
            bx, by, bw, bh = body
            board.text(bx + bw / 2, by + bh / 2, "No data", 16, ha="center", va="center", color=DIM)
            continue
        if p.kind == "stat":
            _stat(board, p, drawn, body)
        elif p.kind == "state-timeline":
            _state_timeline(board, p, drawn, body, start, end)
        else:
            _timeseries(board, p, drawn, body, start, end)
    caption = "\n".join(textwrap.wrap(str(fetched.get("caption", "")), 260))
    board.text(PAD, board.height - FOOTER / 2, caption, 11, va="center", color=DIM)
    out.parent.mkdir(parents=True, exist_ok=True)
    board.figure.savefig(out, dpi=DPI, facecolor=CANVAS)
    return empty


def _header(board: Board, board_json: dict[str, Any], fetched: dict[str, Any]) -> None:
    board.text(PAD * 2, 12, f"Dashboards \u203a {board_json['title']}", 18)
    x = PAD * 2
    for name, value in fetched.get("shown_variables", {}).items():
        label = f" {name} "
        board.text(x, 42, label, TEXT_PX, color=DIM, backgroundcolor="#22252b")
        x += 7 * len(label) + 6
        board.text(x, 42, f" {value} ", TEXT_PX, backgroundcolor=PANEL)
        x += 7 * (len(str(value)) + 2) + 18
    span = (
        f"{_utc(float(fetched['start']), '%Y-%m-%d %H:%M:%S')} to "
        f"{_utc(float(fetched['end']), '%H:%M:%S')} UTC"
    )
    board.text(board.width - PAD * 2, 12, span, TEXT_PX + 1, ha="right")


def _utc(t: float, fmt: str) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime(fmt)


def _named(p: Panel, drawn: list[Drawn]) -> list[tuple[str, Series]]:
    return [(legend(d.legend, s.labels), s) for d in drawn for s in d.series]


def _threshold_color(p: Panel, value: float) -> str:
    chosen = "green"
    for limit, name in p.thresholds:
        if limit is None or value >= limit:
            chosen = name
    return color(chosen)


def _mapped(p: Panel, value: float) -> tuple[str, str] | None:
    key = str(int(value)) if math.isfinite(value) and value == int(value) else str(value)
    return p.mappings.get(key)


def _last(series: Series) -> float:
    finite = [v for _, v in series.points if math.isfinite(v)]
    return finite[-1] if finite else math.nan


def _legend(board: Board, items: Sequence[tuple[str, str]], x: float, y: float, w: float) -> None:
    """Grafana's list legend: a swatch and a name each, left to right, wrapping at W."""
    cx, cy = x, y
    for name, c in items:
        width = 14 + 6 + 6.6 * len(name) + 16
        if cx > x and cx + width > x + w:
            cx, cy = x, cy + LEGEND_ROW
        board.swatch(cx, cy + 8, c)
        board.text(cx + 20, cy + 1, name, TEXT_PX)
        cx += width


def _legend_rows(items: Sequence[tuple[str, str]], w: float) -> int:
    rows, cx = 1, 0.0
    for name, _ in items:
        width = 14 + 6 + 6.6 * len(name) + 16
        if cx > 0 and cx + width > w:
            rows, cx = rows + 1, 0.0
        cx += width
    return rows


def _time_axis(ax: Axes, start: float, end: float) -> None:
    ax.set_xlim(start, end)
    minute = 60.0
    every = minute if end - start <= 15 * minute else 5 * minute
    first = math.ceil(start / every) * every
    ax.set_xticks([first + i * every for i in range(int((end - first) // every) + 1)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _: _utc(t, "%H:%M")))


def _style(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors=DIM, labelsize=pt(11), length=0, pad=4)
    ax.grid(True, color=GRID, linewidth=1)
    ax.set_axisbelow(True)


def _timeseries(
    board: Board, p: Panel, drawn: list[Drawn], body: tuple[float, float, float, float],
    start: float, end: float,
) -> None:  # fmt: skip
    bx, by, bw, bh = body
    named = _named(p, drawn)
    colors = [CLASSIC[i % len(CLASSIC)] for i in range(len(named))]
    items = list(zip([n for n, _ in named], colors, strict=True))
    rows = _legend_rows(items, bw) if p.show_legend else 0
    plot_h = bh - rows * LEGEND_ROW - 22
    ax = board.axes(bx + 72, by, bw - 80, plot_h)
    _style(ax)
    high = 0.0
    for (_, series), c in zip(named, colors, strict=True):
        ts = [t for t, _ in series.points]
        vs = [v if math.isfinite(v) else math.nan for _, v in series.points]
        ax.plot(ts, vs, color=c, linewidth=1.2)
        _fill(ax, ts, vs, c, 0.1)
        high = max([high, *(v for v in vs if math.isfinite(v))])
    low = p.low if p.low is not None else 0.0
    top = p.high if p.high is not None else (high * 1.1 if high > 0 else 1.0)
    ax.set_ylim(low, top)
    if p.threshold_style != "off":
        for limit, name in p.thresholds:
            if limit is not None and low < limit < top:
                ax.axhline(limit, color=color(name), linestyle="--", linewidth=1)
                if "area" in p.threshold_style:
                    ax.axhspan(limit, top, color=color(name), alpha=0.06, linewidth=0)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: shown(v, p.unit)))
    _time_axis(ax, start, end)
    if p.show_legend:
        _legend(board, items, bx + 4, by + plot_h + 22, bw - 8)


def _fill(ax: Axes, ts: list[float], vs: list[float], c: str, alpha: float) -> None:
    """The area under a line (fillOpacity), broken where the line is."""
    finite = [math.isfinite(v) for v in vs]
    ys = [v if ok else 0.0 for v, ok in zip(vs, finite, strict=True)]
    ax.fill_between(ts, ys, 0, where=finite, color=c, alpha=alpha, linewidth=0)


def _stat(
    board: Board, p: Panel, drawn: list[Drawn], body: tuple[float, float, float, float]
) -> None:
    bx, by, bw, bh = body
    named = _named(p, drawn)
    cells = max(1, len(named))
    across = bw >= bh  # orientation auto: side by side in a wide panel
    for i, (name, series) in enumerate(named):
        if across:
            cw, ch = bw / cells, bh
            cx, cy = bx + i * cw, by
        else:
            cw, ch = bw, bh / cells
            cx, cy = bx, by + i * ch
        value = _last(series)
        mapped = _mapped(p, value)
        text = mapped[0] if mapped else shown(value, p.unit)
        c = color(mapped[1]) if mapped else _threshold_color(p, value)
        spark = board.axes(cx + 4, cy + ch * 0.55, cw - 8, ch * 0.45 - 4)
        spark.set_axis_off()
        ts = [t for t, _ in series.points]
        vs = [v if math.isfinite(v) else math.nan for _, v in series.points]
        finite = [v for v in vs if math.isfinite(v)]
        if len(ts) > 1 and finite:
            spark.plot(ts, vs, color=c, linewidth=1, alpha=0.8)
            _fill(spark, ts, vs, c, 0.15)
            spark.set_ylim(0, max(finite) * 1.25 or 1)
        spark.set_xlim(min(ts, default=0), max(ts, default=1))
        board.text(cx + cw / 2, cy + ch * 0.12, name, 15, ha="center", color=TEXT)
        size = min(ch * 0.3, 1.2 * cw / max(3, len(text)))
        board.text(cx + cw / 2, cy + ch * 0.42, text, size, ha="center", va="center", color=c,
                   weight="bold")  # fmt: skip


def _state_timeline(
    board: Board, p: Panel, drawn: list[Drawn], body: tuple[float, float, float, float],
    start: float, end: float,
) -> None:  # fmt: skip
    bx, by, bw, bh = body
    named = _named(p, drawn)
    label_w = 8 + 6.6 * max(len(n) for n, _ in named)
    ax = board.axes(bx + label_w, by, bw - label_w - 8, bh - 22)
    _style(ax)
    ax.grid(False)
    rows = len(named)
    step = _step(named)
    for row, (_, series) in enumerate(named):
        y = rows - 1 - row
        run: tuple[float, float, str] | None = None
        for t, v in series.points:
            if not math.isfinite(v):
                continue
            mapped = _mapped(p, v)
            c = color(mapped[1]) if mapped else _threshold_color(p, v)
            if run is not None and run[2] == c and t - run[1] <= step * 1.5:
                run = (run[0], t, c)
                continue
            if run is not None:
                _bar(ax, run, y, step)
            run = (t, t, c)
        if run is not None:
            _bar(ax, run, y, step)
    ax.set_ylim(-0.5, rows - 0.5)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([n for n, _ in reversed(named)], color=TEXT, fontsize=pt(TEXT_PX))
    _time_axis(ax, start, end)


def _step(named: list[tuple[str, Series]]) -> float:
    gaps = [b[0] - a[0] for _, s in named for a, b in zip(s.points, s.points[1:], strict=False)]
    return min(gaps, default=15.0)


def _bar(ax: Axes, run: tuple[float, float, str], y: float, step: float) -> None:
    begin, last, c = run
    ax.barh(y, last + step - begin, left=begin, height=0.9, color=c, alpha=0.85, linewidth=0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_draw", description=__doc__)
    parser.add_argument("fetched", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    empty = draw(json.loads(args.fetched.read_text()), args.out)
    print(json.dumps({"picture": str(args.out), "panels_without_data": empty}, indent=2))


if __name__ == "__main__":
    main()
