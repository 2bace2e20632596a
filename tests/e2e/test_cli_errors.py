"""The CLI's error contract, and `pjserve info`.

Exit codes: 0 ok; 1 failure, with a stderr line starting `pjserve: error:`
that names the bundle and the field or file at fault; 2 usage error, with a
usage message.
"""

import json
import re

import numpy as np
import pytest

from e2e_util import bundle_copy, describe, error_text, save_inputs
import pjserve_export as pe


def assert_usage_error(r):
    assert r.returncode == 2, describe(r)
    assert re.search(r"usage", r.stderr + r.stdout, re.I), f"no usage message\n{describe(r)}"


def assert_failure(r, *needles):
    """Exit 1 with a `pjserve: error:` message containing every needle."""
    assert r.returncode == 1, describe(r)
    text = error_text(r)
    for needle in needles:
        if isinstance(needle, re.Pattern):
            assert needle.search(text), f"{needle.pattern!r} not in error message\n{describe(r)}"
        else:
            assert needle in text, f"{needle!r} not in error message\n{describe(r)}"
    return text


def mlp_args(models, tmp_path, x=None):
    x = np.zeros((2, 16), np.float32) if x is None else x
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return save_inputs({"x": x}, tmp_path / "in") + ["--output-dir", out,
                                                      "--cache-dir", tmp_path / "cache"]


# ---- usage errors (exit 2) -------------------------------------------------

@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["run"],
    ["run", "--output-dir", "/tmp"],
    ["check"],
    ["run", "MLP", "--bogus-option"],
], ids=["no-args", "unknown-command", "run-no-bundle", "run-only-output-dir", "check-no-bundle",
        "unknown-option"])
def test_usage_errors(pjserve, argv):
    assert_usage_error(pjserve(*argv, plugin=False))


def test_run_without_output_dir_is_usage_error(pjserve, models, tmp_path):
    args = save_inputs({"x": np.zeros((1, 16), np.float32)}, tmp_path / "in")
    assert_usage_error(pjserve("run", models["mlp"].path, *args))


def test_input_without_equals_is_usage_error(pjserve, models, tmp_path):
    assert_usage_error(pjserve("run", models["mlp"].path, "--input", "x",
                               "--output-dir", tmp_path))


def test_non_numeric_batch_size_is_usage_error(pjserve, models, tmp_path):
    args = mlp_args(models, tmp_path)
    assert_usage_error(pjserve("run", models["mlp"].path, *args, "--batch-size", "four"))


# ---- run: inputs that do not fit the bundle (exit 1) -----------------------

def test_unknown_input_name(pjserve, models, tmp_path):
    f = tmp_path / "x.npy"
    np.save(f, np.zeros((1, 16), np.float32))
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", models["mlp"].path, "--input", f"nosuchinput={f}", "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert_failure(r, "mlp", "nosuchinput")
    assert not any(out.iterdir()), "outputs written despite the error"


def test_missing_input(pjserve, models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = save_inputs({"a": np.zeros((1, 8), np.float32)}, tmp_path / "in")
    r = pjserve("run", models["two_io"].path, *args, "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    # names the input that was not given: b
    assert_failure(r, "two_io", re.compile(r"(?<![\w./-])b(?![\w/-])"))


def test_wrong_dtype(pjserve, models, tmp_path):
    r = pjserve("run", models["mlp"].path,
                *mlp_args(models, tmp_path, x=np.zeros((2, 16), np.float64)))
    text = assert_failure(r, "mlp")
    assert "dtype" in text.lower() or ("f32" in text and ("f64" in text or "float64" in text)), \
        describe(r)


def test_wrong_dtype_int(pjserve, models, tmp_path):
    """two_io's b is i32; an f32 array is refused, not converted."""
    out = tmp_path / "out"
    out.mkdir()
    args = save_inputs({"a": np.zeros((2, 8), np.float32), "b": np.zeros((2, 3), np.float32)},
                       tmp_path / "in")
    r = pjserve("run", models["two_io"].path, *args, "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    text = assert_failure(r, "two_io")
    assert "dtype" in text.lower() or "i32" in text, describe(r)


@pytest.mark.parametrize("shape", [(2, 15), (2, 16, 1), (16,)], ids=["extent", "rank+1", "no-batch"])
def test_wrong_shape(pjserve, models, tmp_path, shape):
    r = pjserve("run", models["mlp"].path,
                *mlp_args(models, tmp_path, x=np.zeros(shape, np.float32)))
    text = assert_failure(r, "mlp")
    assert "shape" in text.lower() or "16" in text, describe(r)


def test_inputs_disagree_on_batch(pjserve, models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = save_inputs({"a": np.zeros((3, 8), np.float32), "b": np.zeros((4, 3), np.int32)},
                       tmp_path / "in")
    r = pjserve("run", models["two_io"].path, *args, "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert_failure(r, "two_io")


@pytest.mark.parametrize("batch", [2, 16])
def test_forced_batch_size_not_compiled(pjserve, models, tmp_path, batch):
    r = pjserve("run", models["mlp"].path, *mlp_args(models, tmp_path),  # 2 examples
                "--batch-size", batch)
    text = assert_failure(r, "mlp", str(batch))
    assert "batch" in text.lower(), describe(r)


def test_missing_npy_file(pjserve, models, tmp_path):
    missing = tmp_path / "does-not-exist.npy"
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", models["mlp"].path, "--input", f"x={missing}", "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert_failure(r, "does-not-exist.npy")


def test_garbage_npy_file(pjserve, models, tmp_path):
    bad = tmp_path / "garbage.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00this is not a header")
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", models["mlp"].path, "--input", f"x={bad}", "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert_failure(r, "garbage.npy")


# ---- run: broken bundles (exit 1) -------------------------------------------

def test_nonexistent_bundle(pjserve, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    x = save_inputs({"x": np.zeros((1, 16), np.float32)}, tmp_path / "in")
    r = pjserve("run", tmp_path / "no_such_bundle", *x, "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert_failure(r, "no_such_bundle")


def _set_line(text, key, new_line):
    lines = text.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if ln.startswith(f"{key}:")]
    assert len(hits) == 1, (key, text)
    lines[hits[0]] = new_line + "\n"
    return "".join(lines)


MANIFEST_BREAKS = {
    # id: (edit of the manifest text, what the message must name, width of x to send)
    "yaml-syntax": (lambda t: t + "inputs: [unclosed\n", "manifest.yaml", 16),
    "unknown-key": (lambda t: t + "colour: blue\n", "colour", 16),
    "bad-dtype": (lambda t: t.replace("dtype: f32", "dtype: f33", 1), "dtype", 16),
    "bad-format-version": (lambda t: _set_line(t, "format_version", 'format_version: "9.9"'),
                           "format_version", 16),
    "descending-batch-sizes": (lambda t: _set_line(t, "batch_sizes", "batch_sizes: [4, 1, 8]"),
                               "batch_sizes", 16),
    "module-file-missing": (lambda t: _set_line(t, "batch_sizes", "batch_sizes: [1, 2, 4, 8]"),
                            "model.b2.mlir", 16),
    # The manifest says x is [batch, 17] (and the client obliges) but the
    # modules take [N, 16]: the disagreement is caught at load.
    "input-shape-disagrees-with-module": (
        lambda t: t.replace("shape: [batch, 16]", "shape: [batch, 17]", 1),
        re.compile(r"shape|model\.b\d+\.mlir|inputs\[0\]"), 17),
}


@pytest.mark.parametrize("break_id", list(MANIFEST_BREAKS))
def test_broken_manifest(pjserve, models, tmp_path, break_id):
    edit, needle, width = MANIFEST_BREAKS[break_id]
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_broken")
    man = bundle / pe.MANIFEST_FILE
    man.write_text(edit(man.read_text()))
    r = pjserve("run", bundle, *mlp_args(models, tmp_path, x=np.zeros((2, width), np.float32)))
    assert_failure(r, "mlp_broken", needle)


def _tamper_order(bundle, edit):
    st = bundle / pe.WEIGHTS_FILE
    _, meta = pe.read_safetensors(st)
    order = json.loads(meta["argument_order"])
    pe.rewrite_metadata(st, {**meta, "argument_order": json.dumps(edit(order))})


ORDER_TAMPERS = {
    # reversed: a permutation of the right names whose shapes no longer match
    # the modules' parameters (dense2.w [32,4] where dense1.b [32] is expected)
    "reversed": lambda order: list(reversed(order)),
    "name-missing": lambda order: order[:-1],
    "unknown-name": lambda order: order + ["dense3.w"],
    "duplicate-name": lambda order: order[:1] + order[:-1],
}


@pytest.mark.parametrize("tamper", list(ORDER_TAMPERS))
def test_tampered_argument_order(pjserve, models, tmp_path, tamper):
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_tampered")
    _tamper_order(bundle, ORDER_TAMPERS[tamper])
    r = pjserve("run", bundle, *mlp_args(models, tmp_path))
    text = assert_failure(r, "mlp_tampered")
    assert "weights.safetensors" in text or "argument_order" in text, describe(r)


def test_tampered_argument_order_fails_check_too(pjserve, models, tmp_path):
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_tampered")
    _tamper_order(bundle, lambda order: list(reversed(order)))
    r = pjserve("check", bundle, "--cache-dir", tmp_path / "cache")
    text = assert_failure(r, "mlp_tampered")
    assert "weights.safetensors" in text or "argument_order" in text, describe(r)


def test_weights_file_missing(pjserve, models, tmp_path):
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_noweights")
    (bundle / pe.WEIGHTS_FILE).unlink()
    r = pjserve("run", bundle, *mlp_args(models, tmp_path))
    assert_failure(r, "mlp_noweights", "weights.safetensors")


def test_weight_dtype_disagrees_with_module(pjserve, models, tmp_path):
    """A weights file whose tensors are f16 where the modules take f32."""
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_f16weights")
    st = bundle / pe.WEIGHTS_FILE
    tensors, meta = pe.read_safetensors(st)
    pe.write_safetensors(st, {k: v.astype(np.float16) for k, v in tensors.items()}, meta)
    r = pjserve("run", bundle, *mlp_args(models, tmp_path))
    assert_failure(r, "mlp_f16weights", re.compile(r"weights\.safetensors|dense[12]\.[wb]"))


def test_module_that_does_not_parse(pjserve, models, tmp_path):
    bundle = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_badmodule")
    (bundle / "model.b4.mlir").write_bytes(b"\x00\x01 not mlir at all")
    # 3 examples -> module 4
    r = pjserve("run", bundle, *mlp_args(models, tmp_path, x=np.zeros((3, 16), np.float32)))
    assert_failure(r, "mlp_badmodule", "model.b4.mlir")


# ---- info --------------------------------------------------------------------

def _info_fields(stdout):
    fields = {}
    for line in stdout.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    return fields


def test_info(pjserve, is_cpu_plugin):
    r = pjserve("info")
    assert r.returncode == 0, describe(r)
    fields = _info_fields(r.stdout)
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    for key in ("platform", "pjrt api", "devices", "stablehlo"):
        assert key in fields, f"no `{key}:` line\n{describe(r)}"
    m = re.fullmatch(r"current (\d+\.\d+\.\d+), minimum (\d+\.\d+\.\d+)", fields["stablehlo"])
    assert m, describe(r)
    if is_cpu_plugin:  # facts of the xla-cpu-pjrt wheel pinned in scripts/requirements.txt
        assert "platform: cpu" in lines, describe(r)
        assert "pjrt api: 0.81" in lines, describe(r)
        assert "stablehlo: current 1.13.3, minimum 0.9.0" in lines, describe(r)
        assert fields["devices"], describe(r)

    # What the exporter writes by default is inside the plugin's window.
    def v(s):
        return tuple(int(p) for p in s.split("."))
    target = pe.default_target_version()
    assert v(m.group(2)) <= v(target) <= v(m.group(1)), (target, fields["stablehlo"])


def test_info_with_missing_plugin(pjserve, tmp_path):
    missing = tmp_path / "no_such_plugin.so"
    r = pjserve("info", "--pjrt-plugin", missing, plugin=False)
    assert_failure(r, "no_such_plugin.so")
