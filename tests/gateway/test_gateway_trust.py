"""What a client must not be able to do through `pjserve gateway` (two real
`pjserve serve` workers behind it), and what a worker's refusal means there.

Checked:
- paths with "." or ".." segments or empty segments, spelled out or
  percent-encoded, are refused with 400 on the gateway's REST port and on a
  worker's, before any route or access rule reads them: the admin call
  hidden behind /v2/models/%2e%2e/ unloads nothing, /v2/models/../logging
  reads no settings;
- a header the gateway relays that holds a bare CR is refused, not passed on;
- a model name that reads like a transport failure ("GOAWAY", "Socket
  closed", ...) opens no circuit breaker: the workers' NOT_FOUND answers are
  answers, and every legitimate request over both protocols is served
  meanwhile;
- a worker that is shutting down refuses new requests before running them,
  and the gateway sends those requests to the other worker instead of
  passing the refusal on;
- a worker (here a small gRPC server of the test's) whose repository index
  lists 60,000 models does not slow the routing of the healthy worker's
  requests (p99 under 200 ms), and one listing more than 100,000 is not
  taken at all.
"""

import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import small_repository
from gateway_util import Cluster, GatewayProcess, finish_cluster, wait_for
from pjserve_export import hooks as H
from pjserve_export.triton_examples import export_triton_example
from protocol_util import (ServerProcess, free_ports, grpc_code, grpc_infer_case, http_json,
                           http_request, parse_metrics, scrape, start_or_fail)

HERE = Path(__file__).resolve().parent
TOKEN = "client-secret-0123456789abcdef"

# Paths no reader may take two ways: (method, path as sent on the wire).
UNCLEAN_PATHS = [
    ("POST", "/v2/models/%2e%2e/repository/models/mlp/unload"),
    ("POST", "/v2/models/%2E%2E/repository/models/mlp/unload"),
    ("POST", "/v2/models/../repository/models/mlp/unload"),
    ("GET", "/v2/models/../logging"),
    ("GET", "/v2/models/%2e%2e/logging"),
    ("GET", "/v2/models/mlp/./ready"),
    ("GET", "/v2/models/mlp/%2e/ready"),
    ("GET", "/v2//models/mlp/ready"),
    ("GET", "/v2/models/mlp/ready/"),
    ("GET", "/v2/models/%2F/ready"),
]


def raw_http(host_port: str, request: bytes, timeout: float = 10) -> bytes:
    """Sends request bytes as they are and returns the whole answer (the
    connection is closed by the request's Connection: close)."""
    host, port = host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def raw_request(method: str, path: str, headers=(), body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: localhost", b"Connection: close",
             f"Content-Length: {len(body)}".encode()]
    lines += list(headers)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def infer_both_protocols(cluster, case, rounds):
    """Failures of `rounds` gRPC and `rounds` HTTP requests for case through
    the gateway, sent back to back."""
    failures = []
    g = grpcclient.InferenceServerClient(cluster.gateway.grpc_url)
    try:
        for _ in range(rounds):
            try:
                got, _ = grpc_infer_case(g, case)
                for name, want in case.expected.items():
                    np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)
            except (InferenceServerException, AssertionError) as e:
                failures.append(f"gRPC: {e}")
            status, doc, _ = http_json(cluster.gateway.http_url, "POST",
                                       f"/v2/models/{case.model}/infer", {
                "inputs": [{"name": s.name, "shape": list(case.inputs[s.name].shape),
                            "datatype": "FP32" if case.inputs[s.name].dtype == np.float32
                            else "INT32", "data": case.inputs[s.name].ravel().tolist()}
                           for s in case.input_specs()]})
            if status != 200:
                failures.append(f"HTTP {status}: {doc}")
    finally:
        g.close()
    return failures


def mlp_ready_everywhere(cluster) -> bool:
    for w in cluster.workers:
        c = grpcclient.InferenceServerClient(w.grpc_url)
        try:
            if not c.is_model_ready("mlp"):
                return False
        finally:
            c.close()
    return True


@pytest.mark.parametrize("method,path", UNCLEAN_PATHS)
def test_dot_and_empty_segments_are_refused_everywhere(cluster_factory, tmp_path, method, path):
    token_file = tmp_path / "client-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    # An inference token the caller holds; the admin token it does not.
    c = cluster_factory(gateway_args=["--infer-token-file", str(token_file)])
    auth = f"Authorization: Bearer {TOKEN}".encode()
    for front in [c.gateway] + c.workers:
        answer = raw_http(front.http_url, raw_request(method, path, [auth]))
        assert status_of(answer) == 400, (front.name, path, answer[:300])
        assert b"segment" in answer, answer[:300]
    assert mlp_ready_everywhere(c), "a refused path unloaded mlp"
    # The same credential on a clean inference path still works.
    status, doc, _ = http_request(c.gateway.http_url, "GET", "/v2/models/mlp/ready",
                                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, doc
    finish_cluster(c)


def test_relayed_header_with_a_bare_cr_is_refused(cluster_factory, cases):
    c = cluster_factory()
    case = cases.get("mlp", 1)
    body = (b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":['
            + b",".join(str(float(v)).encode() for v in case.inputs["x"].ravel()) + b"]}]}")
    ok = raw_http(c.gateway.http_url, raw_request(
        "POST", "/v2/models/mlp/infer", [b"Content-Type: application/json"], body))
    assert status_of(ok) == 200, ok[:300]
    answer = raw_http(c.gateway.http_url, raw_request(
        "POST", "/v2/models/mlp/infer", [b"Content-Type: application/json\rX-Injected: 1"], body))
    if status_of(answer) != 400:
        # libmicrohttpd may refuse the header itself; it must never reach a worker as two.
        assert status_of(answer) != 200, answer[:300]
    else:
        assert b"control character" in answer, answer[:300]
    finish_cluster(c)


def breaker_open_count(cluster) -> int:
    samples, _ = parse_metrics(scrape(cluster.gateway.metrics_url))
    return sum(1 for (name, _labels), v in samples.items()
               if name == "pjserve_gateway_worker_breaker_open" and v == 1)


def test_model_names_do_not_open_circuit_breakers(cluster_factory, cases):
    c = cluster_factory()
    case = cases.get("mlp", 1)
    names = ["GOAWAY", "Socket closed", "Connection reset", "Broken pipe", "Stream removed",
             "keepalive", "Transport closed", "failed to connect"]
    stop = threading.Event()
    attacks = {"sent": 0, "not_found": 0}

    def attack():
        client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
        inputs = grpcclient.InferInput("x", [1, 16], "FP32")
        inputs.set_data_from_numpy(case.inputs["x"])
        try:
            while not stop.is_set():
                for name in names:
                    try:
                        client.infer(name, [inputs])
                    except InferenceServerException as e:
                        attacks["sent"] += 1
                        attacks["not_found"] += grpc_code(e) == "NOT_FOUND"
        finally:
            client.close()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    time.sleep(0.5)
    try:
        failures = infer_both_protocols(c, case, 100)
        total = 200
    finally:
        stop.set()
        attacker.join(30)
    assert attacks["sent"] > 50 and attacks["not_found"] == attacks["sent"], attacks
    assert not failures, f"{len(failures)} of {total} legitimate requests failed: {failures[:3]}"
    assert breaker_open_count(c) == 0
    finish_cluster(c)


def test_a_draining_workers_refusals_go_to_the_other_worker(cluster_factory, pjserve_bin,
                                                            cases):
    build = H.hooks_builder(pjserve_bin)
    c = cluster_factory(names=("mlp",),
                        prepare=lambda repo: export_triton_example("repeat_int32", repo,
                                                                   build=build))
    wait_for(lambda: mlp_ready_everywhere(c), 30, "mlp not ready on both workers", c.describe)
    draining = c.workers[0]
    # A run that keeps worker 0 busy (and so draining, once told to stop) for 6 s.
    got = queue.Queue()
    holder = grpcclient.InferenceServerClient(draining.grpc_url)
    holder.start_stream(callback=lambda result, error: got.put((result, error)))
    inputs = []
    for name, array, datatype in (("IN", np.array([1, 2], np.int32), "INT32"),
                                  ("DELAY", np.array([3000, 3000], np.uint32), "UINT32"),
                                  ("WAIT", np.array([0], np.uint32), "UINT32")):
        t = grpcclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        inputs.append(t)
    holder.async_stream_infer("repeat_int32", inputs, request_id="hold")
    time.sleep(0.3)
    draining.terminate()
    case = cases.get("mlp", 1)
    failures, total = [], 0
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline and draining.alive():
            failures += infer_both_protocols(c, case, 1)
            total += 2
    finally:
        holder.stop_stream(cancel_requests=True)
        holder.close()
    refused_by_worker = sum("shutting down" in f for f in failures)
    assert total > 20, total
    assert refused_by_worker == 0 and not failures, \
        f"{len(failures)} of {total} requests failed while worker 0 drained: {failures[:3]}"
    # the requests worker 0 refused went to worker 1, counted per protocol
    samples, _ = parse_metrics(scrape(c.gateway.metrics_url))
    for protocol in ("grpc", "http"):
        retried = samples.get(("pjserve_gateway_retries_total",
                               frozenset({("protocol", protocol)})))
        assert retried is not None and retried >= 1, (protocol, retried)
    draining.wait_exit(30)
    finish_cluster(c, expected_errors=(r"worker 0",))


class FakeWorker:
    """huge_index_worker.py in a process of its own: a gRPC server that
    answers the gateway's probes with a huge index and nothing else (its
    REST and metrics ports are closed)."""

    def __init__(self, n_models, workdir: Path):
        port_file = workdir / "port"
        self.out = open(workdir / "probes.log", "w+")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "huge_index_worker.py"),
                                      str(n_models), str(port_file)], stdout=self.out)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                "the fake worker did not start"
            time.sleep(0.05)
        self.grpc_url = f"127.0.0.1:{port_file.read_text()}"
        http_port, self.metrics_port = free_ports(2)
        self.http_url = f"127.0.0.1:{http_port}"

    def probes(self) -> int:
        """RepositoryIndex calls answered so far."""
        self.out.flush()
        return (Path(self.out.name).read_text()).count("index")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.out.close()


@pytest.fixture
def huge_index_cluster(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """start(n_models) -> (Cluster of one real worker and one fake, fake)."""
    started, fakes = [], []

    def start(n_models):
        repo = small_repository(exported, tmp_path / "repo", ("mlp",))
        w = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "w0", [],
                          "worker0")
        started.append(w)
        start_or_fail(w)
        fake = FakeWorker(n_models, tmp_path)
        fakes.append(fake)
        g = GatewayProcess(pjserve_bin, [w, fake], tmp_path / "gw")
        started.append(g)
        start_or_fail(g)
        return Cluster([w], g), fake

    yield start
    for p in started:
        p.kill()
    for f in fakes:
        f.stop()


def test_a_huge_worker_index_does_not_stall_routing(huge_index_cluster, cases):
    c, fake = huge_index_cluster(60000)
    wait_for(lambda: fake.probes() >= 3, 60, "the gateway did not probe the fake worker",
             c.describe)
    case = cases.get("mlp", 1)
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    latencies = []
    asked_before = fake.probes()
    # Requests while the gateway probes the fake worker (and merges its
    # index) at least four more times; 60 s is a hang guard, not a bound.
    hang_guard = time.monotonic() + 60
    try:
        while (fake.probes() - asked_before < 4 or len(latencies) < 300) and \
                time.monotonic() < hang_guard:
            t0 = time.monotonic()
            got, _ = grpc_infer_case(client, case)
            latencies.append(time.monotonic() - t0)
            np.testing.assert_allclose(got["y"], case.expected["y"], rtol=1e-5, atol=1e-5)
    finally:
        client.close()
    assert fake.probes() - asked_before >= 4, "the fake worker was not probed meanwhile"
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert p99 < 0.2, f"p99 {p99 * 1e3:.0f} ms with a 60,000-model worker index"
    # Its models are in the table: the index through the gateway (gRPC asks
    # every worker over gRPC) lists them, each once.
    client = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    t0 = time.monotonic()
    index = client.get_model_repository_index().models
    took = time.monotonic() - t0
    client.close()
    assert len(index) == 60001 and len({m.name for m in index}) == 60001, len(index)
    assert took < 5, f"the merged index of 60,001 models took {took:.1f} s"
    finish_cluster(c)


def test_an_index_over_the_bound_is_not_taken(huge_index_cluster):
    c, fake = huge_index_cluster(100001)
    wait_for(lambda: fake.probes() >= 2, 60, "the gateway did not probe the fake worker",
             c.describe)
    time.sleep(0.5)
    assert "more than the 100000 a worker may hold" in c.gateway.stderr_text(), c.describe()
    status, doc, _ = http_json(c.gateway.http_url, "POST", "/v2/repository/index", {})
    assert status == 200 and [m["name"] for m in doc] == ["mlp"], (status, doc)
    finish_cluster(c, expected_errors=(r"more than the 100000",))


def test_a_worker_without_the_model_passes_the_request_on(cluster_factory, cases):
    """The route table lags a worker's changes by up to a probe interval: a
    worker that no longer has a model, or one the table does not yet know
    another worker has, refuses before running anything, and the gateway
    sends the request to a worker that has it."""
    c = cluster_factory()
    wait_for(lambda: all(grpcclient.InferenceServerClient(w.grpc_url).is_model_ready("two_io")
                         for w in c.workers), 30, "two_io not ready on both", c.describe)
    case = cases.get("two_io", 1)
    # Worker 1 drops the model; the table still says both hold it.
    direct = grpcclient.InferenceServerClient(c.workers[1].grpc_url)
    direct.unload_model("two_io")
    failures = infer_both_protocols(c, case, 20)
    assert not failures, f"{len(failures)} of 40 failed after worker 1 unloaded: {failures[:3]}"
    # Neither has it, and the table knows; then worker 1 loads it again.
    grpcclient.InferenceServerClient(c.workers[0].grpc_url).unload_model("two_io")
    time.sleep(1.2)  # two probe rounds: no holder in the table
    direct.load_model("two_io")
    failures = infer_both_protocols(c, case, 20)
    assert not failures, f"{len(failures)} of 40 failed after worker 1 loaded: {failures[:3]}"
    direct.close()
    # A model no worker has is still NOT_FOUND in Triton's words.
    g = grpcclient.InferenceServerClient(c.gateway.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.infer("nope", [])
    assert grpc_code(e.value) == "NOT_FOUND" and "unknown model: 'nope'" in str(e.value)
    g.close()
    finish_cluster(c)
