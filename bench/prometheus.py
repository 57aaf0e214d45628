"""A real Prometheus (Debian's `prometheus` package, /usr/bin/prometheus) for the
benchmarks: a configuration scraping the servers' `/metrics` as docs/monitoring.md says,
with the shipped alerting rules loaded, and its HTTP API read back (bench.dashboard_picture).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from oz0_common.certs import API_SERVER_NAME

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "orchestrator-zero-alerts.yml"
# The job name the rules select (docs/monitoring.md, "Scrape the servers").
JOB = "orchestrator-zero"
READY_TIMEOUT = 60.0
QUERY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


class PrometheusError(Exception):
    pass


def config(targets: Sequence[str], ca_file: Path, scrape_s: float) -> dict[str, Any]:
    """prometheus.yml: every server (HOST:8443) scraped over TLS checked against the
    cluster CA, under the job name the rules select, every SCRAPE_S seconds; the rules
    evaluated as often."""
    every = f"{round(scrape_s)}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "scheme": "https",
                "tls_config": {"ca_file": str(ca_file), "server_name": API_SERVER_NAME},
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }


@dataclass
class Prometheus:
    """One `prometheus` process listening on ADDRESS (HOST:PORT), its data in DIRECTORY."""

    address: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, targets: Sequence[str], ca_file: Path, scrape_s: float) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusError("prometheus is not installed (Debian's prometheus package)")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(config(targets, ca_file, scrape_s), sort_keys=False))
        with (self.directory / "prometheus.log").open("wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={path}",
                 f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address={self.address}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready():
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready in {READY_TIMEOUT:g} s")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as answer:
                return int(answer.status) == 200
        except OSError:
            return False

    def log(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)

    def api(self, path: str, **params: str | float) -> Any:
        """GET /api/v1/PATH?PARAMS: its `data`, or PrometheusError with Prometheus' error."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        url = f"http://{self.address}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('error', body)}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return [Series.of(r["metric"], r["values"]) for r in data["result"]]

    def query(self, expr: str, at: float) -> list[Series]:
        data = self.api("query", query=expr, time=at)
        if data["resultType"] == "scalar":
            return [Series.of({}, [data["result"]])]
        return [Series.of(r["metric"], [r["value"]]) for r in data["result"]]

    def label_values(self, label: str, match: str | None) -> list[str]:
        params: dict[str, str | float] = {"match[]": match} if match else {}
        return [str(v) for v in self.api(f"label/{label}/values", **params)]


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels, and (time, value) pairs; NaN as Prometheus
    answers "NaN" (a quantile of nothing), infinities as such."""

    labels: dict[str, str]
    points: list[tuple[float, float]]

    @classmethod
    def of(cls, labels: dict[str, str], values: list[list[Any]]) -> Series:
        return cls(dict(labels), [(float(t), float(v)) for t, v in values])

    @property
    def has_data(self) -> bool:
        return any(math.isfinite(v) for _, v in self.points)

    def to_json(self) -> dict[str, Any]:
        # JSON has no NaN: a point without a value is null.
        return {
            "labels": self.labels,
            "points": [[t, v if math.isfinite(v) else None] for t, v in self.points],
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Series:
        points = [(float(t), math.nan if v is None else float(v)) for t, v in value["points"]]
        return cls(dict(value["labels"]), points)
