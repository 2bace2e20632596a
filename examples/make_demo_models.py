#!/usr/bin/env python3
"""Export the demo models as pjserve bundles.

    examples/make_demo_models.py OUT_DIR [--only NAME ...] [--batch-sizes 1,4,8]
                                 [--target-stablehlo-version X.Y.Z]

Writes OUT_DIR/<name>/ for mlp, convnet, two_io, mlp_bf16, mlp_f16 and gapnet
(see python/pjserve_export/demo.py for what each one computes; gapnet has two
input-shape variants). Weights come from
fixed PRNG keys, so the bundles are byte-for-byte reproducible. Run a bundle
with `build/pjserve run`, or all of them with examples/run_demo.py.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from pjserve_export import default_target_version, read_manifest  # noqa: E402
from pjserve_export.demo import BATCH_SIZES, DEMO_MODEL_NAMES, demo_models  # noqa: E402


def _shape(spec):
    return "[" + ", ".join(["batch"] + [str(d) for d in spec.shape]) + "]"


def _signature(m, variant):
    ins = ", ".join(f"{s.name}:{s.dtype}{_shape(s)}" for s in m.variant_inputs(variant))
    outs = ", ".join(f"{s.name}:{s.dtype}{_shape(s)}" for s in m.variant_outputs(variant))
    return f"{ins} -> {outs}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="directory to write the bundles into")
    ap.add_argument("--only", nargs="+", choices=DEMO_MODEL_NAMES, metavar="NAME",
                    help=f"export only these ({', '.join(DEMO_MODEL_NAMES)})")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)),
                    help="comma-separated compiled batch sizes (default %(default)s)")
    ap.add_argument("--target-stablehlo-version", default=None,
                    help=f"StableHLO version of the artifacts (default {default_target_version()})")
    a = ap.parse_args(argv)
    try:
        batch_sizes = [int(b) for b in a.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes {a.batch_sizes!r}: expected comma-separated integers")

    version = a.target_stablehlo_version or default_target_version()
    print(f"exporting to {a.out_dir} (batch sizes {batch_sizes}, StableHLO {version})", flush=True)
    for model in demo_models(a.only):
        t0 = time.perf_counter()
        try:
            path = model.export(a.out_dir, batch_sizes=batch_sizes,
                                target_stablehlo_version=a.target_stablehlo_version)
        except ValueError as e:
            print(f"make_demo_models: {model.name}: {e}", file=sys.stderr)
            return 1
        m = read_manifest(path)
        print(f"  {model.name:<9} {_signature(m, 'default')}  "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        for v in m.variants:
            print(f"  {'':<9} variant {v.name}: {_signature(m, v.name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
