"""`pjserve import-triton`: a Triton repository written here, converted, served, compared.

Runs in .venv-torch (onnx, onnxruntime, torch, tritonclient; `make e2e-torch`).
The test writes a Triton model repository itself: config.pbtxt and
1/model.onnx (torch.onnx.export, opset 17, from small torch modules with
random weights) for

    classifier   x f32 [16] -> probs f32 [5], labels.txt, max_batch_size 4,
                 dynamic_batching (preferred size 3, a queue policy),
                 instance_group KIND_CPU
    two_io       a f32 [16], b i32 [16] -> sum f32 [16], scaled i32 [16]
    whole        max_batch_size 0: x f32 [3, 4] -> y f32 [4]
    accumulate   sequence_batching: implicit state (STATE_IN -> STATE_OUT,
                 zero initial state) and a START control; OUTPUT = the sum of
                 the sequence's inputs so far
    scripted     platform pytorch_libtorch: 1/model.pt (torch.jit.script),
                 INPUT__0 f32 [8], INPUT__1 i64 [4] -> OUTPUT__0 f32 [3],
                 OUTPUT__1 i64 [4] (served as INT32)
    pipeline     an ensemble: two_io, then classifier on its sum

runs the real binary's `pjserve import-triton` on it, serves the output
repository (with the pjserve.yaml it wrote) with the real server, and
compares every model's answers over gRPC and HTTP with onnxruntime on the
original ONNX files (the ensemble with the two onnxruntime sessions in
sequence, the sequence model step by step with its state carried; the
TorchScript model with torch.jit.load), and the queue policy the server
applied from pjserve.yaml. Then refusals: an unsupported field (and
--ignore for it), a GPU instance group, an input's reshape, an unknown
platform, a model.pt torch cannot load, a malformed config.pbtxt and an ONNX
file with an op export_onnx does not have are each refused naming the model
and the field or op, while a good model beside them is still written (exit
status 1).
"""

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import describe  # noqa: E402
from protocol_util import ServerProcess, finish_checked, start_or_fail  # noqa: E402

onnx = pytest.importorskip("onnx", reason="onnx lives in .venv-torch: make e2e-torch")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime lives in .venv-torch")
torch = pytest.importorskip("torch", reason="PyTorch lives in .venv-torch: make e2e-torch")
pytest.importorskip("tritonclient.grpc.model_config_pb2",
                    reason="tritonclient's model_config_pb2 reads config.pbtxt")
from onnx import TensorProto, helper  # noqa: E402

TOLERANCE = 1e-5
LABELS = ["cat", "dog", "bird", "fish", "horse"]
IMPORT_TIMEOUT_S = 300


# ---- the Triton repository ---------------------------------------------------------------

class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 5)

    def forward(self, x):
        return torch.softmax(self.l2(torch.relu(self.l1(x))), dim=-1)


class TwoIO(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(16))

    def forward(self, a, b):
        return a * self.scale + b.to(torch.float32), b * 3


class Whole(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x).sum(dim=0)


class Scripted(torch.nn.Module):
    """For the TorchScript model: Triton's PyTorch naming (INPUT__0, ...) and int64."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 3)

    def forward(self, x, ids):
        return torch.tanh(self.l(x)), ids * 2 + 1


class Accumulate(torch.nn.Module):
    def forward(self, x, start, state):
        new = state * (1 - start.to(torch.float32)) + x
        return new, new


def export(module, args, path, inputs, outputs, batched=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = {n: {0: "batch"} for n in inputs + outputs} if batched else None
    with warnings.catch_warnings():  # the TorchScript-based exporter's deprecation
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module.eval(), args, str(path), input_names=inputs,
                          output_names=outputs, opset_version=17, dynamo=False,
                          dynamic_axes=axes)


def write_model(repo, name, config, module=None, args=None, inputs=(), outputs=(),
                batched=True, files=None):
    d = repo / name
    d.mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    if module is not None:
        export(module, args, d / "1" / "model.onnx", list(inputs), list(outputs), batched)
    for fname, text in (files or {}).items():
        (d / fname).write_text(text)
    return d


CLASSIFIER = """
name: "classifier"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 3 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { default_timeout_microseconds: 5000000 max_queue_size: 64 }
}
instance_group [ { kind: KIND_CPU count: 2 } ]
"""

TWO_IO = """
name: "two_io"
backend: "onnxruntime"
max_batch_size: 4
input [
  { name: "a" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "b" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "sum" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "scaled" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""

WHOLE = """
name: "whole"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

ACCUMULATE = """
name: "accumulate"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ {
    input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 4 ]
    initial_state: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zeros" }
  } ]
}
"""

SCRIPTED = """
name: "scripted"
platform: "pytorch_libtorch"
max_batch_size: 2
input [
  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 8 ] },
  { name: "INPUT__1" data_type: TYPE_INT64 dims: [ 4 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 4 ] }
]
"""

PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 4
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "PROBS" data_type: TYPE_FP32 dims: [ 5 ] },
  { name: "SCALED" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    { model_name: "two_io" model_version: -1
      input_map { key: "a" value: "A" } input_map { key: "b" value: "B" }
      output_map { key: "sum" value: "s" } output_map { key: "scaled" value: "SCALED" } },
    { model_name: "classifier" model_version: -1
      input_map { key: "x" value: "s" } output_map { key: "probs" value: "PROBS" } }
  ]
}
"""


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton")
    torch.manual_seed(0)
    write_model(repo, "classifier", CLASSIFIER, Classifier(), (torch.randn(1, 16),), ["x"],
                ["probs"], files={"labels.txt": "\n".join(LABELS) + "\n"})
    write_model(repo, "two_io", TWO_IO, TwoIO(),
                (torch.randn(1, 16), torch.zeros(1, 16, dtype=torch.int32)), ["a", "b"],
                ["sum", "scaled"])
    write_model(repo, "whole", WHOLE, Whole(), (torch.randn(3, 4),), ["x"], ["y"],
                batched=False)
    write_model(repo, "accumulate", ACCUMULATE, Accumulate(),
                (torch.randn(1, 4), torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, 4)),
                ["INPUT", "START", "STATE_IN"], ["OUTPUT", "STATE_OUT"])
    d = write_model(repo, "scripted", SCRIPTED)
    (d / "1").mkdir()
    torch.jit.script(Scripted().eval()).save(str(d / "1" / "model.pt"))
    write_model(repo, "pipeline", PIPELINE)
    (repo / "pipeline" / "1").mkdir()  # Triton wants a version directory, even empty
    return repo


def import_triton(pjserve_bin, *args, python=True):
    env = dict(os.environ)
    if python:
        env["PJSERVE_PYTHON"] = sys.executable  # this test's .venv-torch
    else:
        env.pop("PJSERVE_PYTHON", None)
    start = time.monotonic()
    r = subprocess.run([str(pjserve_bin), "import-triton", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    print(f"pjserve import-triton {' '.join(map(str, args))}: exit {r.returncode} in "
          f"{time.monotonic() - start:.1f} s\n{r.stdout}{r.stderr}")
    return r


@pytest.fixture(scope="module")
def imported(triton_repo, pjserve_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("pjserve") / "models"
    # the default interpreter: .venv-torch beside the build directory
    default = (Path(pjserve_bin).resolve().parents[1] / ".venv-torch" / "bin" / "python")
    r = import_triton(pjserve_bin, triton_repo, out, python=not default.exists())
    assert r.returncode == 0, describe(r)
    return out, r.stdout


class Sessions:
    def __init__(self, repo):
        self.s = {n: ort.InferenceSession(str(repo / n / "1" / "model.onnx"))
                  for n in ("classifier", "two_io", "whole", "accumulate")}
        self.scripted = torch.jit.load(str(repo / "scripted" / "1" / "model.pt"))

    def run(self, name, **feed):
        return self.s[name].run(None, feed)


# ---- converted and served ------------------------------------------------------------------

def test_progress_and_summary(imported):
    out, stdout = imported
    assert "classifier: onnx, version 1, max_batch_size 4 -> batch sizes 1,2,3,4 ... done in" \
        in stdout
    assert "whole: onnx, version 1, max_batch_size 0 -> no batch axis ... done in" in stdout
    assert "pipeline: ensemble of two_io -> classifier ... done in" in stdout
    assert "scripted: torchscript, version 1, max_batch_size 2 -> batch sizes 1,2 ... done" \
        in stdout
    assert "TYPE_INT64 is served as INT32" in stdout
    assert "import-triton: 6 converted, 0 refused" in stdout
    assert "instance_group: harmless" in stdout
    for name in ("classifier", "two_io", "whole", "accumulate", "scripted", "pipeline"):
        assert (out / name / "manifest.yaml").is_file(), name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left
    manifest = (out / "classifier" / "manifest.yaml").read_text()
    assert "batch_sizes: [1, 2, 3, 4]" in manifest and 'labels: "labels.txt"' in manifest
    assert (out / "classifier" / "labels.txt").read_text().split() == LABELS
    seq = (out / "accumulate" / "manifest.yaml").read_text()
    assert 'input: "STATE_IN", output: "STATE_OUT", initial: zeros' in seq
    assert 'start: "START"' in seq and "idle_timeout_ms: 5000" in seq
    policies = (out / "pjserve.yaml").read_text()
    assert "classifier:" in policies and "max_queue_depth: 64" in policies
    assert "default_timeout_us: 5000000" in policies


@pytest.fixture(scope="module")
def server(imported, pjserve_bin, plugin_path, tmp_path_factory):
    out, _ = imported
    work = tmp_path_factory.mktemp("serve")
    s = start_or_fail(ServerProcess(pjserve_bin, plugin_path, out, work / "cache", work,
                                    ["--config", str(out / "pjserve.yaml")], "import"))
    yield s
    finish_checked(s)


def relative_error(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want))) / \
        max(1.0, float(np.max(np.abs(want))))


def clients(server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    return ((grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
            (httpclient, httpclient.InferenceServerClient(server.http_url)))


def infer(mod, client, model, arrays, **kw):
    kserve = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    inputs = []
    for name, x in arrays.items():
        i = mod.InferInput(name, list(x.shape), kserve[x.dtype])
        i.set_data_from_numpy(x)
        inputs.append(i)
    return client.infer(model, inputs, **kw)


def test_served_as_onnxruntime_computes(server, triton_repo):
    ort_ = Sessions(triton_repo)
    rng = np.random.default_rng(1)
    for mod, client in clients(server):
        proto = mod.__name__.split(".")[-1]
        for n in (1, 3):  # 3 rows: padded to the compiled size 3, coalesced with nothing
            x = rng.standard_normal((n, 16)).astype(np.float32)
            got = infer(mod, client, "classifier", {"x": x}).as_numpy("probs")
            (want,) = ort_.run("classifier", x=x)
            assert got.shape == want.shape and relative_error(got, want) <= TOLERANCE, proto
            a = rng.standard_normal((n, 16)).astype(np.float32)
            b = rng.integers(-50, 50, (n, 16)).astype(np.int32)
            r = infer(mod, client, "two_io", {"a": a, "b": b})
            want_sum, want_scaled = ort_.run("two_io", a=a, b=b)
            assert relative_error(r.as_numpy("sum"), want_sum) <= TOLERANCE, proto
            assert np.array_equal(r.as_numpy("scaled"), want_scaled), proto
            # the ensemble: two_io, then classifier on its sum
            r = infer(mod, client, "pipeline", {"A": a, "B": b})
            (want_probs,) = ort_.run("classifier", x=want_sum)
            assert relative_error(r.as_numpy("PROBS"), want_probs) <= TOLERANCE, proto
            assert np.array_equal(r.as_numpy("SCALED"), want_scaled), proto
        # TorchScript, its int64 served as int32
        x = rng.standard_normal((2, 8)).astype(np.float32)
        ids = rng.integers(0, 1000, (2, 4)).astype(np.int32)
        r = infer(mod, client, "scripted", {"INPUT__0": x, "INPUT__1": ids})
        with torch.no_grad():
            w0, w1 = ort_.scripted(torch.from_numpy(x), torch.from_numpy(ids).long())
        assert relative_error(r.as_numpy("OUTPUT__0"), w0.numpy()) <= TOLERANCE, proto
        assert r.as_numpy("OUTPUT__1").dtype == np.int32
        assert np.array_equal(r.as_numpy("OUTPUT__1"), w1.numpy()), proto
        x = rng.standard_normal((3, 4)).astype(np.float32)
        got = infer(mod, client, "whole", {"x": x}).as_numpy("y")
        (want,) = ort_.run("whole", x=x)
        assert got.shape == (4,) and relative_error(got, want) <= TOLERANCE, proto
        # classification with the labels file
        x = rng.standard_normal((2, 16)).astype(np.float32)
        i = mod.InferInput("x", [2, 16], "FP32")
        i.set_data_from_numpy(x)
        r = client.infer("classifier", [i],
                         outputs=[mod.InferRequestedOutput("probs", class_count=1)])
        (want,) = ort_.run("classifier", x=x)
        top = [e.decode() if isinstance(e, bytes) else e for e in r.as_numpy("probs").ravel()]
        assert [t.split(":")[2] for t in top] == [LABELS[k] for k in want.argmax(-1)], proto
        print(f"{proto}: classifier, two_io, pipeline, scripted, whole and classification "
              "agree")
        client.close()


def test_sequence_keeps_state_as_onnxruntime(server, triton_repo):
    ort_ = Sessions(triton_repo)
    rng = np.random.default_rng(2)
    steps = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(4)]
    for k, (mod, client) in enumerate(clients(server)):
        state = np.zeros((1, 4), np.float32)
        for j, x in enumerate(steps):
            start = np.array([[1 if j == 0 else 0]], np.int32)
            want, state = ort_.run("accumulate", INPUT=x, START=start, STATE_IN=state)
            got = infer(mod, client, "accumulate", {"INPUT": x}, sequence_id=100 + k,
                        sequence_start=j == 0,
                        sequence_end=j == len(steps) - 1).as_numpy("OUTPUT")
            assert relative_error(got, want) <= TOLERANCE, (mod.__name__, j)
        client.close()


def test_model_config_reports_the_mapping(server):
    import tritonclient.grpc as grpcclient
    # the queue policy from pjserve.yaml, as the server logs it at start-up
    assert "model policy classifier: max queue depth 64, default timeout 5000000 us" in \
        server.stderr_text(), server.describe()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        cfg = c.get_model_config("classifier").config
        assert cfg.max_batch_size == 4
        assert cfg.output[0].label_filename == "labels.txt"
        assert c.get_model_config("whole").config.max_batch_size == 0
        ens = c.get_model_config("pipeline").config
        assert ens.platform == "ensemble"
        assert [s.model_name for s in ens.ensemble_scheduling.step] == ["two_io", "classifier"]
    finally:
        c.close()


# ---- refusals ----------------------------------------------------------------------------

def onnx_file(path, nodes, op_inputs, op_outputs):
    path.parent.mkdir(parents=True, exist_ok=True)
    g = helper.make_graph(nodes, "g", op_inputs, op_outputs)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


RELU = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 2
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 5 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 5 ] }} ]
"""


def relu_model(repo, name, extra=""):
    d = repo / name
    d.mkdir(parents=True)
    (d / "config.pbtxt").write_text(RELU.format(name=name) + extra)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])
    onnx_file(d / "1" / "model.onnx", [helper.make_node("Relu", ["x"], ["y"], name="r")],
              [x], [y])
    return d


def test_refusals_name_the_model_and_field(pjserve_bin, tmp_path):
    repo = tmp_path / "triton"
    relu_model(repo, "good")
    relu_model(repo, "tuned", 'optimization { graph { level: 1 } }\n')
    relu_model(repo, "on_gpu", 'instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n')
    relu_model(repo, "reshaped").joinpath("config.pbtxt").write_text(
        RELU.format(name="reshaped").replace("dims: [ 5 ] }", "dims: [ 5 ] reshape: "
                                             "{ shape: [ 5, 1 ] } }", 1))
    (repo / "engine" / "1").mkdir(parents=True)
    (repo / "engine" / "config.pbtxt").write_text(
        'name: "engine"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n')
    (repo / "scripted" / "1").mkdir(parents=True)
    (repo / "scripted" / "1" / "model.pt").write_bytes(b"not read")
    (repo / "scripted" / "config.pbtxt").write_text(SCRIPTED)
    relu_model(repo, "broken").joinpath("config.pbtxt").write_text(
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: "eight"\n')
    d = repo / "topk"
    d.mkdir()
    (d / "config.pbtxt").write_text(RELU.format(name="topk"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])
    k = helper.make_tensor("k", TensorProto.INT64, [1], [5])
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["y", "i"], name="pick")], "g",
                          [x], [y], initializer=[k])
    (d / "1").mkdir()
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              str(d / "1" / "model.onnx"))

    out = tmp_path / "out"
    r = import_triton(pjserve_bin, repo, out)
    assert r.returncode == 1, describe(r)
    text = r.stdout
    assert "import-triton: 1 converted, 7 refused" in text, text
    assert (out / "good" / "manifest.yaml").is_file()  # written all the same
    for name in ("tuned", "on_gpu", "reshaped", "engine", "scripted", "broken", "topk"):
        assert not (out / name).exists(), name
    expected = {
        "tuned": "optimization: set: XLA compiles the whole program ahead of time",
        "on_gpu": "instance_group[0]: kind KIND_GPU, gpus [0]",
        "reshaped": "input[0] (x).reshape: not supported",
        "engine": "platform 'tensorrt_plan': pjserve imports ONNX models",
        "scripted": "model.pt is not a TorchScript file torch.jit.load reads",
        "broken": "config.pbtxt is not a valid Triton model configuration: 3:17",
        "topk": "node 'pick': ONNX op TopK is not supported by export_onnx",
    }
    for name, words in expected.items():
        lines = [ln for ln in text.splitlines() if ln.startswith(f"{name}: refused: ")]
        assert lines and words in lines[0], (name, words, text)
    assert "pass --ignore optimization" in text and "pass --ignore instance_group" in text

    # --ignore imports the model without the field, and says so
    r = import_triton(pjserve_bin, repo, out, "--only", "tuned", "--ignore", "optimization")
    assert r.returncode == 0, describe(r)
    assert "optimization: set: ignored (--ignore optimization)" in r.stdout
    assert (out / "tuned" / "manifest.yaml").is_file()
    # an existing bundle is refused without --force
    r = import_triton(pjserve_bin, repo, out, "--only", "good")
    assert r.returncode == 1 and "exists: pass --force to replace it" in r.stdout


def test_help_and_interpreter_errors(pjserve_bin, tmp_path):
    r = subprocess.run([str(pjserve_bin), "import-triton", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "PJSERVE_PYTHON" in r.stdout and "refused" in r.stdout
    env = dict(os.environ, PJSERVE_PYTHON=str(tmp_path / "no-python"))
    r = subprocess.run([str(pjserve_bin), "import-triton", str(tmp_path), str(tmp_path / "o")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "PJSERVE_PYTHON" in r.stderr and "no-python" in r.stderr
    r = subprocess.run([str(pjserve_bin), "import-triton", str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "expected TRITON_REPO and OUT_REPO" in r.stderr
