"""The classification extension, against the real server with tritonclient:
an output requested with a class count K comes back as BYTES strings
"score:index[:label]", each row's best K, best first.

tritonclient asks for it with InferRequestedOutput(name, class_count=K):
over gRPC an int64 "classification" parameter of the requested output,
over REST {"parameters": {"classification": K}}. Each classified result is
compared with the same request's plain output: the strings are the plain
values ranked (ties by index), scores written as Triton writes them ("%f"
for floating point, decimal for integers), labels from the manifest's
labels file. Covered: executable outputs with labels (the demo convnet's
"zero".."nine") and without (mlp), integer and f16 outputs, K larger than
the class count (all classes), a batched output of one extent, a meta's
client output with labels next to a string output, JSON and binary HTTP
responses, one output classified next to a plain one, a hooked model's
client output; refused with
INVALID_ARGUMENT (HTTP 400): K of 0 or below or not an integer, a string
output, classification together with a shared-memory output; refused at
load (pjserve check): a labels file missing or shorter than the classes.
The model configuration names the labels file; the exporter's output_labels
writes the manifest key and refuses what the server would.
"""

import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle_code import tensor_yaml, write_meta
from protocol_util import (ServerProcess, finish_checked, grpc_code, guard_alive, http_json,
                           start_or_fail)
from pjserve_export import hooks_builder
from pjserve_export.demo import DIGITS
from pjserve_export.pipelines import export_pipeline

# A meta whose client output SCORES names its classes; NAMES is a string
# output (nothing to rank).
META = "scored"
META_LABELS = ["north", "east", "", "west"]  # class 2 has an empty line: no label
META_SOURCE = r"""
    /* scored: SCORES = X (f32 [batch, 4]); NAMES: "row" per row. */
    #include <pjserve/model.h>

    PJSERVE_EXPORT int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                                   pjserve_tensor *out, size_t n_out)
    {
        (void)n_in, (void)n_out;
        int64_t rows = in[0].shape[0];
        out[0].shape[0] = rows;
        out[0].data = in[0].data;
        out[0].nbytes = in[0].nbytes;
        pjserve_bytes_writer w;
        int rc = pjserve_bytes_reserve(ctx, &w, &out[1], 3 * (size_t)rows, (size_t)rows);
        if (rc != PJSERVE_OK)
            return rc;
        for (int64_t r = 0; r < rows; r++)
            pjserve_bytes_put(&w, "row", 3);
        out[1].shape[0] = rows;
        return PJSERVE_OK;
    }
"""


@pytest.fixture(scope="module")
def class_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-classification")
    for name in ("convnet", "mlp", "two_io", "mlp_f16"):
        shutil.copytree(exported[name].path, repo / name)
    export_pipeline("image_classifier", repo, build=hooks_builder(pjserve_bin))
    d = write_meta(repo, META, [], tensor_yaml("X", "f32", ["batch", 4]),
                   "  - {name: SCORES, dtype: f32, shape: [batch, 4], labels: directions.txt}\n"
                   + tensor_yaml("NAMES", "bytes", ["batch"]), META_SOURCE)
    (d / "directions.txt").write_text("\n".join(META_LABELS) + "\n")
    subprocess.run([str(pjserve_bin), "build-hooks", str(d)], check=True, capture_output=True)
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-classification"), [], "classification")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(class_server):
    yield from guard_alive(class_server)


def expected_classes(values: np.ndarray, k: int, labels=None, batched=True):
    """What the server must send for `values`: per row (the whole tensor
    without a batch axis) the best k as "score:index[:label]"."""
    rows = values.reshape(values.shape[0], -1) if batched else values.reshape(1, -1)
    out = []
    for row in rows:
        order = sorted(range(row.size), key=lambda i: (-row[i], i))[:k]
        strings = []
        for i in order:
            v = row[i]
            text = f"{int(v)}:{i}" if np.issubdtype(row.dtype, np.integer) \
                else "%f:%d" % (float(v), i)
            if labels is not None and i < len(labels) and labels[i]:
                text += f":{labels[i]}"
            strings.append(text.encode())
        out.append(strings)
    return out if batched else out[0]


def as_lists(array):
    """A BYTES result as nested lists of bytes (JSON results come as str)."""
    return [[x.encode() if isinstance(x, str) else x for x in row] for row in array] \
        if array.ndim == 2 else [x.encode() if isinstance(x, str) else x for x in array]


def infer(client, mod, model, inputs, outputs):
    """inputs: {name: (datatype, array)}; outputs: [(name, class_count, kwargs)]."""
    ins = []
    for name, (dt, arr) in inputs.items():
        t = mod.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        ins.append(t)
    outs = [mod.InferRequestedOutput(name, class_count=k, **kw) for name, k, kw in outputs]
    return client.infer(model, ins, outputs=outs)


def images(n, seed=0):
    return {"x": ("FP32", np.random.default_rng(seed).standard_normal((n, 28, 28, 1))
                  .astype(np.float32))}


def test_extension_listed(gclient, hclient):
    assert "classification" in gclient.get_server_metadata(as_json=True)["extensions"]
    assert "classification" in hclient.get_server_metadata()["extensions"]


def test_config_names_the_labels_file(gclient, hclient):
    for outputs in (hclient.get_model_config("convnet")["output"],
                    gclient.get_model_config("convnet", as_json=True)["config"]["output"]):
        assert [(o["name"], o.get("label_filename", "")) for o in outputs] == \
            [("logits", "labels.txt"), ("probs", "labels.txt")]
    assert [o.get("label_filename", "")
            for o in hclient.get_model_config("mlp")["output"]] == [""]
    assert [o.get("label_filename", "") for o in hclient.get_model_config(META)["output"]] == \
        ["directions.txt", ""]


def test_grpc_labels(gclient):
    x = images(3)
    plain = infer(gclient, grpcclient, "convnet", x, [("probs", 0, {})]).as_numpy("probs")
    r = infer(gclient, grpcclient, "convnet", x, [("probs", 3, {})])
    out = r.get_output("probs")
    assert out.datatype == "BYTES" and list(out.shape) == [3, 3]
    assert as_lists(r.as_numpy("probs")) == expected_classes(plain, 3, DIGITS)


@pytest.mark.parametrize("binary", [True, False])
def test_http_labels(hclient, binary):
    x = images(2, seed=1)
    plain = infer(hclient, httpclient, "convnet", x, [("logits", 0, {})]).as_numpy("logits")
    r = infer(hclient, httpclient, "convnet", x, [("logits", 4, {"binary_data": binary})])
    out = r.get_output("logits")
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 4]
    assert ("binary_data_size" in out.get("parameters", {})) == binary
    assert ("data" in out) == (not binary)
    assert as_lists(r.as_numpy("logits")) == expected_classes(plain, 4, DIGITS)


def test_without_labels_and_more_than_all(gclient, hclient):
    x = {"x": ("FP32", np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32))}
    plain = infer(gclient, grpcclient, "mlp", x, [("y", 0, {})]).as_numpy("y")
    for client, mod in ((gclient, grpcclient), (hclient, httpclient)):
        r = infer(client, mod, "mlp", x, [("y", 2, {})])
        assert as_lists(r.as_numpy("y")) == expected_classes(plain, 2)
        # More classes than the output has: every class, ranked ([4, 4]).
        r = infer(client, mod, "mlp", x, [("y", 1000, {})])
        assert r.as_numpy("y").shape == (4, 4)
        assert as_lists(r.as_numpy("y")) == expected_classes(plain, 4)


def test_integer_and_one_extent_outputs(gclient, hclient):
    """two_io: argmax i32 [batch] (one class per row: [batch, 1]) next to sum
    f32 [batch, 8] sent plain in the same response."""
    rng = np.random.default_rng(4)
    x = {"a": ("FP32", rng.standard_normal((3, 8)).astype(np.float32)),
         "b": ("INT32", rng.integers(-3, 3, (3, 3)).astype(np.int32))}
    plain = infer(gclient, grpcclient, "two_io", x, [("argmax", 0, {}), ("sum", 0, {})])
    for client, mod in ((gclient, grpcclient), (hclient, httpclient)):
        r = infer(client, mod, "two_io", x, [("argmax", 5, {}), ("sum", 0, {})])
        assert r.as_numpy("argmax").shape == (3, 1)
        assert as_lists(r.as_numpy("argmax")) == expected_classes(plain.as_numpy("argmax"), 5)
        np.testing.assert_array_equal(r.as_numpy("sum"), plain.as_numpy("sum"))
        r = infer(client, mod, "two_io", x, [("sum", 3, {})])
        assert as_lists(r.as_numpy("sum")) == expected_classes(plain.as_numpy("sum"), 3)


def test_half_precision_output(gclient):
    x = {"x": ("FP16", np.random.default_rng(5).standard_normal((2, 16)).astype(np.float16))}
    plain = infer(gclient, grpcclient, "mlp_f16", x, [("y", 0, {})]).as_numpy("y")
    r = infer(gclient, grpcclient, "mlp_f16", x, [("y", 4, {})])
    assert as_lists(r.as_numpy("y")) == expected_classes(plain.astype(np.float32), 4)


def test_meta_client_output(gclient, hclient):
    scores = np.array([[0.5, 2.0, 3.0, -1.0], [7.0, 7.0, 1.0, 9.0]], np.float32)
    x = {"X": ("FP32", scores)}
    for client, mod in ((gclient, grpcclient), (hclient, httpclient)):
        r = infer(client, mod, META, x, [("SCORES", 2, {}), ("NAMES", 0, {})])
        assert as_lists(r.as_numpy("SCORES")) == [[b"3.000000:2", b"2.000000:1:east"],
                                                  [b"9.000000:3:west", b"7.000000:0:north"]]
        assert as_lists(r.as_numpy("NAMES")) == [b"row", b"row"]
        assert as_lists(r.as_numpy("SCORES")) == expected_classes(scores, 2, META_LABELS)
        # A string output has no classes.
        with pytest.raises(InferenceServerException) as e:
            infer(client, mod, META, x, [("NAMES", 1, {})])
        if mod is grpcclient:
            assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
        else:
            assert e.value.status() == "400", e.value
        assert 'model scored: output "NAMES" is BYTES: classification (class_count) ranks ' \
               'numbers' in e.value.message(), e.value


def test_hooked_client_output(gclient, hclient):
    """image_classifier's postprocess makes SCORES f32 [3] (no batch axis:
    one row) and CLASSES bytes [3]; the first may be classified, the second
    is refused before the hooks run."""
    image = {"IMAGE": ("UINT8", np.random.default_rng(6).integers(0, 256, (20, 30, 3),
                                                                  dtype=np.uint8))}
    plain = infer(gclient, grpcclient, "image_classifier", image, [("SCORES", 0, {})])
    scores = plain.as_numpy("SCORES")
    for client, mod in ((gclient, grpcclient), (hclient, httpclient)):
        r = infer(client, mod, "image_classifier", image, [("SCORES", 2, {})])
        assert r.as_numpy("SCORES").shape == (2,)
        assert as_lists(r.as_numpy("SCORES")) == expected_classes(scores, 2, batched=False)
        with pytest.raises(InferenceServerException) as e:
            infer(client, mod, "image_classifier", image, [("CLASSES", 1, {})])
        assert 'model image_classifier: output "CLASSES" is BYTES' in e.value.message(), e.value


def raw_output(name, k):
    """A gRPC requested output whose "classification" parameter is k as sent
    (tritonclient leaves out a class count of 0)."""
    o = grpcclient.InferRequestedOutput(name)
    o._get_tensor().parameters["classification"].int64_param = k
    return o


def test_bad_class_counts(gclient, server):
    x = np.zeros((1, 16), np.float32)
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    for k, message in ((0, 'output "y": parameter "classification" must be at least 1 (the number '
                           'of classes to return), got 0'),
                       (-2, 'output "y": parameter "classification" must not be negative '
                            '(got -2)')):
        with pytest.raises(InferenceServerException) as e:
            gclient.infer("mlp", [inp], outputs=[raw_output("y", k)])
        assert grpc_code(e.value) == "INVALID_ARGUMENT" and message in e.value.message(), e.value
    o = grpcclient.InferRequestedOutput("y")
    o._get_tensor().parameters["classification"].string_param = "3"
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("mlp", [inp], outputs=[o])
    assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
    assert "must be an int64_param or uint64_param" in e.value.message(), e.value

    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    for k, message in ((0, 'parameter \\"classification\\" must be at least 1'),
                       (-1, 'parameter \\"classification\\" must be a non-negative integer'),
                       ("2", 'parameter \\"classification\\" must be a non-negative integer'),
                       (2.5, 'parameter \\"classification\\" must be a non-negative integer')):
        doc = dict(body, outputs=[{"name": "y", "parameters": {"classification": k}}])
        status, parsed, data = http_json(server.http_url, "POST", "/v2/models/mlp/infer", doc)
        assert status == 400 and message in data.decode(), (k, status, data)


def test_shared_memory_and_classification_refused(gclient, server):
    """Neither protocol writes classes into a region (tritonclient refuses to
    ask; a raw request is refused by the server before any region is
    looked up)."""
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    o = grpcclient.InferRequestedOutput("y")
    o.set_shared_memory("nowhere", 64)
    o._get_tensor().parameters["classification"].int64_param = 2
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("mlp", [inp], outputs=[o])
    assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
    assert 'output "y": classification and a shared memory region cannot be combined' in \
        e.value.message(), e.value
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}],
           "outputs": [{"name": "y", "parameters": {"classification": 2,
                                                    "shared_memory_region": "nowhere",
                                                    "shared_memory_byte_size": 64}}]}
    status, parsed, data = http_json(server.http_url, "POST", "/v2/models/mlp/infer", doc)
    assert status == 400 and "cannot be combined" in data.decode(), (status, data)


@pytest.mark.parametrize("labels,message", [
    (None, "outputs[0].labels: "),
    ("zero\none\ntwo\n", 'labels.txt has 3 lines but output "logits" has 10 classes per row'),
])
def test_labels_checked_at_load(exported, pjserve_bin, plugin_path, tmp_path, labels, message):
    bundle = tmp_path / "convnet"
    shutil.copytree(exported["convnet"].path, bundle)
    if labels is None:
        (bundle / "labels.txt").unlink()
    else:
        (bundle / "labels.txt").write_text(labels)
    r = subprocess.run([str(pjserve_bin), "check", "--pjrt-plugin", str(plugin_path),
                        "--cache-dir", str(tmp_path / "cache"), str(bundle)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert message in r.stderr, r.stderr


def test_exporter_labels(tmp_path):
    """export_jax(output_labels=) writes `labels:` for the outputs named and
    refuses an unknown output, a file not shipped with the bundle and a
    boolean output."""
    import jax.numpy as jnp
    from pjserve_export import export_jax, read_manifest

    def fn(p, x):
        return x * p["w"], x > 0

    args = dict(name="labelled", batch_sizes=[1], input_names=["x"],
                output_names=["scores", "positive"])
    x = [np.zeros((1, 3), np.float32)]
    path = export_jax(fn, {"w": jnp.ones(3)}, x, tmp_path, output_labels={"scores": "c.txt"},
                      extra_files={"c.txt": b"a\nb\nc\n"}, **args)
    m = read_manifest(path)
    assert [(o.name, o.labels) for o in m.outputs] == [("scores", "c.txt"), ("positive", None)]
    assert "labels: \"c.txt\"" in (path / "manifest.yaml").read_text()
    assert (path / "c.txt").read_bytes() == b"a\nb\nc\n"
    for labels, files, message in (({"nope": "c.txt"}, {"c.txt": b"a\n"}, "does not have"),
                                   ({"scores": "c.txt"}, None, "not among extra_files"),
                                   ({"positive": "c.txt"}, {"c.txt": b"a\n"},
                                    "only numeric outputs")):
        with pytest.raises(ValueError, match=message):
            export_jax(fn, {"w": jnp.ones(3)}, x, tmp_path / "bad", output_labels=labels,
                       extra_files=files, **args)
