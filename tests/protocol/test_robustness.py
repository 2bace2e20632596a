"""Clients that misbehave at the transport level (cancelled calls and streams,
half-sent or abandoned HTTP requests, idle connections, chunked and compressed
bodies) and a full request queue. The server must keep answering others."""

import json
import queue
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protocol_util import (grpc_code, grpc_infer_case, grpc_inputs, http_infer_case,
                           http_request, run_threads, serve_only)


def _still_serving(server, cases):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        case = cases.get("two_io", 3)
        got, _ = grpc_infer_case(c, case, client_timeout=30)
        case.check(got, "after misbehaving clients")
    finally:
        c.close()
    h = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    try:
        case = cases.get("mlp", 3)
        got, _ = http_infer_case(h, case)
        case.check(got, "http after misbehaving clients")
    finally:
        h.close()


# ---- gRPC -------------------------------------------------------------------------

def test_grpc_cancelled_calls(server, cases):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        case = cases.get("convnet", 8)
        ctxs = [c.async_infer("convnet", grpc_inputs(case), lambda result, error: None)
                for _ in range(20)]
        for ctx in ctxs:
            ctx.cancel()
    finally:
        c.close()
    _still_serving(server, cases)


def test_grpc_stream_cancelled_with_requests_in_flight(server, cases):
    for _ in range(3):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            c.start_stream(callback=lambda result, error: None)
            case = cases.get("convnet", 8)
            for i in range(20):
                c.async_stream_infer("convnet", grpc_inputs(case), request_id=str(i))
            c.stop_stream(cancel_requests=True)
        finally:
            c.close()
    _still_serving(server, cases)


def test_grpc_stream_half_closed_gets_every_reply(server, cases):
    """Closing the sending side (stop_stream without cancel) still delivers
    every outstanding reply."""
    c = grpcclient.InferenceServerClient(server.grpc_url)
    got = queue.Queue()
    try:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        case = cases.get("mlp", 8)
        for i in range(10):
            c.async_stream_infer("mlp", grpc_inputs(case), request_id=str(i))
        c.stop_stream()
    finally:
        c.close()
    ids = set()
    while not got.empty():
        result, error = got.get()
        assert error is None, error
        ids.add(result.get_response().id)
        case.check({"y": result.as_numpy("y")}, "half-closed stream")
    assert ids == {str(i) for i in range(10)}, sorted(ids)


def test_grpc_compressed_request(gclient, cases):
    for algo in ("gzip", "deflate"):
        case = cases.get("convnet", 3)
        got, _ = grpc_infer_case(gclient, case, compression_algorithm=algo)
        case.check(got, f"grpc {algo}")


# ---- HTTP -------------------------------------------------------------------------

def _raw(server, data: bytes, close_after=0.0, read=False):
    host, port = server.http_url.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(data)
        if read:
            return s.recv(65536)
        time.sleep(close_after)
    finally:
        s.close()


def test_http_abandoned_requests(server, cases):
    """Headers only, half a body, a huge Content-Length, garbage: then hang up."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                   "data": [0.0] * 16}]}).encode()
    req = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    for data in (req,
                 req + b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2],
                 req + b"Content-Length: 10000000000\r\n\r\n" + body,
                 req + b"Content-Length: 64\r\nInference-Header-Content-Length: 1000\r\n\r\n"
                 + body[:64],
                 b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(64)),
                 b"GET /v2 HTTP/1.1\r\nHost: " + b"h" * 100000 + b"\r\n\r\n"):
        _raw(server, data, close_after=0.05)
    _still_serving(server, cases)


def test_http_idle_and_partial_connections_do_not_block(server, cases):
    """40 idle connections and 10 with half-sent headers stay open while normal
    requests are answered promptly."""
    host, port = server.http_url.rsplit(":", 1)
    held = []
    try:
        for i in range(50):
            s = socket.create_connection((host, int(port)), timeout=10)
            if i >= 40:
                s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
            held.append(s)
        t0 = time.monotonic()
        case = cases.get("mlp", 1)
        for _ in range(5):
            status, _, _ = http_request(server.http_url, "GET", "/v2/health/ready", timeout=10)
            assert status == 200
        h = httpclient.InferenceServerClient(server.http_url, network_timeout=10,
                                             connection_timeout=10)
        try:
            got, _ = http_infer_case(h, case)
            case.check(got, "with idle connections open")
        finally:
            h.close()
        assert time.monotonic() - t0 < 10, "requests were slow while idle connections were open"
    finally:
        for s in held:
            s.close()
    _still_serving(server, cases)


def test_http_chunked_request_body(server, cases):
    case = cases.get("mlp", 3)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 16],
                       "data": case.inputs["x"].ravel().tolist()}]}
    body = json.dumps(doc).encode()
    chunks = [body[i:i + 100] for i in range(0, len(body), 100)]
    raw = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    req = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
           b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + raw)
    host, port = server.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(req)
        resp = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            resp += d
    head, _, payload = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), resp[:300]
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", payload
        while rest:
            n, _, rest = rest.partition(b"\r\n")
            n = int(n, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        payload = out
    o = json.loads(payload)["outputs"][0]
    case.check({"y": np.array(o["data"], np.float32).reshape(o["shape"])}, "chunked body")


@pytest.mark.parametrize("algo", ["gzip", "deflate"])
def test_http_compression(hclient, cases, algo):
    """tritonclient's request_compression_algorithm / response_compression_algorithm
    (Content-Encoding and Accept-Encoding, as Triton supports them)."""
    case = cases.get("two_io", 3)
    got, _ = http_infer_case(hclient, case, request_compression_algorithm=algo)
    case.check(got, f"request {algo}")
    got, _ = http_infer_case(hclient, case, response_compression_algorithm=algo)
    case.check(got, f"response {algo}")


# ---- a full queue -----------------------------------------------------------------

@serve_only("each worker has a queue of its own: spread over two, 16 clients may never "
            "fill one (seen once in CI against pjserve node)")
def test_full_queue_is_resource_exhausted(server_factory, cases):
    """--max-queue-depth 1 (per model; every request here goes to two_io):
    requests beyond the queue are refused with RESOURCE_EXHAUSTED / 429; the
    others are answered correctly."""
    srv = server_factory(extra_args=["--max-queue-depth", "1"], names=("mlp", "two_io"))
    case = cases.get("two_io", 8)
    lock = threading.Lock()
    counts = {"ok": 0, "exhausted": 0}
    others = []

    def worker(tid):
        if tid % 2 == 0:
            c = grpcclient.InferenceServerClient(srv.grpc_url)
        else:
            c = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
        try:
            for _ in range(15):
                try:
                    if tid % 2 == 0:
                        got, _ = grpc_infer_case(c, case, client_timeout=60)
                    else:
                        got, _ = http_infer_case(c, case)
                    case.check(got, "queue test")
                    kind = "ok"
                except InferenceServerException as e:
                    code = grpc_code(e)
                    if code in ("RESOURCE_EXHAUSTED", "429"):
                        kind = "exhausted"
                    else:
                        with lock:
                            others.append(f"{code}: {e.message()}")
                        continue
                with lock:
                    counts[kind] += 1
        finally:
            c.close()

    _, errors = run_threads(worker, 16, timeout=180)
    assert not errors, repr(errors[0][1])
    assert not others, others[:3]
    assert counts["ok"] > 0, counts
    assert counts["exhausted"] > 0, f"no request was refused with a queue of 1: {counts}"
    problems = srv.stop_and_check()
    assert not problems, "\n".join(problems) + "\n" + srv.describe()


def test_http_keep_alive_survives_error_replies(server, cases):
    """Error replies to requests with large bodies (unknown model, bad data,
    malformed JSON, unknown endpoint) leave the keep-alive connection usable:
    the next request on the same connection is answered correctly."""
    import http.client
    case = cases.get("mlp", 1)
    good = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                   "data": case.inputs["x"].ravel().tolist()}]}).encode()
    big = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                  "data": [1.0] * 20000}]}).encode()
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        for path, body, want in (("/v2/models/no_such_model/infer", big, 404),
                                 # more than mlp's inputs can hold: 413 before parsing
                                 ("/v2/models/mlp/infer", big, 413),
                                 ("/v2/models/mlp/infer", b"{bad json" + b" " * 50000, 400),
                                 ("/v2/no_such_endpoint", b"x" * 50000, (400, 404))):
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status in (want if isinstance(want, tuple) else (want,)), (path, r.status)
            if r.will_close:
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=20)
            conn.request("POST", "/v2/models/mlp/infer", body=good,
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            assert r.status == 200, (path, r.status, data[:200])
            o = json.loads(data)["outputs"][0]
            case.check({"y": np.array(o["data"], np.float32).reshape(o["shape"])},
                       f"after {path}")
    finally:
        conn.close()
