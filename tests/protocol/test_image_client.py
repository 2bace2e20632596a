"""An image classification client's view of the demo image_convnet, on both
protocols: what such a client (Triton's example image client among them)
reads before it sends anything, and the classified results it parses.

Before sending, the client holds the model to: one input and one output in
the metadata and one input in the configuration; an FP32 output that is a
vector (every extent but the batch axis's and one other is 1); a positive
max_batch_size, so the input's shape is the batch axis and three more; the
input's format FORMAT_NHWC or FORMAT_NCHW, which tells it where height,
width and channels are. It then sends a batch of images as FP32 rows in that
layout (pixels 0..255, unscaled), asks for the output with a class count,
and splits each result "score:index:label" on ':' expecting three fields.
Checked here: those facts from the metadata and configuration (gRPC and
HTTP), and the top 3 of batches of 1 and 2 images (2 is not a compiled batch
size) against the JAX reference, including the request id coming back.
"""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as mc
import tritonclient.http as httpclient

from pjserve_export.demo import IMAGE_CLASSES

MODEL = "image_convnet"
CLASS_COUNT = 3
HEIGHT, WIDTH, CHANNELS = 32, 32, 3


def _grpc_view(gclient):
    """(metadata inputs, metadata outputs, config) as plain values."""
    md = gclient.get_model_metadata(MODEL)
    cfg = gclient.get_model_config(MODEL).config
    ins = [(t.name, t.datatype, list(t.shape)) for t in md.inputs]
    outs = [(t.name, t.datatype, list(t.shape)) for t in md.outputs]
    formats = [mc.ModelInput.Format.Name(i.format) for i in cfg.input]
    return ins, outs, cfg.max_batch_size, formats


def _http_view(hclient):
    md = hclient.get_model_metadata(MODEL)
    cfg = hclient.get_model_config(MODEL)
    ins = [(t["name"], t["datatype"], list(t["shape"])) for t in md["inputs"]]
    outs = [(t["name"], t["datatype"], list(t["shape"])) for t in md["outputs"]]
    formats = [i.get("format", "FORMAT_NONE") for i in cfg["input"]]
    return ins, outs, cfg["max_batch_size"], formats


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_model_is_shaped_for_image_clients(gclient, hclient, protocol):
    ins, outs, max_batch_size, formats = \
        _grpc_view(gclient) if protocol == "grpc" else _http_view(hclient)
    assert len(ins) == 1 and len(outs) == 1 and len(formats) == 1
    assert max_batch_size > 0
    (in_name, in_dtype, in_shape), = ins
    (out_name, out_dtype, out_shape), = outs
    assert out_dtype == "FP32"
    # A vector: besides the batch axis exactly one extent is not 1.
    assert out_shape[0] == -1 and [d for d in out_shape[1:] if d > 1] == [len(IMAGE_CLASSES)]
    assert in_dtype == "FP32"
    assert formats == ["FORMAT_NHWC"]
    assert in_shape == [-1, HEIGHT, WIDTH, CHANNELS]
    assert (in_name, out_name) == ("x", "logits")


def _images(n, seed):
    # Decoded image pixels as a client sends them without scaling: whole
    # numbers 0..255 as FP32, height x width x RGB.
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, HEIGHT, WIDTH, CHANNELS), dtype=np.uint8).astype(np.float32)


def _parse(result):
    fields = (result.decode() if isinstance(result, bytes) else result).split(":")
    assert len(fields) == 3, f"{result!r}: expected score:index:label"
    return float(fields[0]), int(fields[1]), fields[2]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_classified_batch_matches_reference(gclient, hclient, exported, protocol, batch):
    client, mod = (gclient, grpcclient) if protocol == "grpc" else (hclient, httpclient)
    x = _images(batch, seed=10 * batch + (protocol == "http"))
    inp = mod.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = mod.InferRequestedOutput("logits", class_count=CLASS_COUNT)
    r = client.infer(MODEL, [inp], outputs=[out], request_id="7")
    response_id = r.get_response().id if protocol == "grpc" else r.get_response()["id"]
    assert response_id == "7"
    got = r.as_numpy("logits")
    assert got.shape == (batch, CLASS_COUNT)

    (want,) = exported[MODEL].model.reference(x)
    for row, results in zip(want, got):
        best = sorted(range(row.size), key=lambda i: (-row[i], i))[:CLASS_COUNT]
        parsed = [_parse(s) for s in results]
        assert [(i, label) for _, i, label in parsed] == [(i, IMAGE_CLASSES[i]) for i in best]
        np.testing.assert_allclose([s for s, _, _ in parsed], row[best], rtol=1e-4, atol=1e-5)
