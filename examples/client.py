#!/usr/bin/env python3
"""Call a running pjserve with Triton's own Python client, over gRPC and HTTP.

    .venv/bin/python examples/client.py [--host localhost] [--grpc-port 8001]
                                        [--http-port 8000] [--batch 3]

For every ready model in the server's repository this reads the model's
metadata, makes random inputs of its datatypes and shapes, infers once over
gRPC and once over HTTP (binary tensors), prints each output's shape and first
values, and checks that both protocols returned the same bytes. Exits 1 when
a call fails or the protocols disagree. A model with input-shape variants
shows -1 for the extents that vary besides the batch axis; metadata does not
say which values they take, so such a model is skipped (its manifest says).
The composition examples (image_classifier, detector, greedy_decoder) get
inputs made for them: an image, a threshold, a prompt; Triton's string
examples (simple_string, simple_identity) get numerals and strings. The
convnet is also asked for its top 3 classes (the classification extension:
"score:index:label" strings, the labels from its labels.txt). The ensemble
two_io_chain's answer is compared with calling its steps, two_io twice,
one by one.
"""

import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype


def random_input(datatype, shape, rng):
    if datatype == "BF16":
        import ml_dtypes
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


EXAMPLES = ("image_classifier", "detector", "greedy_decoder", "simple_string",
            "simple_identity")
CLASSIFIED = {"convnet": "probs"}  # model: an output with labels, shown classified too


def example_inputs(name, rng):
    """{input: (datatype, array)} for the composition examples, else None."""
    if name == "image_classifier":  # any height and width
        return {"IMAGE": ("UINT8", rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))}
    if name == "detector":
        return {"IMAGE": ("FP32", rng.standard_normal((3, 64, 64)).astype(np.float32)),
                "SCORE_THRESHOLD": ("FP32", np.array([0.95], np.float32))}
    if name == "greedy_decoder":
        return {"PROMPT": ("INT32", np.array([0, 2], np.int32)),
                "MAX_TOKENS": ("INT32", np.array([10], np.int32))}
    if name == "simple_string":  # numerals in, their sums and differences out
        numerals = [[str(v).encode() for v in rng.integers(-1000, 1000, 16)] for _ in range(2)]
        return {"INPUT0": ("BYTES", np.array(numerals[:1], np.object_)),
                "INPUT1": ("BYTES", np.array(numerals[1:], np.object_))}
    if name == "simple_identity":  # any bytes, back unchanged
        return {"INPUT0": ("BYTES", np.array([[b"he\x00llo", b"\x00\x01\x02\x03"]], np.object_))}
    return None


def show_classified(name, output, grpc_c, http_c, batch, rng):
    """The top 3 classes of each row of `output`, over both protocols."""
    meta = grpc_c.get_model_metadata(name, as_json=True)
    t = meta["inputs"][0]
    arr = random_input(t["datatype"], [batch] + [int(d) for d in t["shape"][1:]], rng)
    g_in = grpcclient.InferInput(t["name"], list(arr.shape), t["datatype"])
    h_in = httpclient.InferInput(t["name"], list(arr.shape), t["datatype"])
    g_in.set_data_from_numpy(arr)
    h_in.set_data_from_numpy(arr)
    g = grpc_c.infer(name, [g_in], outputs=[grpcclient.InferRequestedOutput(output, class_count=3)])
    h = http_c.infer(name, [h_in], outputs=[httpclient.InferRequestedOutput(output, class_count=3)])
    top = g.as_numpy(output)
    print(f"  {output} classified (class_count=3): {[s.decode() for s in top[0]]}")
    if top.tolist() != h.as_numpy(output).tolist():
        print(f"  {output} classified: gRPC and HTTP differ", file=sys.stderr)
        return False
    return True


def infer_grpc(c, name, arrays):
    """{output: array} of one gRPC call with arrays {input: array}."""
    inputs = []
    for tname, arr in arrays.items():
        t = grpcclient.InferInput(tname, list(arr.shape), "FP32" if arr.dtype == np.float32
                                  else "INT32")
        t.set_data_from_numpy(arr)
        inputs.append(t)
    r = c.infer(name, inputs)
    return {o.name: r.as_numpy(o.name) for o in r.get_response().outputs}


def check_chain(grpc_c, batch, rng):
    """two_io_chain against its two steps called one by one."""
    a = rng.standard_normal((batch, 8)).astype(np.float32)
    b = rng.integers(0, 8, (batch, 3)).astype(np.int32)
    got = infer_grpc(grpc_c, "two_io_chain", {"a": a, "b": b})
    first = infer_grpc(grpc_c, "two_io", {"a": a, "b": b})
    second = infer_grpc(grpc_c, "two_io", {"a": first["sum"], "b": b})
    if np.array_equal(got["sum"], second["sum"]) and \
            np.array_equal(got["first_argmax"], first["argmax"]):
        print("  the same as calling two_io, then two_io on its sum")
        return True
    print("  two_io_chain differs from calling two_io twice", file=sys.stderr)
    return False


def infer_both(name, grpc_c, http_c, batch, rng):
    meta = grpc_c.get_model_metadata(name, as_json=True)
    arrays = example_inputs(name, rng) or {}
    for t in meta["inputs"] if not arrays else []:
        dims = [int(d) for d in t["shape"]]
        if -1 in dims[1:]:
            print(f"  skipped: input {t['name']} {dims} has extents that vary (input-shape "
                  "variants, or a model with hooks); see its manifest for the shapes it takes")
            return True
        shape = [batch if d == -1 else d for d in dims]
        arrays[t["name"]] = (t["datatype"], random_input(t["datatype"], shape, rng))

    g_inputs, h_inputs = [], []
    for tname, (dt, arr) in arrays.items():
        g = grpcclient.InferInput(tname, list(arr.shape), dt)
        h = httpclient.InferInput(tname, list(arr.shape), dt)
        g.set_data_from_numpy(arr)
        h.set_data_from_numpy(arr, binary_data=True)
        g_inputs.append(g)
        h_inputs.append(h)
    g_result = grpc_c.infer(name, g_inputs)
    h_result = http_c.infer(name, h_inputs)
    same = True
    for t in meta["outputs"]:
        g_out = g_result.as_numpy(t["name"])
        h_out = h_result.as_numpy(t["name"])
        flat = g_out.reshape(-1)[:4]
        print(f"  {t['name']}: {t['datatype']} {list(g_out.shape)} first values {flat.tolist()}")
        if g_out.shape != h_out.shape or (g_out.dtype == object and g_out.tolist() !=
                                          h_out.tolist()) or \
                (g_out.dtype != object and g_out.tobytes() != h_out.tobytes()):
            print(f"  {t['name']}: gRPC and HTTP outputs differ", file=sys.stderr)
            same = False
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    grpc_c = grpcclient.InferenceServerClient(f"{args.host}:{args.grpc_port}")
    http_c = httpclient.InferenceServerClient(f"{args.host}:{args.http_port}")
    server = grpc_c.get_server_metadata(as_json=True)
    print(f"{server['name']} {server['version']}, extensions: {', '.join(server['extensions'])}")
    rng = np.random.default_rng(args.seed)
    ok = True
    for entry in grpc_c.get_model_repository_index(as_json=True).get("models", []):
        if entry.get("state") != "READY":
            print(f"{entry['name']}: {entry.get('state')} {entry.get('reason', '')}")
            continue
        print(f"{entry['name']}:" if entry["name"] in EXAMPLES else
              f"{entry['name']} (batch {args.batch}):")
        ok = infer_both(entry["name"], grpc_c, http_c, args.batch, rng) and ok
        if entry["name"] == "two_io_chain":
            ok = check_chain(grpc_c, args.batch, rng) and ok
        if entry["name"] in CLASSIFIED:
            ok = show_classified(entry["name"], CLASSIFIED[entry["name"]], grpc_c, http_c,
                                 args.batch, rng) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
