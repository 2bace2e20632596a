"""`pjserve node --workers 2` and changes fanned out by its gateway.

Readiness: the node reports a worker ready only once its gateway routes to
it, so the moment GET /v2/pjserve/node shows every worker ready (at start,
and again after one was killed with SIGKILL and restarted) the gateway's
own view agrees (pjserve_gateway_worker_ready is 1 for each) and a
repository load fanned out through the gateway succeeds on every worker.

Replay: in explicit mode, a load with a configuration override (gRPC), a
residency pin and an unload (REST) made through the gateway are sent again
to a worker killed and restarted before it is ready: each worker, asked
directly, then serves the same models with the same configuration, and
answers correctly, directly and through the gateway.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_node_changes.py
"""

import json
import os
import signal
import time

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from protocol_util import finish_checked, grpc_infer_case, http_json, parse_metrics, scrape

# Restarts of each worker in the readiness test.
KILL_ROUNDS = 2


def wait_all_ready(node, victim_pid=None, timeout=240):
    """Polls the node's status until every worker is ready (and none runs
    as victim_pid any more); a hang guard, not a timed assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise AssertionError(f"the node exited ({node.proc.returncode})\n{node.describe()}")
        try:
            code, doc, _ = http_json(node.http_url, "GET", "/v2/pjserve/node", timeout=5)
        except OSError:
            code, doc = None, None
        if code == 200 and doc["workers"] and all(
                w["state"] == "ready" and w["pid"] not in (None, victim_pid)
                for w in doc["workers"]):
            return doc
        time.sleep(0.02)
    raise AssertionError(f"the node's workers were not all ready within {timeout} s\n"
                         f"{node.describe()}")


def check_gateway_takes_every_worker(node, doc, what):
    """Right after the node reported every worker ready: the gateway routes
    to each, and a load fanned out through it succeeds everywhere."""
    samples, _ = parse_metrics(scrape(node.metrics_url))
    ready = {dict(labels)["worker"]: v for (name, labels), v in samples.items()
             if name == "pjserve_gateway_worker_ready"}
    assert ready == {str(w["id"]): 1.0 for w in doc["workers"]}, \
        f"{what}: node ready, gateway's view {ready}\n{node.describe()}"
    code, body, raw = http_json(node.http_url, "POST", "/v2/repository/models/two_io/load", {})
    assert code == 200, f"{what}: load through the gateway: {code} {raw[:300]!r}\n" \
                        f"{node.describe()}"


def kill_and_wait_ready(node, doc, i):
    """SIGKILLs worker i (pid from the status `doc`); the status once the node
    reports every worker ready again."""
    victim = doc["workers"][i]["pid"]
    node.known_worker_pids.add(victim)
    os.kill(victim, signal.SIGKILL)
    doc = wait_all_ready(node, victim_pid=victim)
    node.remember_workers()
    return doc


def test_node_ready_means_the_gateway_routes_to_every_worker(node_factory):
    node = node_factory(["--workers", "2"], ready=False)
    doc = wait_all_ready(node)
    check_gateway_takes_every_worker(node, doc, "at start")
    for round_ in range(KILL_ROUNDS):
        for i in range(2):
            doc = kill_and_wait_ready(node, doc, i)
            check_gateway_takes_every_worker(node, doc, f"round {round_}, worker {i} restarted")
            assert doc["workers"][i]["restarts"] == round_ + 1
    finish_checked(node)


def worker_state(w):
    """What one worker serves, asked on its own REST port: {model: state}
    from its index and mlp's max_batch_size."""
    code, index, raw = http_json(w["http"], "POST", "/v2/repository/index", {})
    assert code == 200, raw
    code, config, raw = http_json(w["http"], "GET", "/v2/models/mlp/config")
    assert code == 200, raw
    return {m["name"]: m["state"] for m in index}, config.get("max_batch_size")


def test_changes_through_the_gateway_are_replayed_to_a_restarted_worker(node_factory, cases):
    node = node_factory(["--workers", "2", "--model-control-mode", "explicit"])
    g = grpcclient.InferenceServerClient(node.grpc_url)
    try:
        # gRPC: a load with a configuration override; REST: a pin on the
        # device (without it explicit mode serves nothing), an unload.
        g.load_model("mlp", config=json.dumps({"name": "mlp", "max_batch_size": 4}))
        code, _, raw = http_json(node.http_url, "POST", "/v2/pjserve/models/mlp/residency",
                                 {"residency": "device"})
        assert code == 200, raw
        code, _, raw = http_json(node.http_url, "POST", "/v2/repository/models/two_io/unload", {})
        assert code == 200, raw
        expected = ({"mlp": "READY", "two_io": "UNAVAILABLE"}, 4)
        doc = node.status()
        assert [worker_state(w) for w in doc["workers"]] == [expected, expected]
        case = cases.get("mlp", 4)
        for i in range(2):
            doc = kill_and_wait_ready(node, doc, i)
            # Ready means up to date: each worker, asked directly, serves
            # what the gateway's changes made of it, and answers mlp.
            assert [worker_state(w) for w in doc["workers"]] == [expected, expected], \
                f"after worker {i} restarted\n{node.describe()}"
            for w in doc["workers"]:
                direct = grpcclient.InferenceServerClient(w["grpc"])
                try:
                    got, _ = grpc_infer_case(direct, case)
                    case.check(got, f"worker {w['id']} directly, after worker {i} restarted")
                finally:
                    direct.close()
            for k in range(6):  # round robin over both workers
                got, _ = grpc_infer_case(g, case)
                case.check(got, f"through the gateway #{k}, after worker {i} restarted")
            assert doc["workers"][i]["restarts"] == 1
        assert node.log_lines("sent it again the 3 changes made through the gateway")
    finally:
        g.close()
    finish_checked(node)


def test_only_changes_a_worker_accepted_are_remembered(node_factory):
    """Loads every worker refuses (models that do not exist) are not kept for
    a restarted worker, and of a model's loads and unloads only the last
    accepted one is: the restarted worker gets 3 changes, not 203."""
    node = node_factory(["--workers", "2", "--model-control-mode", "explicit"])
    g = grpcclient.InferenceServerClient(node.grpc_url)
    try:
        g.load_model("mlp")
        code, _, raw = http_json(node.http_url, "POST", "/v2/pjserve/models/mlp/residency",
                                 {"residency": "device"})
        assert code == 200, raw
        for k in range(100):
            code, _, _ = http_json(node.http_url, "POST",
                                   f"/v2/repository/models/junk_{k}/load", {})
            assert code != 200
            try:
                g.load_model(f"junk_grpc_{k}")
                raise AssertionError(f"junk_grpc_{k} loaded")
            except InferenceServerException:
                pass
        for verb in ("load", "unload", "load", "unload"):
            code, _, raw = http_json(node.http_url, "POST",
                                     f"/v2/repository/models/two_io/{verb}", {})
            assert code == 200, raw
    finally:
        g.close()
    doc = node.status()
    kill_and_wait_ready(node, doc, 0)
    assert node.log_lines("sent it again the 3 changes made through the gateway (0 refused)"), \
        node.describe()
    finish_checked(node)
