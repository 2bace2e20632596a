"""ONNX models exported with export_onnx: onnxruntime and the server agree.

Runs in .venv-torch (onnx, onnxruntime, torch; `make e2e-torch`). Eleven
ONNX files written by torch.onnx.export (opset 17, batch axis dynamic) from
architectures with random weights (nothing is downloaded): ten torchvision
classifiers (ResNet-18, MobileNetV3-Small, SqueezeNet, ShuffleNetV2,
EfficientNet-B0, DenseNet-121, MNASNet, RegNetY-400MF, GoogLeNet,
ConvNeXt-Tiny; 96x96 images) and a tiny BERT encoder from transformers
(input_ids and attention_mask with padded rows). Each is exported at batch
sizes 1 and 4, all are served by one `pjserve serve`, and each answer (3
rows over gRPC, padded to 4 by the server; 1 row over HTTP) is compared
with onnxruntime on the ONNX file, within 1e-4 relative to the output's
scale. Also: the weights are the graph's float initializers by name, and
what export_onnx cannot lower (an op it does not have, a non-standard
domain, an open extent besides the batch) is refused before anything is
traced, naming the node and the op.
"""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import check_served, serving  # noqa: E402

onnx = pytest.importorskip("onnx", reason="onnx lives in .venv-torch: make e2e-torch")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime lives in .venv-torch")
torch = pytest.importorskip("torch", reason="PyTorch lives in .venv-torch: make e2e-torch")
import torchvision  # noqa: E402
import transformers  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from pjserve_export import export_onnx, read_safetensors  # noqa: E402
from pjserve_export.onnx_export import UnsupportedOnnx  # noqa: E402

BATCH_SIZES = (1, 4)
TOLERANCE = 1e-4
SIZE = 96
SEQ, VOCAB = 16, 1000
VISION = ("resnet18", "mobilenet_v3_small", "squeezenet1_0", "shufflenet_v2_x0_5",
          "efficientnet_b0", "densenet121", "mnasnet0_5", "regnet_y_400mf", "googlenet",
          "convnext_tiny")


class Case:
    def __init__(self, name, onnx_path, make_inputs):
        self.name, self.onnx_path, self.make_inputs = name, onnx_path, make_inputs
        self.session = ort.InferenceSession(str(onnx_path))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.path = None

    def reference(self, xs):
        # the ONNX file's own types: int64 ids where pjserve serves int32 ones
        feed = {i.name: (x.astype(np.int64) if i.type == "tensor(int64)" else x)
                for i, x in zip(self.session.get_inputs(), xs)}
        return self.session.run(None, feed)


def vision_case(name, out):
    torch.manual_seed(0)
    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = getattr(torchvision.models, name)(weights=None, **kw).eval()
    path = out / f"{name}.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, SIZE, SIZE),), str(path), input_names=["x"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    return Case(f"onnx_{name}", path, lambda n, seed: [
        np.random.default_rng(seed).standard_normal((n, 3, SIZE, SIZE)).astype(np.float32)])


def bert_case(out):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64, attn_implementation="eager")
    model = transformers.BertModel(config).eval()
    path = out / "bert.onnx"
    ids = torch.randint(1, VOCAB, (1, SEQ))
    batch = {0: "batch"}
    torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17,
                      dynamo=False, dynamic_axes={"input_ids": batch, "attention_mask": batch,
                                                  "last_hidden_state": batch,
                                                  "pooler_output": batch})

    def inputs(n, seed):
        rng = np.random.default_rng(seed)
        lengths = SEQ - rng.integers(0, 4, n)  # rows padded at their end by 0 to 3 tokens
        mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
        return [rng.integers(1, VOCAB, (n, SEQ), dtype=np.int32), mask]
    return Case("onnx_bert", path, inputs)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx")
    result = [vision_case(name, out) for name in VISION] + [bert_case(out)]
    for c in result:
        c.path = export_onnx(c.onnx_path, out / "bundles", name=c.name, batch_sizes=BATCH_SIZES)
    return result


def test_every_model_served_as_onnxruntime_computes(cases, pjserve_bin, plugin_path, tmp_path):
    assert len(cases) >= 10
    with serving(pjserve_bin, plugin_path, [c.path for c in cases], tmp_path) as server:
        check_served(server, cases, TOLERANCE)


def test_weights_are_the_float_initializers_by_name(cases):
    c = next(x for x in cases if x.name == "onnx_resnet18")
    weights, _ = read_safetensors(c.path / "weights.safetensors")
    model = onnx.load(str(c.onnx_path))
    # named as in the graph, with characters other than [A-Za-z0-9_.] as "_"
    floats = {re.sub(r"[^A-Za-z0-9_.]", "_", i.name): onnx.numpy_helper.to_array(i)
              for i in model.graph.initializer
              if onnx.numpy_helper.to_array(i).dtype == np.float32}
    # but the classifier's weight, a Gemm's B with transB=1, is stored transposed
    assert floats and set(weights) == set(floats) - {"fc.weight"} | {"fc.weight_t"}
    assert np.array_equal(weights["fc.weight_t"], floats["fc.weight"].T)
    conv = next(n for n in weights if "onnx__" in n)
    assert np.array_equal(weights[conv], floats[conv])


def graph(nodes, inputs, outputs, domain_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domain_opsets]
    return helper.make_model(g, opset_imports=opsets)


def test_refusals_name_the_node_and_op(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
    top = graph([helper.make_node("TopK", ["x", "k"], ["y", "i"], name="pick")], [x, k], [y])
    with pytest.raises(UnsupportedOnnx, match=r"node 'pick': ONNX op TopK is not supported"):
        export_onnx(top, tmp_path, name="t", batch_sizes=[1])
    custom = graph([helper.make_node("Fancy", ["x"], ["y"], name="f", domain="com.example")],
                   [x], [y], domain_opsets=["com.example"])
    with pytest.raises(UnsupportedOnnx, match=r"com.example.Fancy is not an ONNX standard op"):
        export_onnx(custom, tmp_path, name="c", batch_sizes=[1])
    wide = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])
    relu = graph([helper.make_node("Relu", ["x"], ["y"], name="r")], [wide], [y])
    with pytest.raises(UnsupportedOnnx, match="open at axis 1: give example_inputs"):
        export_onnx(relu, tmp_path, name="w", batch_sizes=[1])
    # given example inputs at one width, it exports
    path = export_onnx(relu, tmp_path, name="w", batch_sizes=[1],
                       example_inputs=[np.zeros((1, 7), np.float32)])
    assert (path / "manifest.yaml").exists()
