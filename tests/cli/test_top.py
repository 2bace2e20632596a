"""`pjserve top` against real servers with traffic: one view (--once, and
without a terminal) as a table and as JSON, the values checked against the
server's own metrics and control status; sorting, filtering and a pinned
model; a node's workers; errors that say what to do; and the live view under
tmux: the screen's text, the keys s, r, / and q, the terminal restored
after q, SIGINT and SIGTERM, and ctrl-z and fg in an interactive shell.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from protocol_util import RELOAD_MODEL, finish_checked, free_ports
from top_util import BUDGET_BYTES, MODELS, Traffic

COLUMNS = ["MODEL", "QUEUE", "INFLT", "REQ/S", "FAIL/S", "LAT ms", "QWAIT p50", "QWAIT p99",
           "BUSY%", "WEIGHTS", "SIZE", "LOADS/S", "EVICT/S"]


def urls(server):
    return ["--url", f"http://{server.http_url}", "--metrics-url", server.metrics_url]


def top(pjserve_bin, *args, timeout=120):
    return subprocess.run([str(pjserve_bin), "top", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def model_rows(text: str):
    """{model: {column: cell}} of the table under the MODEL header."""
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("MODEL "))
    head = re.split(r"\s{2,}", lines[at].strip())
    assert head == COLUMNS, lines[at]
    rows = {}
    for ln in lines[at + 1:]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != len(COLUMNS):
            break
        rows[cells[0]] = dict(zip(COLUMNS, cells))
    return rows


def metrics_value(server, family: str, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'^{family}{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert m, f"{family} of {model} is not in the metrics"
    return float(m.group(1))


def set_residency(server, model: str, residency: str):
    req = urllib.request.Request(f"http://{server.http_url}/v2/pjserve/models/{model}/residency",
                                 data=json.dumps({"residency": residency}).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


# ---- one view -----------------------------------------------------------------------

def test_once_table_under_traffic(pjserve_bin, server, traffic):
    r = top(pjserve_bin, *urls(server), "--once", "--interval", "1")
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"pjserve top - http://{server.http_url}   every 1.0 s")
    assert "scheduler fair" in lines[0]
    assert re.match(r"requests \d+\.\d/s   failed 0\.0/s   queued \d+   in flight \d+   "
                    r"device busy \d+\.\d%$", lines[1]), lines[1]
    assert re.match(r"weights [\d.]+ K?i?B of 3\.0 KiB budget \(\d+%\)   pinned 0 B   "
                    r"loads [\d.]+/s   evictions [\d.]+/s   prefetches [\d.]+/s$",
                    lines[2]), lines[2]
    assert lines[3].startswith("LAT ms: mean over the interval (the server exports sums")
    assert "sort rate   filter -   3 of 3 models" in r.stdout
    rows = model_rows(r.stdout)
    assert set(rows) == set(MODELS)
    busy = [float(rows[m]["REQ/S"]) for m in ("mlp", RELOAD_MODEL)]
    assert sum(busy) > 0, rows
    assert rows["two_io"]["REQ/S"] == "0.0" and rows["two_io"]["LAT ms"] == "-"
    for m in MODELS:
        assert rows[m]["WEIGHTS"] in ("device", "host"), rows[m]
        assert rows[m]["FAIL/S"] == "0.0"
    assert rows["mlp"]["SIZE"] == "2.6 KiB"
    # Rows sort by requests per second, the busiest first.
    order = [float(v["REQ/S"]) for v in rows.values()]
    assert order == sorted(order, reverse=True)


def test_json_matches_the_servers_metrics(pjserve_bin, server, traffic):
    before = metrics_value(server, "nv_inference_request_success", "mlp")
    r = top(pjserve_bin, *urls(server), "--json", "--interval", "1")
    after = metrics_value(server, "nv_inference_request_success", "mlp")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    print(json.dumps(doc, indent=1)[:3000])
    assert doc["url"] == f"http://{server.http_url}"
    assert doc["metrics_url"] == server.metrics_url
    assert doc["latency"] == "mean over the interval"
    assert doc["cache"]["budget_bytes"] == BUDGET_BYTES
    assert doc["cache"]["used_bytes"] <= BUDGET_BYTES
    assert doc["node"] is False and len(doc["workers"]) == 1
    models = {m["name"]: m for m in doc["models"]}
    assert set(models) == set(MODELS)
    mlp = models["mlp"]
    # top scraped between the two reads of the counter.
    assert before <= mlp["requests_total"] <= after
    assert mlp["weight_bytes"] == 2704 and mlp["residency"] == "host"
    both = [models[m] for m in ("mlp", RELOAD_MODEL)]
    assert sum(m["requests_per_s"] for m in both) > 0
    # The budget holds one mlp: requests alternating between them load weights.
    assert sum(m["loads_per_s"] for m in both) > 0, both
    for m in doc["models"]:
        assert (m["weights"] == "device") == (m["resident_bytes"] > 0), m
        assert m["failures_per_s"] == 0
        if m["requests_per_s"] > 0:
            assert m["latency_mean_ms"] > 0 and m["queue_wait_p99_ms"] is not None
    assert 0 <= doc["device_busy"]
    assert doc["requests_per_s"] == pytest.approx(sum(m["requests_per_s"] for m in doc["models"]))


def test_sort_filter_and_a_pinned_model(pjserve_bin, server):
    set_residency(server, "two_io", "device")
    try:
        r = top(pjserve_bin, *urls(server), "--once", "--interval", "0.2", "--sort", "model",
                "--filter", "mlp")
        assert r.returncode == 0, r.stderr
        assert "sort model   filter mlp   2 of 3 models" in r.stdout
        assert list(model_rows(r.stdout)) == ["mlp", RELOAD_MODEL]
        r = top(pjserve_bin, *urls(server), "--once", "--interval", "0.2", "--sort", "model",
                "--reverse")
        assert list(model_rows(r.stdout)) == sorted(MODELS, reverse=True)
        assert model_rows(r.stdout)["two_io"]["WEIGHTS"] == "pinned"
        r = top(pjserve_bin, *urls(server), "--json", "--interval", "0.2", "--filter", "two")
        doc = json.loads(r.stdout)
        assert [m["name"] for m in doc["models"]] == ["two_io"]
        assert doc["models"][0]["weights"] == "pinned"
        assert doc["cache"]["pinned_bytes"] > 0
        r = top(pjserve_bin, *urls(server), "--once", "--interval", "0.2", "--filter", "nothing")
        assert "(no model matches the filter)" in r.stdout
    finally:
        set_residency(server, "two_io", "host")


def test_without_a_terminal_it_prints_one_view(pjserve_bin, server):
    r = top(pjserve_bin, *urls(server), "--interval", "0.2")
    assert r.returncode == 0, r.stderr
    assert "\033[" not in r.stdout
    assert set(model_rows(r.stdout)) == set(MODELS)


def test_node_shows_its_workers(pjserve_bin, node):
    # A worker's models reach the node's status (and the gateway's scrape)
    # once the gateway's pool has read its index.
    node.wait_for("both workers' models in /v2/pjserve/node",
                  lambda: all(len(w["models"]) == 2 for w in node.status()["workers"]))
    r = top(pjserve_bin, *urls(node), "--once", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    lines = r.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("WORKER "))
    assert re.split(r"\s{2,}", lines[at].strip()) == [
        "WORKER", "DEVICE", "STATE", "PID", "RESTARTS", "BUSY%", "CACHE", "MODELS"]
    workers = [re.split(r"\s{2,}", ln.strip()) for ln in lines[at + 1:at + 3]]
    assert [w[:3] for w in workers] == [["0", "cpu:0", "ready"], ["1", "cpu:1", "ready"]]
    assert all(w[3].isdigit() and w[7] == "2" for w in workers), workers
    assert set(model_rows(r.stdout)) == {"mlp", "two_io"}
    doc = json.loads(top(pjserve_bin, *urls(node), "--json", "--interval", "0.5").stdout)
    assert doc["node"] is True
    assert [(w["id"], w["state"]) for w in doc["workers"]] == [(0, "ready"), (1, "ready")]
    assert {m["name"]: m["workers"] for m in doc["models"]} == {"mlp": 2, "two_io": 2}


def test_gateway_shows_its_workers(pjserve_bin, gateway):
    with Traffic(gateway, models=("mlp",)) as t:
        r = top(pjserve_bin, *urls(gateway), "--once", "--interval", "0.5")
        done = t.done
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    lines = r.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("WORKER "))
    workers = [re.split(r"\s{2,}", ln.strip()) for ln in lines[at + 1:at + 3]]
    # No node status: the gateway's word on each worker; no device or pid.
    assert [w[:4] for w in workers] == [["0", "-", "ready", "-"], ["1", "-", "ready", "-"]]
    rows = model_rows(r.stdout)
    assert set(rows) == {"mlp", "two_io"}
    assert float(rows["mlp"]["REQ/S"]) > 0 and done > 0
    assert "(mean of the workers)" in lines[1]


# ---- errors -------------------------------------------------------------------------

def test_errors_say_what_to_do(pjserve_bin, server):
    port = free_ports(1)[0]
    r = top(pjserve_bin, "--once", "--metrics-url", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert (f"pjserve: error: cannot reach http://127.0.0.1:{port}/metrics: Connection refused; "
            f"is pjserve serve (or node) running with --metrics-port {port}? Give the server's "
            f"metrics port with --metrics-url") in r.stderr, r.stderr
    # The REST port is not the metrics port.
    r = top(pjserve_bin, "--once", "--metrics-url", f"http://{server.http_url}")
    assert r.returncode == 1
    assert f"http://{server.http_url}/metrics answered HTTP 404" in r.stderr, r.stderr
    assert "is --metrics-url the metrics port of a pjserve server?" in r.stderr
    # Metrics without the REST port: the view, without residency, says why.
    r = top(pjserve_bin, "--once", "--interval", "0.2", "--url", f"http://127.0.0.1:{port}",
            "--metrics-url", server.metrics_url)
    assert r.returncode == 0, r.stderr
    assert (f"! residency and weight sizes unknown: cannot reach http://127.0.0.1:{port}: "
            f"Connection refused; is pjserve serve (or node) running with --http-port {port}?"
            in r.stdout), r.stdout
    assert set(model_rows(r.stdout)) == set(MODELS)
    for args, says in [(["--sort", "speed"], "--sort takes model, queue, rate"),
                       (["--interval", "0"], "--interval takes seconds from 0.1 to 3600"),
                       (["--url", "grpc://h:8001"], "--url must be http://HOST:PORT"),
                       (["extra"], "takes no arguments"),
                       (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together")]:
        r = top(pjserve_bin, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr and "usage: see 'pjserve top --help'" in r.stderr, r.stderr
    r = top(pjserve_bin, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: pjserve top")


def test_https_and_a_token(pjserve_bin, secure_server):
    s = secure_server
    args = ["--url", f"https://{s.http_url}", "--metrics-url",
            f"https://127.0.0.1:{s.metrics_port}", "--once", "--interval", "0.2"]
    r = top(pjserve_bin, *args)
    assert r.returncode == 1
    assert "https://127.0.0.1" in r.stderr and "certificate" in r.stderr.lower(), r.stderr
    r = top(pjserve_bin, *args, "--tls-ca", s.ca)
    assert r.returncode == 1
    assert (f"https://127.0.0.1:{s.metrics_port}/metrics answered HTTP 401" in r.stderr
            and "give the server's token with --token-file" in r.stderr), r.stderr
    r = top(pjserve_bin, *args, "--tls-ca", s.ca, "--token-file", s.infer_token)
    assert r.returncode == 0, r.stderr
    assert model_rows(r.stdout)["mlp"]["SIZE"] == "2.6 KiB"  # the control status was read
    assert "! " not in r.stdout


# ---- the live view under tmux --------------------------------------------------------

class Tmux:
    """A private tmux server (its own socket) with one 160x40 session."""

    def __init__(self):
        if shutil.which("tmux") is None:
            pytest.fail("tmux is missing: run scripts/bootstrap", pytrace=False)
        self.dir = Path(tempfile.mkdtemp(prefix="pjs-tmux-"))
        self.sock = self.dir / "sock"
        self.pid_file = self.dir / "top.pid"

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", str(self.sock), *args], capture_output=True,
                              text=True, timeout=30)

    def start(self, argv):
        """Runs argv with the pane's terminal as stdin; then prints its exit
        status and the terminal's settings, and stays."""
        quoted = " ".join(f"'{a}'" for a in argv)
        script = (f"{quoted} </dev/tty & echo $! > {self.pid_file}; wait $!; "
                  f"echo \"top exited $?\"; stty -a </dev/tty; sleep 600")
        r = self.tmux("new-session", "-d", "-x", "160", "-y", "40", "-s", "top", script)
        assert r.returncode == 0, r.stderr

    def start_shell(self):
        """An interactive bash without profile files, prompt '$ '."""
        r = self.tmux("new-session", "-d", "-x", "160", "-y", "40", "-s", "top",
                      "env PS1='$ ' bash --norc --noprofile -i")
        assert r.returncode == 0, r.stderr
        self.wait_for("the prompt", lambda s: s.strip().endswith("$"))

    def top_pid(self) -> int:
        self.wait_for("top's pid", lambda s: self.pid_file.exists()
                      and self.pid_file.read_text().strip().isdigit())
        return int(self.pid_file.read_text())

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def keys(self, *keys):
        r = self.tmux("send-keys", "-t", "top", *keys)
        assert r.returncode == 0, r.stderr

    def wait_for(self, what, test, timeout=60):
        """Waits until test(screen) holds; fails with the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if test(screen):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"the screen never showed {what}:\n{screen}", pytrace=False)
            time.sleep(0.1)

    def close(self):
        self.tmux("kill-server")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def tmux():
    t = Tmux()
    yield t
    t.close()


def screen_rows(screen: str):
    try:
        return model_rows(screen)
    except StopIteration:
        return {}


def restored(screen: str) -> bool:
    """top exited 0 and stty shows canonical mode and echo back on."""
    return ("top exited 0" in screen and re.search(r"(?<!-)\bicanon\b", screen) is not None
            and re.search(r"(?<![-\w])echo\b", screen) is not None)


def test_live_view_keys_and_quit(pjserve_bin, server, traffic, tmux):
    tmux.start([str(pjserve_bin), "top", *urls(server), "--interval", "0.5"])
    screen = tmux.wait_for(
        "every model with mlp traffic",
        lambda s: set(screen_rows(s)) == set(MODELS)
        and float(screen_rows(s)["mlp"]["REQ/S"]) + float(screen_rows(s)[RELOAD_MODEL]["REQ/S"])
        > 0)
    print(screen)
    lines = screen.splitlines()
    assert lines[0].startswith(f"pjserve top - http://{server.http_url}   every 0.5 s")
    assert "weights " in lines[2] and "of 3.0 KiB budget" in lines[2]
    assert "sort rate   filter -   3 of 3 models   keys: q quit  s sort  r reverse  / filter" \
        in screen
    assert all(len(ln) <= 160 for ln in lines)

    tmux.keys("s")
    tmux.wait_for("the sort on latency", lambda s: "sort latency   filter -" in s)
    tmux.keys("r")
    tmux.wait_for("the reversed sort", lambda s: "sort latency (reversed)   filter -" in s)
    tmux.keys("/")
    tmux.wait_for("the filter prompt", lambda s: "filter: _   (Enter: apply, Esc: cancel)" in s)
    tmux.keys("two")
    tmux.wait_for("the filter typed", lambda s: "filter: two_" in s)
    tmux.keys("Enter")
    screen = tmux.wait_for("the filtered view",
                           lambda s: "filter two   1 of 3 models" in s
                           and list(screen_rows(s)) == ["two_io"])
    tmux.keys("/", "BSpace", "BSpace", "BSpace", "Escape")
    tmux.wait_for("the filter kept after Esc", lambda s: "filter two   1 of 3 models" in s)

    tmux.keys("q")
    screen = tmux.wait_for("top's exit and the terminal's settings", restored)
    assert "MODEL" not in screen  # the alternate screen is gone


def test_gateway_without_worker_metrics_says_what_is_missing(pjserve_bin,
                                                             gateway_without_worker_metrics,
                                                             tmux):
    """A gateway started as docs/gateway.md once showed it (--worker grpc=,http=
    without metrics=) scrapes no worker: top says so and how to fix it,
    rather than that the server has no models."""
    g = gateway_without_worker_metrics
    tmux.start([str(pjserve_bin), "top", *urls(g), "--interval", "0.5"])
    screen = tmux.wait_for("what is missing",
                           lambda s: "no metrics address for 2 of its 2 workers" in s)
    print(screen)
    assert "--worker grpc=...,http=...,metrics=HOST:PORT" in screen
    assert "has no models loaded" not in screen
    tmux.keys("q")
    tmux.wait_for("top's exit and the terminal's settings", restored)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_restores_the_terminal(pjserve_bin, server, tmux, sig):
    tmux.start([str(pjserve_bin), "top", *urls(server), "--interval", "0.3"])
    tmux.wait_for("the model table", lambda s: set(screen_rows(s)) == set(MODELS))
    os.kill(tmux.top_pid(), sig)
    screen = tmux.wait_for("top's exit and the terminal's settings", restored)
    assert "MODEL" not in screen


def test_a_server_that_goes_away_is_reported_on_the_screen(pjserve_bin, own_server, tmux):
    tmux.start([str(pjserve_bin), "top", *urls(own_server), "--interval", "0.3"])
    tmux.wait_for("the model table", lambda s: list(screen_rows(s)) == ["mlp"])
    finish_checked(own_server)
    note = (f"! cannot reach {own_server.metrics_url}: Connection refused; is pjserve serve "
            f"(or node) running with --metrics-port {own_server.metrics_port}?")
    screen = tmux.wait_for("the failed scrape", lambda s: note in s)
    assert list(screen_rows(screen)) == ["mlp"]  # the last view stays
    tmux.keys("q")
    tmux.wait_for("top's exit and the terminal's settings", restored)


def test_ctrl_z_in_a_shell_gives_the_terminal_back(pjserve_bin, server, tmux):
    """Under an interactive bash (job control: ctrl-z stops the job and fg
    resumes it), the stopped view leaves the alternate screen, and fg
    brings it back."""
    tmux.start_shell()
    command = " ".join([str(pjserve_bin), "top", *urls(server), "--interval", "0.3"])
    tmux.keys(command, "Enter")
    tmux.wait_for("the model table", lambda s: set(screen_rows(s)) == set(MODELS))
    tmux.keys("C-z")
    screen = tmux.wait_for("the stopped job at the prompt",
                           lambda s: "Stopped" in s and "top" in s)
    assert "MODEL" not in screen
    tmux.keys("fg", "Enter")
    tmux.wait_for("the view again", lambda s: set(screen_rows(s)) == set(MODELS))
    tmux.keys("q")
    tmux.wait_for("the prompt after q", lambda s: "MODEL" not in s)
    tmux.keys('echo "top exited $?"; stty -a', "Enter")
    tmux.wait_for("top's exit and the terminal's settings", restored)
