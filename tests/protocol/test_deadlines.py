"""Deadlines from the wire: the KServe `timeout` parameter (microseconds, both
protocols) and the gRPC call deadline (tritonclient's client_timeout). A
timeout of 1 us has passed before the request can be admitted, so it is
answered DEADLINE_EXCEEDED (gRPC), 504 (HTTP) or an error_message (gRPC
stream); generous ones change nothing. `priority` is accepted and ignored."""

import queue

import pytest
from tritonclient.utils import InferenceServerException

from protocol_util import grpc_code, grpc_infer_case, grpc_inputs, http_infer_case, http_json

MODEL = "mlp"
GENEROUS_US = 60_000_000


def test_grpc_timeout_parameter_expires(gclient, cases):
    case = cases.get(MODEL, 2)
    with pytest.raises(InferenceServerException) as ei:
        grpc_infer_case(gclient, case, timeout=1)
    assert grpc_code(ei.value) == "DEADLINE_EXCEEDED", ei.value
    assert "deadline" in str(ei.value).lower(), ei.value


def test_http_timeout_parameter_expires(hclient, cases):
    case = cases.get(MODEL, 2)
    with pytest.raises(InferenceServerException) as ei:
        http_infer_case(hclient, case, timeout=1)
    assert ei.value.status() == "504", (ei.value.status(), ei.value)
    assert "deadline" in str(ei.value).lower(), ei.value


def test_http_timeout_raw_body(server, cases):
    """Without tritonclient: 504 with Triton's {"error": ...} body, and a
    negative timeout is a bad request."""
    case = cases.get(MODEL, 1)
    x = case.inputs["x"]
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                       "data": x.flatten().tolist()}],
           "parameters": {"timeout": 1}}
    status, body, raw = http_json(server.http_url, "POST", f"/v2/models/{MODEL}/infer", doc)
    assert status == 504, raw
    assert "deadline" in body["error"].lower(), body
    doc["parameters"] = {"timeout": -5}
    status, body, raw = http_json(server.http_url, "POST", f"/v2/models/{MODEL}/infer", doc)
    assert status == 400, raw
    assert "timeout" in body["error"], body


def test_generous_timeouts_succeed(gclient, hclient, cases):
    case = cases.get(MODEL, 3)
    got, _ = grpc_infer_case(gclient, case, timeout=GENEROUS_US)
    case.check(got, "gRPC timeout parameter")
    got, _ = grpc_infer_case(gclient, case, client_timeout=60.0)
    case.check(got, "gRPC client_timeout")
    got, _ = grpc_infer_case(gclient, case, timeout=GENEROUS_US, client_timeout=60.0)
    case.check(got, "both")
    got, _ = grpc_infer_case(gclient, case, timeout=0)  # 0: no timeout, as Triton
    case.check(got, "timeout 0")
    got, _ = http_infer_case(hclient, case, timeout=GENEROUS_US)
    case.check(got, "HTTP timeout parameter")


def test_earlier_deadline_wins(gclient, cases):
    """A generous call deadline does not lift a timeout parameter that passed."""
    case = cases.get(MODEL, 1)
    with pytest.raises(InferenceServerException) as ei:
        grpc_infer_case(gclient, case, timeout=1, client_timeout=60.0)
    assert grpc_code(ei.value) == "DEADLINE_EXCEEDED", ei.value


def test_priority_is_ignored(gclient, hclient, cases):
    case = cases.get(MODEL, 2)
    for priority in (1, 7):
        got, _ = grpc_infer_case(gclient, case, priority=priority)
        case.check(got, f"gRPC priority {priority}")
        got, _ = http_infer_case(hclient, case, priority=priority)
        case.check(got, f"HTTP priority {priority}")


def test_stream_timeout_in_error_message(gclient, cases):
    """On ModelStreamInfer an expired request is answered in order with an
    error_message; the stream and the requests after it go on."""
    results = queue.Queue()
    gclient.start_stream(callback=lambda result, error: results.put((result, error)),
                         stream_timeout=120)
    try:
        case = cases.get(MODEL, 2)
        gclient.async_stream_infer(MODEL, grpc_inputs(case), request_id="late", timeout=1)
        gclient.async_stream_infer(MODEL, grpc_inputs(case), request_id="fine",
                                   timeout=GENEROUS_US)
        first = results.get(timeout=60)
        second = results.get(timeout=60)
    finally:
        gclient.stop_stream()
    result, error = first
    assert error is not None, "a 1 us timeout on the stream succeeded"
    assert "deadline" in str(error).lower(), error
    result, error = second
    assert error is None, error
    assert result.get_response().id == "fine"
    case.check({n: result.as_numpy(n) for n in case.output_names()}, "after the expired one")
