#!/usr/bin/env python3
"""Call every model of a running pjserve with Triton's own Python client.

    .venv/bin/python examples/client.py [--host localhost] [--grpc-port 8001]
                                        [--http-port 8000] [--batch 3]
                                        [--model-repository models]

The models come from the server's repository index; each model's
configuration says how it must be called, and this calls it so:

- a plain model: random inputs of the datatypes and shapes its metadata
  gives, once over gRPC and once over HTTP (binary tensors); both must
  return the same bytes.
- a decoupled model (`model_transaction_policy.decoupled`), which may answer
  one request with many responses: over a gRPC stream (start_stream,
  async_stream_infer), reading responses until the one flagged final. HTTP
  cannot carry them.
- a stateful model (`sequence_batching`): a sequence of three one-row steps
  with a sequence_id, sequence_start on the first and sequence_end on the
  last, over gRPC and then again over HTTP; both must give the same answers.
- BYTES inputs get numerals as bytes; image_bytes_classifier gets JPEG files
  (encoded with Pillow when installed, else with libturbojpeg).
- a model with input-shape variants shows -1 for the extents that vary; its
  shapes are read from its manifest under --model-repository.

Some models get inputs made for them (an image, a threshold, a prompt), and
some answers are checked further: two_io_chain against calling two_io twice,
greedy_decoder_stream's streamed tokens against greedy_decoder's answer, the
convnet's top 3 classes (the classification extension). Each model prints
one line per protocol: PASS and what was checked, FAIL and why, or
"skipped:" and why. Exits 1 when anything failed.
"""

import argparse
import ctypes
import ctypes.util
import io
import queue
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import triton_to_np_dtype

SEQUENCE_STEPS = 3


def report(name, protocol, outcome, what):
    print(f"{name:<28} {protocol:<12} {outcome:<5} {what}", flush=True)


def values(arr):
    """A short look at a tensor: datatype, shape and its first values."""
    flat = arr.reshape(-1)[:3].tolist()
    shown = [v.decode(errors="replace") if isinstance(v, bytes) else
             f"{v:.4g}" if isinstance(v, float) else v for v in flat]
    return f"{arr.dtype} {list(arr.shape)} {shown}{'...' if arr.size > 3 else ''}"


# ---- inputs -------------------------------------------------------------------

def random_input(datatype, shape, rng):
    if datatype == "BF16":
        import ml_dtypes
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    if datatype == "BYTES":  # numerals, which every BYTES demo model reads
        numerals = [str(v).encode() for v in rng.integers(-1000, 1000, int(np.prod(shape)))]
        return np.array(numerals, np.object_).reshape(shape)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def encode_jpeg(pixels):
    """A JPEG file of an HxWx3 uint8 image, or None without an encoder."""
    try:
        from PIL import Image
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG")
        return out.getvalue()
    except ImportError:
        pass
    try:  # libjpeg-turbo's own API: tjCompress2 into a buffer it allocates
        tj = ctypes.CDLL(ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0")
    except OSError:
        return None
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    buf, size = ctypes.c_void_p(), ctypes.c_ulong()
    height, width, _ = pixels.shape
    pixels = np.ascontiguousarray(pixels)
    rgb, subsampling_420, quality = 0, 2, 90
    rc = tj.tjCompress2(handle, pixels.ctypes.data_as(ctypes.c_void_p), width, 0, height, rgb,
                        ctypes.byref(buf), ctypes.byref(size), subsampling_420, quality, 0)
    data = ctypes.string_at(buf, size.value) if rc == 0 else None
    tj.tjFree(buf)
    tj.tjDestroy(handle)
    return data


def example_inputs(name, batch, rng):
    """{input: (datatype, array)} for the models that need inputs made for them."""
    if name == "image_classifier":  # any height and width
        return {"IMAGE": ("UINT8", rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))}
    if name == "image_bytes_classifier":  # one JPEG file per row
        files = [encode_jpeg(rng.integers(0, 256, (40 + 8 * i, 56, 3), dtype=np.uint8))
                 for i in range(batch)]
        if None in files:
            return "no JPEG encoder here (pip install pillow, or install libturbojpeg)"
        return {"IMAGE": ("BYTES", np.array(files, np.object_).reshape(batch, 1))}
    if name == "detector":
        return {"IMAGE": ("FP32", rng.standard_normal((3, 64, 64)).astype(np.float32)),
                "SCORE_THRESHOLD": ("FP32", np.array([0.95], np.float32))}
    if name in ("greedy_decoder", "greedy_decoder_stream"):
        return {"PROMPT": ("INT32", np.array([0, 2], np.int32)),
                "MAX_TOKENS": ("INT32", np.array([10], np.int32))}
    if name == "simple_identity":  # any bytes, back unchanged
        return {"INPUT0": ("BYTES", np.array([[b"he\x00llo", b"\x00\x01\x02\x03"]], np.object_))}
    return None


def manifest_shapes(repository, name, batch):
    """{input: shape} of the model's default variant, from its manifest."""
    path = Path(repository) / name / "manifest.yaml"
    if not path.is_file():
        return None
    inputs = yaml.safe_load(path.read_text())["inputs"]
    return {t["name"]: [batch if d == "batch" else int(d) for d in t["shape"]] for t in inputs}


def make_inputs(name, meta, batch, args, rng):
    """{input: (datatype, array)}, or a string saying why the model is skipped.
    The metadata's -1 on the first axis is the batch (or a free length);
    a -1 further in is an extent that varies between input-shape variants."""
    made = example_inputs(name, batch, rng)
    if made is not None:
        return made
    arrays, variant_shapes = {}, None
    for t in meta["inputs"]:
        shape = [int(d) for d in t["shape"]]
        if -1 in shape[1:]:
            variant_shapes = variant_shapes or manifest_shapes(args.model_repository, name, batch)
            if variant_shapes is None:
                return (f"input {t['name']} {shape} has extents that vary: give "
                        "--model-repository to read the shapes from its manifest")
            shape = variant_shapes[t["name"]]
        shape = [batch if d == -1 else d for d in shape]
        arrays[t["name"]] = (t["datatype"], random_input(t["datatype"], shape, rng))
    return arrays


def infer_inputs(module, arrays):
    """tritonclient InferInputs (of `module`: grpcclient or httpclient)."""
    inputs = []
    for tname, (datatype, arr) in arrays.items():
        t = module.InferInput(tname, list(arr.shape), datatype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def same(a, b):
    if a.dtype == object or b.dtype == object:
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- the three ways to call a model -----------------------------------------------

def check_plain(name, meta, arrays, clients):
    """One request over gRPC, one over HTTP: the same outputs from both."""
    grpc_c, http_c = clients
    g = grpc_c.infer(name, infer_inputs(grpcclient, arrays))
    h = http_c.infer(name, infer_inputs(httpclient, arrays))
    outputs = [t["name"] for t in meta["outputs"]]
    report(name, "gRPC", "PASS", "; ".join(f"{o} {values(g.as_numpy(o))}" for o in outputs))
    differ = [o for o in outputs if not same(g.as_numpy(o), h.as_numpy(o))]
    if differ:
        report(name, "HTTP", "FAIL", f"{', '.join(differ)} not the same as over gRPC")
        return False
    report(name, "HTTP", "PASS", f"the same {', '.join(outputs)} as over gRPC")
    return True


def stream(grpc_c, name, arrays):
    """The responses of a decoupled model to one request, in the order sent:
    [{output: array}], read until the response flagged final."""
    got = queue.Queue()
    grpc_c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        # The empty final response tells the client that no more will come.
        grpc_c.async_stream_infer(name, infer_inputs(grpcclient, arrays),
                                  enable_empty_final_response=True)
        responses = []
        while True:
            result, error = got.get(timeout=60)
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        grpc_c.stop_stream()


def check_decoupled(name, meta, arrays, clients):
    """One request over a gRPC stream; a decoupled model cannot answer ModelInfer."""
    responses = stream(clients[0], name, arrays)
    outputs = [t["name"] for t in meta["outputs"]]
    joined = {o: np.concatenate([r[o].reshape(-1) for r in responses]) if responses else
              np.zeros(0) for o in outputs}
    report(name, "gRPC stream", "PASS",
           f"{len(responses)} responses, then the final flag: " +
           "; ".join(f"{o} {values(joined[o])}" for o in outputs))
    report(name, "HTTP", "skip", "skipped: a decoupled model answers over gRPC streams only")
    return check_stream_against_unary(name, arrays, joined, clients)


def check_stream_against_unary(name, arrays, joined, clients):
    """greedy_decoder_stream streams, one by one, the tokens greedy_decoder returns."""
    if name != "greedy_decoder_stream":
        return True
    unary = clients[0].infer("greedy_decoder", infer_inputs(grpcclient, arrays))
    if not same(joined["TOKENS"], unary.as_numpy("TOKENS")):
        report(name, "gRPC stream", "FAIL", "streamed tokens differ from greedy_decoder's")
        return False
    report(name, "gRPC stream", "PASS", "the same tokens as greedy_decoder returns at once")
    return True


def check_sequence(name, meta, arrays_per_step, clients, sequence_id):
    """The same sequence of one-row steps over gRPC, then over HTTP (the id is
    free again once a sequence ends): the same answers from both."""
    answers = {}
    for protocol, client, module in (("gRPC", clients[0], grpcclient),
                                     ("HTTP", clients[1], httpclient)):
        answers[protocol] = []
        for k, arrays in enumerate(arrays_per_step):
            r = client.infer(name, infer_inputs(module, arrays), sequence_id=sequence_id,
                             sequence_start=k == 0, sequence_end=k == len(arrays_per_step) - 1)
            answers[protocol].append([r.as_numpy(t["name"]) for t in meta["outputs"]])
    flat = [np.concatenate([a[i].reshape(-1) for a in answers["gRPC"]])
            for i in range(len(meta["outputs"]))]
    report(name, "gRPC", "PASS", f"sequence {sequence_id}, {len(arrays_per_step)} steps "
           f"(start ... end): " + "; ".join(f"{t['name']} per step {values(v)}"
                                            for t, v in zip(meta["outputs"], flat)))
    if not all(same(g, h) for gs, hs in zip(answers["gRPC"], answers["HTTP"])
               for g, h in zip(gs, hs)):
        report(name, "HTTP", "FAIL", "the same sequence answered differently than over gRPC")
        return False
    report(name, "HTTP", "PASS", f"the same sequence {sequence_id}, the same answers as gRPC")
    return True


# ---- checks beyond one call -------------------------------------------------------

def check_chain(clients, batch, rng):
    """two_io_chain against its two steps called one by one."""
    grpc_c = clients[0]
    a = rng.standard_normal((batch, 8)).astype(np.float32)
    b = rng.integers(0, 8, (batch, 3)).astype(np.int32)

    def two_io(name, a):
        return grpc_c.infer(name, infer_inputs(grpcclient, {"a": ("FP32", a), "b": ("INT32", b)}))

    got, first = two_io("two_io_chain", a), two_io("two_io", a)
    second = two_io("two_io", first.as_numpy("sum"))
    if same(got.as_numpy("sum"), second.as_numpy("sum")) and \
            same(got.as_numpy("first_argmax"), first.as_numpy("argmax")):
        report("two_io_chain", "gRPC", "PASS", "the same as calling two_io, then two_io on its sum")
        return True
    report("two_io_chain", "gRPC", "FAIL", "differs from calling two_io twice")
    return False


def check_classified(name, output, arrays, clients):
    """The top 3 classes of `output` (the classification extension), over both protocols."""
    top = {}
    for protocol, client, module in (("gRPC", clients[0], grpcclient),
                                     ("HTTP", clients[1], httpclient)):
        r = client.infer(name, infer_inputs(module, arrays),
                         outputs=[module.InferRequestedOutput(output, class_count=3)])
        top[protocol] = r.as_numpy(output)
    same_top = same(top["gRPC"], top["HTTP"])
    report(name, "gRPC+HTTP", "PASS" if same_top else "FAIL",
           f"{output} top 3 classes (score:index:label) {[s.decode() for s in top['gRPC'][0]]}"
           + ("" if same_top else ": gRPC and HTTP differ"))
    return same_top


CLASSIFIED = {"convnet": "probs"}  # model: an output with labels, shown classified too


def check_model(name, clients, args, rng, sequence_id):
    grpc_c = clients[0]
    meta = grpc_c.get_model_metadata(name, as_json=True)
    config = grpc_c.get_model_config(name, as_json=True)["config"]
    decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
    stateful = "sequence_batching" in config
    batch = 1 if stateful else args.batch  # a sequence step is one row
    arrays = make_inputs(name, meta, batch, args, rng)
    if isinstance(arrays, str):
        report(name, "gRPC+HTTP", "skip", f"skipped: {arrays}")
        return True
    if decoupled:
        return check_decoupled(name, meta, arrays, clients)
    if stateful:
        steps = [arrays] + [make_inputs(name, meta, 1, args, rng)
                            for _ in range(SEQUENCE_STEPS - 1)]
        return check_sequence(name, meta, steps, clients, sequence_id)
    ok = check_plain(name, meta, arrays, clients)
    if name == "two_io_chain":
        ok = check_chain(clients, args.batch, rng) and ok
    if name in CLASSIFIED:
        ok = check_classified(name, CLASSIFIED[name], arrays, clients) and ok
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-repository", type=Path,
                    default=Path(__file__).resolve().parents[1] / "models",
                    help="where to read the shapes of input-shape variants (default: "
                         "the models/ `make models` writes)")
    args = ap.parse_args()

    clients = (grpcclient.InferenceServerClient(f"{args.host}:{args.grpc_port}"),
               httpclient.InferenceServerClient(f"{args.host}:{args.http_port}"))
    server = clients[0].get_server_metadata(as_json=True)
    print(f"{server['name']} {server['version']}, extensions: {', '.join(server['extensions'])}")
    rng = np.random.default_rng(args.seed)
    ok = True
    index = clients[0].get_model_repository_index(as_json=True).get("models", [])
    for n, entry in enumerate(index):
        name = entry["name"]
        if entry.get("state") != "READY":
            report(name, "gRPC+HTTP", "skip",
                   f"skipped: {entry.get('state')} {entry.get('reason', '')}")
            continue
        try:
            ok = check_model(name, clients, args, rng, sequence_id=1000 + n) and ok
        except Exception as e:  # report it and go on with the other models
            report(name, "", "FAIL", f"{type(e).__name__}: {e}")
            ok = False
    print("every model answered as expected" if ok else "some models failed", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
