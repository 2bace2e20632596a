"""Large inputs over gRPC: a request of several MiB, which gRPC hands the
server in many slices and whose tensors pjserve reads where they arrived
(src/frontend/grpc/infer_wire.c), gives exactly what numpy computes, with
tritonclient, with its raw entries anywhere on the wire and on a stream;
the same message truncated or with a length that runs past its end is
refused as malformed (INVALID_ARGUMENT) and the server answers the whole
one next.

The model, exported here: x f32 [batch, 512, 512, 3] (3 MiB a row) and
b f32 [batch, 3] -> twice (x * 2, exact in f32, as large as x) and
mean (mean of x over H and W, plus b).
"""

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from protocol_util import (ServerProcess, finish_checked, grpc_channel, grpc_stub, guard_alive,
                           start_or_fail)
from pjserve_export.jax_export import export_jax

MODEL = "large_input"
SIDE = 512
INFER = "/inference.GRPCInferenceService/ModelInfer"


def _fn(params, x, b):
    return x * params["two"], jnp.mean(x, axis=(1, 2)) + b


@pytest.fixture(scope="module")
def large_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-large-input")
    export_jax(_fn, {"two": np.float32(2.0)},
               [jax.ShapeDtypeStruct((1, SIDE, SIDE, 3), jnp.float32),
                jax.ShapeDtypeStruct((1, 3), jnp.float32)],
               repo, name=MODEL, batch_sizes=[1, 2], input_names=["x", "b"],
               output_names=["twice", "mean"])
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-large-input"), [], "large-input")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(large_server):
    yield from guard_alive(large_server)


def _inputs(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIDE, SIDE, 3), dtype=np.float32)
    b = rng.standard_normal((n, 3), dtype=np.float32)
    return x, b


def _request(x, b):
    """A ModelInferRequest with x and b in raw_input_contents."""
    r = service_pb2.ModelInferRequest(model_name=MODEL)
    for name, a in (("x", x), ("b", b)):
        r.inputs.add(name=name, datatype="FP32", shape=list(a.shape))
        r.raw_input_contents.append(a.tobytes())
    return r


def _send_bytes(server, wire):
    with grpc_channel(server.grpc_url) as ch:
        call = ch.unary_unary(INFER, request_serializer=None, response_deserializer=None)
        return call(wire, timeout=60)


def _check(x, b, twice, mean):
    np.testing.assert_array_equal(twice, x * np.float32(2))
    np.testing.assert_allclose(mean, x.astype(np.float64).mean(axis=(1, 2)) + b,
                               rtol=1e-5, atol=1e-5)


def _outputs(resp):
    got = {}
    for out, raw in zip(resp.outputs, resp.raw_output_contents):
        got[out.name] = np.frombuffer(raw, np.float32).reshape(list(out.shape))
    return got["twice"], got["mean"]


@pytest.mark.parametrize("n", [1, 2])
def test_tritonclient_large_input_matches_numpy(server, n):
    x, b = _inputs(n, seed=n)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        ins = [grpcclient.InferInput("x", list(x.shape), "FP32"),
               grpcclient.InferInput("b", list(b.shape), "FP32")]
        ins[0].set_data_from_numpy(x)
        ins[1].set_data_from_numpy(b)
        result = c.infer(MODEL, ins)
    _check(x, b, result.as_numpy("twice"), result.as_numpy("mean"))


def test_raw_entries_anywhere_on_the_wire(server):
    """Protobuf concatenates repeated fields wherever they appear: x's bytes
    first, then the inputs, then b's bytes, then the model's name."""
    x, b = _inputs(2, seed=7)
    whole = _request(x, b)
    parts = [service_pb2.ModelInferRequest(raw_input_contents=[x.tobytes()]),
             service_pb2.ModelInferRequest(inputs=whole.inputs),
             service_pb2.ModelInferRequest(raw_input_contents=[b.tobytes()]),
             service_pb2.ModelInferRequest(model_name=MODEL)]
    wire = b"".join(p.SerializeToString() for p in parts)
    assert service_pb2.ModelInferRequest.FromString(wire) == whole
    resp = service_pb2.ModelInferResponse.FromString(_send_bytes(server, wire))
    _check(x, b, *_outputs(resp))


def test_stream_of_large_inputs(server):
    inputs = [_inputs(1, seed=20 + i) for i in range(3)]
    requests = [_request(x, b) for x, b in inputs]
    for i, r in enumerate(requests):
        r.id = str(i)
    with grpc_channel(server.grpc_url) as ch:
        answers = list(grpc_stub(ch).ModelStreamInfer(iter(requests), timeout=120))
    assert len(answers) == len(requests)
    for a in answers:
        assert a.error_message == ""
        x, b = inputs[int(a.infer_response.id)]
        _check(x, b, *_outputs(a.infer_response))


def _length_past_end(wire):
    """The last field (b's 12 bytes in raw_input_contents) claiming one
    byte more than the message holds."""
    assert wire[-13] == 12 and wire[-14] == (7 << 3 | 2)
    return wire[:-13] + bytes([13]) + wire[-12:]


@pytest.mark.parametrize("corrupt", [
    lambda w: w[:len(w) // 2],        # cut in the middle of x's bytes
    lambda w: w[:-1],                 # one byte short
    _length_past_end,
], ids=["half", "one_byte_short", "length_past_end"])
def test_malformed_large_message_is_refused(server, corrupt):
    x, b = _inputs(1, seed=3)
    wire = _request(x, b).SerializeToString()
    assert len(wire) > 3 << 20
    with pytest.raises(grpc.RpcError) as ei:
        _send_bytes(server, corrupt(wire))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    # serve's words, or a node's gateway's (which reads the message first)
    assert any(w in ei.value.details() for w in ("malformed ModelInferRequest",
                                                  "not a well-formed protobuf message"))
    # The same bytes whole are answered, on the same server.
    resp = service_pb2.ModelInferResponse.FromString(_send_bytes(server, wire))
    _check(x, b, *_outputs(resp))
