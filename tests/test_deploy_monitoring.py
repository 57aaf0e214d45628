"""The Grafana dashboard and the Prometheus alert rules shipped in deploy/ (docs/monitoring.md),
held to promtool and to a real server (127.0.0.64): promtool accepts the rules, and every
metric a panel, a dashboard variable or a rule names, with every label it names, is one the
server exports on `/metrics` once it has served a little (an agent joined, a job run, a
person past the request cap). PromQL is read by `promql_parser` (Prometheus' grammar), not
by patterns of ours.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fixtures import job_rows, metrics, operator_certs
from fixtures.agent import AgentProcess, connected
from fixtures.cluster import Served
from fixtures.polling import wait_until
from oz0.server import cluster_counts
from tests.conftest import CliRunner, create_token

SERVER = "127.0.0.64"
ADVERTISE = SERVER
EDGE = f"{SERVER}:7443"

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "orchestrator-zero-alerts.yml"
RULE_TESTS = RULES.with_suffix(".test.yml")
DASHBOARD = ROOT / "deploy" / "grafana" / "orchestrator-zero.json"
DOCS = ROOT / "docs" / "monitoring.md"

# Made by Prometheus for every target it scrapes, not by the servers: `up`, and the
# labels it adds to each series.
PROMETHEUS_OWN = {"up"}
TARGET_LABELS = {"job", "instance"}
SEVERITIES = {"critical", "warning", "info"}
# Grafana's own variables, given a value PromQL takes in their place: an interval, or a
# regular expression (every other variable is used inside a label matcher's string).
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")
GRAFANA_VARIABLES = re.compile(r"\$\{?\w+\}?")
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)$")
LEGEND_LABELS = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TEMPLATE_LABELS = re.compile(r"\$labels\.(\w+)")
SCRAPE_BOUND = 30.0

# Rows with no server running, for what a scrape reads of them (fixtures/job_rows.py).
CLEAN = job_rows.CLEAN


# --- what the files ask for --------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the files: WHERE it is, and the labels its output is
    shown by (a legend's `{{state}}`, an annotation's `$labels.cap`)."""

    where: str
    expr: str
    shown_by: frozenset[str] = frozenset()


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row's


def rule_queries() -> list[Query]:
    out = []
    for rule in rules():
        texts = " ".join(str(v) for v in rule.get("annotations", {}).values())
        out.append(Query(f"rule {rule['alert']}", rule["expr"], _labels(TEMPLATE_LABELS, texts)))
    return out


def dashboard_queries() -> list[Query]:
    board = dashboard()
    out = []
    for panel in panels(board):
        for target in panel.get("targets", []):
            out.append(
                Query(
                    f"panel {panel['title']!r} {target['refId']}",
                    _grafana_free(target["expr"]),
                    _labels(LEGEND_LABELS, target.get("legendFormat", "")),
                )
            )
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = LABEL_VALUES.match(variable["query"]["query"])
        assert found is not None, variable
        expr = found["expr"]
        assert expr, f"variable {variable['name']} names no metric"
        out.append(
            Query(f"variable {variable['name']}", _grafana_free(expr), frozenset({found["label"]}))
        )
    return out


def _labels(pattern: re.Pattern[str], text: str) -> frozenset[str]:
    return frozenset(pattern.findall(text))


def _grafana_free(expr: str) -> str:
    return GRAFANA_VARIABLES.sub(".*", GRAFANA_INTERVALS.sub("5m", expr))


@dataclass
class Named:
    """What an expression names: metrics with the labels matched on each, and labels it
    groups or matches by."""

    matched: dict[str, set[str]] = field(default_factory=dict)
    grouped: set[str] = field(default_factory=set)


def named(expr: str) -> Named:
    found = Named()
    _walk(promql_parser.parse(expr), found)
    return found


def _walk(node: Any, found: Named) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        assert node.name, f"a selector without a metric name: {node}"
        labels = found.matched.setdefault(node.name, set())
        labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
    elif isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, found)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, found)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            found.grouped.update(node.modifier.labels)
        _walk(node.expr, found)
        if node.param is not None:
            _walk(node.param, found)
    elif isinstance(node, promql_parser.BinaryExpr):
        modifier = node.modifier
        if modifier is not None and modifier.matching is not None:
            found.grouped.update(modifier.matching.labels)
        _walk(node.lhs, found)
        _walk(node.rhs, found)
    elif isinstance(
        node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
    ):
        _walk(node.expr, found)
    else:
        assert isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral), node


# --- what a server exports ---------------------------------------------------------------


def exported(text: str) -> dict[str, set[str]]:
    """Every series name the exposition TEXT has (a histogram's _bucket, _sum and _count, a
    counter's _total), with the label names its family's samples carry."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        labels = {label for s in family.samples for label in s.labels if label != "le"}
        names = {s.name for s in family.samples}
        # A family declared with no sample yet is exported all the same.
        names |= {
            "counter": {f"{family.name}_total"},
            "histogram": {f"{family.name}_{x}" for x in ("bucket", "sum", "count")},
            "info": {f"{family.name}_info"},
        }.get(family.type, {family.name})
        for name in names:
            out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def unknown(queries: list[Query], series: dict[str, set[str]]) -> list[str]:
    """What QUERIES name that SERIES (exported) lacks, one line each."""
    wrong = []
    for query in queries:
        found = named(query.expr)
        known = set(TARGET_LABELS)
        for name, matched in found.matched.items():
            if name in PROMETHEUS_OWN:
                continue
            if name not in series:
                wrong.append(f"{query.where}: {name} is not exported")
                continue
            known |= series[name]
            for label in matched - series[name] - TARGET_LABELS:
                wrong.append(f"{query.where}: {name} has no label {label!r}")
        for label in (found.grouped | query.shown_by) - known:
            wrong.append(f"{query.where}: no metric of it has the label {label!r}")
    return wrong


# --- the tests ---------------------------------------------------------------------------


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (Debian's prometheus package; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout, done.stdout


def test_each_alert_fires_on_the_series_it_is_for_and_not_before() -> None:
    tested = {
        found["name"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for check in case["promql_expr_test"]
        if check["exp_samples"]
        for found in [re.search(r'alertname="(?P<name>\w+)"', check["expr"])]
        if found is not None
    }
    assert tested == {rule["alert"] for rule in rules()}, "an alert without a unit test"
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_each_alert_says_how_long_how_bad_what_and_where_to_read_on() -> None:
    anchors = {_anchor(line) for line in DOCS.read_text().splitlines() if line.startswith("#")}
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), names
    for rule in rules():
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), rule
        assert rule["labels"]["severity"] in SEVERITIES, rule
        notes = rule["annotations"]
        assert notes["summary"] and len(notes["description"]) > 40, rule
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/monitoring.md" and anchor == rule["alert"].lower(), rule
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in {DOCS.name}"


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_dashboard_takes_its_data_source_as_a_variable() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 39
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${" + variable["name"] + "}"}
    ids = []
    for panel in panels(board):
        ids.append(panel["id"])
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
    for other in board["templating"]["list"]:
        if other["type"] == "query":
            assert other["datasource"] == source, other["name"]
    assert len(ids) == len(set(ids)), ids
    titles = {panel["title"] for panel in panels(board)}
    # What issue 45 asks the dashboard to show, each a row of it.
    assert {
        "Servers and membership", "Nodes and streams", "Block fan-out", "Jobs",
        "Temporal host", "Database", "Caps on one person",
    } <= titles, titles  # fmt: skip


def test_a_misspelled_metric_or_label_is_caught() -> None:
    series = {"oz0_jobs": {"state"}, "oz0_job_duration_seconds_bucket": {"state", "le"}}
    good = Query(
        "good",
        "histogram_quantile(0.9, sum by (le, state)"
        ' (rate(oz0_job_duration_seconds_bucket{job="x"}[5m])))'
        " + on (instance) max by (state) (oz0_jobs)",
    )
    assert unknown([good], series) == []
    assert unknown([Query("q", "oz0_job{state='queued'}")], series) == [
        "q: oz0_job is not exported"
    ]
    assert unknown([Query("q", "oz0_jobs{phase='queued'}")], series) == [
        "q: oz0_jobs has no label 'phase'"
    ]
    assert unknown([Query("q", "sum by (tenant) (oz0_jobs)")], series) == [
        "q: no metric of it has the label 'tenant'"
    ]
    assert unknown([Query("q", "oz0_jobs", frozenset({"tenant"}))], series) == [
        "q: no metric of it has the label 'tenant'"
    ]


def test_every_metric_the_dashboard_and_rules_name_is_one_a_server_exports(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    files = served.files
    env = files.cli_env
    before = metrics.scrape(SERVER)

    def count(samples: metrics.Samples, name: str, **labels: str) -> float:
        return metrics.value(samples, name, **labels) or 0

    # A little of everything the dashboard shows: an agent joins and runs a job...
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE], files.ca_hash, token=create_token(cli, env)
    ).start()
    agents.append(agent)
    node_id = agent.wait_status(connected, timeout=60)["node_id"]
    ran = cli("job", "run", "--node", node_id, "--", "true", env=env)
    assert ran.code == 0, ran.err
    # ... and a person sends more requests than their cap (a burst of 200, then 50 a
    # second): 1,000 at once, of one curl over one connection (`[1-1000]` is curl's URL
    # glob), each answered 400 for its job ID before any query: only at 16 ms each or more
    # would none be refused.
    admin = operator_certs.OperatorFiles(files.context_dir)
    burst = subprocess.run(
        ["curl", "-sk", "--max-time", "60", *admin.curl_args, "--create-dirs",
         "-o", str(tmp_path / "answers" / "#1"), "--write-out", "%{http_code}\n",
         f"https://{SERVER}:8443/api/v1/jobs/not-a-job-[1-1000]"],
        capture_output=True, text=True, check=True, timeout=180,
    )  # fmt: skip
    answers = burst.stdout.split()
    refused = answers.count("429")
    assert len(answers) == 1000 and set(answers) == {"400", "429"}, set(answers)
    assert refused > 0, "1,000 requests at once, none past the cap"

    succeeded = count(before, "oz0_job_duration_seconds_count", state="succeeded")
    capped = count(before, "oz0_person_caps_hit_total", cap="requests")
    after = wait_until(
        lambda: (
            (s := metrics.scrape(SERVER))
            and count(s, "oz0_job_duration_seconds_count", state="succeeded") == succeeded + 1
            and count(s, "oz0_person_caps_hit_total", cap="requests") == capped + refused
            and s
        ),
        SCRAPE_BOUND,
        "a scrape with the job ended and the refusals counted",
        step=0.5,
    )
    assert count(after, "oz0_job_wait_seconds_count", state="succeeded") == (
        count(before, "oz0_job_wait_seconds_count", state="succeeded") + 1
    )
    assert count(after, "oz0_servers_up") == 1
    assert metrics.value(after, "oz0_jobs", state="queued") is not None

    code, _, text = metrics.get(SERVER, "/metrics")
    assert code == 200, text
    series = exported(text)
    queries = dashboard_queries() + rule_queries()
    assert len(queries) > 40, len(queries)
    assert unknown(queries, series) == []


def test_a_scrape_reads_the_servers_up_the_jobs_not_ended_and_how_long_they_wait(
    conn: psycopg.Connection[Any],
) -> None:
    node = job_rows.add_node(conn)
    waiting = job_rows.new_job(conn, node=node)
    conn.execute(
        "UPDATE jobs SET created_at = now() - interval '90 seconds' WHERE id = %s", (waiting.id,)
    )
    counted = cluster_counts.count(conn)
    assert counted.servers_up == 1
    assert counted.nodes == {("default", "accepted"): 1}
    assert counted.jobs == {"queued": 1, "running": 0}
    assert 90 <= counted.oldest_queued < 120 and 90 <= counted.oldest_unstarted < 120
    # Its workflow started and its first attempt placed: running, nothing waits.
    conn.execute("UPDATE jobs SET workflow_started = true WHERE id = %s", (waiting.id,))
    job_rows.place(conn, waiting, 1)
    counted = cluster_counts.count(conn)
    assert counted.jobs == {"queued": 0, "running": 1}
    assert (counted.oldest_queued, counted.oldest_unstarted) == (0, 0)
    # A server whose heartbeat is older than the 5 s of membership is not up.
    conn.execute("UPDATE servers SET last_heartbeat = now() - interval '6 seconds'")
    assert cluster_counts.count(conn).servers_up == 0
