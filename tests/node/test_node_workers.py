"""`pjserve node --workers 2`: the gateway in the node serves the public
ports over two CPU workers on private loopback ports; both are ready in
/v2/pjserve/node and the control service's NodeStatus; a worker killed with SIGKILL under load from 8 client
threads costs at most the requests in flight on it (UNAVAILABLE), never a
wrong answer, while the other serves throughout; SIGTERM drains and exits 0.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_node_workers.py
"""

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

from control_client import ControlClient
from node_util import parent_of, process_alive, tcp_listeners
from protocol_util import finish_checked, grpc_code, grpc_infer_case, http_infer_case, run_threads

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def test_two_workers_behind_the_gateway(node_factory, cases):
    node = node_factory(["--workers", "2"])
    # Models come from the gateway's pool, which probes on its own clock.
    node.wait_for("models of both workers in /v2/pjserve/node",
                  lambda: all(w["models"] for w in node.status()["workers"]))
    doc = node.status()
    assert doc["routing"] == "round_robin"
    assert [w["id"] for w in doc["workers"]] == [0, 1]
    for w in doc["workers"]:
        assert w["state"] == "ready" and w["restarts"] == 0
        assert sorted(w["models"]) == ["mlp", "two_io"]
        # Behind the gateway, workers listen on Unix sockets in the node's
        # private run directory, never on TCP.
        assert w["grpc"] == f"unix:{node.run_dir}/worker-{w['id']}.grpc", w
        assert w["http"] == f"unix:{node.run_dir}/worker-{w['id']}.http", w
        assert not tcp_listeners(w["pid"]), tcp_listeners(w["pid"])
        assert parent_of(w["pid"]) == node.proc.pid
    assert doc["workers"][0]["device"] == "cpu:0" and doc["workers"][1]["device"] == "cpu:1"
    # The control gRPC service answers the same document.
    control = ControlClient(node.grpc_url)
    r = control.call("NodeStatus")
    control.close()
    assert r.routing == doc["routing"]
    assert [(w.id, w.device, w.pid, w.state, w.restarts, sorted(w.models), w.grpc, w.http)
            for w in r.workers] == \
        [(w["id"], w["device"], w["pid"], w["state"], w["restarts"], sorted(w["models"]),
          w["grpc"], w["http"]) for w in node.status()["workers"]]
    # Another local user cannot reach a worker (the run directory is 0700).
    if os.geteuid() == 0 and shutil.which("setpriv"):
        sock = doc["workers"][0]["http"][len("unix:"):]
        probe = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
             "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); "
                   "s.connect(sys.argv[1]); print('connected')", sock],
            capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe
    # The workers' admin token: private to the node's user.
    token = node.run_dir / "worker-admin-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text().strip()) == 64
    case = cases.get("mlp", 4)
    g = grpcclient.InferenceServerClient(node.grpc_url)
    h = httpclient.InferenceServerClient(node.http_url, network_timeout=60)
    try:
        for i in range(4):
            got, _ = grpc_infer_case(g, case)
            case.check(got, f"gRPC through the gateway #{i}")
            got, _ = http_infer_case(h, case)
            case.check(got, f"HTTP through the gateway #{i}")
    finally:
        g.close()
        h.close()
    pids = [w["pid"] for w in doc["workers"]]
    finish_checked(node)
    assert not any(process_alive(p) for p in pids)
    assert not node.run_dir.exists()


def test_kill_9_of_one_worker_under_load(node_factory, cases):
    node = node_factory(["--workers", "2"])
    doc = node.status()
    victim, other = doc["workers"][0]["pid"], doc["workers"][1]["pid"]
    stop = threading.Event()
    case_by_thread = [cases.get("mlp", 1 + (i % 2) * 3, seed=100 + i) for i in range(8)]

    def client(i):
        c = grpcclient.InferenceServerClient(node.grpc_url)
        case = case_by_thread[i]
        ok, unavailable = 0, 0
        try:
            while not stop.is_set():
                try:
                    got, _ = grpc_infer_case(c, case)
                except InferenceServerException as e:
                    assert grpc_code(e) == "UNAVAILABLE", f"thread {i}: {e}"
                    unavailable += 1
                    continue
                case.check(got, f"thread {i} under a worker kill")  # never a wrong answer
                ok += 1
        finally:
            c.close()
        return ok, unavailable

    results = []
    runner = threading.Thread(target=lambda: results.append(run_threads(client, 8, 120)))
    runner.start()
    time.sleep(1.0)
    os.kill(victim, signal.SIGKILL)
    node.wait_for("restarted worker 0",
                  lambda: (node.status()["workers"][0]["pid"] not in (None, victim)
                           and node.status()["workers"][0]["state"] == "ready"))
    time.sleep(1.0)
    stop.set()
    runner.join(150)
    (outcomes, errors), = results
    assert not errors, errors
    ok = sum(o for o, _ in outcomes)
    failed = sum(u for _, u in outcomes)
    # Only requests in flight on the killed worker may fail: at most one per
    # client thread.
    assert failed <= 8, f"{failed} requests failed"
    assert ok > 0
    doc = node.status()
    assert doc["workers"][1]["pid"] == other and doc["workers"][1]["restarts"] == 0
    assert doc["workers"][0]["restarts"] == 1
    assert doc["workers"][0]["last_exit"] == "signal SIGKILL"
    finish_checked(node)


def test_a_stopped_worker_leaves_the_routing_before_it_is_killed(node_factory, cases):
    """SIGSTOP of one worker under load: requests in flight on it may fail
    (the node kills it), but no client ever gets its "shutting down"
    refusal: a worker the node stops is out of the routing first, and a
    refusal before anything ran goes to the other worker."""
    node = node_factory(["--workers", "2", "--health-interval-ms", "200",
                         "--health-timeout-ms", "300"])
    victim = node.status()["workers"][0]["pid"]
    stop = threading.Event()
    case = cases.get("mlp", 1)

    def client(i):
        failures = []
        g = grpcclient.InferenceServerClient(node.grpc_url)
        h = httpclient.InferenceServerClient(node.http_url, network_timeout=30)
        try:
            while not stop.is_set():
                try:
                    got, _ = (grpc_infer_case(g, case) if i % 2 == 0
                              else http_infer_case(h, case))
                    case.check(got, f"thread {i} around a stopped worker")
                except InferenceServerException as e:
                    failures.append(str(e))
        finally:
            g.close()
            h.close()
        return failures

    results = []
    runner = threading.Thread(target=lambda: results.append(run_threads(client, 4, 120)))
    runner.start()
    time.sleep(1.0)
    os.kill(victim, signal.SIGSTOP)
    try:
        node.wait_for("replacement of the stopped worker",
                      lambda: (node.status()["workers"][0]["pid"] not in (None, victim)
                               and node.status()["workers"][0]["state"] == "ready"))
    finally:
        if process_alive(victim):
            os.kill(victim, signal.SIGCONT)
    time.sleep(1.0)
    stop.set()
    runner.join(150)
    (outcomes, errors), = results
    assert not errors, errors
    failures = [f for per_thread in outcomes for f in per_thread]
    refused = [f for f in failures if "shutting down" in f]
    assert not refused, f"{len(refused)} clients got the stopped worker's refusal: {refused[:2]}"
    # Only requests in flight on the stopped worker may fail: one per thread.
    assert len(failures) <= 4, failures
    finish_checked(node)
