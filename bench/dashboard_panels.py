"""The shipped Grafana dashboard (deploy/grafana/orchestrator-zero.json) read as Grafana
reads it, for bench.dashboard_picture: its panels, their queries with Grafana's variables
given values, where each panel sits on the grid, and how a value shows in a unit.

Pure: no network, no drawing (bench/dashboard_draw.py draws).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "orchestrator-zero.json"

# Grafana's grid (public/app/core/constants.ts): 24 columns, a unit of height 30 px, 8 px
# between panels both ways.
COLUMNS = 24
CELL_HEIGHT = 30
MARGIN = 8

# The panel types bench/dashboard_draw.py draws; any other fails the picture (and the test).
DRAWN = frozenset({"row", "stat", "timeseries", "state-timeline"})

# Grafana's own variables, as Grafana names them: the longest first, so that
# $__interval_ms is not read as $__interval followed by "_ms".
_OWN = ("__rate_interval", "__interval_ms", "__interval", "__range_s", "__range")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class DashboardError(Exception):
    """The dashboard has what the picture cannot show: the message says what."""


@dataclass(frozen=True)
class Target:
    ref: str
    expr: str
    legend: str
    instant: bool


@dataclass(frozen=True)
class Box:
    """A panel's place in pixels: left, top (from the board's top), width, height."""

    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Panel:
    id: int
    kind: str
    title: str
    grid: tuple[int, int, int, int]  # x, y, w, h in grid units
    targets: tuple[Target, ...] = ()
    unit: str = "short"
    # Threshold steps, lowest first: (value, colour name); the first's value is None.
    thresholds: tuple[tuple[float | None, str], ...] = ()
    threshold_style: str = "off"
    # Value mappings: the value's text ("0", "1") to (text shown, colour name).
    mappings: dict[str, tuple[str, str]] = field(default_factory=dict)
    low: float | None = None
    high: float | None = None
    show_legend: bool = True


@dataclass(frozen=True)
class Variables:
    """What Grafana substitutes in a query: the dashboard's variables (by name, each a
    value already written as it goes in the query) and its own intervals, in seconds."""

    values: dict[str, str]
    interval: float
    rate_interval: float
    range_s: float

    def substitute(self, expr: str) -> str:
        own = {
            "__rate_interval": duration(self.rate_interval),
            "__interval": duration(self.interval),
            "__interval_ms": str(round(self.interval * 1000)),
            "__range": duration(self.range_s),
            "__range_s": str(round(self.range_s)),
        }

        def one(found: re.Match[str]) -> str:
            name = found[1] or found[2] or found[3]
            for known in _OWN:  # $__interval_ms before $__interval
                if name == known:
                    return own[known]
            if name in self.values:
                return self.values[name]
            raise DashboardError(f"the query names a variable the dashboard lacks: ${name}")

        return _VARIABLE.sub(one, expr)


def grafana_intervals(range_s: float, max_points: int, scrape_s: float) -> tuple[float, float]:
    """Grafana's $__interval and $__rate_interval for a time range of RANGE_S seconds
    drawn in at most MAX_POINTS points, the data source's scrape interval SCRAPE_S (its
    "min interval"): the interval is the range over the points, never below the scrape
    interval; the rate interval max($__interval + scrape, 4 × scrape), so that a rate
    always spans at least four scrapes."""
    interval = max(range_s / max_points, scrape_s)
    return interval, max(interval + scrape_s, 4 * scrape_s)


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds (`20s`), as Grafana writes its intervals."""
    return f"{max(1, round(seconds))}s"


def load(path: Path = DASHBOARD) -> tuple[dict[str, Any], list[Panel]]:
    """The dashboard's JSON and its panels in order (a collapsed row's too, after it)."""
    board: dict[str, Any] = json.loads(path.read_text())
    out = []
    for raw in board["panels"]:
        out.append(panel(raw))
        out += [panel(inner) for inner in raw.get("panels", [])]
    return board, out


def panel(raw: dict[str, Any]) -> Panel:
    kind = str(raw["type"])
    if kind not in DRAWN:
        raise DashboardError(f"panel {raw.get('title')!r}: no drawing of a {kind!r} panel")
    box = raw["gridPos"]
    defaults = raw.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    steps = defaults.get("thresholds", {}).get("steps", [])
    mappings: dict[str, tuple[str, str]] = {}
    for mapping in defaults.get("mappings", []):
        if mapping.get("type") != "value":
            raise DashboardError(f"panel {raw['title']!r}: a {mapping.get('type')} mapping")
        for value, shown in mapping["options"].items():
            mappings[value] = (shown.get("text", value), shown.get("color", "text"))
    return Panel(
        id=int(raw["id"]),
        kind=kind,
        title=str(raw.get("title", "")),
        grid=(box["x"], box["y"], box["w"], box["h"]),
        targets=tuple(
            Target(
                t["refId"],
                t["expr"],
                t.get("legendFormat", ""),
                bool(t.get("instant")) and not t.get("range"),
            )
            for t in raw.get("targets", [])
        ),
        unit=str(defaults.get("unit", "short")),
        thresholds=tuple((s["value"], s["color"]) for s in steps),
        threshold_style=str(custom.get("thresholdsStyle", {}).get("mode", "off")),
        mappings=mappings,
        low=defaults.get("min"),
        high=defaults.get("max"),
        show_legend=bool(raw.get("options", {}).get("legend", {}).get("showLegend", True)),
    )


def template_values(board: dict[str, Any], found: dict[str, list[str]]) -> dict[str, str]:
    """Each query variable's value as it goes in a query: FOUND the values Grafana's
    `label_values` would list for each; a multi-value variable set to All takes its
    `allValue`, another its first value, escaped as Grafana's Prometheus data source
    escapes it. The data source variable names no query's text."""
    values: dict[str, str] = {}
    for variable in board["templating"]["list"]:
        name = variable["name"]
        if variable["type"] == "datasource":
            values[name] = "prometheus"
        elif variable["type"] == "query":
            if variable.get("includeAll") and variable.get("allValue"):
                values[name] = str(variable["allValue"])
            elif found.get(name):
                values[name] = _escaped(found[name][0], multi=bool(variable.get("multi")))
            else:
                raise DashboardError(f"variable {name}: no value found")
        else:
            raise DashboardError(f"variable {name}: a {variable['type']} variable")
    return values


def _escaped(value: str, *, multi: bool) -> str:
    """VALUE as Grafana's Prometheus data source writes it into a query
    (prometheusSpecialRegexEscape, prometheusRegularEscape): a multi-value variable's with
    each special character of a regular expression behind two backslashes (one for PromQL's
    string, one for the expression), a single value's with only backslashes and quotes
    escaped."""
    if multi:
        return re.sub(r"[$^*+?.()|\\{}\[\]]", lambda m: "\\\\" + m[0], value)
    return value.replace("\\", "\\\\\\\\").replace("'", "\\\\'")


def label_values_query(variable: dict[str, Any]) -> tuple[str | None, str]:
    """(series selector or None, label) of a `label_values(SELECTOR, LABEL)` variable."""
    text = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
    found = re.fullmatch(r"label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)", str(text))
    if found is None:
        raise DashboardError(f"variable {variable['name']}: not label_values(...): {text}")
    return found["expr"], found["label"]


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series' name from a legendFormat (`{{instance}} in use`); without one, Grafana's
    name for it: the metric and its labels."""
    if fmt:
        return _LEGEND.sub(lambda m: labels.get(m[1], ""), fmt).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


# --- the grid ------------------------------------------------------------------------------


def box(grid: tuple[int, int, int, int], width: float) -> Box:
    """Where a panel at GRID (x, y, w, h in grid units) sits on a board WIDTH pixels wide,
    as Grafana's react-grid-layout places it: columns of (width - 25 margins) / 24, a row
    of 30 px, 8 px between."""
    x, y, w, h = grid
    column = (width - MARGIN * (COLUMNS + 1)) / COLUMNS
    return Box(
        x=MARGIN + x * (column + MARGIN),
        y=MARGIN + y * (CELL_HEIGHT + MARGIN),
        w=w * column + (w - 1) * MARGIN,
        h=h * CELL_HEIGHT + (h - 1) * MARGIN,
    )


def board_height(panels: list[Panel]) -> float:
    """The board's height in pixels: down to the lowest panel's bottom, and a margin."""
    bottom = max(p.grid[1] + p.grid[3] for p in panels)
    return MARGIN + bottom * (CELL_HEIGHT + MARGIN)


def overlaps(panels: list[Panel]) -> list[tuple[str, str]]:
    """Pairs of panels whose grid boxes overlap (Grafana would push one down)."""
    out = []
    for i, a in enumerate(panels):
        for b in panels[i + 1 :]:
            ax, ay, aw, ah = a.grid
            bx, by, bw, bh = b.grid
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a.title, b.title))
    return out


# --- values in units -----------------------------------------------------------------------

_SUFFIX = {"cps": " c/s", "ops": " ops/s", "reqps": " req/s"}


def shown(value: float, unit: str, decimals: int | None = None) -> str:
    """VALUE as Grafana shows it in UNIT (the units the dashboard uses)."""
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{_number(value * 100, decimals)}%"
    if unit == "percent":
        return f"{_number(value, decimals)}%"
    if unit == "s":
        return _seconds(value, decimals)
    if unit == "ms":
        return _seconds(value / 1000, decimals)
    return _short(value, decimals) + _SUFFIX.get(unit, "")


def _number(value: float, decimals: int | None) -> str:
    if decimals is None:
        size = abs(value)
        decimals = 0 if size >= 100 or size == int(size) else 1 if size >= 10 else 2
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _short(value: float, decimals: int | None) -> str:
    for scale, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " Mil"), (1e3, " K")):
        if abs(value) >= scale:
            return _number(value / scale, decimals) + suffix
    return _number(value, decimals)


def _seconds(value: float, decimals: int | None) -> str:
    size = abs(value)
    if size == 0:
        return "0 s"
    if size < 1e-3:
        return f"{_number(value * 1e6, decimals)} µs"
    if size < 1:
        return f"{_number(value * 1e3, decimals)} ms"
    if size < 60:
        return f"{_number(value, decimals)} s"
    if size < 3600:
        return f"{_number(value / 60, decimals)} min"
    if size < 86400:
        return f"{_number(value / 3600, decimals)} hour"
    return f"{_number(value / 86400, decimals)} day"
