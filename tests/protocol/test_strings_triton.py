"""The models Triton's example clients call, driven the way those clients
drive them, over gRPC and HTTP, with tritonclient.

simple and simple_int8 (plain adders in i32 and i8): INPUT0 = 0..15, INPUT1 =
ones -> OUTPUT0 the sum and OUTPUT1 the difference, with and without
requested outputs, one model in the statistics, and simple_int8 through
gRPC's typed int_contents as grpc_explicit_int8_content_client.py sends it;
the errors grpc_explicit_int_content_client.py and
grpc_explicit_int8_content_client.py look for (typed contents beside
raw_input_contents, a version string that is not a number) in Triton's words;
custom_identity_int32 returning its input to a new client each time, as
memory_growth_test.py calls it.

simple_string (hooks around an adder) and simple_identity (a compute-only
meta) are exported by python/pjserve_export/triton_examples.py, as `make
models` exports them. The checks are the examples' own: two BYTES [1, 16]
tensors of numerals in, OUTPUT0 and OUTPUT1 parsed as integers equal to
the sum and the difference; identity returns "he\\x00llo" strings and
4-byte binary blobs unchanged, over gRPC, HTTP binary and HTTP JSON; the
same through system shared memory, where the output regions are exactly
the serialized size of the expected results. Beyond the examples: batches
up to Triton's max_batch_size 8 (and the refusal past it), concurrent
requests, negative and signed numerals, every byte value through identity,
the model metadata and configuration clients read, and bad input (a
numeral that does not parse, one outside the 32-bit range, a sum or
difference that overflows) refused with INVALID_ARGUMENT (HTTP 400)
naming the element.
"""

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from pjserve_export import hooks as H
from pjserve_export.triton_examples import export_triton_example
from protocol_util import ServerProcess, finish_checked, grpc_code, guard_alive, start_or_fail

WIDTH = 16


@pytest.fixture(scope="module")
def strings_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-triton-strings")
    build = H.hooks_builder(pjserve_bin)
    for name in ("simple", "simple_int8", "custom_identity_int32", "simple_string",
                 "simple_identity"):
        export_triton_example(name, repo, build=build)
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-triton-strings"), ["--allow-client-shm"],
                      "triton-strings")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(strings_server):
    yield from guard_alive(strings_server)


@pytest.mark.parametrize("model,dtype,kserve", [("simple", np.int32, "INT32"),
                                                 ("simple_int8", np.int8, "INT8")])
@pytest.mark.parametrize("requested", [True, False], ids=["outputs", "no-outputs"])
def test_simple_sum_and_difference(gclient, hclient, model, dtype, kserve, requested):
    a = np.arange(16, dtype=dtype).reshape(1, 16)
    b = np.ones((1, 16), dtype)
    for mod, client in ((grpcclient, gclient), (httpclient, hclient)):
        inputs = [mod.InferInput("INPUT0", [1, 16], kserve), mod.InferInput("INPUT1", [1, 16], kserve)]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        outputs = ([mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
                   if requested else None)
        r = client.infer(model, inputs, outputs=outputs)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert len(gclient.get_inference_statistics(model_name=model).model_stats) == 1


def test_custom_identity_int32_repeated_on_new_connections(server):
    """As memory_growth_test.py: a new client per request, INPUT0 = 0..15
    back unchanged as OUTPUT0, on both protocols."""
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(5):
        for mod, url in ((grpcclient, server.grpc_url), (httpclient, server.http_url)):
            client = mod.InferenceServerClient(url)
            i = mod.InferInput("INPUT0", [1, 16], "INT32")
            i.set_data_from_numpy(x)
            r = client.infer("custom_identity_int32", [i],
                             outputs=[mod.InferRequestedOutput("OUTPUT0")])
            got = r.as_numpy("OUTPUT0")
            assert got.dtype == x.dtype and got.shape == x.shape
            np.testing.assert_array_equal(got, x)
            client.close()


def explicit_contents_request(model, datatype):
    """INPUT0 = 0..15 and INPUT1 = ones in gRPC's typed int_contents (32-bit
    slots whatever the datatype), as grpc_explicit_int{,8}_content_client.py
    build their request."""
    req = service_pb2.ModelInferRequest(model_name=model)
    for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
        t = req.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        t.contents.int_contents[:] = values
    for name in ("OUTPUT0", "OUTPUT1"):
        req.outputs.add(name=name)
    return req


def grpc_model_infer(server, req):
    with grpc.insecure_channel(server.grpc_url) as channel:
        return service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)


def test_simple_int8_typed_int_contents(server):
    """INT8 elements in gRPC's int_contents (32-bit slots), as Triton's example sends them."""
    resp = grpc_model_infer(server, explicit_contents_request("simple_int8", "INT8"))
    got = {o.name: np.frombuffer(raw, np.int8)
           for o, raw in zip(resp.outputs, resp.raw_output_contents)}
    np.testing.assert_array_equal(got["OUTPUT0"], np.arange(16) + 1)
    np.testing.assert_array_equal(got["OUTPUT1"], np.arange(16) - 1)


def test_contents_beside_raw_refused_in_tritons_words(server):
    """grpc_explicit_int_content_client.py's last step: half of INPUT0 in
    raw_input_contents, the other half in its int_contents (so the element
    count is wrong too). It prints PASS only when the error holds Triton's
    words, a substring check; REST has no typed contents, so no equivalent."""
    req = explicit_contents_request("simple", "INT32")
    req.raw_input_contents.extend([np.arange(8).tobytes()])
    req.inputs[0].contents.int_contents[:] = list(range(8, 16))
    with pytest.raises(grpc.RpcError) as ei:
        grpc_model_infer(server, req)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    assert ("contents field must not be specified when using raw_input_contents for 'INPUT0' "
            "for model 'simple'") in str(ei.value), ei.value.details()


def test_bad_version_string_refused_in_tritons_words(server, hclient):
    """grpc_explicit_int8_content_client.py's last step: model_version
    "wrong_specification", refused in Triton's words (its PASS is a
    substring check) and pjserve's hint after them; the same over REST's
    /versions/ path."""
    words = "failed to get model version from specified version string 'wrong_specification'"
    req = explicit_contents_request("simple_int8", "INT8")
    req.model_version = "wrong_specification"
    with pytest.raises(grpc.RpcError) as ei:
        grpc_model_infer(server, req)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    assert words in str(ei.value) and "whole number" in ei.value.details(), ei.value.details()
    inputs = [httpclient.InferInput(n, [1, 16], "INT8") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), np.int8))
    with pytest.raises(InferenceServerException) as ei:
        hclient.infer("simple_int8", inputs, model_version="wrong_specification")
    assert ei.value.status() == "400" and words in str(ei.value), ei.value


def numerals(values) -> np.ndarray:
    """An int array as an object array of UTF-8 numerals, same shape."""
    values = np.asarray(values)
    return np.array([str(v).encode() for v in values.flatten()],
                    dtype=np.object_).reshape(values.shape)


def example_operands():
    """The examples' operands: 0..15 and sixteen ones, one row."""
    return np.arange(WIDTH, dtype=np.int32)[None, :], np.ones((1, WIDTH), np.int32)


def check_sums(result, a, b):
    """What the examples check: each output element read as an integer."""
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == a.shape and out1.shape == a.shape
    assert out0.dtype == np.object_ and out1.dtype == np.object_
    assert [[int(x) for x in row] for row in out0] == (a + b).tolist()
    assert [[int(x) for x in row] for row in out1] == (a - b).tolist()
    # Written as numerals with nothing around them, as the shm example
    # compares them byte for byte.
    # (JSON outputs come back as str.)
    text = [x.encode() if isinstance(x, str) else x for x in out0.flatten()]
    assert text == numerals(a + b).flatten().tolist()


# ---- simple_string, as simple_*_string_infer_client.py ----------------------------

def string_infer_grpc(gclient, a, b):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "BYTES"),
              grpcclient.InferInput("INPUT1", list(b.shape), "BYTES")]
    inputs[0].set_data_from_numpy(numerals(a))
    inputs[1].set_data_from_numpy(numerals(b))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"),
               grpcclient.InferRequestedOutput("OUTPUT1")]
    return gclient.infer("simple_string", inputs, outputs=outputs)


def string_infer_http(hclient, a, b, binary=(True, False)):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "BYTES"),
              httpclient.InferInput("INPUT1", list(b.shape), "BYTES")]
    inputs[0].set_data_from_numpy(numerals(a), binary_data=binary[0])
    inputs[1].set_data_from_numpy(numerals(b), binary_data=binary[1])
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary[0]),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary[1])]
    return hclient.infer("simple_string", inputs, outputs=outputs)


def test_simple_string_grpc(gclient):
    a, b = example_operands()
    check_sums(string_infer_grpc(gclient, a, b), a, b)


@pytest.mark.parametrize("binary", [(True, False), (False, True), (True, True), (False, False)])
def test_simple_string_http(hclient, binary):
    a, b = example_operands()
    check_sums(string_infer_http(hclient, a, b, binary), a, b)


def test_simple_string_batches_and_signs(gclient, hclient):
    rng = np.random.default_rng(3)
    for rows in (1, 3, 8):
        a = rng.integers(-10**9, 10**9, (rows, WIDTH), dtype=np.int64).astype(np.int32)
        b = rng.integers(-10**9, 10**9, (rows, WIDTH), dtype=np.int64).astype(np.int32)
        check_sums(string_infer_grpc(gclient, a, b), a, b)
        check_sums(string_infer_http(hclient, a, b), a, b)
    # The extremes that fit, a "+" sign and leading zeros.
    a = np.array([[2**31 - 1, -2**31, -5, 0] * 4], np.int64)
    b = np.array([[0, 0, 7, 0] * 4], np.int64)
    check_sums(string_infer_grpc(gclient, a, b), a, b)
    i0 = grpcclient.InferInput("INPUT0", [1, WIDTH], "BYTES")
    i1 = grpcclient.InferInput("INPUT1", [1, WIDTH], "BYTES")
    i0.set_data_from_numpy(np.array([[b"+12", b"007", b"-0"] + [b"1"] * 13], np.object_))
    i1.set_data_from_numpy(np.array([[b"1"] * WIDTH], np.object_))
    r = gclient.infer("simple_string", [i0, i1])
    assert r.as_numpy("OUTPUT0")[0, :3].tolist() == [b"13", b"8", b"1"]
    assert r.as_numpy("OUTPUT1")[0, :3].tolist() == [b"11", b"6", b"-1"]


def test_simple_string_concurrent(gclient, server):
    """Concurrent requests (coalesced into batches by the scheduler) each get
    their own rows back."""
    def one(k):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            a = np.full((1 + k % 3, WIDTH), k, np.int32)
            b = np.arange(WIDTH, dtype=np.int32)[None, :].repeat(a.shape[0], 0)
            check_sums(string_infer_grpc(c, a, b), a, b)
        finally:
            c.close()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(32)))


def test_simple_string_past_max_batch_size(gclient, hclient):
    a = np.zeros((9, WIDTH), np.int32)
    with pytest.raises(InferenceServerException) as e:
        string_infer_grpc(gclient, a, a)
    assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
    # Refused by the server before preprocess: batched client rows are rows of
    # the executable's batch (hooks.md, "Rows and batching").
    message = "batch size 9 is outside 1..8 (the model's max_batch_size)"
    assert message in e.value.message(), e.value
    with pytest.raises(InferenceServerException) as e:
        string_infer_http(hclient, a, a)
    assert e.value.status() == "400" and message in e.value.message(), e.value


@pytest.mark.parametrize("row,bad,message", [
    (0, b"x3", 'INPUT1[0][3]: "x3" is not an integer numeral (an optional sign, then decimal '
               'digits)'),
    (1, b"", 'INPUT1[1][3]: "" is not an integer numeral'),
    (0, b"-", 'INPUT1[0][3]: "-" is not an integer numeral'),
    (0, b" 4", 'INPUT1[0][3]: " 4" is not an integer numeral'),
    (0, b"4\x00", 'INPUT1[0][3]: "4\\x00" is not an integer numeral'),
    (1, b"2147483648", 'INPUT1[1][3]: "2147483648" is out of range: numerals must lie in '
                       '-2147483648..2147483647'),
    (0, b"-99999999999999999999999", 'INPUT1[0][3]: "-99999999999999999999999" is out of range'),
])
def test_simple_string_bad_numerals(gclient, hclient, row, bad, message):
    a = numerals(np.zeros((2, WIDTH), np.int32))
    b = a.copy()
    b[row, 3] = bad
    for protocol in ("grpc", "http"):
        client, mod = (gclient, grpcclient) if protocol == "grpc" else (hclient, httpclient)
        inputs = [mod.InferInput("INPUT0", [2, WIDTH], "BYTES"),
                  mod.InferInput("INPUT1", [2, WIDTH], "BYTES")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple_string", inputs)
        if protocol == "grpc":
            assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
        else:
            assert e.value.status() == "400", e.value
        assert message in e.value.message(), e.value


@pytest.mark.parametrize("a,b,message", [
    (2**31 - 1, 1, "element [0][5]: the sum of 2147483647 and 1 is 2147483648, outside the "
                   "32-bit range of the results"),
    (-2**31, 1, "element [0][5]: the difference of -2147483648 and 1 is -2147483649"),
    (-2**31, -2**31, "the sum of -2147483648 and -2147483648 is -4294967296"),
])
def test_simple_string_overflow(gclient, hclient, a, b, message):
    x = np.zeros((1, WIDTH), np.int64)
    y = np.zeros((1, WIDTH), np.int64)
    x[0, 5], y[0, 5] = a, b
    with pytest.raises(InferenceServerException) as e:
        string_infer_grpc(gclient, x, y)
    assert grpc_code(e.value) == "INVALID_ARGUMENT" and message in e.value.message(), e.value
    with pytest.raises(InferenceServerException) as e:
        string_infer_http(hclient, x, y)
    assert e.value.status() == "400" and message in e.value.message(), e.value


def test_simple_string_metadata_and_config(gclient, hclient):
    for meta in (gclient.get_model_metadata("simple_string", as_json=True),
                 hclient.get_model_metadata("simple_string")):
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] \
            == [("INPUT0", "BYTES", [-1, WIDTH]), ("INPUT1", "BYTES", [-1, WIDTH])]
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]])
                for t in meta["outputs"]] \
            == [("OUTPUT0", "BYTES", [-1, WIDTH]), ("OUTPUT1", "BYTES", [-1, WIDTH])]
    config = hclient.get_model_config("simple_string")
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == \
        [("INPUT0", "TYPE_STRING", [WIDTH]), ("INPUT1", "TYPE_STRING", [WIDTH])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == \
        [("OUTPUT0", "TYPE_STRING", [WIDTH]), ("OUTPUT1", "TYPE_STRING", [WIDTH])]
    g = gclient.get_model_config("simple_string", as_json=True)["config"]
    assert int(g["max_batch_size"]) == 8


# ---- simple_identity, as the examples' identity_inference -------------------------

def null_chars():
    return np.array(["he\x00llo".encode() for _ in range(WIDTH)], np.object_).reshape(1, WIDTH)


def blobs():
    return np.array([b"\x00\x01\x02\x03" for _ in range(WIDTH)], np.bytes_).reshape(1, WIDTH)


def identity(client, mod, array, **binary):
    inp = mod.InferInput("INPUT0", list(array.shape), "BYTES")
    inp.set_data_from_numpy(array, **binary)
    out = mod.InferRequestedOutput("OUTPUT0", **binary)
    return client.infer("simple_identity", [inp], outputs=[out]).as_numpy("OUTPUT0")


def check_identity(sent, got, json_strings=False):
    """The examples' checks: object arrays equal as they are (or, from JSON,
    once the strings are encoded again); np.bytes_ arrays equal once the
    results are turned into str and encoded."""
    if sent.dtype == np.object_:
        if json_strings:
            got = np.array([str(x).encode("utf-8") for x in got.flatten()],
                           np.object_).reshape(got.shape)
        assert np.array_equal(sent, got), got
    else:
        assert np.array_equal(sent, np.char.encode(got.astype(str))), got


def test_simple_identity_grpc(gclient):
    for array in (null_chars(), blobs()):
        check_identity(array, identity(gclient, grpcclient, array))


@pytest.mark.parametrize("binary", [True, False])
def test_simple_identity_http(hclient, binary):
    for array in (null_chars(), blobs()):
        got = identity(hclient, httpclient, array, binary_data=binary)
        check_identity(array, got, json_strings=not binary)


def test_simple_identity_any_bytes(gclient, hclient):
    """Every byte value, empty strings, long ones, rows of other widths."""
    strings = [bytes(range(256)), b"", b"\xff\xfe\x00", b"x" * 100000, "\u00e9t\u00e9".encode()]
    for shape in ((1, 5), (5, 1)):
        array = np.array(strings, np.object_).reshape(shape)
        assert identity(gclient, grpcclient, array).tolist() == array.tolist()
        assert identity(hclient, httpclient, array, binary_data=True).tolist() == array.tolist()
    one = np.array([[b"only"]], np.object_)
    assert identity(gclient, grpcclient, one).tolist() == [[b"only"]]


def test_simple_identity_metadata(gclient):
    meta = gclient.get_model_metadata("simple_identity", as_json=True)
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("INPUT0", "BYTES")]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [("OUTPUT0", "BYTES")]
    # Rank 2 as Triton's [batch, -1]: a flat list of strings is not it.
    inp = grpcclient.InferInput("INPUT0", [WIDTH], "BYTES")
    inp.set_data_from_numpy(np.array([b"a"] * WIDTH, np.object_))
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple_identity", [inp])
    assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value


# ---- simple_string through system shared memory, as simple_*_shm_string_client.py ----

@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_simple_string_shared_memory(server, protocol):
    mod = grpcclient if protocol == "grpc" else httpclient
    client = (grpcclient.InferenceServerClient(server.grpc_url) if protocol == "grpc"
              else httpclient.InferenceServerClient(server.http_url))
    a, b = np.arange(WIDTH, dtype=np.int32), np.ones(WIDTH, np.int32)
    in0, in1 = numerals(a), numerals(b)
    want0, want1 = numerals(a + b), numerals(a - b)
    serialized = [utils.serialize_byte_tensor(x) for x in (in0, in1, want0, want1)]
    sizes = [utils.serialized_byte_size(s) for s in serialized]
    names = [f"{protocol}_{n}" for n in ("input0", "input1", "output0", "output1")]
    keys = [f"/pjs_test_triton_{n}" for n in names]
    handles = []
    try:
        client.unregister_system_shared_memory()
        for name, key, size in zip(names, keys, sizes):
            handles.append(shm.create_shared_memory_region(name, key, size))
            client.register_system_shared_memory(name, key, size)
        shm.set_shared_memory_region(handles[0], [serialized[0]])
        shm.set_shared_memory_region(handles[1], [serialized[1]])
        inputs = [mod.InferInput("INPUT0", [1, WIDTH], "BYTES"),
                  mod.InferInput("INPUT1", [1, WIDTH], "BYTES")]
        inputs[0].set_shared_memory(names[0], sizes[0])
        inputs[1].set_shared_memory(names[1], sizes[1])
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(names[2], sizes[2])  # exactly the results' size
        outputs[1].set_shared_memory(names[3], sizes[3])
        result = client.infer("simple_string", inputs, outputs=outputs)
        for k, want in ((2, want0), (3, want1)):
            out = result.get_output(f"OUTPUT{k - 2}")
            assert out is not None
            datatype = out.datatype if protocol == "grpc" else out["datatype"]
            shape = list(out.shape) if protocol == "grpc" else out["shape"]
            assert datatype == "BYTES" and shape == [1, WIDTH]
            got = shm.get_contents_as_numpy(handles[k], utils.triton_to_np_dtype(datatype),
                                            shape)
            assert got[0].tolist() == want.tolist()
    finally:
        client.unregister_system_shared_memory()
        for h in handles:
            shm.destroy_shared_memory_region(h)
        client.close()
