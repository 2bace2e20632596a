#!/usr/bin/env python3
"""Export the large models, for benchmarks and for trying pjserve on real architectures.

    examples/make_large_models.py OUT_DIR [--only NAME ...] [--batch-sizes 1,2,4,8,16]

Writes OUT_DIR/<name>/ for resnet50 (ResNet-50 v1.5, 25.6 M parameters, about
98 MiB of f32 weights) and resnet18 (11.7 M, about 45 MiB): x f32
[batch,224,224,3] (NHWC) -> logits f32 [batch,1000], in plain JAX with fixed
random weights (python/pjserve_export/resnet.py; no pretrained checkpoint is
fetched: the answers are JAX's, not ImageNet classes). Compiling them takes a
while on a CPU: `pjserve serve` logs each model's progress. `make
models-large` runs this into models-large/; serve them with
`build/pjserve serve --model-repository models-large`.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from pjserve_export.resnet import parameter_count, resnet_model  # noqa: E402

LARGE = {"resnet50": 50, "resnet18": 18}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--only", nargs="+", choices=sorted(LARGE), metavar="NAME",
                    help=f"export only these ({', '.join(sorted(LARGE))})")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16",
                    help="compiled batch sizes (default %(default)s)")
    a = ap.parse_args(argv)
    try:
        sizes = tuple(sorted({int(b) for b in a.batch_sizes.split(",")}))
    except ValueError:
        ap.error(f"--batch-sizes {a.batch_sizes!r}: comma-separated positive integers")
    if not sizes or sizes[0] < 1:
        ap.error("--batch-sizes: at least one, each at least 1")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in a.only or LARGE:
        t0 = time.monotonic()
        m = resnet_model(LARGE[name])
        path = m.export(a.out_dir, batch_sizes=sizes)
        print(f"{name}: {parameter_count(m.params) / 1e6:.1f} M parameters, batch sizes "
              f"{list(sizes)} -> {path} ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
