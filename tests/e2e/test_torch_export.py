"""PyTorch models exported with export_torch: eager PyTorch, `pjserve run` and the server agree.

Runs in .venv-torch (torch, torchvision, transformers, torchax; `make
e2e-torch`). Two real architectures with random weights from a fixed seed
(nothing is downloaded): torchvision's ResNet-18 (x f32 [batch,3,224,224]
NCHW -> logits [batch,1000]) and a tiny BERT encoder from transformers
(2 layers, hidden 64: input_ids and attention_mask int32 [batch,16] ->
last_hidden_state [batch,16,64] and pooler_output [batch,64]), and BERT,
DistilBERT and RoBERTa encoders as their configs build them (SDPA attention,
whose all-ones-mask shortcut a trace cannot take) with padded masks. Each is
exported at batch sizes 1 and 4 and compared with eager PyTorch on the same
inputs: through `pjserve run` at 1 and 3 rows (padded to 4 by the server and
sliced back) and served, over gRPC at 4 rows and HTTP at 1. The max absolute
error of every output is printed (pytest -s). Also: the weights are the
module's state_dict by name, in a stable order, and bad calls say what is
wrong, torchvision's ResNet-50 itself is exported and served at batch size
1, and make models-large's densenet_onnx (DenseNet-121 without a batch axis)
is served as PyTorch computes it.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import describe, save_inputs, serving  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch lives in .venv-torch: make e2e-torch")
import torchvision  # noqa: E402
import transformers  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from pjserve_export import export_torch, torch_reference  # noqa: E402

SEQ = 16
VOCAB = 1000
BATCH_SIZES = (1, 4)
# f32 in both, but different kernels: PyTorch's CPU convolutions and matrix
# products against XLA's, with other summation orders
ATOL = RTOL = 2e-4


class Case:
    def __init__(self, name, module, make_inputs, input_names, output_names, kserve_types):
        self.name, self.module, self.make_inputs = name, module, make_inputs
        self.input_names, self.output_names = input_names, output_names
        self.kserve_types = kserve_types


def resnet18():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None)
    return Case("resnet18", m,
                lambda n, seed: [np.random.default_rng(seed).standard_normal((n, 3, 224, 224))
                                 .astype(np.float32)],
                ["x"], ["logits"], ["FP32"])


def token_inputs(n, seed):
    """input_ids and attention_mask int32 [n, SEQ], each row padded at its
    end by 0 to 3 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (n, SEQ), dtype=np.int32)
    lengths = SEQ - rng.integers(0, 4, n)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    return [ids, mask]


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64, attn_implementation="eager")
    return Case("tiny_bert", transformers.BertModel(config), token_inputs,
                ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
                ["INT32", "INT32"])


def encoder(name, model_class, config):
    """A Hugging Face encoder as its config builds it (default attention:
    SDPA, whose mask shortcut looks at the mask's values), called with an
    attention mask."""
    def make():
        torch.manual_seed(0)
        return Case(name, model_class(config()), token_inputs, ["input_ids", "attention_mask"],
                    ["last_hidden_state"], ["INT32", "INT32"])
    return make


CASES = {
    "resnet18": resnet18,
    "tiny_bert": tiny_bert,
    "bert_sdpa": encoder("bert_sdpa", transformers.BertModel, lambda: transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64)),
    "distilbert": encoder("distilbert", transformers.DistilBertModel,
                          lambda: transformers.DistilBertConfig(
                              vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                              max_position_embeddings=64)),
    "roberta": encoder("roberta", transformers.RobertaModel, lambda: transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=SEQ + 4)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    case = CASES[request.param]()
    path = export_torch(case.module, case.make_inputs(1, 0), tmp_path_factory.mktemp("torch"),
                        name=case.name, batch_sizes=BATCH_SIZES, input_names=case.input_names,
                        output_names=case.output_names)
    return case, path


def compare(what, got, want):
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    print(f"{what}: max abs error {err:.3g} (scale {float(np.abs(want).max()):.3g})")
    assert got.shape == want.shape, f"{what}: shape {got.shape}, PyTorch's {want.shape}"
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=what)


@pytest.mark.parametrize("n", [1, 3])
def test_run_matches_pytorch(pjserve, exported, tmp_path, n):
    case, path = exported
    inputs = case.make_inputs(n, seed=10 + n)
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", path, *save_inputs(dict(zip(case.input_names, inputs)), tmp_path / "in"),
                "--output-dir", out, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
    want = torch_reference(case.module, inputs, case.output_names)
    for name, w in zip(case.output_names, want):
        compare(f"pjserve run {case.name} n={n} {name}", np.load(out / f"{name}.npy"), w)


def test_served_matches_pytorch(pjserve_bin, plugin_path, exported, tmp_path):
    case, path = exported
    with serving(pjserve_bin, plugin_path, [path], tmp_path, case.name) as s:
        inputs = case.make_inputs(4, seed=21)
        want = torch_reference(case.module, inputs, case.output_names)
        g = grpcclient.InferenceServerClient(s.grpc_url)
        g_in = []
        for name, x, t in zip(case.input_names, inputs, case.kserve_types):
            g_in.append(grpcclient.InferInput(name, list(x.shape), t))
            g_in[-1].set_data_from_numpy(x)
        result = g.infer(case.name, g_in)
        for name, w in zip(case.output_names, want):
            compare(f"gRPC {case.name} n=4 {name}", result.as_numpy(name), w)

        h = httpclient.InferenceServerClient(s.http_url)
        h_in = []
        for name, x, t in zip(case.input_names, inputs, case.kserve_types):
            h_in.append(httpclient.InferInput(name, [1, *x.shape[1:]], t))
            h_in[-1].set_data_from_numpy(x[:1], binary_data=True)
        result = h.infer(case.name, h_in)
        for name, w in zip(case.output_names, want):
            compare(f"HTTP {case.name} n=1 {name}", result.as_numpy(name), w[:1])


def test_resnet50_served_matches_pytorch(pjserve_bin, plugin_path, tmp_path):
    """The full-size architecture the benchmarks use, at batch size 1."""
    torch.manual_seed(0)
    module = torchvision.models.resnet50(weights=None)
    x = np.random.default_rng(50).standard_normal((1, 3, 224, 224)).astype(np.float32)
    path = export_torch(module, [x], tmp_path / "bundles", name="resnet50_torch",
                        batch_sizes=(1,), input_names=["x"], output_names=["logits"],
                        input_formats={"x": "NCHW"})
    with serving(pjserve_bin, plugin_path, [path], tmp_path, "resnet50") as s:
        g = grpcclient.InferenceServerClient(s.grpc_url)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        (want,) = torch_reference(module, [x], ["logits"])
        compare("gRPC resnet50_torch n=1 logits", g.infer("resnet50_torch", [inp]).as_numpy("logits"),
                want)
        config = g.get_model_config("resnet50_torch").config
        assert config.input[0].format == config.input[0].FORMAT_NCHW


def test_densenet_onnx_without_batch_axis_matches_pytorch(pjserve_bin, plugin_path, tmp_path):
    """make models-large's densenet_onnx (torchvision's DenseNet-121 shaped as
    Triton's example model of that name: no batch axis, data_0 [3,224,224]
    -> fc6_1 [1000,1,1]), exported by examples/make_large_models.py itself,
    served and compared with eager PyTorch on both protocols."""
    import importlib.util
    script = Path(__file__).resolve().parents[2] / "examples" / "make_large_models.py"
    spec = importlib.util.spec_from_file_location("make_large_models", script)
    large = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(large)
    module, path = large.export_torch_model("densenet_onnx", tmp_path / "bundles", (1,))
    x = np.random.default_rng(121).standard_normal((3, 224, 224)).astype(np.float32)
    (want,) = torch_reference(module, [x], ["fc6_1"])
    assert want.shape == (1000, 1, 1)
    with serving(pjserve_bin, plugin_path, [path], tmp_path, "densenet") as s:
        g = grpcclient.InferenceServerClient(s.grpc_url)
        inp = grpcclient.InferInput("data_0", [3, 224, 224], "FP32")
        inp.set_data_from_numpy(x)
        compare("gRPC densenet_onnx fc6_1", g.infer("densenet_onnx", [inp]).as_numpy("fc6_1"),
                want)
        config = g.get_model_config("densenet_onnx").config
        assert config.max_batch_size == 0
        assert config.input[0].format == config.input[0].FORMAT_NCHW
        h = httpclient.InferenceServerClient(s.http_url)
        hin = httpclient.InferInput("data_0", [3, 224, 224], "FP32")
        hin.set_data_from_numpy(x, binary_data=True)
        compare("HTTP densenet_onnx fc6_1", h.infer("densenet_onnx", [hin]).as_numpy("fc6_1"),
                want)


def safetensors_shapes(path):
    """{name: shape} of the bundle's weights, in the file's order."""
    with open(path / "weights.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def safetensors_names(path):
    return list(safetensors_shapes(path))


def test_module_still_runs_in_pytorch_after_export(tmp_path):
    """Tracing swaps JAX-backed tensors into the module by name; a weight
    tied under two names (T5's shared embedding) must come back as it was,
    so the module still runs, and answers the same, in PyTorch."""
    torch.manual_seed(0)
    m = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4))
    inputs = token_inputs(2, 5)
    (before,) = torch_reference(m, inputs, ["last_hidden_state"])
    export_torch(m, token_inputs(1, 0), tmp_path, name="t5_encoder", batch_sizes=[1],
                 input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"])
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        assert type(t.data) is torch.Tensor, f"{name} is a {type(t.data).__name__} after export"
    (after,) = torch_reference(m, inputs, ["last_hidden_state"])
    np.testing.assert_array_equal(after, before)


def run_x(pjserve, path, x, tmp_path):
    """`pjserve run` of the bundle at `path` on input x: its output y."""
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", path, *save_inputs({"x": x}, tmp_path / "in"), "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
    return np.load(out / "y.npy")


def test_parametrized_weights_are_refused_with_the_remedy(pjserve, tmp_path):
    """weight_norm (as Wav2Vec2's positional convolution has) cannot be
    traced: the export is refused naming the weight and how to remove the
    parametrization; removed as it says, the module exports and answers as
    PyTorch does."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(16, 4)))
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"parametrized weights \(2\.weight: .*"
                                         r"remove_parametrizations"):
        export_torch(m, [x[:1]], tmp_path / "refused", name="wn", batch_sizes=[1, 2],
                     input_names=["x"], output_names=["y"])
    (want,) = torch_reference(m, [x], ["y"])
    torch.nn.utils.parametrize.remove_parametrizations(m[2], "weight", leave_parametrized=True)
    path = export_torch(m, [x[:1]], tmp_path, name="wn", batch_sizes=[1, 2],
                        input_names=["x"], output_names=["y"])
    compare("weight_norm removed, pjserve run", run_x(pjserve, path, x, tmp_path), want)


def test_rewritten_convolutions_answer_as_pytorch(pjserve, tmp_path):
    """Depthwise convolutions, which export_torch traces as sums of kernel
    taps (stride, padding, dilation, with and without bias), and 1x1 ones,
    traced as matrix products (strided or not, with and without bias),
    beside convolutions that stay so (grouped, padded 1x1), answer as
    PyTorch does; the module keeps its own Conv2d modules and its
    state_dict names."""
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8),
                      nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8, bias=False),
                      nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8),
                      nn.Conv2d(8, 8, 3, stride=2, padding=3, dilation=3, groups=8),
                      nn.Conv2d(8, 8, (3, 1), stride=(1, 2), padding=(1, 0), groups=8),
                      nn.Conv2d(8, 16, 3, padding=1, groups=4),
                      nn.Conv2d(16, 12, 1),
                      nn.Conv2d(12, 12, 1, stride=2, bias=False),
                      nn.Conv2d(12, 6, 1, padding=1))
    names = list(m.state_dict())
    x = np.random.default_rng(5).standard_normal((2, 8, 17, 23)).astype(np.float32)
    (want,) = torch_reference(m, [x], ["y"])
    path = export_torch(m, [x[:1]], tmp_path, name="dw", batch_sizes=[1, 2],
                        input_names=["x"], output_names=["y"])
    assert all(type(c) is nn.Conv2d for c in m) and list(m.state_dict()) == names
    assert set(safetensors_names(path)) == set(names)
    compare("rewritten convolutions, pjserve run", run_x(pjserve, path, x, tmp_path), want)


class TiedHead(torch.nn.Module):
    """Token ids -> logits through an embedding whose weight the head shares
    (as a language model ties them), a Linear, and a Linear subclass whose
    owner reads its weight directly (as MultiheadAttention does)."""

    class Subclassed(torch.nn.Linear):
        pass

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.mlp = torch.nn.Linear(16, 16)
        self.direct = self.Subclassed(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = torch.relu(self.mlp(self.embed(ids)))
        h = torch.nn.functional.linear(h, self.direct.weight, self.direct.bias)
        return self.head(h * (self.mlp.weight.dtype == torch.float32))


def test_linear_weights_are_stored_transposed(pjserve, tmp_path):
    """An nn.Linear's weight is stored [in, out] as weight_t (XLA's CPU
    backend multiplies several rows by it many times faster), read back as
    `weight` by code that looks at it; a weight tied to another parameter,
    and a subclass's, stay as they are. Answers as PyTorch does at several
    batch sizes; the module is left as it was."""
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 8, bias=False))
    x = np.random.default_rng(7).standard_normal((3, 5, 12)).astype(np.float32)
    (want,) = torch_reference(m, [x], ["y"])
    path = export_torch(m, [x[:1]], tmp_path / "mlp", name="mlp", batch_sizes=[1, 3],
                        input_names=["x"], output_names=["y"])
    assert all(type(c) in (nn.Linear, nn.GELU) for c in m)
    assert list(m.state_dict()) == ["0.weight", "0.bias", "2.weight"]
    assert safetensors_shapes(path) == {"0.weight_t": [12, 32], "0.bias": [32],
                                        "2.weight_t": [32, 8]}
    compare("transposed linear layers, pjserve run", run_x(pjserve, path, x, tmp_path / "mlp"),
            want)

    tied = TiedHead().eval()
    ids = np.random.default_rng(8).integers(0, 50, (2, 6)).astype(np.int32)
    (want,) = torch_reference(tied, [ids], ["y"])
    path = export_torch(tied, [ids[:1]], tmp_path / "tied", name="tied", batch_sizes=[2],
                        input_names=["x"], output_names=["y"])
    assert tied.head.weight is tied.embed.weight
    assert safetensors_shapes(path) == {"embed.weight": [50, 16], "mlp.weight_t": [16, 16],
                                        "mlp.bias": [16], "direct.weight": [16, 16],
                                        "direct.bias": [16]}
    compare("tied and subclassed linear layers, pjserve run",
            run_x(pjserve, path, ids, tmp_path / "tied"), want)


def test_weights_are_the_state_dict_in_a_stable_order(tmp_path):
    case = resnet18()
    a = export_torch(case.module, case.make_inputs(1, 0), tmp_path / "a", name="r",
                     batch_sizes=(1,), input_names=["x"], output_names=["logits"])
    b = export_torch(resnet18().module, case.make_inputs(1, 0), tmp_path / "b", name="r",
                     batch_sizes=(1,), input_names=["x"], output_names=["logits"])
    names = safetensors_names(a)
    linear = {f"{n}.weight" for n, m in case.module.named_modules()
              if type(m) is torch.nn.Linear}
    assert linear == {"fc.weight"}
    assert set(names) == {f"{k}_t" if k in linear else k for k in case.module.state_dict()}
    assert names == safetensors_names(b)
    assert (a / "weights.safetensors").read_bytes() == (b / "weights.safetensors").read_bytes()
    assert (a / "model.b1.mlir").read_bytes() == (b / "model.b1.mlir").read_bytes()


def test_bad_calls_say_what_is_wrong(tmp_path):
    case = tiny_bert()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        export_torch(lambda x: x, [np.zeros((1, 4), np.float32)], tmp_path, name="f",
                     batch_sizes=(1,), input_names=["x"], output_names=["y"])
    with pytest.raises(ValueError, match="output_names asks for"):
        export_torch(case.module, case.make_inputs(1, 0), tmp_path, name="b", batch_sizes=(1,),
                     input_names=case.input_names, output_names=["last_hidden_state", "nope"])
