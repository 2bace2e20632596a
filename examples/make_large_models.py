#!/usr/bin/env python3
"""Export the large models, for benchmarks and for trying pjserve on real architectures.

    examples/make_large_models.py OUT_DIR [--only NAME ...] [--batch-sizes 1,2,4,8,16]

Writes OUT_DIR/<name>/ for resnet50 (ResNet-50 v1.5, 25.6 M parameters, about
98 MiB of f32 weights) and resnet18 (11.7 M, about 45 MiB): x f32
[batch,224,224,3] (NHWC) -> logits f32 [batch,1000], in plain JAX with fixed
random weights (python/pjserve_export/resnet.py). Run by a Python with torch
(.venv-torch/bin/python), also the same models from PyTorch: resnet50_torch
(torchvision's, x f32 [batch,3,224,224] NCHW) and bert_base_torch
(transformers' BERT-base encoder, 12 layers, hidden 768, 110 M parameters:
input_ids and attention_mask int32 [batch,128] -> last_hidden_state
[batch,128,768], pooler_output [batch,768]), through export_torch; and
densenet_onnx, torchvision's DenseNet-121 (8.0 M parameters) shaped as the
model of that name in Triton's example repository, which its grpc_client.py
calls: no batch axis, data_0 f32 [3,224,224] (NCHW) -> fc6_1 f32
[1000,1,1]. All with
random weights from fixed seeds; nothing is downloaded, so the answers are
the frameworks', not ImageNet classes or language. Compiling them takes a
while on a CPU: `pjserve serve` logs each model's progress. `make
models-large` runs this into models-large/ (with .venv-torch); serve them with
`build/pjserve serve --model-repository models-large`.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from pjserve_export.resnet import parameter_count, resnet_model  # noqa: E402

LARGE = {"resnet50": 50, "resnet18": 18}
TORCH = ("resnet50_torch", "bert_base_torch", "densenet_onnx")
BERT_SEQ = 128


def have_torch():
    try:
        import torch  # noqa: F401
        import torchax  # noqa: F401
        return True
    except ImportError:
        return False


def export_torch_model(name, out_dir, sizes):
    import numpy as np
    import torch
    from pjserve_export import export_torch
    torch.manual_seed(0)
    if name == "resnet50_torch":
        import torchvision
        module = torchvision.models.resnet50(weights=None)
        return module, export_torch(module, [np.zeros((1, 3, 224, 224), np.float32)], out_dir,
                                    name=name, batch_sizes=sizes, input_names=["x"],
                                    output_names=["logits"], input_formats={"x": "NCHW"})
    if name == "densenet_onnx":
        import torchvision

        class OneImage(torch.nn.Module):
            """DenseNet-121 on one image without a batch axis, scores as
            [1000, 1, 1] (Triton's densenet_onnx tensors)."""

            def __init__(self):
                super().__init__()
                self.net = torchvision.models.densenet121(weights=None)

            def forward(self, data_0):
                return self.net(data_0.unsqueeze(0)).reshape(1000, 1, 1)

        module = OneImage()
        return module, export_torch(module, [np.zeros((3, 224, 224), np.float32)], out_dir,
                                    name=name, batch_sizes=None, input_names=["data_0"],
                                    output_names=["fc6_1"], input_formats={"data_0": "NCHW"})
    import transformers
    module = transformers.BertModel(transformers.BertConfig(attn_implementation="eager"))
    ids = np.ones((1, BERT_SEQ), np.int32)
    return module, export_torch(module, [ids, ids], out_dir, name=name, batch_sizes=sizes,
                                input_names=["input_ids", "attention_mask"],
                                output_names=["last_hidden_state", "pooler_output"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    names = sorted(LARGE) + list(TORCH)
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME",
                    help=f"export only these ({', '.join(names)}; the _torch ones need torch)")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16",
                    help="compiled batch sizes (default %(default)s)")
    a = ap.parse_args(argv)
    try:
        sizes = tuple(sorted({int(b) for b in a.batch_sizes.split(",")}))
    except ValueError:
        ap.error(f"--batch-sizes {a.batch_sizes!r}: comma-separated positive integers")
    if not sizes or sizes[0] < 1:
        ap.error("--batch-sizes: at least one, each at least 1")
    torch = have_torch()
    wanted = a.only or (list(LARGE) + (list(TORCH) if torch else []))
    if not torch and any(n in TORCH for n in wanted):
        ap.error("the _torch models need torch and torchax: run this with .venv-torch/bin/python "
                 "(scripts/bootstrap --torch makes it)")
    if not torch:
        print("no torch in this Python: exporting the JAX models only (run with "
              ".venv-torch/bin/python for the PyTorch ones too)", flush=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        t0 = time.monotonic()
        if name in TORCH:
            module, path = export_torch_model(name, a.out_dir, sizes)
            n = sum(p.numel() for p in module.parameters())
        else:
            m = resnet_model(LARGE[name])
            path = m.export(a.out_dir, batch_sizes=sizes)
            n = parameter_count(m.params)
        batching = "no batch axis" if name == "densenet_onnx" else f"batch sizes {list(sizes)}"
        print(f"{name}: {n / 1e6:.1f} M parameters, {batching} -> {path} "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
