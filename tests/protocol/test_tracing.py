"""Traces: W3C traceparent in on both protocols, spans out over OTLP/HTTP to a
real receiver (an HTTP server in this test that keeps every ExportTraceService
body it is sent, as a collector's OTLP/HTTP receiver does).

Checked against a dedicated server (behind a gateway when the suite runs under
PJSERVE_PROTOCOL_NODE_WORKERS): one trace per request, under the caller's
span; the request's server span with its stages (decode, queue, execute with
the batch it rode in and the execution's phases, respond); a hooked model's
preprocess and postprocess; through a gateway,
the gateway's span and its forward span between the caller and the worker;
an ensemble's sub-calls as spans with their own queue and execute; the
caller's unsampled flag followed; the rate for requests without a
traceparent; Triton's trace settings on both protocols (and what they
refuse); the span counters in /metrics; a collector that is down costing the
requests nothing.
"""

import importlib.util
import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pjserve_export import hooks as H
from pjserve_export.triton_examples import export_triton_example
from protocol_util import (NODE_WORKERS, finish_checked, free_ports, metric, parse_metrics,
                           scrape)

_demo_spec = importlib.util.spec_from_file_location(
    "make_demo_models", Path(__file__).resolve().parents[2] / "examples" / "make_demo_models.py")
demo_models = importlib.util.module_from_spec(_demo_spec)
_demo_spec.loader.exec_module(demo_models)

SERVER, CLIENT = 2, 3  # OTLP span kinds
PROTOCOLS = ["grpc", "http"]


class Collector:
    """An OTLP/HTTP traces receiver on loopback: every span it was sent."""

    def __init__(self):
        self.spans = []
        self.bodies = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = (self.path == "/v1/traces"
                      and self.headers.get("Content-Type") == "application/json")
                if ok:
                    collector.add(json.loads(body))
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add(self, doc):
        with self.lock:
            self.bodies += 1
            for rs in doc["resourceSpans"]:
                attrs = {a["key"]: a["value"]["stringValue"]
                         for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        s["service"] = attrs["service.name"]
                        s["attrs"] = {a["key"]: next(iter(a["value"].values()))
                                      for a in s.get("attributes", [])}
                        self.spans.append(s)

    def trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if s["traceId"] == trace_id]

    def wait_trace(self, trace_id, server_spans, timeout=10.0):
        """The spans of trace_id once `server_spans` spans of kind SERVER (the
        request's own, and the gateway's) and all their stages arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if sum(s["kind"] == SERVER for s in spans) >= server_spans and any(
                    s["name"] == "respond" for s in spans):
                time.sleep(0.3)  # the rest of the batch
                return self.trace(trace_id)
            time.sleep(0.05)
        raise AssertionError(f"trace {trace_id}: {len(self.trace(trace_id))} spans after "
                             f"{timeout} s: {[s['name'] for s in self.trace(trace_id)]}")

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


@pytest.fixture
def servers(server_factory):
    """server_factory's servers, each stopped and checked (exit 0, no error
    or sanitizer line) after the test."""
    started = []

    def start(*args, **kwargs):
        started.append(server_factory(*args, **kwargs))
        return started[-1]

    yield start
    for s in started:
        finish_checked(s)


def traced_server(servers, collector, rate="0"):
    return servers(["--trace-endpoint", collector.url, "--trace-rate", rate],
                          names=("mlp", "two_io"))


def infer_mlp(server, protocol, traceparent=None, rows=1):
    x = np.full((rows, 16), 0.5, np.float32)
    headers = {"traceparent": traceparent} if traceparent else None
    if protocol == "grpc":
        c = grpcclient.InferenceServerClient(server.grpc_url)
        i = grpcclient.InferInput("x", list(x.shape), "FP32")
    else:
        c = httpclient.InferenceServerClient(server.http_url)
        i = httpclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    try:
        return c.infer("mlp", [i], headers=headers).as_numpy("y")
    finally:
        c.close()


def new_ids():
    import secrets
    return secrets.token_hex(16), secrets.token_hex(8)


def by_id(spans):
    return {s["spanId"]: s for s in spans}


def children(spans, parent):
    return sorted((s for s in spans if s.get("parentSpanId") == parent["spanId"]),
                  key=lambda s: int(s["startTimeUnixNano"]))


def within(child, parent):
    return (int(parent["startTimeUnixNano"]) <= int(child["startTimeUnixNano"])
            and int(child["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"]))


def the_request_span(spans, caller_span, model):
    """The server's span of the request, checked to hang from the caller's
    span: directly, or through the gateway's span and its forward span."""
    [server] = [s for s in spans if s["name"] == f"infer {model}"]
    assert server["kind"] == SERVER and server["service"] == "pjserve"
    assert server["attrs"]["pjserve.model"] == model
    if NODE_WORKERS:
        ids = by_id(spans)
        forward = ids[server["parentSpanId"]]
        assert forward["name"] == "forward to a worker" and forward["kind"] == CLIENT
        gateway = ids[forward["parentSpanId"]]
        assert gateway["kind"] == SERVER and gateway["service"] == "pjserve-gateway"
        assert gateway["name"].startswith("gateway ")
        assert gateway["parentSpanId"] == caller_span
        assert within(forward, gateway)
        assert int(forward["startTimeUnixNano"]) <= int(server["startTimeUnixNano"])
    else:
        assert server["parentSpanId"] == caller_span
    return server


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_trace_per_request_under_the_callers_span(servers, collector, protocol):
    server = traced_server(servers, collector)
    trace_id, caller = new_ids()
    y = infer_mlp(server, protocol, f"00-{trace_id}-{caller}-01")
    assert y.shape == (1, 4)
    spans = collector.wait_trace(trace_id, 2 if NODE_WORKERS else 1)
    assert len({s["spanId"] for s in spans}) == len(spans)
    request = the_request_span(spans, caller, "mlp")
    assert request["attrs"]["rpc.system"] == protocol
    stages = children(spans, request)
    assert [s["name"] for s in stages] == ["decode", "queue", "execute", "respond"]
    for s in stages:
        assert s["kind"] == 1 and within(s, request), s
    execute = stages[2]
    assert execute["attrs"]["pjserve.batch_rows"] == "1"
    assert execute["attrs"]["pjserve.batch_requests"] == "1"
    assert int(execute["attrs"]["pjserve.batch_size"]) >= 1
    assert [s["name"] for s in children(spans, execute)] == ["upload", "compute", "read back"]
    # one request, one trace: nothing else arrived under another parent
    assert all(s["traceId"] == trace_id for s in spans)


def test_ensemble_sub_calls_are_spans_of_the_request(servers, collector, exported,
                                                      tmp_path):
    server = servers(["--trace-endpoint", collector.url, "--trace-rate", "0"],
                            names=("mlp", "two_io"))
    # the ensemble beside two_io, loaded into the running server's repository
    demo_models.export_ensemble("two_io_chain", server.repository)
    wait_ready(server, "two_io_chain")
    c = httpclient.InferenceServerClient(server.http_url)
    trace_id, caller = new_ids()
    a = httpclient.InferInput("a", [2, 8], "FP32")
    a.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(2, 8))
    b = httpclient.InferInput("b", [2, 3], "INT32")
    b.set_data_from_numpy(np.ones((2, 3), np.int32))
    c.infer("two_io_chain", [a, b], headers={"traceparent": f"00-{trace_id}-{caller}-01"})
    c.close()
    spans = collector.wait_trace(trace_id, 2 if NODE_WORKERS else 1)
    request = the_request_span(spans, caller, "two_io_chain")
    names = [s["name"] for s in children(spans, request)]
    assert names[:3] == ["decode", "queue", "run"] and names[-1] == "respond", names
    calls = [s for s in children(spans, request) if s["name"] == "call two_io"]
    assert len(calls) == 2
    for call in calls:
        assert within(call, request)
        assert call["attrs"]["pjserve.model"] == "two_io"
        under = children(spans, call)
        assert [s["name"] for s in under] == ["queue", "execute"]
        assert under[1]["attrs"]["pjserve.request_rows"] == "2"


def wait_ready(server, model):
    c = httpclient.InferenceServerClient(server.http_url)
    deadline = time.monotonic() + 60
    while not c.is_model_ready(model) and time.monotonic() < deadline:
        time.sleep(0.2)
    c.close()


def test_hooks_are_spans_of_the_request(servers, collector, pjserve_bin):
    server = servers(["--trace-endpoint", collector.url, "--trace-rate", "0"], names=("mlp",))
    # Triton's simple_string: C hooks (strings to numbers and back) around an adder
    export_triton_example("simple_string", server.repository, build=H.hooks_builder(pjserve_bin))
    wait_ready(server, "simple_string")
    trace_id, caller = new_ids()
    c = httpclient.InferenceServerClient(server.http_url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(name, [1, 16], "BYTES")
        i.set_data_from_numpy(np.array([str(k).encode() for k in range(16)],
                                       np.object_).reshape(1, 16))
        inputs.append(i)
    r = c.infer("simple_string", inputs, headers={"traceparent": f"00-{trace_id}-{caller}-01"})
    c.close()
    assert [int(v) for v in r.as_numpy("OUTPUT0").ravel()] == [2 * k for k in range(16)]
    spans = collector.wait_trace(trace_id, 2 if NODE_WORKERS else 1)
    request = the_request_span(spans, caller, "simple_string")
    names = [s["name"] for s in children(spans, request)]
    assert names == ["decode", "preprocess", "queue", "execute", "postprocess", "respond"], names


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_callers_decision_and_the_rate(servers, collector, protocol):
    server = traced_server(servers, collector, rate="0")
    unsampled, caller = new_ids()
    infer_mlp(server, protocol, f"00-{unsampled}-{caller}-00")
    infer_mlp(server, protocol)  # rate 0, no traceparent: not traced
    # a malformed traceparent counts as none (rate 0: not traced), and is answered
    infer_mlp(server, protocol, "00-XYZ-notatrace-01")
    sampled, caller = new_ids()
    infer_mlp(server, protocol, f"00-{sampled}-{caller}-01")
    collector.wait_trace(sampled, 2 if NODE_WORKERS else 1)
    assert collector.trace(unsampled) == []
    with collector.lock:
        assert {s["traceId"] for s in collector.spans} == {sampled}


def trace_settings(server, protocol, settings=None):
    """Reads (settings None) or updates the server-wide trace settings; the
    settings as a dict of lists."""
    if protocol == "grpc":
        c = grpcclient.InferenceServerClient(server.grpc_url)
        r = (c.get_trace_settings(as_json=True) if settings is None
             else c.update_trace_settings(settings=settings, as_json=True))
        c.close()
        return {k: v.get("value", []) for k, v in r["settings"].items()}
    c = httpclient.InferenceServerClient(server.http_url)
    r = c.get_trace_settings() if settings is None else c.update_trace_settings(
        settings=settings)
    c.close()
    return {k: v if isinstance(v, list) else [v] if v != "" else [] for k, v in r.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_settings_set_the_rate_and_level(servers, collector, protocol):
    server = traced_server(servers, collector, rate="0.01")
    got = trace_settings(server, protocol)
    assert got["trace_level"] == ["TIMESTAMPS"]
    assert got["trace_rate"] == ["100"]
    assert got["trace_mode"] == ["opentelemetry"]
    assert got["trace_count"] == ["-1"]
    # one request in 1: every request without a traceparent is traced
    got = trace_settings(server, protocol, {"trace_rate": "1"})
    assert got["trace_rate"] == ["1"]
    before = len(collector.spans)
    for _ in range(3):
        infer_mlp(server, protocol)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with collector.lock:
            requests = [s for s in collector.spans[before:] if s["name"] == "infer mlp"]
        if len(requests) == 3:
            break
        time.sleep(0.05)
    assert len(requests) == 3 and len({s["traceId"] for s in requests}) == 3
    # OFF: nothing is traced, the caller's sampled flag included
    got = trace_settings(server, protocol, {"trace_level": ["OFF"]})
    assert got["trace_level"] == ["OFF"]
    off, caller = new_ids()
    infer_mlp(server, protocol, f"00-{off}-{caller}-01")
    # cleared: back to the start-up values
    got = trace_settings(server, protocol, {"trace_level": None, "trace_rate": None})
    assert got["trace_level"] == ["TIMESTAMPS"] and got["trace_rate"] == ["100"]
    on, caller = new_ids()
    infer_mlp(server, protocol, f"00-{on}-{caller}-01")
    collector.wait_trace(on, 2 if NODE_WORKERS else 1)
    assert collector.trace(off) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("settings, words", [
    ({"trace_level": ["TENSORS"]}, "not tensor values"),
    ({"trace_rate": "0"}, "whole number N >= 1"),
    ({"trace_file": "/tmp/trace.json"}, "cannot be changed"),
    ({"trace_mode": "triton"}, "cannot be changed"),
    ({"no_such_setting": "1"}, "unknown trace setting"),
])
def test_trace_settings_refused(servers, collector, protocol, settings, words):
    server = traced_server(servers, collector, rate="0.5")
    with pytest.raises(InferenceServerException) as e:
        trace_settings(server, protocol, settings)
    assert words in str(e.value)
    assert trace_settings(server, protocol)["trace_rate"] == ["2"]  # nothing changed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_per_model_settings_and_no_collector(servers, protocol):
    server = servers([], names=("mlp",))  # no --trace-endpoint
    assert trace_settings(server, protocol)["trace_level"] == ["OFF"]
    assert trace_settings(server, protocol, {"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
    with pytest.raises(InferenceServerException) as e:
        trace_settings(server, protocol, {"trace_level": ["TIMESTAMPS"]})
    assert "--trace-endpoint" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        if protocol == "grpc":
            c = grpcclient.InferenceServerClient(server.grpc_url)
            c.update_trace_settings(model_name="mlp", settings={"trace_rate": "10"})
        else:
            c = httpclient.InferenceServerClient(server.http_url)
            c.update_trace_settings(model_name="mlp", settings={"trace_rate": "10"})
    assert "server-wide" in str(e.value)


def test_span_counters_and_a_collector_that_is_down(servers, collector):
    (dead,) = free_ports(1)  # nothing listens there
    server = servers(["--trace-endpoint", f"http://127.0.0.1:{dead}/v1/traces",
                             "--trace-rate", "1"], names=("mlp",))
    for protocol in PROTOCOLS * 3:
        assert infer_mlp(server, protocol).shape == (1, 4)
    deadline = time.monotonic() + 10
    failed = 0
    while time.monotonic() < deadline:
        samples, types = parse_metrics(scrape(server.metrics_url))
        failed = metric(samples, "pjserve_trace_spans_total", outcome="dropped_export_failed")
        if failed and failed >= 6 * 7:  # six requests of seven spans at least
            break
        time.sleep(0.1)
    assert types["pjserve_trace_spans_total"] == "counter"
    assert failed >= 6 * 7
    assert metric(samples, "pjserve_trace_spans_total", outcome="exported") == 0

    server = traced_server(servers, collector, rate="1")
    infer_mlp(server, "http")
    deadline = time.monotonic() + 10
    exported = 0
    while time.monotonic() < deadline and not exported:
        samples, _ = parse_metrics(scrape(server.metrics_url))
        exported = metric(samples, "pjserve_trace_spans_total", outcome="exported")
        time.sleep(0.1)
    assert exported >= 7
    assert metric(samples, "pjserve_trace_spans_total", outcome="dropped_queue_full") == 0
