"""Input-shape variants end to end: `pjserve run` picks the variant from the
input shapes, `check` and `info` report every variant's modules, and the
loader checks each variant's module files against the variant's shapes.

The demo model gapnet has the top-level shapes x [batch, 16, 16, 3] and the
variant "wide", x [batch, 16, 32, 3]; running both against jax is in
test_run_matches_jax.py.
"""

import numpy as np

from e2e_util import bundle_copy, describe, error_text, save_inputs


def gapnet_args(tmp_path, width):
    x = np.zeros((2, 16, width, 3), np.float32)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return save_inputs({"x": x}, tmp_path / "in") + ["--output-dir", out,
                                                      "--cache-dir", tmp_path / "cache"]


def test_run_shape_matching_no_variant(pjserve, models, tmp_path):
    r = pjserve("run", models["gapnet"].path, *gapnet_args(tmp_path, 24))
    assert r.returncode == 1, describe(r)
    text = error_text(r)
    assert "bundle gapnet: input shapes x [2, 16, 24, 3] match no variant of the model" in text
    assert "default [-1, 16, 16, 3], wide [-1, 16, 32, 3]" in text, text


def test_run_variant_outputs_have_its_shapes(pjserve, models, tmp_path):
    r = pjserve("run", models["gapnet"].path, *gapnet_args(tmp_path, 32))
    assert r.returncode == 0, describe(r)
    assert np.load(tmp_path / "out" / "heatmap.npy").shape == (2, 16, 32)
    assert np.load(tmp_path / "out" / "logits.npy").shape == (2, 10)


def test_check_reports_modules_per_variant(pjserve, models, tmp_path):
    r = pjserve("check", models["gapnet"].path, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    i = lines.index("variant default: 3 modules")
    j = lines.index("variant wide: 3 modules")
    assert [ln.split(":")[0] for ln in lines[i + 1:i + 4]] == ["b1", "b4", "b8"], r.stdout
    assert [ln.split(":")[0] for ln in lines[j + 1:j + 4]] == ["b1", "b4", "b8"], r.stdout
    assert "x f32 [batch, 16, 32, 3]" in r.stdout and "heatmap f32 [batch, 16, 32]" in r.stdout
    assert "modules: 6 (compiled 6, from cache 0)" in r.stdout, r.stdout


def test_info_shows_variants(pjserve, models):
    r = pjserve("info", models["gapnet"].path, models["mlp"].path)
    assert r.returncode == 0, describe(r)
    assert "bundle gapnet (" in r.stdout and "bundle mlp (" in r.stdout, r.stdout
    assert "variants: 2 (default, wide), modules: 6" in r.stdout, r.stdout
    assert "variants: 1 (default), modules: 3" in r.stdout, r.stdout
    assert "variant wide:" in r.stdout and "x f32 [batch, 16, 32, 3]" in r.stdout, r.stdout


def test_info_with_a_broken_bundle_fails(pjserve, tmp_path):
    r = pjserve("info", tmp_path / "nope")
    assert r.returncode == 1, describe(r)
    assert "nope" in error_text(r)
    assert "platform:" in r.stdout  # the plugin is still described


def test_missing_variant_module(pjserve, models, tmp_path):
    bundle = bundle_copy(models, "gapnet", tmp_path / "repo")
    (bundle / "model.wide.b4.mlir").unlink()
    r = pjserve("check", bundle, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 1, describe(r)
    text = error_text(r)
    assert "bundle" in text and "model.wide.b4.mlir: missing" in text, text
    assert "variants[0] \"wide\"" in text, text


def test_variant_module_with_the_wrong_shapes(pjserve, models, tmp_path):
    bundle = bundle_copy(models, "gapnet", tmp_path / "repo")
    (bundle / "model.wide.b4.mlir").write_bytes((bundle / "model.b4.mlir").read_bytes())
    r = pjserve("run", bundle, *gapnet_args(tmp_path, 32))
    assert r.returncode == 1, describe(r)
    text = error_text(r)
    assert "model.wide.b4.mlir: parameter" in text and "(input \"x\")" in text, text
    assert "has shape [4, 16, 16, 3] but manifest.yaml inputs[0] in variant \"wide\" says " \
           "[4, 16, 32, 3]" in text, text
    # The default variant's modules are untouched: its inputs still run.
    out = tmp_path / "out16"
    out.mkdir()
    x = save_inputs({"x": np.zeros((2, 16, 16, 3), np.float32)}, tmp_path / "in16")
    r = pjserve("run", bundle, *x, "--output-dir", out, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
