#!/usr/bin/env python3
"""Run every bundle in a directory once with `pjserve run` and show the outputs.

    examples/run_demo.py --pjserve build/pjserve MODELS_DIR [--batch N] [--seed S]
                         [--pjrt-plugin PATH] [--cache-dir DIR]

For each bundle (a subdirectory with manifest.yaml), and each of its
input-shape variants, this makes random inputs of the manifest's dtypes and
shapes (N examples, default 3, so the server pads to a compiled batch size),
saves them as .npy, runs

    pjserve run BUNDLE --input NAME=FILE.npy ... --output-dir DIR

and prints each output's shape, dtype and first values. Exits 1 if any run
fails. Needs only numpy and PyYAML (no jax). A model with C hooks runs its
executable alone here (`pjserve run` says so); meta models and ensembles are
skipped: their runs call other models, which only a server has (`make serve`, then
examples/client.py).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from pjserve_export.bundle import MANIFEST_FILE, random_inputs, read_manifest  # noqa: E402


def run_bundle(pjserve, bundle, n, seed, work, extra):
    try:
        manifest = read_manifest(bundle)
    except Exception as e:  # the server reports the details; here just do not crash
        print(f"== {bundle.name}: FAILED: cannot read {MANIFEST_FILE}: {e}", flush=True)
        return False
    if manifest.kind in ("meta", "ensemble"):
        what = "a meta model" if manifest.kind == "meta" else "an ensemble"
        print(f"== {bundle.name}: skipped: {what} runs inside the server (make serve, then "
              "examples/client.py)", flush=True)
        return True
    results = [run_variant(pjserve, bundle, manifest, variant, n, seed, work / variant, extra)
               for variant in manifest.variant_names()]
    return all(results)


def run_variant(pjserve, bundle, manifest, variant, n, seed, work, extra):
    in_dir, out_dir = work / "in", work / "out"
    in_dir.mkdir(parents=True)
    out_dir.mkdir()
    argv = [str(pjserve), "run", str(bundle)]
    for name, array in random_inputs(manifest, n, seed, variant).items():
        f = in_dir / f"{name}.npy"
        np.save(f, array)
        argv += ["--input", f"{name}={f}"]
    argv += ["--output-dir", str(out_dir)] + extra
    shown = manifest.name if not manifest.variants else f"{manifest.name} (variant {variant})"
    print(f"== {shown}: {' '.join(argv)}", flush=True)
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.stdout.strip():
        print(r.stdout.rstrip())
    if r.returncode != 0:
        print(f"   FAILED (exit {r.returncode}): {r.stderr.strip()}", flush=True)
        return False
    ok = True
    for spec in manifest.variant_outputs(variant):
        f = out_dir / f"{spec.name}.npy"
        if not f.is_file():
            print(f"   FAILED: {f.name} was not written")
            ok = False
            continue
        y = np.load(f)
        first = np.array2string(y.reshape(-1)[:6], precision=4, separator=", ")
        print(f"   {spec.name}: {y.dtype} {list(y.shape)} first values {first}")
        if y.shape != spec.full_shape(n):
            print(f"   FAILED: {spec.name} has shape {list(y.shape)}, "
                  f"expected {list(spec.full_shape(n))}")
            ok = False
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pjserve", required=True, type=Path, help="the pjserve binary")
    ap.add_argument("models_dir", type=Path)
    ap.add_argument("--batch", type=int, default=3, help="examples per run (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pjrt-plugin", help="passed on to pjserve run")
    ap.add_argument("--cache-dir", help="passed on to pjserve run")
    a = ap.parse_args(argv)
    if a.batch < 1:
        ap.error("--batch must be >= 1")
    if not a.pjserve.is_file():
        print(f"run_demo: {a.pjserve}: no such file (build it with `make`)", file=sys.stderr)
        return 1
    bundles = sorted(p for p in a.models_dir.iterdir()
                     if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_FILE).is_file()) \
        if a.models_dir.is_dir() else []
    if not bundles:
        print(f"run_demo: no bundles in {a.models_dir} (make them with "
              "examples/make_demo_models.py)", file=sys.stderr)
        return 1
    extra = []
    if a.pjrt_plugin:
        extra += ["--pjrt-plugin", a.pjrt_plugin]
    if a.cache_dir:
        extra += ["--cache-dir", a.cache_dir]
    failed = []
    with tempfile.TemporaryDirectory(prefix="pjserve-demo-") as tmp:
        for bundle in bundles:
            if not run_bundle(a.pjserve, bundle, a.batch, a.seed, Path(tmp) / bundle.name, extra):
                failed.append(bundle.name)
    print(f"{len(bundles) - len(failed)} of {len(bundles)} bundles ran"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
