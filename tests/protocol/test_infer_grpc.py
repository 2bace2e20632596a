"""Inference over gRPC (inference.GRPCInferenceService/ModelInfer and
ModelStreamInfer) with tritonclient, compared with the JAX reference."""

import queue
import threading
from functools import partial

import numpy as np
import pytest

import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from protocol_util import (BF16, BF16_MODEL, DEMO_MODELS, grpc_channel, grpc_code, grpc_infer_case, grpc_inputs,
                           grpc_stub, kserve_dtype)

BATCHES = [1, 3, 8]


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("model", DEMO_MODELS + (BF16_MODEL,))
def test_sync_infer_matches_jax(gclient, cases, model, n):
    case = cases.get(model, n)
    got, result = grpc_infer_case(gclient, case)
    case.check(got, "grpc")
    resp = result.get_response()
    assert resp.model_name == model
    assert resp.model_version in ("1", ""), resp.model_version
    # tritonclient reads raw_output_contents only: the reply must be raw.
    assert len(resp.raw_output_contents) == len(resp.outputs) == len(case.output_names())
    for out in resp.outputs:
        spec = {o.name: o for o in case.manifest.outputs}[out.name]
        assert out.datatype == kserve_dtype(spec)
        assert list(out.shape) == list(spec.full_shape(n))


def test_request_id_is_echoed(gclient, cases):
    case = cases.get("mlp", 1)
    _, result = grpc_infer_case(gclient, case, request_id="req-42")
    assert result.get_response().id == "req-42"


def test_explicit_version(gclient, cases):
    case = cases.get("mlp", 3)
    got, _ = grpc_infer_case(gclient, case, model_version="1")
    case.check(got, "version 1")


def test_extra_parameters_are_tolerated(gclient, cases):
    """tritonclient sends priority (uint64), timeout and custom parameters."""
    case = cases.get("mlp", 3)
    got, _ = grpc_infer_case(gclient, case, priority=1, timeout=10_000_000,
                             parameters={"custom_str": "x", "custom_int": 5,
                                         "custom_bool": True})
    case.check(got, "with parameters")


def test_priority_as_int64_and_uint64(server, cases):
    case = cases.get("two_io", 1)
    with grpc_channel(server.grpc_url) as ch:
        stub = grpc_stub(ch)
        for which in ("int64_param", "uint64_param"):
            req = _raw_request(case)
            setattr(req.parameters["priority"], which, 1)
            setattr(req.parameters["timeout"], which, 5_000_000)
            req.parameters["unknown_param"].string_param = "ignored"
            resp = stub.ModelInfer(req, timeout=60)
            case.check(_decode_raw(resp), which)


def _raw_request(case, typed=False):
    req = service_pb2.ModelInferRequest(model_name=case.model)
    for spec in case.manifest.inputs:
        arr = case.inputs[spec.name]
        t = req.inputs.add(name=spec.name, datatype=kserve_dtype(spec), shape=list(arr.shape))
        if typed:
            if arr.dtype == np.float32:
                t.contents.fp32_contents.extend(arr.flatten().tolist())
            elif arr.dtype == np.int32:
                t.contents.int_contents.extend(arr.flatten().tolist())
            else:
                raise AssertionError(arr.dtype)
        else:
            req.raw_input_contents.append(arr.tobytes())
    return req


def _decode_raw(resp):
    out = {}
    assert len(resp.raw_output_contents) == len(resp.outputs), resp
    for o, raw in zip(resp.outputs, resp.raw_output_contents):
        dt = {"FP32": np.float32, "INT32": np.int32, "FP16": np.float16,
              "BF16": BF16}[o.datatype]
        out[o.name] = np.frombuffer(raw, dtype=dt).reshape(list(o.shape))
    return out


def test_typed_contents_accepted(server, cases):
    """KServe V2 allows tensor data in InferTensorContents instead of raw bytes."""
    case = cases.get("two_io", 3)
    with grpc_channel(server.grpc_url) as ch:
        resp = grpc_stub(ch).ModelInfer(_raw_request(case, typed=True), timeout=60)
    case.check(_decode_raw(resp), "typed contents")


@pytest.mark.parametrize("outputs", [["sum"], ["argmax"], ["argmax", "sum"]])
def test_requested_output_subset(gclient, cases, outputs):
    case = cases.get("two_io", 3)
    got, result = grpc_infer_case(gclient, case, outputs=outputs)
    case.check(got, f"outputs={outputs}", outputs=outputs)
    returned = [o.name for o in result.get_response().outputs]
    assert sorted(returned) == sorted(outputs), f"asked for {outputs}, got {returned}"


def test_inputs_in_any_order(gclient, cases):
    case = cases.get("two_io", 4)
    inputs = list(reversed(grpc_inputs(case)))
    result = gclient.infer("two_io", inputs)
    case.check({n: result.as_numpy(n) for n in case.output_names()}, "reversed inputs")


def test_dtypes_on_the_wire(gclient, cases):
    """FP32, INT32 (two_io), FP16 (mlp_f16) and BF16 (bf16_io: ml_dtypes.bfloat16
    arrays, sent as raw 2-byte values) in both directions."""
    seen = set()
    for model in ("two_io", "mlp_f16", BF16_MODEL):
        case = cases.get(model, 2)
        got, result = grpc_infer_case(gclient, case)
        case.check(got, "dtypes")
        for o in result.get_response().outputs:
            seen.add(o.datatype)
        for spec in case.manifest.inputs:
            seen.add(kserve_dtype(spec))
    assert {"FP32", "INT32", "FP16", "BF16"} <= seen
    assert cases.get(BF16_MODEL, 2).expected["y"].dtype == BF16


def test_async_infer(server, cases):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        done = queue.Queue()
        todo = []
        for i, (model, n) in enumerate([("mlp", 1), ("convnet", 3), ("two_io", 8),
                                        ("mlp_f16", 4), ("mlp_bf16", 2), ("mlp", 8),
                                        ("two_io", 1), (BF16_MODEL, 5)]):
            case = cases.get(model, n)
            todo.append(case)
            client.async_infer(model, grpc_inputs(case),
                               partial(lambda i, result, error: done.put((i, result, error)), i),
                               request_id=f"async-{i}", client_timeout=60)
        seen = set()
        for _ in todo:
            i, result, error = done.get(timeout=90)
            assert error is None, f"request {i} failed: {error}"
            case = todo[i]
            assert result.get_response().id == f"async-{i}"
            case.check({n: result.as_numpy(n) for n in case.output_names()}, f"async {i}")
            seen.add(i)
        assert seen == set(range(len(todo)))
    finally:
        client.close()


def test_stream_with_a_bad_request_in_the_middle(server, cases):
    """Errors come back on the stream; the stream stays open and later requests
    still succeed."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = queue.Queue()
    plan = [("mlp", 1), ("two_io", 3), ("BAD", 0), ("convnet", 2), ("mlp_f16", 8), ("mlp", 4)]
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        sent = {}
        for i, (model, n) in enumerate(plan):
            if model == "BAD":
                # x with 15 features instead of 16
                bad = grpcclient.InferInput("x", [1, 15], "FP32")
                bad.set_data_from_numpy(np.zeros((1, 15), np.float32))
                client.async_stream_infer("mlp", [bad], request_id=f"s{i}")
                continue
            case = cases.get(model, n)
            sent[f"s{i}"] = case
            client.async_stream_infer(model, grpc_inputs(case), request_id=f"s{i}")
        ok, errors = {}, []
        for _ in plan:
            try:
                result, error = results.get(timeout=60)
            except queue.Empty:
                pytest.fail(f"stream: only {len(ok)} results and {len(errors)} errors of "
                            f"{len(plan)} requests arrived within 60 s")
            if error is not None:
                errors.append(error)
            else:
                ok[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()
    assert len(errors) == 1, f"expected one error, got {[str(e) for e in errors]}"
    msg = errors[0].message()
    assert "x" in msg and ("15" in msg or "16" in msg or "shape" in msg.lower()), msg
    assert sorted(ok) == sorted(sent), f"successful ids {sorted(ok)}, expected {sorted(sent)}"
    for rid, case in sent.items():
        r = ok[rid]
        case.check({n: r.as_numpy(n) for n in case.output_names()}, f"stream {rid}")


def test_stream_many_requests_in_flight(server, cases):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = queue.Queue()
    n_req = 40
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        sent = {}
        for i in range(n_req):
            case = cases.get(("mlp", "two_io")[i % 2], 1 + i % 8)
            sent[f"m{i}"] = case
            client.async_stream_infer(case.model, grpc_inputs(case), request_id=f"m{i}")
        got = {}
        for _ in range(n_req):
            result, error = results.get(timeout=60)
            assert error is None, str(error)
            got[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()
    assert sorted(got) == sorted(sent)
    for rid, case in sent.items():
        case.check({n: got[rid].as_numpy(n) for n in case.output_names()}, rid)


def test_large_message_passes(gclient, cases):
    """Above gRPC's default 4 MB receive limit: convnet at batch 8 is only 25 KB,
    so send a 5 MB request body via a large request-level parameter instead."""
    case = cases.get("mlp", 1)
    got, _ = grpc_infer_case(gclient, case, parameters={"padding": "p" * (5 << 20)})
    case.check(got, "5 MB request")


def test_unknown_model_not_found(gclient, cases):
    case = cases.get("mlp", 1)
    with pytest.raises(InferenceServerException) as ei:
        gclient.infer("no_such_model", grpc_inputs(case))
    assert grpc_code(ei.value) == "NOT_FOUND", ei.value
    assert "no_such_model" in ei.value.message()


def test_concurrent_async_infers_share_one_client(server, cases):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    lock = threading.Lock()
    failures = []
    done = threading.Semaphore(0)
    cs = [cases.get("mlp", n) for n in (1, 3, 8)]
    try:
        for i in range(30):
            case = cs[i % 3]

            def cb(result, error, case=case):
                try:
                    assert error is None, str(error)
                    case.check({"y": result.as_numpy("y")}, "shared client")
                except AssertionError as e:
                    with lock:
                        failures.append(str(e))
                done.release()
            client.async_infer("mlp", grpc_inputs(case), cb, client_timeout=60)
        for _ in range(30):
            assert done.acquire(timeout=90), "async request did not complete"
    finally:
        client.close()
    assert not failures, failures[:3]


def test_long_request_id_echoed(gclient, hclient, cases):
    """Triton accepts request ids of any length and echoes them."""
    case = cases.get("mlp", 1)
    rid = "r" * 1000
    _, result = grpc_infer_case(gclient, case, request_id=rid)
    assert result.get_response().id == rid
    from protocol_util import http_infer_case
    _, result = http_infer_case(hclient, case, request_id=rid)
    assert result.get_response()["id"] == rid


def test_classification_is_served_or_refused(gclient, cases):
    """class_count asks for Triton's classification extension. pjserve does not
    list it, so it must refuse clearly rather than ignore it."""
    case = cases.get("mlp", 2)
    out = grpcclient.InferRequestedOutput("y", class_count=2)
    try:
        r = gclient.infer("mlp", grpc_inputs(case), outputs=[out])
    except InferenceServerException as e:
        assert grpc_code(e) in ("INVALID_ARGUMENT", "UNIMPLEMENTED"), e
        assert "class" in e.message().lower(), e.message()
        return
    o = r.get_response().outputs[0]
    assert o.datatype == "BYTES" and list(o.shape) == [2, 2], \
        f"class_count ignored: got {o.datatype} {list(o.shape)}"
