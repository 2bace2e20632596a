"""The exporter's hooked and meta bundles (no pjserve binary needed): what
they hold, their manifests read back, and the arguments refused."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
import pjserve_export as pe  # noqa: E402

HOOKS = b"""#include <pjserve/model.h>
int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                       pjserve_tensor *out, size_t n_out)
{ (void)ctx; (void)in; (void)n_in; (void)out; (void)n_out; return PJSERVE_OK; }
"""


def _linear(p, x):
    return x @ p["w"]


def export_hooked(tmp_path, **kw):
    args = dict(name="hooked", batch_sizes=[1, 2], input_names=["x"], output_names=["y"],
                client_inputs=[("TEXT", "bytes", [-1]), ("SCALE", np.float32, ["batch", 1]),
                               ("IMAGE", "u8", [-1, -1, 3], "NHWC")],
                client_outputs=[pe.tensor_spec("LABELS", "bytes", [-1, 2])],
                hooks_source=HOOKS, extra_files={"vocab.txt": b"a\nb\n"})
    args.update(kw)
    return pe.export_jax(_linear, {"w": np.ones((4, 2), np.float32)},
                         [np.zeros((1, 4), np.float32)], tmp_path, **args)


def test_hooked_bundle_layout_and_manifest(tmp_path):
    path = export_hooked(tmp_path, build_hooks=pe.hooks_builder())
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.yaml", "model.b1.mlir", "model.b2.mlir", "model.c", "model.so",
        "vocab.txt", "weights.safetensors"]
    assert (path / "model.so").stat().st_mtime >= (path / "model.c").stat().st_mtime
    assert (path / "model.c").read_bytes() == HOOKS
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert doc["client_inputs"] == [{"name": "TEXT", "dtype": "bytes", "shape": [-1]},
                                    {"name": "SCALE", "dtype": "f32", "shape": ["batch", 1]},
                                    {"name": "IMAGE", "dtype": "u8", "shape": [-1, -1, 3],
                                     "format": "NHWC"}]
    assert doc["client_outputs"] == [{"name": "LABELS", "dtype": "bytes", "shape": [-1, 2]}]
    assert doc["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["batch", 4]}]
    m = pe.read_manifest(path)
    assert m.kind == "model" and m.calls is None and m.extra == {}
    assert m.client_inputs == [pe.TensorSpec("TEXT", "bytes", (-1,), batched=False),
                               pe.TensorSpec("SCALE", "f32", (1,), batched=True),
                               pe.TensorSpec("IMAGE", "u8", (-1, -1, 3), False, "NHWC")]
    assert m.client_outputs[0].numpy_dtype == np.dtype(object)


def test_hooks_libraries_written_and_linked(tmp_path):
    source = b"#include <zlib.h>\n" + HOOKS + b"const char *version(void) { return zlibVersion(); }\n"
    path = export_hooked(tmp_path, hooks_source=source, hooks_libraries=["z"],
                         build_hooks=pe.hooks_builder())
    assert yaml.safe_load((path / "manifest.yaml").read_text())["hooks_libraries"] == ["z"]
    assert pe.read_manifest(path).hooks_libraries == ["z"]
    needed = subprocess.run(["readelf", "-d", str(path / "model.so")], capture_output=True,
                            text=True, check=True).stdout
    assert "libz.so" in needed


def test_plain_bundle_has_no_client_keys(tmp_path):
    path = pe.export_jax(_linear, {"w": np.ones((4, 2), np.float32)},
                         [np.zeros((1, 4), np.float32)], tmp_path, name="plain",
                         batch_sizes=[1], input_names=["x"], output_names=["y"])
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert "client_inputs" not in doc and "client_outputs" not in doc
    assert pe.read_manifest(path).client_inputs == []


def test_meta_bundle_layout_and_manifest(tmp_path):
    path = pe.export_meta(tmp_path, name="pipeline", calls=["stage_a", "stage_b"],
                          client_inputs=[("IN", "i32", [-1])],
                          client_outputs=[("OUT", "bytes", [-1])], source=HOOKS,
                          description="two stages")
    assert sorted(p.name for p in path.iterdir()) == ["manifest.yaml", "model.c"]
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert doc == {"format_version": "2.0", "name": "pipeline", "kind": "meta",
                   "description": "two stages", "meta": {"calls": ["stage_a", "stage_b"]},
                   "client_inputs": [{"name": "IN", "dtype": "i32", "shape": [-1]}],
                   "client_outputs": [{"name": "OUT", "dtype": "bytes", "shape": [-1]}],
                   "residency": "host", "weight": 1.0}
    m = pe.read_manifest(path)
    assert (m.kind, m.calls, m.batch_sizes, m.inputs, m.outputs) == (
        "meta", ["stage_a", "stage_b"], [], [], [])


def test_compute_only_meta(tmp_path):
    path = pe.export_meta(tmp_path, name="alone", calls=[], client_inputs=[("A", "f32", [2])],
                          client_outputs=[("B", "f32", [2])], source=HOOKS)
    assert "calls: []" in (path / "manifest.yaml").read_text()
    assert pe.read_manifest(path).calls == []


def test_build_failure_publishes_nothing(tmp_path):
    with pytest.raises(ValueError, match="building the hooks of .* failed"):
        pe.export_meta(tmp_path, name="broken", calls=[], client_inputs=[("A", "f32", [1])],
                       client_outputs=[("B", "f32", [1])], source=b"this is not C\n",
                       build=pe.hooks_builder())
    assert list(tmp_path.iterdir()) == []


META = dict(name="m", calls=["s"], client_inputs=[("A", "f32", [1])],
            client_outputs=[("B", "f32", [1])], source=HOOKS)


@pytest.mark.parametrize("change,message", [
    (dict(calls=["m"]), "may not call itself"),
    (dict(calls=["s", "s"]), "must be unique"),
    (dict(client_inputs=[]), "needs client_inputs and client_outputs"),
    (dict(client_inputs=[("A", "f32", [-2])]), "extents are ints >= 0, or -1"),
    (dict(client_inputs=[("A", "string", [1])]), "dtype must be one of"),
    (dict(client_inputs=[("A", "f32", [1] * 9)]), "at most 8 extents"),
    (dict(client_inputs=[("A", "f32", [1, 2], "NHWC")]), "three extents per example"),
    (dict(client_inputs=[("A", "f32", [1, 2, 3], "HWC")]), "must be NHWC or NCHW"),
    (dict(client_outputs=[("B", "f32", [1, 2, 3], "NHWC")]), "only inputs have an image"),
    (dict(client_inputs=[("A", "f32")]), "tuple"),
    (dict(client_outputs=[("A", "f32", [1])]), "both a client input and a client output"),
    (dict(client_inputs=[("A", "f32", [1]), ("A", "i32", [1])]), "must be unique"),
    (dict(source=None), "needs its model.c"),
    (dict(source="/no/such/model.c"), "no such file"),
    (dict(extra_files={"model.so": b""}), "would replace a file the bundle format defines"),
    (dict(extra_files={"model.b1.mlir": b""}), "would replace a file"),
    (dict(extra_files={"sub/dir.txt": b""}), "extra file name"),
])
def test_meta_arguments_refused(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        pe.export_meta(tmp_path, **{**META, **change})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change,message", [
    (dict(hooks_source=None), "need the hooks that produce them"),
    (dict(client_outputs=[("Y", "f32", [1, "batch"])]), "extents are ints"),
    (dict(extra_files={"weights.safetensors": b""}), "would replace a file"),
    (dict(hooks_libraries="z"), "must be a list of names"),
    (dict(hooks_libraries=["-lz"]), "not a library name as it follows -l"),
    (dict(hooks_libraries=["z", "lib z"]), "not a library name"),
    (dict(hooks_libraries=["z", "z"]), "listed twice"),
])
def test_hooked_arguments_refused(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        export_hooked(tmp_path, **change)
    assert list(tmp_path.iterdir()) == []


def test_executable_tensors_are_never_bytes():
    with pytest.raises(ValueError, match="not supported by pjserve bundles"):
        pe.dtypes.manifest_name(np.dtype(object))
