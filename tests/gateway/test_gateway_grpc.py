"""`pjserve gateway` over gRPC: two real `pjserve serve` workers behind one
gateway, driven with tritonclient.

Checked: answers equal the JAX reference (unary and streaming); round-robin
spreads a model's requests over the workers; the repository index and the
statistics are merged; an unknown model gets Triton's words; loads and
unloads reach every worker; the client's deadline reaches the worker; admin
calls need the gateway's own token and are forwarded with the workers';
lpt_packing keeps each model on one worker; a worker killed with SIGKILL
under load from 8 clients costs only requests in flight on it (UNAVAILABLE),
the other serves throughout, and the restarted worker gets traffic again; a
SIGSTOPped worker is found by the probes and its traffic moves.
"""

import os
import queue
import shutil
import subprocess
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import common
from bundle_code import tensor_yaml, write_meta
from gateway_util import (Cluster, GatewayProcess, finish_cluster, restart_same_ports,
                          wait_for)
from protocol_util import (ServerProcess, grpc_code, grpc_infer_case, grpc_inputs,
                           start_or_fail)

MODELS = ("mlp", "two_io")


def worker_count(w, model: str) -> int:
    c = grpcclient.InferenceServerClient(w.grpc_url)
    try:
        return c.get_inference_statistics(model).model_stats[0].inference_count
    finally:
        c.close()


def check_case(got: dict, case):
    for name, want in case.expected.items():
        common.assert_matches(case.model, name, got[name], want, "through the gateway")


def test_infer_stream_index_statistics_and_spread(cluster_factory, cases):
    c = cluster_factory()
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    for model in MODELS:
        assert client.is_model_ready(model)
        assert client.get_model_metadata(model).name == model
        assert client.get_model_config(model).config.name == model
    for n in (1, 4):
        for model in MODELS:
            case = cases.get(model, n)
            got, _ = grpc_infer_case(client, case)
            check_case(got, case)
    # Round robin: one client's 20 sequential requests split 10 / 10.
    before = [worker_count(w, "mlp") for w in c.workers]
    case = cases.get("mlp", 1)
    for _ in range(20):
        grpc_infer_case(client, case)
    spread = [worker_count(w, "mlp") - b for w, b in zip(c.workers, before)]
    assert spread == [10, 10], spread
    # Merged statistics: the gateway's count is the workers' sum.
    total = client.get_inference_statistics("mlp").model_stats[0].inference_count
    assert total == sum(worker_count(w, "mlp") for w in c.workers)
    # Merged index: each model once, ready.
    index = client.get_model_repository_index().models
    assert sorted((m.name, m.state) for m in index) == [("mlp", "READY"), ("two_io", "READY")]
    # A stream: every answer correct, in order.
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    stream_cases = [cases.get("two_io", 1, seed=s) for s in range(5)]
    for k, sc in enumerate(stream_cases):
        client.async_stream_infer("two_io", grpc_inputs(sc), request_id=str(k))
    for k, sc in enumerate(stream_cases):
        result, error = answers.get(timeout=30)
        assert error is None, error
        assert result.get_response().id == str(k)
        check_case({n: result.as_numpy(n) for n in sc.expected}, sc)
    client.stop_stream()
    # Unknown model: Triton's words, NOT_FOUND.
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", grpc_inputs(case))
    assert grpc_code(e.value) == "NOT_FOUND"
    assert "Request for unknown model: 'no_such_model' is not found" in e.value.message()
    client.close()
    finish_cluster(c)


def test_load_unload_reach_every_worker(cluster_factory, cases):
    c = cluster_factory()
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    client.unload_model("two_io")
    for w in c.workers:
        wc = grpcclient.InferenceServerClient(w.grpc_url)
        assert not wc.is_model_ready("two_io"), w.describe()
        wc.close()
    # Through the gateway, as from a worker: an unloaded model is UNAVAILABLE.
    with pytest.raises(InferenceServerException) as e:
        client.infer("two_io", grpc_inputs(cases.get("two_io", 1)))
    assert grpc_code(e.value) == "UNAVAILABLE", e.value.message()
    assert "two_io" in e.value.message()
    client.load_model("two_io")
    for w in c.workers:
        wc = grpcclient.InferenceServerClient(w.grpc_url)
        assert wc.is_model_ready("two_io"), w.describe()
        wc.close()
    case = cases.get("two_io", 1)
    wait_for(lambda: client.is_model_ready("two_io"), 10, "two_io not ready again", c.describe)
    got, _ = grpc_infer_case(client, case)
    check_case(got, case)
    client.close()
    finish_cluster(c)


DEADLINE_LEFT_C = """\
#include <pjserve/model.h>

/* x i32 [1] (unused) -> left i64 [1]: nanoseconds left before the deadline */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)in, (void)n_in, (void)n_out;
    int64_t *left = pjserve_alloc(ctx, sizeof *left);
    if (left == NULL)
        return PJSERVE_RESOURCE_EXHAUSTED;
    *left = pjserve_remaining_ns(ctx);
    out[0].data = left;
    out[0].nbytes = sizeof *left;
    return PJSERVE_OK;
}
"""


def test_deadline_reaches_the_worker(cluster_factory, pjserve_bin):
    """A meta bundle on the workers reports the time left before its
    request's deadline: through the gateway, the client's timeout."""
    def prepare(repo):
        write_meta(repo, "deadline_left", [], tensor_yaml("x", "int32", [1]),
                   tensor_yaml("left", "int64", [1]), DEADLINE_LEFT_C, pjserve_bin)
    c = cluster_factory(prepare=prepare)
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    x = grpcclient.InferInput("x", [1], "INT32")
    x.set_data_from_numpy(np.zeros(1, np.int32))
    for timeout_s in (30.0, 5.0):
        left = client.infer("deadline_left", [x], client_timeout=timeout_s).as_numpy("left")[0]
        # gRPC carries the time left rounded up, at each hop.
        assert 0 < left <= (timeout_s + 0.5) * 1e9, (timeout_s, left)
        assert left > (timeout_s - 2) * 1e9, (timeout_s, left)
    # Without a timeout the worker sees none.
    left = client.infer("deadline_left", [x]).as_numpy("left")[0]
    assert left == np.iinfo(np.int64).max
    client.close()
    finish_cluster(c)


def test_admin_calls_need_the_gateways_token(cluster_factory, tmp_path, cases):
    worker_token = tmp_path / "worker-token"
    worker_token.write_text("worker-secret-0123456789abcdef\n")
    client_token = tmp_path / "client-token"
    client_token.write_text("client-secret-0123456789abcdef\n")
    for f in (worker_token, client_token):
        os.chmod(f, 0o600)
    c = cluster_factory(worker_args=["--admin-token-file", str(worker_token)],
                        gateway_args=["--admin-token-file", str(client_token),
                                      "--worker-token-file", str(worker_token)])
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("two_io")
    assert grpc_code(e.value) == "UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("two_io",
                            headers={"authorization": "Bearer worker-secret-0123456789abcdef"})
    assert grpc_code(e.value) == "PERMISSION_DENIED"
    client.unload_model("two_io", headers={"authorization": "Bearer client-secret-0123456789abcdef"})
    for w in c.workers:
        wc = grpcclient.InferenceServerClient(w.grpc_url)
        assert not wc.is_model_ready("two_io")
        wc.close()
    # Inference needs no token (none configured for it).
    got, _ = grpc_infer_case(client, cases.get("mlp", 1))
    check_case(got, cases.get("mlp", 1))
    client.close()
    finish_cluster(c)


def test_lpt_packing_keeps_each_model_on_one_worker(cluster_factory, cases):
    c = cluster_factory(gateway_args=["--routing", "lpt_packing", "--lpt-devices-per-model", "1"])
    wait_for(lambda: "lpt_packing placed" in c.gateway.stderr_text(), 20,
             "the gateway did not place the models", c.describe)
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    before = {m: [worker_count(w, m) for w in c.workers] for m in MODELS}
    for _ in range(10):
        for m in MODELS:
            grpc_infer_case(client, cases.get(m, 1))
    where = {}
    for m in MODELS:
        grown = [worker_count(w, m) - b for w, b in zip(c.workers, before[m])]
        assert sorted(grown) == [0, 10], (m, grown)
        where[m] = grown.index(10)
    assert where["mlp"] != where["two_io"], where
    client.close()
    finish_cluster(c)


def load_from_8_clients(c, case, stop, outcome):
    def run(i):
        cl = grpcclient.InferenceServerClient(c.gateway.grpc_url)
        while not stop.is_set():
            try:
                got, _ = grpc_infer_case(cl, case, client_timeout=20)
                for name, want in case.expected.items():
                    common.assert_matches(case.model, name, got[name], want)
                with outcome["lock"]:
                    outcome["ok"] += 1
            except InferenceServerException as e:
                with outcome["lock"]:
                    outcome["errors"].append((grpc_code(e), e.message()))
        cl.close()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    return threads


def test_worker_killed_under_load(cluster_factory, cases):
    c = cluster_factory()
    case = cases.get("mlp", 1)
    stop = threading.Event()
    outcome = {"ok": 0, "errors": [], "lock": threading.Lock()}
    threads = load_from_8_clients(c, case, stop, outcome)
    time.sleep(1.5)
    victim = c.workers[1]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    ok_at_kill = outcome["ok"]
    time.sleep(3)
    ok_after = outcome["ok"] - ok_at_kill
    # Restarted on the same ports (as the node does): it gets traffic again.
    restart_same_ports(victim)
    wait_for(lambda: "worker 1 (gRPC" in c.gateway.stderr_text().split("is unhealthy")[-1], 15,
             "the restarted worker was not taken back", c.describe)
    served_before = worker_count(victim, "mlp")
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(30)
    assert ok_after > 0, "the other worker did not serve while one was down"
    assert worker_count(victim, "mlp") > served_before, "no traffic reached the restarted worker"
    # Only requests in flight on the killed worker may fail, as UNAVAILABLE.
    assert len(outcome["errors"]) <= 8, outcome["errors"][:10]
    assert all(code == "UNAVAILABLE" for code, _ in outcome["errors"]), outcome["errors"][:10]
    assert "worker 1 (gRPC" in c.gateway.stderr_text() and "is unhealthy" in \
        c.gateway.stderr_text()
    finish_cluster(c)


def test_stopped_worker_is_found_and_avoided(cluster_factory, cases):
    c = cluster_factory()
    case = cases.get("mlp", 1)
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    victim = c.workers[0]
    os.kill(victim.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "worker 0 (gRPC" in c.gateway.stderr_text() and
                 "is unhealthy" in c.gateway.stderr_text(), 15,
                 "the probes did not find the stopped worker", c.describe)
        before = worker_count(c.workers[1], "mlp")
        for _ in range(10):
            got, _ = grpc_infer_case(client, case, client_timeout=10)
            check_case(got, case)
        assert worker_count(c.workers[1], "mlp") - before == 10
    finally:
        os.kill(victim.proc.pid, signal.SIGCONT)
    client.close()
    finish_cluster(c)


def test_workers_from_dns(pjserve_bin, plugin_path, exported, cache_dir, tmp_path, cases):
    """--worker-dns: every address the name resolves to (here localhost) is a
    worker at the given ports, taken when it answers."""
    repo = tmp_path / "repo"
    shutil.copytree(exported["mlp"].path, repo / "mlp")
    w = start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "w",
                                    [], "worker0"))
    g = start_or_fail(GatewayProcess(pjserve_bin, [], tmp_path / "gw", [
        "--worker-dns", "localhost", "--worker-grpc-port", str(w.grpc_port),
        "--worker-http-port", str(w.http_port), "--worker-metrics-port", str(w.metrics_port)]))
    c = Cluster([w], g)
    assert "joined from localhost" in g.stderr_text()
    client = grpcclient.InferenceServerClient(g.grpc_url)
    case = cases.get("mlp", 2)
    got, _ = grpc_infer_case(client, case)
    check_case(got, case)
    client.close()
    finish_cluster(c)


def test_gateway_applies_the_client_limits(cluster_factory, cases):
    """The gateway takes serve's endpoint flags and enforces them itself: a
    request over its --max-request-bytes is refused there, a smaller one
    answered."""
    c = cluster_factory(gateway_args=["--max-request-bytes", "400",
                                      "--grpc-max-concurrent-streams", "8"])
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    small = cases.get("mlp", 1)
    got, _ = grpc_infer_case(client, small)
    check_case(got, small)
    with pytest.raises(InferenceServerException) as e:
        grpc_infer_case(client, cases.get("mlp", 8))
    assert grpc_code(e.value) == "RESOURCE_EXHAUSTED", e.value.message()
    assert "400" in e.value.message()
    assert "8 streams per connection" in c.gateway.stderr_text()
    client.close()
    finish_cluster(c)


@pytest.mark.parametrize("flag,value,message", [
    ("--http-max-connections", "0", "--http-max-connections 0: expected an integer in 1..1000000"),
    ("--max-request-bytes", "3Gi", "--max-request-bytes 3Gi: expected 1 to 2147483648 bytes"),
    ("--grpc-tls-key", "k.pem", "--grpc-tls-cert and --grpc-tls-key go together"),
])
def test_gateway_refuses_bad_endpoint_flags(pjserve_bin, flag, value, message):
    r = subprocess.run([str(pjserve_bin), "gateway", "--worker", "127.0.0.1", flag, value],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert message in r.stderr, r.stderr
