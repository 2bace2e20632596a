"""Modules whose parameters have another layout than row-major
(mhlo.layout_mode): pjserve still sends and reads row-major tensors.

The exported linear model's module is replaced by a text module computing
the same y = x @ w + b, with x laid out column-major: `pjserve run` and a
served request must answer what numpy computes (before the fix, x was read transposed). A
module that lays out a weight so is refused at load: one device copy of a
weight serves every module of the bundle."""

import numpy as np
import tritonclient.grpc as grpcclient

import pjserve_export as pe
from e2e_util import serving


def _linear(p, x):
    return x @ p["w"] + p["b"]


RNG = np.random.default_rng(7)
PARAMS = {"w": RNG.standard_normal((16, 4)).astype(np.float32),
          "b": RNG.standard_normal(4).astype(np.float32)}

# Arguments in the bundle's order: the weights (b, w), then x.
MODULE = """module @linear {{
  func.func public @main(%b: tensor<4xf32>, %w: tensor<16x4xf32>{w_attr},
                         %x: tensor<4x16xf32>{x_attr}) -> tensor<4x4xf32> {{
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<4x4xf32>
    %1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<4x4xf32>
    %2 = stablehlo.add %0, %1 : tensor<4x4xf32>
    return %2 : tensor<4x4xf32>
  }}
}}
"""
COLUMN_MAJOR = ' {mhlo.layout_mode = "{0,1}"}'


def bundle_with(tmp_path, w_attr="", x_attr=""):
    path = pe.export_jax(_linear, PARAMS, [np.zeros((1, 16), np.float32)], tmp_path,
                         name="linear", batch_sizes=[4], input_names=["x"], output_names=["y"])
    data = (path / "model.b4.mlir").read_bytes()
    assert pe.main_signature(pe.deserialize_portable_artifact(data))[0] == [
        ((4,), "f32"), ((16, 4), "f32"), ((4, 16), "f32")]
    (path / "model.b4.mlir").write_text(MODULE.format(w_attr=w_attr, x_attr=x_attr))
    return path


def test_an_input_laid_out_column_major_is_read_as_sent(pjserve, tmp_path):
    path = bundle_with(tmp_path / "bundle", x_attr=COLUMN_MAJOR)
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = pjserve("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                tmp_path / "out", "--no-cache")
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "out" / "y.npy")
    np.testing.assert_allclose(y, x @ PARAMS["w"] + PARAMS["b"], rtol=1e-5, atol=1e-5)


def test_a_served_request_to_such_a_module_is_answered_right(pjserve_bin, plugin_path,
                                                            tmp_path):
    path = bundle_with(tmp_path / "bundle", x_attr=COLUMN_MAJOR)
    with serving(pjserve_bin, plugin_path, [path], tmp_path / "srv", "layouts") as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        for rows in (1, 3, 4):  # padded to the compiled 4 rows, and exactly 4
            x = RNG.standard_normal((rows, 16)).astype(np.float32)
            inp = grpcclient.InferInput("x", [rows, 16], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer("linear", [inp]).as_numpy("y"),
                                       x @ PARAMS["w"] + PARAMS["b"], rtol=1e-5, atol=1e-5)
        client.close()


def test_a_weight_laid_out_column_major_is_refused_with_the_reason(pjserve, tmp_path):
    path = bundle_with(tmp_path / "bundle", w_attr=COLUMN_MAJOR)
    np.save(tmp_path / "x.npy", np.zeros((4, 16), np.float32))
    r = pjserve("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                tmp_path / "out", "--no-cache")
    assert r.returncode != 0
    assert 'parameter 1 (weight "w") is laid out in another order than row-major' in r.stderr
    assert "pjserve passes weights row-major" in r.stderr
