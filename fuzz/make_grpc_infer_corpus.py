#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_grpc_infer: serialized ModelInferRequests.

Built with tritonclient's own protobuf classes, so the seeds are exactly what
a Triton client puts on the wire. Valid requests match the driver's manifest
(x: FP32 [batch, 4], mask: INT8 [batch, 2]; outputs y, n), or, for model
"texts", its string client tensors (TEXT: BYTES [batch, -1], LANG: BYTES
[1]); the invalid ones each break one rule the codec or validation enforces.
Some ask for outputs classified (the classification extension).

    .venv/bin/python fuzz/make_grpc_infer_corpus.py fuzz/corpus/fuzz_grpc_infer
"""
import os
import struct
import sys

from tritonclient.grpc import service_pb2 as pb


def request(batch=1, raw=True, model="fuzz"):
    r = pb.ModelInferRequest(model_name=model)
    x = r.inputs.add(name="x", datatype="FP32", shape=[batch, 4])
    m = r.inputs.add(name="mask", datatype="INT8", shape=[batch, 2])
    xs = [float(i) for i in range(batch * 4)]
    ms = [(-1) ** i * i for i in range(batch * 2)]
    if raw:
        r.raw_input_contents.append(struct.pack(f"<{len(xs)}f", *xs))
        r.raw_input_contents.append(struct.pack(f"<{len(ms)}b", *ms))
    else:
        x.contents.fp32_contents.extend(xs)
        m.contents.int_contents.extend(ms)
    return r


def serialize(strings):
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


TEXT = [b"", b"a\0b", b"\xff\xfe", b"hello", b"x" * 300, b"\n"]


def texts(raw=True):
    r = pb.ModelInferRequest(model_name="texts")
    t = r.inputs.add(name="TEXT", datatype="BYTES", shape=[2, 3])
    lang = r.inputs.add(name="LANG", datatype="BYTES", shape=[1])
    if raw:
        r.raw_input_contents.extend([serialize(TEXT), serialize([b"en"])])
    else:
        t.contents.bytes_contents.extend(TEXT)
        lang.contents.bytes_contents.append(b"en")
    return r


def bytes_seeds():
    yield "texts_raw", texts()
    r = texts(raw=False)
    r.outputs.add(name="LABEL")
    yield "texts_contents", r
    r = texts()
    r.raw_input_contents[0] = serialize(TEXT)[:-1]
    yield "texts_bad_length", r
    r = texts()
    r.raw_input_contents[0] = serialize(TEXT) + b"\0\0"
    yield "texts_bad_trailing", r
    r = texts()
    r.inputs[0].shape[1] = 4
    yield "texts_bad_count", r
    r = texts(raw=False)
    r.inputs[1].contents.fp32_contents.append(1.0)
    yield "texts_bad_contents_field", r
    r = request()
    r.inputs[0].datatype = "BYTES"
    r.raw_input_contents[0] = serialize([b"a"] * 4)
    yield "bytes_to_number_tensor", r


def classification_seeds():
    """Outputs asked for classified (class_count): numbers (K within, past and
    at the class count, int64 or uint64), strings (refused), K of 0 or below,
    and classification with a shared-memory output (both refused)."""
    r = request()
    r.outputs.add(name="y").parameters["classification"].int64_param = 2
    yield "classification", r
    r = request(batch=3)
    r.outputs.add(name="n").parameters["classification"].uint64_param = 9
    r.outputs.add(name="y").parameters["classification"].int64_param = 3
    yield "classification_every_output", r
    for k in (0, -4):
        r = request()
        r.outputs.add(name="y").parameters["classification"].int64_param = k
        yield f"classification_count_{'zero' if k == 0 else 'negative'}", r
    r = request()
    o = r.outputs.add(name="y")
    o.parameters["classification"].int64_param = 1
    o.parameters["shared_memory_region"].string_param = "region"
    o.parameters["shared_memory_byte_size"].int64_param = 64
    yield "classification_with_shm", r
    for name in ("LABEL", "SCORE"):
        r = texts()
        r.outputs.add(name=name).parameters["classification"].int64_param = 1
        yield f"texts_classification_{name.lower()}", r


def seeds():
    yield from bytes_seeds()
    yield "valid_raw_batch1", request()
    r = request(batch=2)
    r.id = "req-42"
    r.parameters["priority"].int64_param = 1
    r.parameters["timeout"].uint64_param = 100000
    r.parameters["sequence_id"].int64_param = 7  # unknown to pjserve: tolerated
    r.outputs.add(name="y")
    yield "valid_raw_params_requested", r
    yield "valid_contents", request(batch=4, raw=False)
    r = request(batch=1, raw=False)  # one contents input, positional raw layout
    del r.inputs[0].contents.fp32_contents[:]
    r.raw_input_contents.extend([struct.pack("<4f", 1, 2, 3, 4), b""])
    yield "valid_positional_raw", r
    r = request()
    r.inputs[0].datatype = "FP64"
    yield "bad_datatype", r
    r = request()
    r.inputs[0].shape[1] = 5
    yield "bad_shape", r
    r = request()
    del r.inputs[1]
    del r.raw_input_contents[1]
    yield "missing_input", r
    r = request()
    r.outputs.add(name="nope")
    yield "unknown_output", r
    r = request()
    del r.raw_input_contents[1]
    yield "raw_count_mismatch", r
    r = request(raw=False)
    r.inputs[1].contents.int_contents[0] = 1000
    yield "contents_out_of_range", r
    r = request()
    r.inputs[0].parameters["shared_memory_region"].string_param = "region"
    r.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    yield "shm_without_registry", r
    yield from classification_seeds()
    r = request()
    r.parameters["priority"].string_param = "high"
    yield "priority_wrong_type", r
    yield "batch_too_large", request(batch=5)
    yield "empty", pb.ModelInferRequest()


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, msg in seeds():
        with open(os.path.join(out_dir, name + ".pb"), "wb") as f:
            f.write(msg.SerializeToString())
    truncated = request(batch=2).SerializeToString()[:-7]
    with open(os.path.join(out_dir, "truncated.pb"), "wb") as f:
        f.write(truncated)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus/fuzz_grpc_infer")
