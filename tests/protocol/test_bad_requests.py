"""A corpus of bad inference requests, sent over gRPC (raw protobuf stubs) and
HTTP (binary extension and JSON, by hand). Each must fail with the expected
status and a message that names what was wrong; afterwards the server still
answers good requests correctly.

Expected statuses follow Triton: INVALID_ARGUMENT / 400 for a bad request
(an unparseable version included), NOT_FOUND / 404 for an unknown model or
version, with Triton's words for those ("Request for unknown model: 'NAME' is
not found"), which Triton's clients match.
"""

import json
import struct
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from protocol_util import (binary_infer_body, grpc_channel, grpc_infer_case, grpc_stub,
                           http_infer_case, http_request)

F32 = np.float32
I32 = np.int32


@dataclass
class T:
    """A tensor as sent: claimed name/datatype/shape, raw bytes, JSON data."""
    name: str
    datatype: str
    shape: List[int]
    raw: bytes
    json: list


def t(name, arr, datatype=None, shape=None, raw=None, json_data=None) -> T:
    arr = np.asarray(arr)
    dt = datatype or {np.dtype(F32): "FP32", np.dtype(I32): "INT32",
                      np.dtype(np.float64): "FP64", np.dtype(np.float16): "FP16"}[arr.dtype]
    return T(name, dt, list(arr.shape) if shape is None else list(shape),
             arr.tobytes() if raw is None else raw,
             arr.flatten().tolist() if json_data is None else json_data)


@dataclass
class Bad:
    id: str
    model: str
    inputs: List[T]
    outputs: Sequence[str] = ()
    version: str = ""
    grpc: Tuple[str, ...] = ("INVALID_ARGUMENT",)
    http: Tuple[int, ...] = (400,)
    words: Tuple[str, ...] = ()  # the message contains at least one (case-insensitive)


X1 = np.linspace(-1, 1, 16, dtype=F32).reshape(1, 16)
A2 = np.ones((2, 8), F32)
B2 = np.ones((2, 3), I32)
BYTES_RAW = b"".join(struct.pack("<I", 1) + b"a" for _ in range(16))
NOT_FOUND = dict(grpc=("NOT_FOUND",), http=(404,))
DUP = ("duplicate", "twice", "once", "again", "repeated", "more than one")

CORPUS = [
    Bad("unknown_model", "no_such_model", [t("x", X1)], words=("no_such_model",), **NOT_FOUND),
    Bad("unknown_version", "mlp", [t("x", X1)], version="7",
        words=("Request for unknown model: 'mlp' version 7 is not found",), **NOT_FOUND),
    Bad("non_numeric_version", "mlp", [t("x", X1)], version="latest",
        words=("failed to get model version from specified version string 'latest'",)),
    Bad("unknown_input", "mlp", [t("bogus_input", X1)], words=("bogus_input",)),
    Bad("wrong_dtype_int32", "mlp", [t("x", X1.astype(I32))], words=("INT32", "FP32")),
    Bad("wrong_dtype_fp64", "mlp", [t("x", X1.astype(np.float64))], words=("FP64", "FP32")),
    Bad("wrong_dtype_fp16", "mlp", [t("x", X1.astype(np.float16))], words=("FP16", "FP32")),
    Bad("two_io_b_as_fp32", "two_io", [t("a", A2), t("b", B2.astype(F32))],
        words=("INT32", "FP32")),
    Bad("lowercase_datatype", "mlp", [t("x", X1, datatype="fp32")], words=("fp32",)),
    Bad("unknown_datatype_fp128", "mlp",
        [t("x", X1, datatype="FP128", raw=X1.astype(np.float64).tobytes() * 2)],
        words=("FP128",)),
    Bad("bytes_datatype", "mlp", [t("x", X1, datatype="BYTES", raw=BYTES_RAW, json_data=["a"] * 16)],
        grpc=("INVALID_ARGUMENT", "UNIMPLEMENTED"), words=("BYTES",)),
    Bad("wrong_inner_dim", "mlp", [t("x", np.ones((1, 15), F32))], words=("15", "16")),
    Bad("wrong_rank_1", "mlp", [t("x", np.ones(16, F32))], words=("shape", "rank", "dim")),
    Bad("wrong_rank_3", "mlp", [t("x", np.ones((1, 16, 1), F32))], words=("shape", "rank", "dim")),
    Bad("byte_size_short", "mlp", [t("x", X1, raw=X1.tobytes()[:60], json_data=X1.ravel().tolist()[:15])],
        words=("byte", "size", "element", "60", "15", "expected")),
    Bad("byte_size_long", "mlp",
        [t("x", X1, raw=X1.tobytes() + b"\0" * 4, json_data=X1.ravel().tolist() + [0.0])],
        words=("byte", "size", "element", "68", "17", "expected")),
    Bad("missing_input", "two_io", [t("a", A2)],
        words=("missing", "'b'", '"b"', "input b", "expected 2", "2 inputs")),
    Bad("no_inputs", "mlp", [], words=("'x'", '"x"', "input x", "missing", "no input", "expected 1")),
    Bad("extra_input", "mlp", [t("x", X1), t("extra_input", X1)], words=("extra_input",)),
    Bad("duplicate_input", "mlp", [t("x", X1), t("x", X1)], words=DUP),
    Bad("unknown_output", "mlp", [t("x", X1)], outputs=["no_such_output"],
        words=("no_such_output",)),
    Bad("duplicate_output", "mlp", [t("x", X1)], outputs=["y", "y"], words=DUP),
    Bad("batch_too_large", "mlp", [t("x", np.ones((9, 16), F32))], words=("9", "8", "batch")),
    Bad("batch_zero", "mlp", [t("x", np.ones((0, 16), F32))], words=("0", "batch")),
    Bad("negative_dim", "mlp", [t("x", X1, shape=[-1, 16])], words=("-1", "negative", "shape")),
    Bad("huge_dim", "mlp", [t("x", X1, shape=[1, 2 ** 62])],
        words=(str(2 ** 62), "shape", "16", "large", "overflow")),
    Bad("overflowing_dims", "mlp", [t("x", X1, shape=[2 ** 32, 2 ** 32])],
        words=("shape", "batch", "large", "overflow", "4294967296")),
    Bad("huge_batch", "mlp", [t("x", X1, shape=[2 ** 40, 16])],
        words=("batch", "1099511627776", "8", "large")),
    Bad("batch_mismatch", "two_io", [t("a", A2), t("b", np.ones((3, 3), I32))],
        words=("batch", "2", "3")),
]


def _grpc_request(c: Bad):
    req = service_pb2.ModelInferRequest(model_name=c.model, model_version=c.version, id=c.id)
    for x in c.inputs:
        req.inputs.add(name=x.name, datatype=x.datatype, shape=x.shape)
        req.raw_input_contents.append(x.raw)
    for o in c.outputs:
        req.outputs.add(name=o)
    return req


def _path(c: Bad):
    v = f"/versions/{c.version}" if c.version else ""
    return f"/v2/models/{c.model}{v}/infer"


def _outputs_json(c: Bad, binary: bool):
    return [{"name": o, "parameters": {"binary_data": binary}} for o in c.outputs]


def _check_words(msg: str, words, what):
    assert msg, f"{what}: empty error message"
    if words:
        low = msg.lower()
        assert any(w.lower() in low for w in words), \
            f"{what}: message {msg!r} names none of {list(words)}"


def _check_http_reply(status, body, c_http, words, what):
    assert status in c_http, f"{what}: HTTP {status} (expected {c_http}): {body[:500]!r}"
    try:
        doc = json.loads(body)
    except ValueError:
        pytest.fail(f"{what}: error body is not JSON: {body[:500]!r}")
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str), \
        f"{what}: error body has no \"error\" string: {doc}"
    _check_words(doc["error"], words, what)


@pytest.fixture(scope="module")
def stub(_main_server):
    ch = grpc_channel(_main_server.grpc_url)
    yield grpc_stub(ch)
    ch.close()


@pytest.mark.parametrize("c", CORPUS, ids=[c.id for c in CORPUS])
def test_grpc(server, stub, c):
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(_grpc_request(c), timeout=30)
    code = ei.value.code().name
    assert code in c.grpc, f"gRPC {code} (expected {c.grpc}): {ei.value.details()}"
    _check_words(ei.value.details(), c.words, "gRPC")


@pytest.mark.parametrize("c", CORPUS, ids=[c.id for c in CORPUS])
def test_http_binary(server, c):
    header = {"id": c.id, "inputs": [
        {"name": x.name, "datatype": x.datatype, "shape": x.shape,
         "parameters": {"binary_data_size": len(x.raw)}} for x in c.inputs]}
    if c.outputs:
        header["outputs"] = _outputs_json(c, True)
    body, headers = binary_infer_body(header, [x.raw for x in c.inputs])
    status, _, data = http_request(server.http_url, "POST", _path(c), body, headers)
    _check_http_reply(status, data, c.http, c.words, "HTTP binary")


@pytest.mark.parametrize("c", CORPUS, ids=[c.id for c in CORPUS])
def test_http_json(server, c):
    doc = {"id": c.id, "inputs": [{"name": x.name, "datatype": x.datatype, "shape": x.shape,
                                   "data": x.json} for x in c.inputs]}
    if c.outputs:
        doc["outputs"] = _outputs_json(c, False)
    status, _, data = http_request(server.http_url, "POST", _path(c), json.dumps(doc).encode(),
                                   {"Content-Type": "application/json"})
    _check_http_reply(status, data, c.http, c.words, "HTTP JSON")


# ---- gRPC-only: malformed protobuf-level requests ------------------------------------

def _g_raw_count_more():
    r = _grpc_request(Bad("", "mlp", [t("x", X1)]))
    r.raw_input_contents.append(X1.tobytes())
    return r


def _g_raw_count_fewer():
    r = _grpc_request(Bad("", "two_io", [t("a", A2), t("b", B2)]))
    del r.raw_input_contents[1]
    return r


def _g_raw_and_typed():
    r = _grpc_request(Bad("", "mlp", [t("x", X1)]))
    r.inputs[0].contents.fp32_contents.extend(X1.ravel().tolist())
    return r


def _g_typed(values, field_name="fp32_contents", shape=(1, 16), datatype="FP32"):
    def make():
        r = service_pb2.ModelInferRequest(model_name="mlp")
        i = r.inputs.add(name="x", datatype=datatype, shape=list(shape))
        getattr(i.contents, field_name).extend(values)
        return r
    return make


def _g_no_data():
    r = service_pb2.ModelInferRequest(model_name="mlp")
    r.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    return r


def _g_empty_model():
    r = _grpc_request(Bad("", "mlp", [t("x", X1)]))
    r.model_name = ""
    return r


GRPC_ONLY = [
    ("raw_contents_more_than_inputs", _g_raw_count_more, ("INVALID_ARGUMENT",), ("raw",)),
    ("raw_contents_fewer_than_inputs", _g_raw_count_fewer, ("INVALID_ARGUMENT",), ("raw", "b")),
    ("raw_and_typed_contents", _g_raw_and_typed, ("INVALID_ARGUMENT",), ("raw", "contents")),
    ("typed_contents_short", _g_typed([1.0] * 15), ("INVALID_ARGUMENT",), ("15", "16")),
    ("typed_contents_wrong_field", _g_typed([1] * 16, "int_contents"), ("INVALID_ARGUMENT",),
     ("FP32", "int", "contents")),
    ("typed_contents_huge_shape", _g_typed([1.0] * 16, shape=(1, 2 ** 62)),
     ("INVALID_ARGUMENT",), ()),
    ("no_data", _g_no_data, ("INVALID_ARGUMENT",), ("x", "data", "contents")),
    ("empty_model_name", _g_empty_model, ("INVALID_ARGUMENT", "NOT_FOUND"), ("model",)),
]


@pytest.mark.parametrize("make,codes,words", [g[1:] for g in GRPC_ONLY],
                         ids=[g[0] for g in GRPC_ONLY])
def test_grpc_malformed(server, stub, make, codes, words):
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelInfer(make(), timeout=30)
    assert ei.value.code().name in codes, f"{ei.value.code()}: {ei.value.details()}"
    _check_words(ei.value.details(), words, "gRPC")


# ---- HTTP-only: malformed bodies and framing -----------------------------------------

def _bin(header, blobs, hlen=None, extra_headers=None):
    body, headers = binary_infer_body(header, blobs)
    if hlen is not None:
        headers["Inference-Header-Content-Length"] = str(hlen)
    headers.update(extra_headers or {})
    return body, headers


def _x_header(size=64, shape=(1, 16), **more):
    d = {"name": "x", "datatype": "FP32", "shape": list(shape),
         "parameters": {"binary_data_size": size}}
    d.update(more)
    return {"inputs": [d]}


JSONH = {"Content-Type": "application/json"}
XB = X1.tobytes()
XJ = X1.ravel().tolist()


def _json(doc):
    return json.dumps(doc).encode(), dict(JSONH)


def _xj(**over):
    d = {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": XJ}
    d.update(over)
    return {"inputs": [d]}


HTTP_ONLY = [
    ("truncated_json", (b'{"inputs": [{"name": "x", "datatype": "FP32"', dict(JSONH)),
     ("json", "parse", "invalid", "malformed")),
    ("empty_body", (b"", dict(JSONH)), ("json", "empty", "body", "parse", "input")),
    ("json_not_object", (b"[1, 2, 3]", dict(JSONH)), ("object", "json", "inputs")),
    ("json_garbage", (b"\xff\xfe\x00garbage", dict(JSONH)), ("json", "parse", "invalid")),
    ("inputs_not_array", _json({"inputs": {"name": "x"}}), ("inputs", "array")),
    ("input_not_object", _json({"inputs": [5]}), ("input", "object")),
    ("missing_name", _json({"inputs": [{"datatype": "FP32", "shape": [1, 16], "data": XJ}]}),
     ("name",)),
    ("missing_datatype", _json({"inputs": [{"name": "x", "shape": [1, 16], "data": XJ}]}),
     ("datatype",)),
    ("missing_shape", _json({"inputs": [{"name": "x", "datatype": "FP32", "data": XJ}]}),
     ("shape",)),
    ("missing_data", _json({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16]}]}),
     ("data",)),
    ("shape_not_ints", _json(_xj(shape=[1, "16"])), ("shape",)),
    ("shape_float", _json(_xj(shape=[1, 16.5])), ("shape",)),
    ("data_count_short", _json(_xj(data=XJ[:15])), ("15", "16", "element", "data", "size")),
    ("data_count_long", _json(_xj(data=XJ + [1.0])), ("17", "16", "element", "data", "size")),
    ("data_strings_for_fp32", _json(_xj(data=["a"] * 16)), ("FP32", "data", "number", "type")),
    ("data_bool_for_fp32", _json(_xj(data=[True] * 16)), ("FP32", "data", "number", "type")),
    ("data_float_for_int32", _json({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8},
        {"name": "b", "datatype": "INT32", "shape": [1, 3], "data": [1.5, 2.0, 3.0]}]}),
     ("INT32", "integer", "data", "b")),
    ("data_int32_out_of_range", _json({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8},
        {"name": "b", "datatype": "INT32", "shape": [1, 3], "data": [2 ** 40, 0, 0]}]}),
     ("INT32", "range", "data", "b")),
    ("data_nested_wrong", _json(_xj(data=[[1.0] * 8, [1.0] * 9])),
     ("data", "shape", "element", "16", "17")),
    ("outputs_not_array", _json({**_xj(), "outputs": "y"}), ("outputs", "array")),
    ("binary_data_output_not_bool", _json({**_xj(), "parameters": {"binary_data_output": "yes"}}),
     ("binary_data_output", "bool")),
    ("header_length_beyond_body", _bin(_x_header(), [XB], hlen=100000),
     ("inference-header-content-length", "header", "length")),
    ("header_length_not_a_number", _bin(_x_header(), [XB], hlen="abc"),
     ("inference-header-content-length", "header", "length")),
    ("header_length_negative", _bin(_x_header(), [XB], hlen=-5),
     ("inference-header-content-length", "header", "length")),
    ("header_length_huge", _bin(_x_header(), [XB], hlen=2 ** 64 + 5),
     ("inference-header-content-length", "header", "length")),
    ("header_length_cuts_json", _bin(_x_header(), [XB], hlen=10),
     ("json", "parse", "header", "invalid")),
    ("binary_size_beyond_body", _bin(_x_header(), [XB[:32]]),
     ("binary", "size", "data", "64", "32")),
    ("binary_trailing_bytes", _bin(_x_header(), [XB + XB[:32]]),
     ("binary", "size", "data", "additional", "trailing", "unexpected")),
    ("binary_size_vs_shape", _bin(_x_header(size=60), [XB[:60]]),
     ("60", "64", "byte", "size")),
    ("binary_size_negative", _bin(_x_header(size=-1), [XB]),
     ("binary_data_size", "size", "negative")),
    ("binary_size_not_int", _bin(_x_header(size="64"), [XB]), ("binary_data_size", "size")),
    ("binary_and_json_data", _bin(_x_header(data=XJ), [XB]),
     ("data", "binary", "both")),
    ("binary_huge_claimed_dims", _bin(_x_header(shape=[1, 2 ** 62]), [XB]),
     ("shape", "size", "byte", "16", str(2 ** 62))),
]


@pytest.mark.parametrize("body,headers,words", [(h[1][0], h[1][1], h[2]) for h in HTTP_ONLY],
                         ids=[h[0] for h in HTTP_ONLY])
def test_http_malformed(server, body, headers, words):
    status, _, data = http_request(server.http_url, "POST", "/v2/models/mlp/infer", body,
                                   dict(headers))
    _check_http_reply(status, data, (400,), words, "HTTP")


def test_http_unknown_endpoint(server):
    status, _, _ = http_request(server.http_url, "GET", "/v2/no/such/endpoint")
    assert status in (400, 404), status
    status, _, _ = http_request(server.http_url, "POST", "/v2/models/mlp/nonsense", b"{}")
    assert status in (400, 404, 405), status


# ---- and afterwards ------------------------------------------------------------------

def test_server_still_correct_after_the_corpus(server, gclient, hclient, cases):
    for model, n in (("mlp", 3), ("two_io", 8), ("convnet", 1)):
        case = cases.get(model, n)
        got, _ = grpc_infer_case(gclient, case)
        case.check(got, "grpc after corpus")
        got, _ = http_infer_case(hclient, case, binary_in=False, binary_out=False)
        case.check(got, "http json after corpus")
        got, _ = http_infer_case(hclient, case)
        case.check(got, "http binary after corpus")


UNKNOWN = "Request for unknown model: 'no_such_model' is not found"


def test_unknown_model_in_tritons_words(server, stub):
    """Every per-model call names an unknown model as Triton does, at the
    start of the message, with NOT_FOUND / 404."""
    calls = {
        "ModelMetadata": lambda: stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name="no_such_model"), timeout=30),
        "ModelConfig": lambda: stub.ModelConfig(
            service_pb2.ModelConfigRequest(name="no_such_model"), timeout=30),
        "ModelInfer": lambda: stub.ModelInfer(
            service_pb2.ModelInferRequest(model_name="no_such_model"), timeout=30),
        "RepositoryModelUnload": lambda: stub.RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(model_name="no_such_model"), timeout=30),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as ei:
            call()
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND, f"{name}: {ei.value}"
        assert ei.value.details().startswith(UNKNOWN), f"{name}: {ei.value.details()!r}"
    for method, path in (("GET", "/v2/models/no_such_model"),
                         ("GET", "/v2/models/no_such_model/config"),
                         ("POST", "/v2/models/no_such_model/infer"),
                         ("POST", "/v2/repository/models/no_such_model/unload")):
        status, _, data = http_request(server.http_url, method, path,
                                       b"{}" if method == "POST" else b"",
                                       {"Content-Type": "application/json"})
        assert status == 404, f"{method} {path}: {status} {data!r}"
        assert json.loads(data)["error"].startswith(UNKNOWN), f"{method} {path}: {data!r}"


def test_version_that_is_not_a_number(server, stub):
    """A version string that is not a whole number is INVALID_ARGUMENT / 400;
    a number that is not served stays NOT_FOUND / 404."""
    with pytest.raises(grpc.RpcError) as ei:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="mlp", version="1.0"),
                           timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    assert "from specified version string '1.0'" in ei.value.details()
    for version, want in (("x1", 400), ("01", 400), ("-1", 400), ("2", 404), ("1", 200)):
        status, _, data = http_request(server.http_url, "GET",
                                       f"/v2/models/mlp/versions/{version}")
        assert status == want, f"version {version!r}: {status} {data!r}"


def test_raw_and_typed_contents_mixed(server, stub):
    """An input with typed contents in a request whose raw_input_contents also
    carry bytes for it is refused saying so, in both layouts."""
    a = np.ones((1, 8), F32)

    def request(n_raw: int):
        r = service_pb2.ModelInferRequest(model_name="two_io")
        ta = r.inputs.add(name="a", datatype="FP32", shape=[1, 8])
        ta.contents.fp32_contents.extend(a.ravel().tolist())
        r.inputs.add(name="b", datatype="INT32", shape=[1, 3])
        for _ in range(n_raw):
            r.raw_input_contents.append(np.ones((1, 3), I32).tobytes())
        return r

    for n_raw in (2, 3):
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(request(n_raw), timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
        details = ei.value.details()
        assert ("contents field must not be specified when using raw_input_contents for 'a' "
                "for model 'two_io'") in details, details
        assert "not both" in details, details
    # one raw entry, for b alone, is the mix pjserve accepts
    assert stub.ModelInfer(request(1), timeout=30).raw_output_contents


def test_unsupported_feature_is_not_implemented(server, stub):
    """A feature pjserve does not implement (here client shared memory, off on
    this server) is UNIMPLEMENTED / 501, as Triton answers."""
    doc = {"key": "/pjs_test_not_implemented", "offset": 0, "byte_size": 64}
    status, _, data = http_request(server.http_url, "POST",
                                   "/v2/systemsharedmemory/region/r/register",
                                   json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert status == 501, f"{status} {data!r}"
    assert "shared memory" in json.loads(data)["error"]
    r = service_pb2.SystemSharedMemoryRegisterRequest(name="r", key="/pjs_test_not_implemented",
                                                      offset=0, byte_size=64)
    with pytest.raises(grpc.RpcError) as ei:
        stub.SystemSharedMemoryRegister(r, timeout=30)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED, ei.value
