"""Inference over HTTP/REST (POST /v2/models/{m}/infer): JSON tensors, the
binary tensor extension and mixtures, with tritonclient.http and by hand."""

import json

import numpy as np
import pytest

from protocol_util import (BF16, BF16_MODEL, DEMO_MODELS, binary_infer_body, http_infer_case,
                           http_request, kserve_dtype, parse_binary_infer_response)

JSON_MODELS = DEMO_MODELS  # tritonclient sends BF16 only as binary data


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("model", DEMO_MODELS + (BF16_MODEL,))
def test_binary_infer_matches_jax(hclient, cases, model, n):
    case = cases.get(model, n)
    got, result = http_infer_case(hclient, case, binary_in=True, binary_out=True)
    case.check(got, "http binary")
    resp = result.get_response()
    assert resp["model_name"] == model
    for out in resp["outputs"]:
        spec = {o.name: o for o in case.manifest.outputs}[out["name"]]
        assert out["datatype"] == kserve_dtype(spec)
        assert out["shape"] == list(spec.full_shape(n))
        assert out["parameters"]["binary_data_size"] == got[out["name"]].nbytes


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("model", JSON_MODELS)
def test_json_infer_matches_jax(hclient, cases, model, n):
    case = cases.get(model, n)
    got, result = http_infer_case(hclient, case, binary_in=False, binary_out=False)
    case.check(got, "http json")
    for out in result.get_response()["outputs"]:
        assert "data" in out, f"JSON output {out['name']} has no data: {out}"
        assert "binary_data_size" not in (out.get("parameters") or {})


@pytest.mark.parametrize("binary_in,binary_out", [
    ({"a": True, "b": False}, {"sum": False, "argmax": True}),
    ({"a": False, "b": True}, {"sum": True, "argmax": False}),
    (True, False),
    (False, True),
], ids=["a-bin,b-json->sum-json,argmax-bin", "a-json,b-bin->sum-bin,argmax-json",
        "bin->json", "json->bin"])
def test_mixed_binary_and_json(hclient, cases, binary_in, binary_out):
    case = cases.get("two_io", 3)
    names = ["sum", "argmax"]
    bo = binary_out if isinstance(binary_out, dict) else {n: binary_out for n in names}
    got, result = http_infer_case(hclient, case, binary_in=binary_in, binary_out=bo,
                                  outputs=names)
    case.check(got, f"mixed {binary_in} -> {binary_out}")
    for out in result.get_response()["outputs"]:
        is_binary = "binary_data_size" in (out.get("parameters") or {})
        assert is_binary == bo[out["name"]], out
        assert ("data" in out) != is_binary, out


@pytest.mark.parametrize("outputs", [["sum"], ["argmax"]])
def test_requested_output_subset(hclient, cases, outputs):
    case = cases.get("two_io", 3)
    for binary in (True, False):
        got, result = http_infer_case(hclient, case, binary_out=binary, outputs=outputs)
        case.check(got, f"outputs={outputs} binary={binary}", outputs=outputs)
        returned = [o["name"] for o in result.get_response()["outputs"]]
        assert returned == outputs


def test_dtypes_on_the_wire(hclient, cases):
    """FP16 as JSON and binary, INT32 as JSON and binary, BF16 as binary."""
    for model, binary in (("mlp_f16", False), ("mlp_f16", True), ("two_io", False),
                          ("two_io", True), (BF16_MODEL, True)):
        case = cases.get(model, 2)
        got, _ = http_infer_case(hclient, case, binary_in=binary, binary_out=binary)
        case.check(got, f"binary={binary}")
    assert cases.get(BF16_MODEL, 2).inputs["x"].dtype == BF16


def test_async_infer(hclient, cases):
    import tritonclient.http as httpclient
    reqs = []
    for model, n in (("mlp", 3), ("two_io", 8), ("convnet", 1), ("mlp_f16", 4)):
        case = cases.get(model, n)
        inputs = []
        for spec in case.manifest.inputs:
            i = httpclient.InferInput(spec.name, list(case.inputs[spec.name].shape),
                                      kserve_dtype(spec))
            i.set_data_from_numpy(case.inputs[spec.name])
            inputs.append(i)
        reqs.append((case, hclient.async_infer(model, inputs)))
    for case, req in reqs:
        r = req.get_result(timeout=60)
        case.check({n: r.as_numpy(n) for n in case.output_names()}, "http async")


# ---- by hand ----------------------------------------------------------------

def _json_request(case, outputs=None, binary_output=None, nested=False):
    doc = {"id": "http-1", "inputs": []}
    for spec in case.manifest.inputs:
        arr = case.inputs[spec.name]
        data = arr.tolist() if nested else arr.flatten().tolist()
        doc["inputs"].append({"name": spec.name, "datatype": kserve_dtype(spec),
                              "shape": list(arr.shape), "data": data})
    if outputs is not None:
        doc["outputs"] = [{"name": o} for o in outputs]
    if binary_output is not None:
        doc["parameters"] = {"binary_data_output": binary_output}
    return doc


def _decode_json_outputs(doc, raw=None):
    out = {}
    for o in doc["outputs"]:
        dt = {"FP32": np.float32, "INT32": np.int32, "FP16": np.float16, "BF16": BF16}[
            o["datatype"]]
        if raw and o["name"] in raw:
            out[o["name"]] = np.frombuffer(raw[o["name"]], dt).reshape(o["shape"])
        else:
            out[o["name"]] = np.array(o["data"], dtype=dt).reshape(o["shape"])
    return out


def test_plain_json_request_and_reply(server, cases):
    case = cases.get("two_io", 3)
    status, hdrs, body = http_request(server.http_url, "POST", "/v2/models/two_io/infer",
                                      json.dumps(_json_request(case)).encode(),
                                      {"Content-Type": "application/json"})
    assert status == 200, body
    assert "inference-header-content-length" not in hdrs
    assert hdrs.get("content-type", "").startswith("application/json"), hdrs
    doc = json.loads(body)
    assert doc["id"] == "http-1"
    assert doc["model_name"] == "two_io"
    assert doc["model_version"] == "1"
    assert [o["name"] for o in doc["outputs"]] == ["sum", "argmax"]
    case.check(_decode_json_outputs(doc), "plain JSON")


def test_nested_json_data_accepted(server, cases):
    """KServe V2: tensor data may be given flat or nested by shape."""
    case = cases.get("two_io", 3)
    status, _, body = http_request(server.http_url, "POST", "/v2/models/two_io/infer",
                                   json.dumps(_json_request(case, nested=True)).encode(),
                                   {"Content-Type": "application/json"})
    assert status == 200, body
    case.check(_decode_json_outputs(json.loads(body)), "nested JSON")


def test_binary_data_output_parameter(server, cases):
    """parameters.binary_data_output = true: every output comes back binary."""
    case = cases.get("two_io", 2)
    status, hdrs, body = http_request(
        server.http_url, "POST", "/v2/models/two_io/infer",
        json.dumps(_json_request(case, binary_output=True)).encode(),
        {"Content-Type": "application/json"})
    assert status == 200, body
    assert "inference-header-content-length" in hdrs, hdrs
    doc, raw = parse_binary_infer_response(hdrs, body)
    assert sorted(raw) == ["argmax", "sum"], doc
    case.check(_decode_json_outputs(doc, raw), "binary_data_output")


def test_binary_request_by_hand(server, cases):
    """The binary extension built by hand: header JSON, then input bytes in order;
    versioned URL; outputs asked for binary one by one."""
    case = cases.get("two_io", 4)
    a, b = case.inputs["a"], case.inputs["b"]
    header = {"inputs": [
        {"name": "b", "datatype": "INT32", "shape": list(b.shape),
         "parameters": {"binary_data_size": b.nbytes}},
        {"name": "a", "datatype": "FP32", "shape": list(a.shape),
         "parameters": {"binary_data_size": a.nbytes}}],
        "outputs": [{"name": "argmax", "parameters": {"binary_data": True}},
                    {"name": "sum", "parameters": {"binary_data": False}}]}
    body, headers = binary_infer_body(header, [b.tobytes(), a.tobytes()])
    status, hdrs, data = http_request(server.http_url, "POST",
                                      "/v2/models/two_io/versions/1/infer", body, headers)
    assert status == 200, data
    doc, raw = parse_binary_infer_response(hdrs, data)
    assert list(raw) == ["argmax"]
    case.check(_decode_json_outputs(doc, raw), "binary by hand")


def test_json_floats_round_trip_exactly(server, cases):
    """FP32 outputs printed as JSON must parse back to the same float32 values
    the binary reply carries (enough digits, no %g-style truncation)."""
    case = cases.get("convnet", 3)
    got = {}
    for binary in (False, True):
        status, hdrs, data = http_request(
            server.http_url, "POST", "/v2/models/convnet/infer",
            json.dumps(_json_request(case, binary_output=binary)).encode(),
            {"Content-Type": "application/json"})
        assert status == 200, data
        doc, raw = parse_binary_infer_response(hdrs, data)
        got[binary] = _decode_json_outputs(doc, raw)
    for name in ("logits", "probs"):
        np.testing.assert_array_equal(got[False][name], got[True][name],
                                      err_msg=f"{name}: JSON and binary values differ")


def test_json_float_inputs_exact(server, exported):
    """JSON numbers for FP32 inputs are parsed to the nearest float32 (values that
    need all 9 significant digits)."""
    x = np.array([[np.float32(1) + np.float32(2 ** -23) * k for k in range(16)]],
                 dtype=np.float32)
    x[0, 3] = np.float32(3.4028234e38) / np.float32(1e30)
    x[0, 4] = np.float32(1.17549435e-38)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                       "data": [float(v) for v in x.flatten()]}]}
    status, _, data = http_request(server.http_url, "POST", "/v2/models/mlp/infer",
                                   json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert status == 200, data
    got = _decode_json_outputs(json.loads(data))["y"]
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                          "parameters": {"binary_data_size": 64}}],
              "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    body, headers = binary_infer_body(header, [x.tobytes()])
    status, hdrs, data = http_request(server.http_url, "POST", "/v2/models/mlp/infer",
                                      body, headers)
    assert status == 200, data
    doc, raw = parse_binary_infer_response(hdrs, data)
    want = np.frombuffer(raw["y"], np.float32).reshape(1, 4)
    np.testing.assert_array_equal(got, want)
    ref = exported["mlp"].model.reference(x)[0]
    np.testing.assert_allclose(want, ref, atol=1e-5, rtol=1e-5)


def test_error_reply_is_json_with_error_key(server):
    status, hdrs, body = http_request(server.http_url, "POST", "/v2/models/no_such_model/infer",
                                      b'{"inputs": []}', {"Content-Type": "application/json"})
    assert status == 404, body
    doc = json.loads(body)
    assert isinstance(doc.get("error"), str) and "no_such_model" in doc["error"], doc

