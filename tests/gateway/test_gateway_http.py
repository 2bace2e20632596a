"""`pjserve gateway` over HTTP/REST and metrics: two real `pjserve serve`
workers behind one gateway, driven with tritonclient.http and raw requests.

Checked: inference through the gateway equals direct inference on a worker
and the JAX reference (binary and JSON tensors); round-robin spreads a
model's requests over the workers (each worker's own statistics); requests
of one sequence_id stay on one worker; an unknown model gets Triton's words
with 404; the health bodies; metadata, config and statistics (merged over
the workers); the repository index lists each model once; loads and unloads
reach every worker (a refusal every worker gives is answered in their
words, a worker that cannot take the change is named);
admin calls need the gateway's own token and reach the workers with theirs;
/metrics carries every worker's samples under a worker label (each family's
TYPE once) and the gateway's own series; the node status is 404 in a
standalone gateway; CUDA shared memory is answered as serve does; a worker
killed with SIGKILL under load from 8 clients fails only requests in flight
on it (503), the other answers every client throughout, and with none left
readiness is 503 and requests are 503.
"""

import os
import re
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gateway_util import finish_cluster, wait_for
from protocol_util import (http_infer_case, http_json, http_request, parse_metrics, run_threads,
                           scrape)

UNKNOWN = "Request for unknown model: 'nope' is not found"


def client_for(p):
    return httpclient.InferenceServerClient(p.http_url, network_timeout=60,
                                            connection_timeout=60)


def inference_count(w, model: str) -> int:
    status, doc, _ = http_json(w.http_url, "GET", f"/v2/models/{model}/stats")
    assert status == 200, doc
    return doc["model_stats"][0]["inference_count"]


def counts(cluster, model: str):
    return [inference_count(w, model) for w in cluster.workers]


def all_workers_ready(cluster):
    """Waits until the gateway routes to every worker (its readiness needs
    only one)."""
    def ready():
        samples, _ = parse_metrics(scrape(cluster.gateway.metrics_url))
        return all(samples.get(("pjserve_gateway_worker_ready", frozenset({("worker", str(i))})))
                   == 1 for i in range(len(cluster.workers)))
    wait_for(ready, 30, "the gateway did not find every worker ready", cluster.describe)


def infer_body(case, sequence_id=None) -> dict:
    """A JSON-tensor inference request for case."""
    doc = {"inputs": [{"name": spec.name, "shape": list(case.inputs[spec.name].shape),
                       "datatype": "FP32" if case.inputs[spec.name].dtype == np.float32
                       else str(case.inputs[spec.name].dtype).upper(),
                       "data": case.inputs[spec.name].flatten().tolist()}
                      for spec in case.input_specs()]}
    if sequence_id is not None:
        doc["parameters"] = {"sequence_id": sequence_id}
    return doc


def test_infer_spread_documents_health_and_metrics(cluster_factory, cases):
    c = cluster_factory()
    all_workers_ready(c)
    g = c.gateway
    gw = client_for(g)
    direct = client_for(c.workers[0])
    try:
        assert gw.is_server_live() and gw.is_server_ready()
        assert http_json(g.http_url, "GET", "/v2/health/live")[:2] == (200, {"live": True})
        assert http_json(g.http_url, "GET", "/v2/health/ready")[:2] == (200, {"ready": True})

        # The same answers as a worker's, and the reference's.
        for model, n in (("mlp", 1), ("mlp", 4), ("two_io", 3)):
            case = cases.get(model, n)
            for binary in (True, False):
                got, r = http_infer_case(gw, case, binary_in=binary, binary_out=binary)
                want, _ = http_infer_case(direct, case, binary_in=binary, binary_out=binary)
                case.check(got, f"through the gateway (binary={binary})")
                for name in want:
                    np.testing.assert_array_equal(got[name], want[name])
                assert r.get_response()["model_name"] == model

        # Round robin: both workers take a share of mlp's requests.
        before = counts(c, "mlp")
        case = cases.get("mlp", 1)
        for _ in range(8):
            http_infer_case(gw, case)
        delta = [a - b for a, b in zip(counts(c, "mlp"), before)]
        assert sum(delta) == 8 and min(delta) >= 2, f"spread over the workers: {delta}"

        # One sequence stays on one worker (REST parameters.sequence_id).
        before = counts(c, "mlp")
        for _ in range(6):
            status, doc, _ = http_json(g.http_url, "POST", "/v2/models/mlp/infer",
                                       infer_body(case, sequence_id=41))
            assert status == 200, doc
        delta = sorted(a - b for a, b in zip(counts(c, "mlp"), before))
        assert delta == [0, 6], f"a sequence's requests went to {delta}"

        # Statistics through the gateway are the workers' summed.
        status, doc, _ = http_json(g.http_url, "GET", "/v2/models/mlp/stats")
        assert status == 200
        assert doc["model_stats"][0]["inference_count"] == sum(counts(c, "mlp"))
        status, doc, _ = http_json(g.http_url, "GET", "/v2/models/stats")
        by_name = {s["name"]: s for s in doc["model_stats"]}
        assert sorted(by_name) == ["mlp", "two_io"]
        assert by_name["mlp"]["inference_count"] == sum(counts(c, "mlp"))
        assert by_name["two_io"]["inference_count"] == sum(counts(c, "two_io"))

        # Unknown model: Triton's words, 404, for inference and metadata.
        status, doc, _ = http_json(g.http_url, "POST", "/v2/models/nope/infer",
                                   {"inputs": []})
        assert status == 404 and doc["error"].startswith(UNKNOWN), doc
        with pytest.raises(InferenceServerException, match=re.escape(UNKNOWN)):
            gw.get_model_metadata("nope")

        # Documents relayed as the worker writes them.
        assert gw.get_server_metadata() == direct.get_server_metadata()
        assert gw.get_model_metadata("two_io") == direct.get_model_metadata("two_io")
        assert gw.get_model_config("mlp") == direct.get_model_config("mlp")
        assert gw.is_model_ready("mlp") and not gw.is_model_ready("nope")
        index = gw.get_model_repository_index()
        assert sorted(e["name"] for e in index) == ["mlp", "two_io"]
        assert all(e["state"] == "READY" for e in index)

        # Served by the gateway itself.
        status, doc, _ = http_json(g.http_url, "GET", "/v2/pjserve/node")
        assert status == 404 and "not under `pjserve node`" in doc["error"]
        status, doc, _ = http_json(g.http_url, "GET", "/v2/cudasharedmemory/status")
        assert (status, doc) == (200, [])
        status, doc, _ = http_json(g.http_url, "GET", "/v2/nowhere")
        assert status == 404 and "no such endpoint" in doc["error"]

        # Metrics: every worker's samples under its label (each family's TYPE
        # once), then the gateway's own series for every worker.
        text = scrape(g.metrics_url)
        types = re.findall(r"^# TYPE (\S+)", text, re.M)
        assert len(types) == len(set(types)), "a TYPE line repeated"
        samples, _ = parse_metrics(text)
        per_worker = {dict(labels)["worker"]: value
                      for (name, labels), value in samples.items()
                      if name == "nv_inference_count" and dict(labels).get("model") == "mlp"}
        assert per_worker == {"0": counts(c, "mlp")[0], "1": counts(c, "mlp")[1]}, per_worker
        for i in ("0", "1"):
            assert samples[("pjserve_gateway_worker_ready", frozenset({("worker", i)}))] == 1
            assert samples[("pjserve_gateway_forwarded_total", frozenset({("worker", i)}))] > 0
            assert samples[("pjserve_gateway_worker_metrics_scraped",
                            frozenset({("worker", i)}))] == 1
    finally:
        gw.close()
        direct.close()
    finish_cluster(c)


def write_token(path, token: str):
    path.write_text(token + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_load_unload_fan_out_with_tokens(cluster_factory, tmp_path):
    client_token = write_token(tmp_path / "client.token", "gateway-admin-token-0123456789")
    worker_token = write_token(tmp_path / "worker.token", "worker-admin-token-0123456789")
    c = cluster_factory(worker_args=["--admin-token-file", worker_token],
                        gateway_args=["--admin-token-file", client_token,
                                      "--worker-token-file", worker_token])
    g = c.gateway
    admin = {"Authorization": "Bearer gateway-admin-token-0123456789"}

    def post(path, headers=None):
        status, _, body = http_request(g.http_url, "POST", path, b"", headers or {})
        return status, body

    # The client's rights are the gateway's: no token, the worker's, a wrong one.
    status, _ = post("/v2/repository/models/mlp/unload")
    assert status == 401
    status, _ = post("/v2/repository/models/mlp/unload",
                     {"Authorization": "Bearer worker-admin-token-0123456789"})
    assert status == 403

    status, body = post("/v2/repository/models/mlp/unload", admin)
    assert status == 200, body
    for w in c.workers:
        assert http_request(w.http_url, "GET", "/v2/models/mlp/ready")[0] != 200

    # Refused as a worker refuses it (not loaded), or as unknown once the
    # gateway's probes no longer see it ready anywhere.
    status, doc, _ = http_json(g.http_url, "POST", "/v2/models/mlp/infer", {"inputs": []})
    assert (status == 503 and "is not loaded" in doc["error"]) or \
        (status == 404 and doc["error"].startswith(
            "Request for unknown model: 'mlp' is not found")), (status, doc)

    status, body = post("/v2/repository/models/mlp/load", admin)
    assert status == 200, body
    for w in c.workers:
        assert http_request(w.http_url, "GET", "/v2/models/mlp/ready")[0] == 200
    wait_for(lambda: http_request(g.http_url, "GET", "/v2/models/mlp/ready")[0] == 200, 10,
             "the gateway did not see mlp loaded again", c.describe)

    # A load every worker refuses alike: the workers' own answer.
    status, body = post("/v2/repository/models/nope/load", admin)
    direct = http_request(c.workers[0].http_url, "POST", "/v2/repository/models/nope/load", b"",
                          {"Authorization": "Bearer worker-admin-token-0123456789"})
    assert status >= 400 and (status, body) == (direct[0], direct[2])

    # A worker that cannot take a change: the error names it.
    c.workers[1].kill()
    status, body = post("/v2/repository/models/two_io/unload", admin)
    assert status == 503, body
    assert re.search(r"worker 1 \(127\.0\.0\.1:%d\) did not answer: .*\(the other 1 worker "
                     r"succeeded\)" % c.workers[1].http_port, body.decode()), body
    assert http_request(c.workers[0].http_url, "GET", "/v2/models/two_io/ready")[0] != 200
    finish_cluster(c, expected_errors=[r"nope"])


def test_worker_killed_under_load_then_none_left(cluster_factory, cases):
    c = cluster_factory()
    all_workers_ready(c)
    g = c.gateway
    gw = client_for(g)
    case = cases.get("mlp", 2)
    stop = threading.Event()
    killed_at = []

    def client_loop(i):
        """(failures, successes after the kill) of one client."""
        cl = client_for(g)
        failures, after = [], 0
        try:
            while not stop.is_set():
                try:
                    got, _ = http_infer_case(cl, case)
                    case.check(got, f"client {i} while a worker is killed")
                    after += bool(killed_at)
                except InferenceServerException as e:
                    failures.append(e)
        finally:
            cl.close()
        return failures, after

    try:
        results = {}

        def run():
            results["r"] = run_threads(client_loop, 8, 120)

        runner = threading.Thread(target=run)
        runner.start()
        time.sleep(1)
        c.workers[1].kill()
        killed_at.append(time.monotonic())
        time.sleep(3)
        stop.set()
        runner.join()
        outcomes, errors = results["r"]
        assert not errors, errors
        failures = [e for f, _ in outcomes for e in f]
        # Only requests in flight on the killed worker may fail, with 503.
        assert all(e.status() == "503" for e in failures), failures
        assert len(failures) <= 8, f"{len(failures)} requests failed: {failures[:3]}"
        assert all(after > 0 for _, after in outcomes), "a client got no answer after the kill"
        assert http_json(g.http_url, "GET", "/v2/health/ready")[:2] == (200, {"ready": True})
        index = gw.get_model_repository_index()
        assert sorted(e["name"] for e in index) == ["mlp", "two_io"]

        c.workers[0].kill()
        wait_for(lambda: http_json(g.http_url, "GET", "/v2/health/ready")[:2] ==
                 (400, {"ready": False}), 15, "readiness did not turn 400", c.describe)
        status, doc, _ = http_json(g.http_url, "POST", "/v2/models/mlp/infer", infer_body(case))
        assert status == 503, doc
        assert http_json(g.http_url, "GET", "/v2/health/live")[:2] == (200, {"live": True})
    finally:
        gw.close()
    finish_cluster(c)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_status(s: socket.socket) -> int:
    """The status of one HTTP/1.1 reply on s, its body read to the end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed after {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split()[1])


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the gateway closes s (EOF or reset) within `seconds`."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_client_limits_hold_on_the_relay_loop(cluster_factory, cases):
    """The REST port runs on the thread that relays its requests; the
    front end's limits still act on it: the header deadline and the idle
    timeout (a watchdog on another thread cuts the connection, which must
    wake the loop), the per-address cap, a body refused early (413) is read
    and dropped before its reply while relays go on, and a full table makes
    room for a new client at once."""
    c = cluster_factory(n_workers=1, names=("mlp",), gateway_args=[
        "--http-header-timeout-s", "2", "--http-idle-timeout-s", "2",
        "--http-max-connections-per-ip", "4", "--max-request-bytes", "1M",
        "--http-max-connections", "24"])
    g = c.gateway
    case = cases.get("mlp", 1)
    port = g.http_port
    slow = connect(port)
    slow.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: a")
    kept = connect(port)
    kept.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_status(kept) == 200
    t0 = time.monotonic()
    try:
        for _ in range(5):  # one byte every 0.25 s: never idle, headers never done
            time.sleep(0.25)
            slow.sendall(b"a")
            started = time.monotonic()
            status, doc, _ = http_json(g.http_url, "POST", "/v2/models/mlp/infer",
                                       infer_body(case))
            assert status == 200 and time.monotonic() - started < 1.0, doc
    except (BrokenPipeError, ConnectionResetError):
        pass  # cut already
    assert closed_within(slow, 3) and time.monotonic() - t0 < 2 + 1.5
    assert closed_within(kept, 3) and time.monotonic() - t0 < 2 + 1.5
    held = [connect(port, "127.0.0.3") for _ in range(4)]
    extra = connect(port, "127.0.0.3")
    assert closed_within(extra, 2), "a fifth connection from one address was kept"
    big = b"{" + b" " * (2 << 20) + b"}"
    held[0].sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(big) + big)
    assert read_status(held[0]) == 413
    held[0].sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_status(held[0]) == 200  # every byte was read: still in step
    for s in held + [extra, slow, kept]:
        s.close()
    # 40 connections that send nothing, into a table of 24: the ones
    # waiting longest are evicted to admit the rest, then a new client.
    crowd = [connect(port, f"127.0.0.{10 + i % 10}") for i in range(40)]
    started = time.monotonic()
    status, doc, _ = http_json(g.http_url, "GET", "/v2/health/ready")
    assert status == 200 and time.monotonic() - started < 1.0, \
        f"{status} {doc} after {time.monotonic() - started:.1f} s"
    for s in crowd:
        s.close()
    assert "did not send headers within --http-header-timeout-s" in g.stderr_text()
    finish_cluster(c)
