"""The Grafana dashboard in deploy/grafana/ against a real Prometheus.

A real `prometheus` (Debian's package, installed by scripts/bootstrap)
scrapes a running `pjserve node --workers 2` (its metrics port carries the
gateway's own metrics and every worker's, labelled by worker) every 200 ms
while a client sends requests; then every query of every panel, with the
dashboard's variables set to "All", must return at least one finite value
through Prometheus' HTTP API. A panel whose metric is renamed, whose label
is wrong or whose PromQL does not parse fails here, naming the panel.
"""

import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from protocol_util import finish_checked, free_ports

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pjserve-dashboard.json"

# What the dashboard's variables become in the queries: every instance and
# model, and a rate window of some scrapes.
VARIABLES = {"$__rate_interval": "3s", "$instance": ".*", "$model": ".*"}


def panel_queries(dashboard: dict):
    """(panel title, refId, expr) of every query of every panel, rows' own
    panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel] + panel.get("panels", []):
            for t in p.get("targets", []):
                out.append((p["title"], t["refId"], t["expr"]))
    return out


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


class Prometheus:
    """A Prometheus server scraping one target, its data in `workdir`."""

    def __init__(self, target: str, workdir: Path):
        self.port = free_ports(1)[0]
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n"
            "scrape_configs:\n  - job_name: pjserve\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path: str, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def wait_target_up(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("prometheus exited:\n" + self.log.read_text(errors="replace")[-3000:])
            try:
                targets = self.api("targets")["data"]["activeTargets"]
                if targets and targets[0]["health"] == "up":
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail("prometheus never scraped the node:\n" +
                    self.log.read_text(errors="replace")[-3000:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def send_requests(url: str, stop: threading.Event, errors: list):
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    while not stop.is_set():
        try:
            client.infer("mlp", [x])
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(str(e))
            return


def test_dashboard_queries_return_data(node_factory, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: run scripts/bootstrap", pytrace=False)
    dashboard = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dashboard)
    assert len(queries) >= 20, "the dashboard lost its panels"
    # A finite weight budget, so the cache panel's budget line has a value.
    node = node_factory(["--workers", "2", "--device-weight-budget", "64Mi"])
    prometheus = Prometheus(f"127.0.0.1:{node.metrics_port}", tmp_path)
    stop, errors = threading.Event(), []
    sender = threading.Thread(target=send_requests, args=(node.http_url, stop, errors))
    sender.start()
    try:
        prometheus.wait_target_up()
        time.sleep(6)  # two rate windows of scrapes under traffic
        assert not errors, errors[:3]
        empty = []
        for title, ref, expr in queries:
            reply = prometheus.api("query", query=substitute(expr))
            assert reply["status"] == "success", f"{title} ({ref}): {reply}"
            values = [float(r["value"][1]) for r in reply["data"]["result"]]
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{title} ({ref}): {expr} -> {values}")
        assert not empty, "panels with no data:\n" + "\n".join(empty)
    finally:
        stop.set()
        sender.join()
        prometheus.stop()
    finish_checked(node)
