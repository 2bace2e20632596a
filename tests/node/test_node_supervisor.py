"""`pjserve node` with one worker: it serves on the public ports, reports
itself on GET /v2/pjserve/node, restarts a worker killed with SIGKILL or
stopped with SIGSTOP, gives a worker up past its restart budget, drains on
SIGTERM leaving no process behind, and refuses bad command lines clearly.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_node_supervisor.py
"""

import os
import re
import signal
import socket
import subprocess
import time

import pytest

from node_util import RESTART_TIMEOUT_S, parent_of, process_alive
from protocol_util import (EXIT_TIMEOUT_S, finish_checked, grpc_infer_case, http_infer_case,
                           http_json)

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def infer_both(node, cases, seed=None):
    """mlp over gRPC and HTTP through the node's public ports, checked
    against the JAX reference."""
    case = cases.get("mlp", 4, seed=seed)
    g = grpcclient.InferenceServerClient(node.grpc_url)
    h = httpclient.InferenceServerClient(node.http_url, network_timeout=60)
    try:
        got, _ = grpc_infer_case(g, case)
        case.check(got, "gRPC through the node")
        got, _ = http_infer_case(h, case)
        case.check(got, "HTTP through the node")
    finally:
        g.close()
        h.close()


def test_one_worker_serves_and_reports_itself(node_factory, cases):
    node = node_factory()
    infer_both(node, cases)
    doc = node.status()
    assert doc["routing"] == "round_robin"
    assert len(doc["workers"]) == 1
    w = doc["workers"][0]
    assert w["id"] == 0 and w["device"] == "cpu:0"
    assert w["state"] == "ready" and w["restarts"] == 0 and w["last_exit"] is None
    assert sorted(w["models"]) == ["mlp", "two_io"]
    assert w["http"] == node.http_url and w["grpc"] == node.grpc_url
    # The pid is the node's own child, a `pjserve serve`.
    assert parent_of(w["pid"]) == node.proc.pid
    with open(f"/proc/{w['pid']}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert argv[1] == b"serve" and b"--node-status-file" in argv
    # One log: the worker's lines behind its prefix, the node's own beside them.
    assert node.log_lines("[worker 0] ") and node.log_lines("worker 0 (cpu:0) ready: pid")
    finish_checked(node)


def test_kill_9_of_the_worker_restarts_it(node_factory, cases):
    node = node_factory()
    old = node.worker(0)["pid"]
    os.kill(old, signal.SIGKILL)
    node.wait_for("restarted worker",
                  lambda: (node.worker(0)["pid"] not in (None, old)
                           and node.worker(0)["state"] == "ready"))
    w = node.status()["workers"][0]
    assert w["restarts"] == 1 and w["last_exit"] == "signal SIGKILL"
    assert w["pid"] != old and not process_alive(old)
    infer_both(node, cases, seed=5)
    lines = node.log_lines(f"pid {old} exited (signal SIGKILL); restart 1 in 100 ms")
    assert len(lines) == 1, node.describe()
    finish_checked(node)


def test_backoff_returns_to_the_first_delay_after_a_stable_worker(node_factory):
    """A worker that stayed ready --restart-stable-s before it went down
    restarts after 100 ms again, however often that happened before; the
    delay doubles only for one that went down sooner (a crash loop)."""
    node = node_factory(["--restart-stable-s", "1"])
    for k in range(1, 4):
        ready = node.worker(0)
        assert ready["state"] == "ready"
        # Ready for longer than the stable period (the node marked it ready
        # before the status file said so).
        time.sleep(1.5)
        old = ready["pid"]
        os.kill(old, signal.SIGKILL)
        node.wait_for(f"restart {k}",
                      lambda: (node.worker(0)["pid"] not in (None, old)
                               and node.worker(0)["state"] == "ready"))
        lines = node.log_lines(f"pid {old} exited (signal SIGKILL); restart {k} in ")
        assert len(lines) == 1, node.describe()
        assert lines[0].endswith(f"restart {k} in 100 ms"), lines[0]
    # Killed at once after it became ready: not stable, so the delay doubles.
    old = node.worker(0)["pid"]
    os.kill(old, signal.SIGKILL)
    node.wait_for("restart 4",
                  lambda: (node.worker(0)["pid"] not in (None, old)
                           and node.worker(0)["state"] == "ready"))
    assert node.log_lines(f"pid {old} exited (signal SIGKILL); restart 4 in 200 ms"), \
        node.describe()
    finish_checked(node)


def test_a_stopped_worker_is_detected_and_replaced(node_factory, cases):
    node = node_factory(["--health-interval-ms", "200", "--health-timeout-ms", "300"])
    node.wait_for("ready worker", lambda: node.worker(0)["state"] == "ready")
    old = node.worker(0)["pid"]
    os.kill(old, signal.SIGSTOP)
    try:
        # The stopped worker cannot answer /v2/pjserve/node: read the file.
        node.wait_for("replacement of the stopped worker",
                      lambda: (node.worker(0)["pid"] not in (None, old)
                               and node.worker(0)["state"] == "ready"))
    finally:
        if process_alive(old):
            os.kill(old, signal.SIGCONT)
    assert node.log_lines(f"pid {old}: health probe 1 of 3 failed")
    assert node.log_lines(f"pid {old} failed 3 health probes in a row: killing it")
    assert node.status()["workers"][0]["restarts"] == 1
    infer_both(node, cases, seed=6)
    finish_checked(node)


def test_sigterm_drains_and_leaves_no_process(node_factory):
    node = node_factory()
    pid = node.worker(0)["pid"]
    node.terminate()
    assert node.wait_exit() == 0, node.describe()
    assert not process_alive(pid)
    assert not node.run_dir.exists(), "the run directory the node made is left behind"
    assert node.log_lines("SIGTERM received: draining every worker")
    assert node.log_lines(f"worker 0 (cpu:0) pid {pid} stopped: exit status 0")


def test_past_the_restart_budget_the_worker_fails(node_factory):
    """The worker cannot bind its REST port (taken here), so it exits 1 on
    every start; one restart allowed, then it is failed and, being the only
    worker, the node exits 1."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        # The last --http-port wins, as in serve.
        node = node_factory(["--max-restarts", "1", "--http-port", str(port)], ready=False)
        rc = node.wait_exit(EXIT_TIMEOUT_S)
    finally:
        taken.close()
    assert rc == 1, node.describe()
    exits = node.log_lines("exited (exit status 1)")
    assert len(exits) == 2, node.describe()
    assert "restart 1 in 100 ms" in exits[0]
    assert re.search(r"restart budget spent \(1 restarts within 60 s\): worker failed",
                     exits[1]), exits[1]
    assert node.log_lines("every worker failed: the node stops")
    assert not node.run_dir.exists()


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "pjserve node: unknown option --bogus"),
    (["--workers", "0"], "--workers 0: expected an integer in 1..64"),
    (["--workers", "2", "--devices", "0,1"], "--workers and --devices exclude each other"),
    (["--devices", "0,,1"], "expected device ids separated by commas"),
    (["--routing", "random"], "--routing random: expected round_robin or lpt_packing"),
    (["--max-restarts", "x"], "--max-restarts x: expected an integer"),
    (["--restart-stable-s", "0"], "--restart-stable-s 0: expected an integer in 1..86400"),
    (["--http-port"], "--http-port needs a value"),
])
def test_bad_flags_are_usage_errors(pjserve_bin, tmp_path, args, message):
    r = subprocess.run([str(pjserve_bin), "node", "--model-repository", str(tmp_path)] + args,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "see 'pjserve node --help'" in r.stderr


def test_missing_repository(pjserve_bin, tmp_path):
    r = subprocess.run([str(pjserve_bin), "node"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--model-repository DIR is required" in r.stderr
    r = subprocess.run([str(pjserve_bin), "node", "--model-repository", str(tmp_path / "no")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_a_serve_flag_the_worker_refuses_stops_the_node(node_factory):
    node = node_factory(["--scheduler-discipline", "lottery"], ready=False)
    rc = node.wait_exit(EXIT_TIMEOUT_S)
    assert rc == 2, node.describe()
    assert node.log_lines("[worker 0] pjserve serve: ") and \
        node.log_lines("lottery"), node.describe()
    assert node.log_lines("exited with status 2 before it served: its command line was "
                          "refused")


def test_node_accepts_every_serve_flag(pjserve_bin, tmp_path):
    """Every flag `pjserve serve --help` lists is one the node knows (and
    passes on): a flag added to serve must be sorted in cmd_node.c."""
    text = subprocess.run([str(pjserve_bin), "serve", "--help"], capture_output=True,
                          text=True, timeout=60).stdout
    flags = sorted(set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", text, re.M)) - {"--help"})
    assert len(flags) > 40, text
    unknown = []
    for flag in flags:
        if flag == "--node-status-file":
            continue  # the node's own business
        r = subprocess.run([str(pjserve_bin), "node", "--model-repository",
                            str(tmp_path / "missing"), flag, "1"],
                           capture_output=True, text=True, timeout=60)
        if "unknown option" in r.stderr:
            unknown.append(flag)
    assert not unknown, f"serve flags the node does not know: {unknown}"


def test_help_answers(pjserve_bin):
    r = subprocess.run([str(pjserve_bin), "node", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for needle in ("--workers N", "--devices auto|LIST", "CUDA_VISIBLE_DEVICES",
                   "--max-restarts N", "GET /v2/pjserve/node", "[worker N]", "exits 0"):
        assert needle in r.stdout, needle
