"""Strings (KServe BYTES) over every way a client sends and receives them:
gRPC raw contents and typed bytes_contents, HTTP JSON strings and binary
data, and system shared memory, with tritonclient (and by hand where
tritonclient cannot make the request).

The model is a compute-only meta bundle written and built here: it returns
its strings as they came (OUTPUT0) and each string's length (LENGTHS).
Strings include the empty string, embedded NULs, bytes that are not UTF-8,
every byte value and a 3 MB element. Malformed length prefixes and element
counts that do not match the shape are refused with INVALID_ARGUMENT (HTTP
400) and a message saying where. A string output that is not UTF-8 asked
for as JSON is written with its bytes as they are, as Triton's server does:
tritonclient then asks for binary data.
"""

import json
import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import (InferenceServerException, deserialize_bytes_tensor,
                                serialize_byte_tensor)

import grpc
from bundle_code import tensor_yaml, write_meta
from protocol_util import (ServerProcess, binary_infer_body, finish_checked, grpc_code, guard_alive,
                           http_request, start_or_fail)

MODEL = "strings"

SOURCE = r"""
    /* strings: OUTPUT0 is INPUT0 as it came; LENGTHS the length of each string. */
    #include <pjserve/model.h>

    PJSERVE_EXPORT int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                                   pjserve_tensor *out, size_t n_out)
    {
        (void)n_in;
        (void)n_out;
        int64_t n = pjserve_numel(&in[0]);
        int32_t *lengths = pjserve_alloc(ctx, (size_t)(n > 0 ? n : 1) * sizeof *lengths);
        if (lengths == NULL) {
            pjserve_error(ctx, "out of memory for %lld lengths", (long long)n);
            return PJSERVE_RESOURCE_EXHAUSTED;
        }
        pjserve_bytes_reader r = pjserve_bytes_begin(&in[0]);
        const char *s;
        uint32_t len;
        int64_t i = 0;
        while (pjserve_bytes_next(&r, &s, &len))
            lengths[i++] = (int32_t)len;
        for (int k = 0; k < 2; k++) {
            out[0].shape[k] = in[0].shape[k];
            out[1].shape[k] = in[0].shape[k];
        }
        out[0].data = in[0].data;
        out[0].nbytes = in[0].nbytes;
        out[1].data = lengths;
        out[1].nbytes = (size_t)n * sizeof *lengths;
        return PJSERVE_OK;
    }
"""

# Strings any client may send: valid UTF-8 (JSON can carry them).
TEXT = [b"", b"hello", b"a\x00b\x00", "tr\u00e8s \u00fcn\u00efcode \u2713 \U0001F600".encode(),
        b'quote " backslash \\ newline \n tab \t bell \x07', b"x" * 1000]
# And bytes that are not UTF-8: binary paths only.
BLOBS = TEXT + [b"\xff\xfe\xfd", bytes(range(256)), b"\x80" + b"\x00" * 7]
LARGE = bytes(range(256)) * (3 * 4096)  # 3 MiB


def serialize(strings) -> bytes:
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


def as_array(strings, shape=None):
    a = np.array(strings, dtype=np.object_)
    return a.reshape(shape if shape is not None else (len(strings), 1))


@pytest.fixture(scope="module")
def strings_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-strings")
    write_meta(repo, MODEL, [], tensor_yaml("INPUT0", "bytes", [-1, -1]),
               tensor_yaml("OUTPUT0", "bytes", [-1, -1]) + tensor_yaml("LENGTHS", "i32", [-1, -1]),
               SOURCE, pjserve_bin)
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-strings"), ["--allow-client-shm"], "strings")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(strings_server):
    yield from guard_alive(strings_server)


@pytest.fixture
def hclient(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    yield c
    c.close()


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url, options=[
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20)])
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def check_result(outputs, strings, shape):
    """outputs: name -> numpy array as tritonclient hands it back."""
    got = outputs["OUTPUT0"]
    assert got.shape == shape and got.dtype == np.object_
    assert [bytes(x) if not isinstance(x, str) else x.encode() for x in got.ravel()] == \
        list(strings)
    lengths = outputs["LENGTHS"]
    assert lengths.shape == shape and lengths.dtype == np.int32
    assert lengths.ravel().tolist() == [len(s) for s in strings]


# ---- metadata --------------------------------------------------------------

def test_metadata_and_config(gclient, hclient):
    md = gclient.get_model_metadata(MODEL)
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == \
        [("INPUT0", "BYTES", [-1, -1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == \
        [("OUTPUT0", "BYTES", [-1, -1]), ("LENGTHS", "INT32", [-1, -1])]
    cfg = gclient.get_model_config(MODEL).config
    assert cfg.input[0].data_type == model_config_pb2.TYPE_STRING
    assert [o.data_type for o in cfg.output] == [model_config_pb2.TYPE_STRING,
                                                 model_config_pb2.TYPE_INT32]
    hmd = hclient.get_model_metadata(MODEL)
    assert hmd["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}]
    hcfg = hclient.get_model_config(MODEL)
    assert hcfg["input"][0]["data_type"] == "TYPE_STRING"
    assert [o["data_type"] for o in hcfg["output"]] == ["TYPE_STRING", "TYPE_INT32"]


# ---- gRPC ------------------------------------------------------------------

@pytest.mark.parametrize("strings", [BLOBS, [b""], [LARGE, b"", LARGE[:5]]],
                         ids=["mixed", "one_empty", "large"])
def test_grpc_raw_round_trip(gclient, strings):
    inp = grpcclient.InferInput("INPUT0", [len(strings), 1], "BYTES")
    inp.set_data_from_numpy(as_array(strings))
    r = gclient.infer(MODEL, [inp])
    assert r.get_output("OUTPUT0").datatype == "BYTES"
    check_result({n: r.as_numpy(n) for n in ("OUTPUT0", "LENGTHS")}, strings, (len(strings), 1))


def test_grpc_raw_two_dimensions(gclient):
    strings = BLOBS[:6]
    inp = grpcclient.InferInput("INPUT0", [2, 3], "BYTES")
    inp.set_data_from_numpy(as_array(strings, (2, 3)))
    r = gclient.infer(MODEL, [inp])
    check_result({n: r.as_numpy(n) for n in ("OUTPUT0", "LENGTHS")}, strings, (2, 3))


def test_grpc_typed_bytes_contents(stub):
    """tritonclient sends raw contents only: typed bytes_contents by hand."""
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[len(BLOBS) + 1, 1])
    t.contents.bytes_contents.extend(BLOBS + [LARGE])
    resp = stub.ModelInfer(req, timeout=120)
    names = [o.name for o in resp.outputs]
    assert names == ["OUTPUT0", "LENGTHS"]
    assert resp.outputs[0].datatype == "BYTES"
    assert list(resp.outputs[0].shape) == [len(BLOBS) + 1, 1]
    assert resp.raw_output_contents[0] == serialize(BLOBS + [LARGE])
    got = deserialize_bytes_tensor(resp.raw_output_contents[0])
    assert [bytes(x) for x in got] == BLOBS + [LARGE]
    assert np.frombuffer(resp.raw_output_contents[1], np.int32).tolist() == \
        [len(s) for s in BLOBS + [LARGE]]


def grpc_error(stub, req):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=60)
    return e.value.code(), e.value.details()


@pytest.mark.parametrize("raw,shape,words", [
    (serialize([b"ab"]) + struct.pack("<I", 100) + b"xyz", [2, 1],
     "malformed BYTES data: element 1 at offset 6 has length 100 but only 3 bytes are left"),
    (serialize([b"ab", b"c"]) + b"\x01\x00", [3, 1],
     "malformed BYTES data: element 2 starts at offset 11 but only 2 bytes are left, too few "
     "for its 4-byte length"),
    (b"\xff\xff\xff\xff" + b"abc", [1, 1],
     "element 0 at offset 0 has length 4294967295 but only 3 bytes are left"),
    (serialize([b"a", b"b", b"c"]), [2, 2],
     "the BYTES data holds 3 elements but shape [2, 2] has 4"),
    (serialize([b"a", b"b", b"c"]), [1, 2],
     "the BYTES data holds 3 elements but shape [1, 2] has 2"),
], ids=["length_past_end", "prefix_cut", "length_huge", "too_few", "too_many"])
def test_grpc_raw_refused(stub, raw, shape, words):
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
    req.raw_input_contents.append(raw)
    code, details = grpc_error(stub, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert f'model {MODEL}: input "INPUT0": ' in details and words in details, details


def test_grpc_typed_refused(stub):
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[4, 1])
    t.contents.bytes_contents.extend([b"a", b"b", b"c"])
    code, details = grpc_error(stub, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert 'input "INPUT0": bytes_contents holds 3 elements but the shape has 4' in details
    t.contents.bytes_contents.append(b"d")
    t.contents.int_contents.append(1)
    code, details = grpc_error(stub, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "BYTES elements belong in bytes_contents, not int_contents" in details


def test_grpc_wrong_datatype(gclient):
    inp = grpcclient.InferInput("INPUT0", [2, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException) as e:
        gclient.infer(MODEL, [inp])
    assert grpc_code(e.value) == "INVALID_ARGUMENT"
    assert "datatype INT32 does not match the model's BYTES" in e.value.message()


# ---- HTTP ------------------------------------------------------------------

def http_infer(hclient, strings, shape, binary_in, binary_out):
    inp = httpclient.InferInput("INPUT0", list(shape), "BYTES")
    inp.set_data_from_numpy(as_array(strings, shape), binary_data=binary_in)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary_out)
            for n in ("OUTPUT0", "LENGTHS")]
    return hclient.infer(MODEL, [inp], outputs=outs)


@pytest.mark.parametrize("binary_out", [False, True], ids=["json_out", "binary_out"])
@pytest.mark.parametrize("shape", [(6, 1), (2, 3)], ids=["column", "matrix"])
def test_http_json_round_trip(hclient, shape, binary_out):
    """JSON strings in (nested as the shape); JSON or binary out."""
    r = http_infer(hclient, TEXT, shape, binary_in=False, binary_out=binary_out)
    check_result({n: r.as_numpy(n) for n in ("OUTPUT0", "LENGTHS")}, TEXT, shape)


@pytest.mark.parametrize("strings", [BLOBS, [LARGE, b""]], ids=["mixed", "large"])
def test_http_binary_round_trip(hclient, strings):
    r = http_infer(hclient, strings, (len(strings), 1), binary_in=True, binary_out=True)
    check_result({n: r.as_numpy(n) for n in ("OUTPUT0", "LENGTHS")}, strings,
                 (len(strings), 1))


def test_http_json_escapes_by_hand(server):
    """What a JSON client reads: escapes decoded, NUL characters kept."""
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2],
                       "data": [["", "a\u0000b"], ["\"q\\\n\t", "tr\u00e8s"]]}]}
    status, _, body = http_request(server.http_url, "POST", f"/v2/models/{MODEL}/infer",
                                   json.dumps(doc).encode(),
                                   {"Content-Type": "application/json"})
    assert status == 200, body
    out = json.loads(body)["outputs"]
    assert out[0] == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2, 2],
                      "data": ["", "a\u0000b", "\"q\\\n\t", "tr\u00e8s"]}
    assert out[1]["data"] == [0, 3, 5, 5]


def test_http_not_utf8_as_json_is_written_as_is(server, hclient):
    """Bytes that are not UTF-8 asked for as JSON: copied into the JSON
    string unchanged (Triton's server does the same), which JSON clients
    cannot read; tritonclient says to ask for binary data."""
    blob = b"\xff\xfe ok \x80"
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                          "parameters": {"binary_data_size": len(serialize([blob]))}}],
              "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    body, headers = binary_infer_body(header, [serialize([blob])])
    status, hdrs, data = http_request(server.http_url, "POST", f"/v2/models/{MODEL}/infer",
                                      body, headers)
    assert status == 200, data
    assert b'"data":["\xff\xfe ok \x80"]' in data
    with pytest.raises(InferenceServerException) as e:
        http_infer(hclient, [blob], (1, 1), binary_in=True, binary_out=False)
    assert "binary_data=True" in e.value.message()


def http_error(server, body, headers):
    status, _, data = http_request(server.http_url, "POST", f"/v2/models/{MODEL}/infer", body,
                                   headers)
    return status, json.loads(data)["error"]


@pytest.mark.parametrize("raw,shape,words", [
    (serialize([b"ab"]) + struct.pack("<I", 100) + b"xyz", [2, 1],
     "malformed BYTES data: element 1 at offset 6 has length 100 but only 3 bytes are left"),
    (serialize([b"ab", b"c"]) + b"\x01", [3, 1],
     "element 2 starts at offset 11 but only 1 bytes are left"),
    (serialize([b"a", b"b", b"c"]), [2, 2], "the BYTES data holds 3 elements but shape [2, 2] "
                                            "has 4"),
], ids=["length_past_end", "prefix_cut", "count"])
def test_http_binary_refused(server, raw, shape, words):
    header = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": shape,
                          "parameters": {"binary_data_size": len(raw)}}]}
    body, headers = binary_infer_body(header, [raw])
    status, msg = http_error(server, body, headers)
    assert status == 400 and f'model {MODEL}: input "INPUT0": ' in msg and words in msg, msg


@pytest.mark.parametrize("data,words", [
    (["a", "b", "c"], 'input "INPUT0": "data" holds 3 strings but the shape needs 4'),
    (["a", "b", "c", 4], '"data" element 3 is not a string; BYTES elements are JSON strings'),
    ("abcd", '"data" must be a list of strings'),
], ids=["count", "number", "not_a_list"])
def test_http_json_refused(server, data, words):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2], "data": data}]}
    status, msg = http_error(server, json.dumps(doc).encode(),
                             {"Content-Type": "application/json"})
    assert status == 400 and words in msg, msg


# ---- system shared memory --------------------------------------------------

@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory_round_trip(server, protocol, request):
    client_mod = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = client_mod.InferenceServerClient(url)
    strings = BLOBS + [LARGE]
    size = len(serialize(strings))
    tag = f"{protocol}_{request.node.name[-8:]}".replace("[", "").replace("]", "")
    in_key, out_key = f"/pjs_bytes_in_{tag}", f"/pjs_bytes_out_{tag}"
    h_in = shm.create_shared_memory_region("bytes_in", in_key, size)
    h_out = shm.create_shared_memory_region("bytes_out", out_key, size)
    try:
        shm.set_shared_memory_region(h_in, [serialize_byte_tensor(as_array(strings))])
        client.register_system_shared_memory("bytes_in", in_key, size)
        client.register_system_shared_memory("bytes_out", out_key, size)
        inp = client_mod.InferInput("INPUT0", [len(strings), 1], "BYTES")
        inp.set_shared_memory("bytes_in", size)
        out = client_mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("bytes_out", size)
        lengths = client_mod.InferRequestedOutput("LENGTHS")
        r = client.infer(MODEL, [inp], outputs=[out, lengths])
        view = shm.get_contents_as_numpy(h_out, np.object_, [len(strings), 1])
        got = [bytes(x) for x in view.ravel()]
        del view
        assert got == strings
        assert r.as_numpy("LENGTHS").ravel().tolist() == [len(s) for s in strings]

        # An output region one byte short of the strings is refused.
        out.set_shared_memory("bytes_out", size - 1)
        with pytest.raises(InferenceServerException) as e:
            client.infer(MODEL, [inp], outputs=[out])
        assert f'output "OUTPUT0" is {size} bytes but shared memory region "bytes_out" was ' \
               f'given {size - 1}' in e.value.message()

        # A malformed serialization in the region is refused like a raw one.
        shm.set_shared_memory_region(h_in, [np.frombuffer(b"\x09\x00\x00\x00abc", np.uint8)])
        inp = client_mod.InferInput("INPUT0", [1, 1], "BYTES")
        inp.set_shared_memory("bytes_in", 7)
        with pytest.raises(InferenceServerException) as e:
            client.infer(MODEL, [inp])
        assert "malformed BYTES data: element 0 at offset 0 has length 9 but only 3 bytes " \
               "are left" in e.value.message()
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
