"""`pjserve run` on every demo bundle gives what jax gives.

For each model and each batch of n examples (n = 1, 4, 8: the compiled sizes;
n = 3: padded by the server to the compiled size 4 and sliced back), random
inputs are saved as .npy, run through `pjserve run`, and each output is
compared with fn(params, *inputs) computed by jax on the same inputs. The max
absolute error per output is printed (pytest -s shows it). A model with
input-shape variants is run at each variant's shapes.
"""

import numpy as np
import pytest

from common import F32_TOL, MODEL_TOLERANCE
from e2e_util import describe, save_inputs
from pjserve_export import demo, random_inputs

# Per-model tolerances (and why they are what they are): tests/common.py.
TOLERANCE = MODEL_TOLERANCE

BATCHES = [1, 3, 4, 8]


def run_and_compare(pjserve, exported, n, tmp_path, extra_args=(), seed=None,
                    reverse_inputs=False, variant="default"):
    m = exported.manifest
    inputs = random_inputs(m, n, seed=seed if seed is not None else 1000 + n, variant=variant)
    in_args = save_inputs(inputs, tmp_path / "in")
    if reverse_inputs:  # the --input flags in the opposite order to the manifest's
        pairs = [in_args[i:i + 2] for i in range(0, len(in_args), 2)]
        in_args = [a for pair in reversed(pairs) for a in pair]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = pjserve("run", exported.path, *in_args, "--output-dir", out_dir,
                "--cache-dir", tmp_path / "cache", *extra_args)
    assert r.returncode == 0, describe(r)

    written = sorted(p.name for p in out_dir.iterdir())
    assert written == sorted(f"{o.name}.npy" for o in m.outputs), describe(r)

    want = exported.model.reference(*[inputs[s.name] for s in m.inputs])
    atol, rtol = TOLERANCE[m.name]
    for spec, ref in zip(m.variant_outputs(variant), want):
        got = np.load(out_dir / f"{spec.name}.npy")
        assert got.dtype == spec.numpy_dtype, f"{spec.name}: dtype {got.dtype}, manifest {spec.dtype}"
        assert got.dtype == ref.dtype
        assert got.shape == spec.full_shape(n) == ref.shape, \
            f"{spec.name}: shape {got.shape}, expected {spec.full_shape(n)}"
        if np.issubdtype(ref.dtype, np.integer) or ref.dtype == np.bool_:
            mismatches = int(np.sum(got != ref))
            print(f"{m.name} n={n} {spec.name}: {mismatches} mismatching elements")
            np.testing.assert_array_equal(got, ref, err_msg=f"{m.name} n={n} {spec.name}")
        else:
            g, w = got.astype(np.float64), ref.astype(np.float64)
            err = float(np.max(np.abs(g - w))) if g.size else 0.0
            print(f"{m.name} ({variant}) n={n} {spec.name}: max abs error {err:.3g} "
                  f"(atol {atol:g}, rtol {rtol:g})")
            assert np.all(np.isfinite(g)), f"{spec.name}: non-finite values"
            np.testing.assert_allclose(g, w, atol=atol, rtol=rtol,
                                       err_msg=f"{m.name} n={n} {spec.name}")
    return inputs, out_dir


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("name", demo.DEMO_MODEL_NAMES)
def test_run_matches_jax(pjserve, models, name, n, tmp_path):
    run_and_compare(pjserve, models[name], n, tmp_path)


# The demo models' input-shape variants besides "default" (which the test above runs).
VARIANT_MODELS = [("gapnet", "wide")]


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("name,variant", VARIANT_MODELS)
def test_run_variant_matches_jax(pjserve, models, name, variant, n, tmp_path):
    """Inputs at a variant's shapes run that variant's modules."""
    run_and_compare(pjserve, models[name], n, tmp_path, variant=variant)


def test_input_flags_in_any_order(pjserve, models, tmp_path):
    """--input flags are matched by name, not by position."""
    run_and_compare(pjserve, models["two_io"], 3, tmp_path, reverse_inputs=True)


@pytest.mark.parametrize("name", ["mlp", "two_io"])
def test_forced_batch_size_pads_and_slices(pjserve, models, name, tmp_path):
    """--batch-size 8 runs module 8 on 3 examples; outputs are still 3 long."""
    run_and_compare(pjserve, models[name], 3, tmp_path, extra_args=("--batch-size", 8))


@pytest.mark.parametrize("n,forced", [(11, None), (3, 1), (9, 4)],
                         ids=["11-as-8+4", "3-as-1+1+1", "9-forced-4"])
def test_large_batches_run_in_chunks(pjserve, models, n, forced, tmp_path):
    """More examples than the module holds run as consecutive chunks (the last
    one padded); the output is still one array of n rows in input order."""
    extra = ("--batch-size", forced) if forced else ()
    for name in ("mlp", "two_io"):
        run_and_compare(pjserve, models[name], n, tmp_path / name, extra_args=extra)


def test_padding_does_not_leak_between_rows(pjserve, models, tmp_path):
    """Row i of a padded batch equals the same example run alone."""
    exported = models["convnet"]
    inputs, out3 = run_and_compare(pjserve, exported, 3, tmp_path / "three", seed=7)
    single = {k: v[1:2] for k, v in inputs.items()}
    in_args = save_inputs(single, tmp_path / "one" / "in")
    out1 = tmp_path / "one" / "out"
    out1.mkdir()
    r = pjserve("run", exported.path, *in_args, "--output-dir", out1,
                "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
    for spec in exported.manifest.outputs:
        np.testing.assert_allclose(np.load(out1 / f"{spec.name}.npy")[0],
                                   np.load(out3 / f"{spec.name}.npy")[1],
                                   atol=F32_TOL[0], rtol=F32_TOL[1])
