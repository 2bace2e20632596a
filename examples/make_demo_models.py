#!/usr/bin/env python3
"""Export the demo models as pjserve bundles.

    examples/make_demo_models.py OUT_DIR [--only NAME ...] [--batch-sizes 1,4,8]
                                 [--pjserve build/pjserve]
                                 [--target-stablehlo-version X.Y.Z]

Writes OUT_DIR/<name>/ for mlp, convnet, two_io, mlp_bf16, mlp_f16, gapnet
and image_convnet (see python/pjserve_export/demo.py for what each one
computes; gapnet has two input-shape variants; image_convnet is shaped for
image classification clients), and the composition examples (python/pjserve_export/
pipelines.py; their C code is in examples/bundles/): image_classifier (a model
with C hooks), image_bytes_classifier (a hook decoding JPEG files, which Triton's
ensemble_image_client.py calls), detector (a meta over detector_stage1 and detector_stage2) and
greedy_decoder (a meta over decoder_step), the models Triton's example
clients call by name (python/pjserve_export/triton_examples.py): simple and
simple_int8 (adders), custom_identity_int32, simple_string (hooks around an adder),
simple_identity (a compute-only meta), repeat_int32 (a decoupled meta),
simple_sequence, simple_dyna_sequence and simple_string_dyna_sequence
(sequence models), and two_io_chain, an ensemble (a manifest alone, no code)
calling two_io twice: two_io(a, b) -> s1, first_argmax; two_io(s1, b) ->
sum. Each model.so is built with `pjserve build-hooks` when --pjserve is
given, else with cc directly. Weights come from fixed PRNG keys, so the
bundles are byte-for-byte reproducible (model.so aside). Run a plain bundle
with `build/pjserve run`, or all of them with examples/run_demo.py; serve them
all with `make serve`.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from pjserve_export import default_target_version, hooks_builder, read_manifest  # noqa: E402
from pjserve_export.bundle import MANIFEST_FILE  # noqa: E402
from pjserve_export.demo import BATCH_SIZES, DEMO_MODEL_NAMES, demo_models  # noqa: E402
from pjserve_export.pipelines import PIPELINE_NAMES, export_pipeline  # noqa: E402
from pjserve_export.triton_examples import (  # noqa: E402
    TRITON_EXAMPLE_NAMES, export_triton_example)

ENSEMBLE_NAMES = ("two_io_chain",)
ALL_NAMES = DEMO_MODEL_NAMES + PIPELINE_NAMES + TRITON_EXAMPLE_NAMES + ENSEMBLE_NAMES

# two_io_chain: two_io's sum fed back as its `a`, `b` given to both steps
# (docs/serving.md § Ensembles). Serve it beside two_io.
TWO_IO_CHAIN = """\
format_version: "2.0"
name: two_io_chain
kind: ensemble
description: "two_io twice: sum = two_io(two_io(a, b).sum, b).sum; first_argmax of the first"
client_inputs:
  - {name: a, dtype: f32, shape: [batch, 8]}
  - {name: b, dtype: i32, shape: [batch, 3]}
client_outputs:
  - {name: sum, dtype: f32, shape: [batch, 8]}
  - {name: first_argmax, dtype: i32, shape: [batch]}
ensemble:
  steps:
    - model: two_io
      input_map: {a: a, b: b}
      output_map: {sum: s1, argmax: first_argmax}
    - model: two_io
      input_map: {a: s1, b: b}
      output_map: {sum: sum}
"""


def export_ensemble(name, out_dir: Path) -> Path:
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    (d / MANIFEST_FILE).write_text(TWO_IO_CHAIN)
    return d


def _shape(spec):
    return "[" + ", ".join((["batch"] if spec.batched else []) + [str(d) for d in spec.shape]) \
        + "]"


def _tensors(specs):
    return ", ".join(f"{s.name}:{s.dtype}{_shape(s)}" for s in specs)


def _signature(m, variant):
    return f"{_tensors(m.variant_inputs(variant))} -> {_tensors(m.variant_outputs(variant))}"


def _client_signature(m):
    what = ("hooks" if m.kind != "meta" else
            f"meta calling {', '.join(m.calls)}" if m.calls else "compute-only meta")
    # A side a hooked model leaves undeclared is the executable's own.
    ins = m.client_inputs or m.inputs
    outs = m.client_outputs or m.outputs
    return f"{_tensors(ins)} -> {_tensors(outs)}  ({what})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="directory to write the bundles into")
    ap.add_argument("--only", nargs="+", choices=ALL_NAMES, metavar="NAME",
                    help=f"export only these ({', '.join(ALL_NAMES)})")
    ap.add_argument("--pjserve", type=Path, default=None,
                    help="build each model.so with PJSERVE build-hooks (default: cc directly)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)),
                    help="comma-separated compiled batch sizes of the plain demo models "
                         "(default %(default)s; the composition examples have their own)")
    ap.add_argument("--target-stablehlo-version", default=None,
                    help=f"StableHLO version of the artifacts (default {default_target_version()})")
    a = ap.parse_args(argv)
    try:
        batch_sizes = [int(b) for b in a.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes {a.batch_sizes!r}: expected comma-separated integers")

    version = a.target_stablehlo_version or default_target_version()
    print(f"exporting to {a.out_dir} (batch sizes {batch_sizes}, StableHLO {version})", flush=True)
    only = a.only or ALL_NAMES
    for model in demo_models([n for n in only if n in DEMO_MODEL_NAMES]):
        t0 = time.perf_counter()
        try:
            path = model.export(a.out_dir, batch_sizes=batch_sizes,
                                target_stablehlo_version=a.target_stablehlo_version)
        except ValueError as e:
            print(f"make_demo_models: {model.name}: {e}", file=sys.stderr)
            return 1
        m = read_manifest(path)
        print(f"  {model.name:<16} {_signature(m, 'default')}  "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        for v in m.variants:
            print(f"  {'':<16} variant {v.name}: {_signature(m, v.name)}", flush=True)
    build = hooks_builder(a.pjserve)
    for name in [n for n in only if n in PIPELINE_NAMES + TRITON_EXAMPLE_NAMES]:
        t0 = time.perf_counter()
        export = export_pipeline if name in PIPELINE_NAMES else export_triton_example
        try:
            paths = export(name, a.out_dir, build=build,
                           target_stablehlo_version=a.target_stablehlo_version)
        except ValueError as e:
            print(f"make_demo_models: {name}: {e}", file=sys.stderr)
            return 1
        for bundle, path in paths.items():
            m = read_manifest(path)
            line = _client_signature(m) if m.kind == "meta" else _signature(m, "default")
            print(f"  {bundle:<16} {line}", flush=True)
            if m.kind == "model" and m.client_inputs:
                print(f"  {'':<16} clients: {_client_signature(m)}", flush=True)
        print(f"  {'':<16} ({time.perf_counter() - t0:.1f} s)", flush=True)
    for name in [n for n in only if n in ENSEMBLE_NAMES]:
        m = read_manifest(export_ensemble(name, a.out_dir))
        steps = " -> ".join(s["model"] for s in m.extra["ensemble"]["steps"])
        print(f"  {name:<16} {_tensors(m.client_inputs)} -> {_tensors(m.client_outputs)}  "
              f"(ensemble: {steps})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
