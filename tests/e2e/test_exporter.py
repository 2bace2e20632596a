"""The exporter on its own (no pjserve binary needed): what a bundle holds,
how weights map to module arguments, argument validation, reproducibility."""

import json
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import yaml

import pjserve_export as pe
from pjserve_export import demo


def _linear(p, x):
    return x @ p["w"] + p["b"]


LINEAR_PARAMS = {"w": np.ones((16, 4), np.float32), "b": np.zeros(4, np.float32)}
X = [np.zeros((1, 16), np.float32)]


def export_linear(tmp_path, **kw):
    args = dict(name="linear", batch_sizes=[1, 4], input_names=["x"], output_names=["y"])
    args.update(kw)
    return pe.export_jax(_linear, LINEAR_PARAMS, X, tmp_path, **args)


def test_bundle_layout_and_manifest(tmp_path):
    path = export_linear(tmp_path, description='a "linear" model: y = x @ w + b',
                         residency="device", weight=2.5)
    assert path == tmp_path / "linear"
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.yaml", "model.b1.mlir", "model.b4.mlir", "weights.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging left behind"
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert doc == {
        "format_version": "2.0", "name": "linear", "kind": "model",
        "description": 'a "linear" model: y = x @ w + b',
        "batch_sizes": [1, 4],
        "inputs": [{"name": "x", "dtype": "f32", "shape": ["batch", 16]}],
        "outputs": [{"name": "y", "dtype": "f32", "shape": ["batch", 4]}],
        "residency": "device", "weight": 2.5,
    }


def test_weights_first_then_inputs_and_unused_weights_kept(tmp_path):
    params = {"z_unused": np.ones(3, np.float32),
              "layers": [{"w": np.ones((16, 4), np.float32)}, {"b": np.zeros(4, np.float32)}]}

    def fn(p, x, k):
        return x @ p["layers"][0]["w"] + p["layers"][1]["b"] + k

    path = pe.export_jax(fn, params, [np.zeros((2, 16), np.float32), np.zeros((2, 1), np.int32)],
                         tmp_path, name="m", batch_sizes=[2, 8], input_names=["x", "k"],
                         output_names=["y"])
    tensors, meta = pe.read_safetensors(path / "weights.safetensors")
    order = json.loads(meta["argument_order"])
    assert order == ["layers.0.w", "layers.1.b", "z_unused"]   # jax order: keys sorted
    assert list(tensors) == order                               # stored in argument order
    for n in (2, 8):
        artifact = (path / f"model.b{n}.mlir").read_bytes()
        args, results = pe.main_signature(pe.deserialize_portable_artifact(artifact))
        assert args == [((16, 4), "f32"), ((4,), "f32"), ((3,), "f32"),
                        ((n, 16), "f32"), ((n, 1), "i32")]
        assert results == [((n, 4), "f32")]
    # jax's own promotion: i32 + f32 -> f32
    assert pe.read_manifest(path).inputs[1].dtype == "i32"


def test_artifacts_target_the_plugin_version(tmp_path):
    lo, hi = pe.stablehlo_versions()
    target = pe.default_target_version()
    assert target == min(hi, pe.PLUGIN_STABLEHLO_VERSION, key=lambda v: tuple(map(int, v.split("."))))
    path = export_linear(tmp_path)
    assert pe.artifact_version((path / "model.b1.mlir").read_bytes()) == target
    old = export_linear(tmp_path / "old", target_stablehlo_version="1.0.0")
    data = (old / "model.b4.mlir").read_bytes()
    assert pe.artifact_version(data) == "1.0.0"
    assert pe.main_signature(pe.deserialize_portable_artifact(data))[0][-1] == ((4, 16), "f32")


def test_export_is_reproducible(tmp_path):
    m = demo.demo_models(["convnet"])[0]
    a = m.export(tmp_path / "a")
    b = m.export(tmp_path / "b")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_reexport_replaces_bundle(tmp_path):
    export_linear(tmp_path, batch_sizes=[1, 4])
    path = export_linear(tmp_path, batch_sizes=[2])
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.yaml", "model.b2.mlir", "weights.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["linear"]


def test_refuses_to_replace_a_non_bundle_directory(tmp_path):
    (tmp_path / "linear").mkdir()
    (tmp_path / "linear" / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a pjserve bundle"):
        export_linear(tmp_path)
    assert (tmp_path / "linear" / "precious.txt").read_text() == "keep me"


def test_safetensors_round_trip_all_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "bool": rng.integers(0, 2, (3,)).astype(np.bool_),
        "u8": np.arange(5, dtype=np.uint8), "i8": np.arange(-2, 3, dtype=np.int8),
        "u16": np.arange(3, dtype=np.uint16), "i16": np.arange(3, dtype=np.int16),
        "u32": np.arange(3, dtype=np.uint32), "i32": np.arange(3, dtype=np.int32),
        "u64": np.arange(3, dtype=np.uint64), "i64": np.arange(3, dtype=np.int64),
        "f16": rng.standard_normal((2, 3)).astype(np.float16),
        "bf16": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
        "f32": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "f64": rng.standard_normal(4).astype(np.float64),
        "scalar": np.float32(3.5), "empty": np.zeros((0, 4), np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
    }
    f = tmp_path / "t.safetensors"
    pe.write_safetensors(f, tensors, {"argument_order": json.dumps(list(tensors))})
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["bf16"]["dtype"] == "BF16" and header["big_endian"]["dtype"] == "I32"
    back, meta = pe.read_safetensors(f)
    assert json.loads(meta["argument_order"]) == list(tensors)
    for k, v in tensors.items():
        v = np.asarray(v)
        assert back[k].shape == v.shape and back[k].dtype == v.dtype.newbyteorder("="), k
        np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_reduced_precision_weights_are_stored_as_such(tmp_path):
    path = demo.demo_models(["mlp_bf16"])[0].export(tmp_path)
    tensors, _ = pe.read_safetensors(path / "weights.safetensors")
    assert {str(v.dtype) for v in tensors.values()} == {"bfloat16"}
    m = pe.read_manifest(path)
    assert [s.dtype for s in m.inputs + m.outputs] == ["f32", "f32"]
    path = demo.demo_models(["mlp_f16"])[0].export(tmp_path)
    m = pe.read_manifest(path)
    assert [s.dtype for s in m.inputs + m.outputs] == ["f16", "f16"]


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_sizes=[]), "must not be empty"),
    (dict(batch_sizes=[4, 1]), "strictly ascending"),
    (dict(batch_sizes=[1, 1]), "strictly ascending"),
    (dict(batch_sizes=[0, 4]), "positive ints"),
    (dict(batch_sizes=[1.0]), "positive ints"),
    (dict(batch_sizes=[True]), "positive ints"),
    (dict(batch_sizes=[1, 65537]), "at most 65536"),
    (dict(input_names=["x", "y2"]), "input_names has 2 name"),
    (dict(input_names=[]), "input_names has 0 name"),
    (dict(output_names=["y", "z"]), "returns 1 output"),
    (dict(output_names=[]), "must not be empty"),
    (dict(output_names=["x"]), "both an input and an output"),
    (dict(output_names=["has space"]), "letters, digits"),
    (dict(input_names=["x/1"]), "letters, digits"),
    (dict(name="bad name"), "name must be"),
    (dict(name=""), "name must be"),
    (dict(residency="gpu"), "residency"),
    (dict(weight=0), "weight must be"),
    (dict(weight=float("nan")), "weight must be"),
    (dict(target_stablehlo_version="0.1.0"), "outside what this jaxlib"),
    (dict(target_stablehlo_version="99.0.0"), "outside what this jaxlib"),
    (dict(target_stablehlo_version="latest"), "looks like"),
])
def test_argument_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        export_linear(tmp_path, **kwargs)
    assert not (tmp_path / "linear").exists()


def test_duplicate_output_names(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        pe.export_jax(lambda p, x: (x, x), {}, X, tmp_path, name="d", batch_sizes=[1],
                      input_names=["x"], output_names=["y", "y"])


def test_output_without_batch_axis(tmp_path):
    with pytest.raises(ValueError, match="leading batch axis"):
        pe.export_jax(lambda p, x: jnp.sum(x), LINEAR_PARAMS, X, tmp_path, name="s",
                      batch_sizes=[2], input_names=["x"], output_names=["total"])


def _image_scores(p, image):
    """An unbatched model, as Triton's densenet_onnx: [3, 4, 5] -> [2, 1, 1]."""
    return (jnp.einsum("chw,kchw->k", image, p["w"]).reshape(2, 1, 1),)


def test_model_without_batch_axis_is_served(tmp_path, pjserve_bin, plugin_path):
    """batch_sizes=None exports a model without a batch axis (Triton's
    max_batch_size 0): the manifest's shapes have no `batch`, one module is
    compiled, the server answers requests of exactly those shapes on both
    protocols as JAX computes them, reports max_batch_size 0, and refuses a
    request that adds a batch axis."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    from e2e_util import serving

    params = {"w": jnp.asarray(np.random.default_rng(3).standard_normal((2, 3, 4, 5)),
                               jnp.float32)}
    path = pe.export_jax(_image_scores, params, [np.zeros((3, 4, 5), np.float32)], tmp_path,
                         name="unbatched", batch_sizes=None, input_names=["data_0"],
                         output_names=["fc6_1"], input_formats={"data_0": "NCHW"})
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert doc["batch_sizes"] == [1]
    assert doc["inputs"][0]["shape"] == [3, 4, 5]
    assert doc["outputs"][0]["shape"] == [2, 1, 1]
    assert sorted(p.name for p in path.glob("*.mlir")) == ["model.b1.mlir"]
    m = pe.read_manifest(path)
    assert not m.inputs[0].batched and not m.outputs[0].batched

    x = np.random.default_rng(4).standard_normal((3, 4, 5)).astype(np.float32)
    (want,) = _image_scores(params, x)
    with serving(pjserve_bin, plugin_path, [path], tmp_path / "srv", "unbatched") as s:
        g = grpcclient.InferenceServerClient(s.grpc_url)
        inp = grpcclient.InferInput("data_0", [3, 4, 5], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(g.infer("unbatched", [inp]).as_numpy("fc6_1"), want,
                                   rtol=1e-5, atol=1e-5)
        assert g.get_model_config("unbatched").config.max_batch_size == 0
        batched = grpcclient.InferInput("data_0", [1, 3, 4, 5], "FP32")
        batched.set_data_from_numpy(x[None])
        with pytest.raises(InferenceServerException):
            g.infer("unbatched", [batched])
        h = httpclient.InferenceServerClient(s.http_url)
        hin = httpclient.InferInput("data_0", [3, 4, 5], "FP32")
        hin.set_data_from_numpy(x, binary_data=True)
        np.testing.assert_allclose(h.infer("unbatched", [hin]).as_numpy("fc6_1"), want,
                                   rtol=1e-5, atol=1e-5)
        g.close()
        h.close()


def test_model_without_batch_axis_takes_no_variants_or_sequences(tmp_path):
    x = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match="without a batch axis"):
        pe.export_jax(_image_scores, {"w": jnp.ones((2, 3, 4, 5))}, [x], tmp_path, name="u",
                      batch_sizes=None, input_names=["data_0"], output_names=["fc6_1"],
                      variants={"wide": [np.zeros((3, 4, 6), np.float32)]})


def test_dict_output_rejected(tmp_path):
    with pytest.raises(ValueError, match="tuple of arrays"):
        pe.export_jax(lambda p, x: {"y": x}, {}, X, tmp_path, name="d", batch_sizes=[1],
                      input_names=["x"], output_names=["y"])


def test_scalar_example_input_rejected(tmp_path):
    with pytest.raises(ValueError, match="leading batch axis"):
        pe.export_jax(lambda p, x: x, {}, [np.float32(1)], tmp_path, name="s",
                      batch_sizes=[1], input_names=["x"], output_names=["y"])


def test_colliding_weight_names(tmp_path):
    params = {"a.b": np.ones(2, np.float32), "a": {"b": np.ones(2, np.float32)}}
    with pytest.raises(ValueError, match="collide"):
        pe.export_jax(lambda p, x: x, params, X, tmp_path, name="c", batch_sizes=[1],
                      input_names=["x"], output_names=["y"])


def test_64_bit_weights_stored_as_jax_computes_them(tmp_path):
    if jax.config.jax_enable_x64:
        pytest.skip("x64 enabled: 64-bit types are kept")
    params = {"w": np.ones((16, 4), np.float64)}
    with pytest.warns(UserWarning, match="float32"):
        path = pe.export_jax(lambda p, x: x @ p["w"], params, X, tmp_path, name="w64",
                             batch_sizes=[1], input_names=["x"], output_names=["y"])
    tensors, _ = pe.read_safetensors(path / "weights.safetensors")
    assert tensors["w"].dtype == np.float32


def test_custom_calls_are_reported_and_serialized(tmp_path):
    """jnp.linalg.inv lowers to LAPACK custom calls carrying Shardy attributes:
    the export warns (the bare CPU plugin has no handlers) and still writes a
    pure-VHLO artifact."""
    with pytest.warns(UserWarning, match="lapack_sgetrf_ffi"):
        path = pe.export_jax(lambda p, x: jnp.linalg.inv(x), {},
                             [np.eye(3, dtype=np.float32)[None]], tmp_path, name="inv",
                             batch_sizes=[1], input_names=["x"], output_names=["y"])
    text = pe.deserialize_portable_artifact((path / "model.b1.mlir").read_bytes())
    assert pe.custom_call_targets(text) == ["lapack_sgetrf_ffi", "lapack_strsm_ffi"]
    assert "#sdy." not in text.replace('"#sdy.', "")   # sdy only inside string attributes


# ---- input-shape variants -------------------------------------------------------

def _pool(p, x):
    # x [n, L, 16]: y does not depend on L, z does.
    return x.mean(axis=1) @ p["w"] + p["b"], x * 2


X_POOL = [np.zeros((1, 4, 16), np.float32)]


def export_pool(tmp_path, variants, fn=_pool, **kw):
    args = dict(name="pool", batch_sizes=[1, 4], input_names=["x"], output_names=["y", "z"],
                variants=variants)
    args.update(kw)
    return pe.export_jax(fn, LINEAR_PARAMS, X_POOL, tmp_path, **args)


def test_variants_layout_and_manifest(tmp_path):
    path = export_pool(tmp_path, {"long": [np.zeros((3, 8, 16), np.float32)],
                                  "short": [jax.ShapeDtypeStruct((1, 2, 16), jnp.float32)]})
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.yaml", "model.b1.mlir", "model.b4.mlir", "model.long.b1.mlir",
        "model.long.b4.mlir", "model.short.b1.mlir", "model.short.b4.mlir",
        "weights.safetensors"]
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    # Only what differs from the top level: z changes with L, y does not.
    assert doc["variants"] == [
        {"name": "long", "inputs": {"x": ["batch", 8, 16]}, "outputs": {"z": ["batch", 8, 16]}},
        {"name": "short", "inputs": {"x": ["batch", 2, 16]}, "outputs": {"z": ["batch", 2, 16]}},
    ]
    for variant, length in (("long", 8), ("short", 2)):
        for n in (1, 4):
            artifact = (path / pe.module_file(n, variant)).read_bytes()
            args, results = pe.main_signature(pe.deserialize_portable_artifact(artifact))
            assert args == [((4,), "f32"), ((16, 4), "f32"), ((n, length, 16), "f32")]
            assert results == [((n, 4), "f32"), ((n, length, 16), "f32")]
    # The weights are written once, for every variant.
    tensors, _ = pe.read_safetensors(path / "weights.safetensors")
    assert sorted(tensors) == ["b", "w"]

    m = pe.read_manifest(path)
    assert m.variant_names() == ["default", "long", "short"]
    assert [s.shape for s in m.variant_inputs("long")] == [(8, 16)]
    assert [s.shape for s in m.variant_outputs("long")] == [(4,), (8, 16)]
    assert [s.shape for s in m.variant_inputs()] == [(4, 16)]
    assert pe.random_inputs(m, 3, variant="short")["x"].shape == (3, 2, 16)
    with pytest.raises(ValueError, match="no variant 'wide'"):
        m.variant_inputs("wide")


def test_export_without_variants_writes_no_variants_key(tmp_path):
    doc = yaml.safe_load((export_linear(tmp_path) / "manifest.yaml").read_text())
    assert "variants" not in doc
    assert pe.read_manifest(tmp_path / "linear").variants == []


def test_variants_export_is_reproducible(tmp_path):
    m = demo.demo_models(["gapnet"])[0]
    a = m.export(tmp_path / "a")
    b = m.export(tmp_path / "b")
    files = sorted(p.name for p in a.iterdir())
    assert "model.wide.b8.mlir" in files
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def _rank_changing(p, x):
    y = x.mean(axis=1) @ p["w"] + p["b"]
    return y, (x * 2 if x.shape[1] == 4 else (x * 2).reshape(x.shape[0], -1))


@pytest.mark.parametrize("variants,message", [
    ([("long", [np.zeros((1, 8, 16), np.float32)])], "must be a mapping"),
    ({"default": [np.zeros((1, 8, 16), np.float32)]}, "'default' is taken"),
    ({"a b": [np.zeros((1, 8, 16), np.float32)]}, "variant name must be"),
    ({"long": []}, "has 0 example input"),
    ({"long": [np.zeros((1, 8, 16), np.float16)]}, "dtype float16"),
    ({"long": [np.zeros((1, 8, 16, 1), np.float32)]}, "another rank"),
    ({"same": [np.zeros((9, 4, 16), np.float32)]}, "same input shapes as 'default'"),
    ({"a": [np.zeros((1, 8, 16), np.float32)], "b": [np.zeros((1, 8, 16), np.float32)]},
     "'b' has the same input shapes as 'a'"),
    ({f"v{k}": [np.zeros((1, k + 5, 16), np.float32)] for k in range(17)},
     "at most 16 variants"),
])
def test_variant_validation(tmp_path, variants, message):
    with pytest.raises(ValueError, match=message):
        export_pool(tmp_path, variants)
    assert not (tmp_path / "pool").exists()


def test_variant_output_rank_must_not_change(tmp_path):
    with pytest.raises(ValueError, match="variant 'long': output 'z'.*extents only"):
        export_pool(tmp_path, {"long": [np.zeros((1, 8, 16), np.float32)]}, fn=_rank_changing)
    assert not (tmp_path / "pool").exists()


def _pool_image(p, x):
    return jnp.mean(x, axis=(1, 2)) * p["scale"]


def test_input_formats_reach_the_manifest_and_the_server(tmp_path, pjserve):
    """input_formats writes `format:` on image inputs; the server's check
    accepts the bundle; read_manifest gives the layout back."""
    path = pe.export_jax(_pool_image, {"scale": np.ones(3, np.float32)},
                         [np.zeros((1, 8, 8, 3), np.float32)], tmp_path, name="pool",
                         batch_sizes=[1, 2], input_names=["image"], output_names=["mean"],
                         input_formats={"image": "NHWC"})
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    assert doc["inputs"] == [{"name": "image", "dtype": "f32", "shape": ["batch", 8, 8, 3],
                              "format": "NHWC"}]
    assert "format" not in doc["outputs"][0]
    assert pe.read_manifest(path).inputs[0].format == "NHWC"
    result = pjserve("check", str(path))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("formats, message", [
    ({"nope": "NHWC"}, "not an input"),
    ({"image": "HWC"}, "must be NHWC or NCHW"),
    ("NHWC", "must be a mapping"),
])
def test_input_formats_validation(tmp_path, formats, message):
    with pytest.raises(ValueError, match=message):
        pe.export_jax(_pool_image, {"scale": np.ones(3, np.float32)},
                      [np.zeros((1, 8, 8, 3), np.float32)], tmp_path, name="pool",
                      batch_sizes=[1], input_names=["image"], output_names=["mean"],
                      input_formats=formats)


def test_input_format_needs_three_extents(tmp_path):
    with pytest.raises(ValueError, match="three extents"):
        export_linear(tmp_path, input_formats={"x": "NCHW"})


# ---- swap-in stages -------------------------------------------------------------

from pjserve_export import swap_in as S  # noqa: E402

MLP_DIMS = [16, 32, 32, 32, 8]


def _mlp_params():
    rng = np.random.default_rng(5)
    return {f"l{i}": {"w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                      "b": rng.standard_normal(b).astype(np.float32)}
            for i, (a, b) in enumerate(zip(MLP_DIMS, MLP_DIMS[1:]))}


def _mlp(p, x):
    for i in range(4):
        x = x @ p[f"l{i}"]["w"] + p[f"l{i}"]["b"]
        if i < 3:
            x = jnp.tanh(x)
    return x


def export_mlp(tmp_path, **kw):
    args = dict(name="mlp", batch_sizes=[1, 4], input_names=["x"], output_names=["y"],
                swap_in_stages=3)
    args.update(kw)
    return pe.export_jax(_mlp, _mlp_params(), [np.zeros((1, 16), np.float32)], tmp_path, **args)


def _stage_of(manifest, order):
    """Per weight of argument_order: its stage, the first entry listing it (the last
    stage for a weight no entry lists)."""
    stages = manifest.swap_in_stages
    first = {}
    for k, st in enumerate(stages):
        for w in st.weights:
            first.setdefault(w, k)
    return [first.get(w, len(stages) - 1) for w in order]


def check_swap_in_bundle(path):
    """What the loader checks of a bundle with swap_in_stages, from the files
    alone: the entries, the argument_order rule and every stage module's @main
    (weights as listed, then stage 0's inputs or the previous stage's outputs;
    returning the entry's outputs, the last the model's)."""
    m = pe.read_manifest(path)
    tensors, meta = pe.read_safetensors(path / "weights.safetensors")
    order = json.loads(meta["argument_order"])
    stages = m.swap_in_stages
    assert 2 <= len(stages) <= 16 and not m.variants
    for k, st in enumerate(stages):
        assert len(set(st.weights)) == len(st.weights) and set(st.weights) <= set(order)
        assert st.weights == sorted(st.weights, key=order.index)    # in argument_order order
        if k + 1 < len(stages):
            assert st.outputs and [t.name for t in st.outputs] == \
                [f"s{k}.{i}" for i in range(len(st.outputs))]
        else:
            assert st.outputs == []
    ranks = _stage_of(m, order)
    assert ranks == sorted(ranks), "stages decrease along argument_order"

    def full(specs, n):
        return [(t.full_shape(n), t.dtype) for t in specs]

    for n in m.batch_sizes:
        takes = m.inputs
        for k, st in enumerate(stages):
            artifact = (path / pe.swap_in_file(k, n)).read_bytes()
            args, results = pe.main_signature(pe.deserialize_portable_artifact(artifact))
            weights = [(tuple(tensors[w].shape), _manifest_dtype(tensors[w])) for w in st.weights]
            assert args == weights + full(takes, n), (k, n)
            gives = st.outputs if k + 1 < len(stages) else m.outputs
            assert results == full(gives, n), (k, n)
            takes = st.outputs
        # the whole-model modules take every weight in argument_order
        args, _ = pe.main_signature(pe.deserialize_portable_artifact(
            (path / pe.module_file(n)).read_bytes()))
        assert args[:len(order)] == [(tuple(tensors[w].shape), _manifest_dtype(tensors[w]))
                                     for w in order]
    files = {p.name for p in path.glob("swap_in.*")}
    assert files == {pe.swap_in_file(k, n) for k in range(len(stages)) for n in m.batch_sizes}
    return m, order


def _manifest_dtype(a):
    from pjserve_export import dtypes
    return dtypes.manifest_name(a.dtype)


def test_swap_in_stages_mlp(tmp_path):
    path = export_mlp(tmp_path)
    doc = yaml.safe_load((path / "manifest.yaml").read_text())
    # Weight bytes: l0 544 floats, l1 1056, l2 1056, l3 264: the most even split.
    assert doc["swap_in_stages"] == [
        {"weights": ["l0.b", "l0.w"],
         "outputs": [{"name": "s0.0", "dtype": "f32", "shape": ["batch", 32]}]},
        {"weights": ["l1.b", "l1.w"],
         "outputs": [{"name": "s1.0", "dtype": "f32", "shape": ["batch", 32]}]},
        {"weights": ["l2.b", "l2.w", "l3.b", "l3.w"]},
    ]
    m, order = check_swap_in_bundle(path)
    assert order == ["l0.b", "l0.w", "l1.b", "l1.w", "l2.b", "l2.w", "l3.b", "l3.w"]
    assert [len(st.outputs) for st in m.swap_in_stages] == [1, 1, 0]
    assert sorted(p.name for p in path.glob("*.mlir")) == [
        "model.b1.mlir", "model.b4.mlir", "swap_in.s0.b1.mlir", "swap_in.s0.b4.mlir",
        "swap_in.s1.b1.mlir", "swap_in.s1.b4.mlir", "swap_in.s2.b1.mlir", "swap_in.s2.b4.mlir"]


def test_swap_in_stages_reorder_weights_for_the_whole_model(tmp_path):
    """Weights first used in a later stage move after those of earlier ones,
    and the whole-model modules take them in that order; one never used goes
    last."""
    params = {"a_late": np.full((8, 4), 0.5, np.float32), "b_early": np.eye(4, 8, dtype=np.float32),
              "c_unused": np.ones(3, np.float32)}

    def fn(p, x):
        return jnp.tanh(x @ p["b_early"]) @ p["a_late"]

    path = pe.export_jax(fn, params, [np.zeros((1, 4), np.float32)], tmp_path, name="re",
                         batch_sizes=[2], input_names=["x"], output_names=["y"],
                         swap_in_stages=2)
    m, order = check_swap_in_bundle(path)
    assert order == ["b_early", "a_late", "c_unused"]
    assert [st.weights for st in m.swap_in_stages] == [["b_early"], ["a_late"]]
    tensors, _ = pe.read_safetensors(path / "weights.safetensors")
    assert list(tensors) == order


def test_swap_in_stages_1_or_none_is_todays_export(tmp_path):
    a = export_mlp(tmp_path / "a", swap_in_stages=None)
    b = export_mlp(tmp_path / "b", swap_in_stages=1)
    c = pe.export_jax(_mlp, _mlp_params(), [np.zeros((1, 16), np.float32)], tmp_path / "c",
                      name="mlp", batch_sizes=[1, 4], input_names=["x"], output_names=["y"])
    names = sorted(p.name for p in a.iterdir())
    assert names == ["manifest.yaml", "model.b1.mlir", "model.b4.mlir", "weights.safetensors"]
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes() == (c / f).read_bytes(), f


def test_swap_in_stages_export_is_reproducible(tmp_path):
    a = export_mlp(tmp_path / "a")
    b = export_mlp(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def _bundle_of_module(out_dir, name, artifact, weights, inputs, outputs):
    """A bundle without batch axis around one module: `weights` {name: array}
    in argument order, inputs and outputs [(name, dtype, full shape)]."""
    out_dir.mkdir(parents=True)
    (out_dir / "model.b1.mlir").write_bytes(artifact)
    pe.write_safetensors(out_dir / "weights.safetensors", weights,
                         {"argument_order": json.dumps(list(weights))})
    m = pe.Manifest(name=name, batch_sizes=[1],
                    inputs=[pe.TensorSpec(nm, dt, shape, batched=False)
                            for nm, dt, shape in inputs],
                    outputs=[pe.TensorSpec(nm, dt, shape, batched=False)
                             for nm, dt, shape in outputs])
    from pjserve_export import bundle as B
    (out_dir / "manifest.yaml").write_text(B.manifest_yaml(m))


def _run(pjserve, bundle, arrays, out_dir, *options):
    argv = ["run", bundle, *options]
    for nm, a in arrays.items():
        f = out_dir / f"in-{nm}.npy"
        out_dir.mkdir(parents=True, exist_ok=True)
        np.save(f, a)
        argv += ["--input", f"{nm}={f}"]
    result = pjserve(*argv, "--output-dir", out_dir / "out")
    assert result.returncode == 0, result.stderr
    return {p.stem: np.load(p) for p in (out_dir / "out").glob("*.npy")}


def run_stages_through_pjserve(pjserve, path, n, inputs, work):
    """Runs each stage module of `path` at batch size n as a bundle of its
    own through `pjserve run`, each on the previous one's results; returns
    the last stage's outputs by name."""
    m = pe.read_manifest(path)
    tensors, _ = pe.read_safetensors(path / "weights.safetensors")
    values = dict(inputs)
    takes = m.inputs
    for k, st in enumerate(m.swap_in_stages):
        gives = st.outputs if st.outputs else m.outputs
        d = work / f"s{k}"
        _bundle_of_module(d, f"s{k}", (path / pe.swap_in_file(k, n)).read_bytes(),
                          {w: tensors[w] for w in st.weights},
                          [(t.name, t.dtype, t.full_shape(n)) for t in takes],
                          [(t.name, t.dtype, t.full_shape(n)) for t in gives])
        values = _run(pjserve, d, {t.name: values[t.name] for t in takes}, work / f"run{k}")
        takes = gives
    return values


def test_swap_in_stage_modules_compose_to_the_model(tmp_path, pjserve):
    """The exported stage modules, run one after the other by pjserve, answer
    as fn does; so do the whole-model modules over the reordered weights."""
    params = _mlp_params()
    path = export_mlp(tmp_path)
    result = pjserve("check", path)     # the loader's own checks of the stages
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(6).standard_normal((4, 16)).astype(np.float32)
    want = np.asarray(_mlp(params, x))
    got = run_stages_through_pjserve(pjserve, path, 4, {"x": x}, tmp_path / "stages")
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
    # Copied weight by weight, the weights are never staged: this runs the
    # whole-model module, on the reordered weights.
    whole = _run(pjserve, path, {"x": x}, tmp_path / "whole", "--weight-upload", "each")
    np.testing.assert_allclose(whole["y"], want, rtol=1e-5, atol=1e-5)


def test_swap_in_self_check_catches_a_wrong_stage(tmp_path, monkeypatch):
    real = S.stage_function

    def broken(p, lo, hi, weights, ins, outs):
        f = real(p, lo, hi, weights, ins, outs)
        if lo != 0:
            return f
        return lambda ws, *xs: tuple(y + 1e-3 for y in f(ws, *xs))

    monkeypatch.setattr(S, "stage_function", broken)
    with pytest.raises(ValueError, match="output 'y' differs from fn's"):
        export_mlp(tmp_path)
    assert not (tmp_path / "mlp").exists()


@pytest.mark.parametrize("value,message", [
    (0, "an int from 2 to 16"), (17, "an int from 2 to 16"), (-3, "an int from 2 to 16"),
    ("x", "an int from 2 to 16 or 'auto'"), (True, "an int from 2 to 16"),
    (2.0, "an int from 2 to 16"), ([2], "an int from 2 to 16"),
])
def test_swap_in_stages_validation(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        export_mlp(tmp_path, swap_in_stages=value)
    assert not (tmp_path / "mlp").exists()


@pytest.mark.parametrize("value", [2, "auto"])
def test_swap_in_stages_not_with_variants(tmp_path, value):
    with pytest.raises(ValueError, match="swap_in_stages and variants cannot be combined"):
        export_pool(tmp_path, {"long": [np.zeros((1, 8, 16), np.float32)]},
                    swap_in_stages=value)


def test_swap_in_stages_need_the_same_trace_at_every_batch_size(tmp_path):
    def fn(p, x):
        y = x @ p["w"]
        return jnp.tanh(y) @ p["v"] if x.shape[0] > 1 else y @ p["v"]

    params = {"w": np.ones((4, 4), np.float32), "v": np.ones((4, 2), np.float32)}
    with pytest.raises(ValueError, match="other operations at batch size"):
        pe.export_jax(fn, params, [np.zeros((1, 4), np.float32)], tmp_path, name="t",
                      batch_sizes=[1, 2], input_names=["x"], output_names=["y"],
                      swap_in_stages=2)


def test_swap_in_stages_nothing_to_cut_exports_whole(tmp_path):
    with pytest.warns(UserWarning, match="no place to cut.*exported without stages"):
        path = pe.export_jax(lambda p, x: jnp.tanh(x @ p["w"]) * 2,
                             {"w": np.ones((16, 4), np.float32)}, X, tmp_path, name="one",
                             batch_sizes=[1], input_names=["x"], output_names=["y"],
                             swap_in_stages=2)
    assert "swap_in_stages" not in yaml.safe_load((path / "manifest.yaml").read_text())
    assert not list(path.glob("swap_in.*"))


def _convnet_params():
    rng = np.random.default_rng(7)

    def conv(cin, cout):
        return {"w": (rng.standard_normal((3, 3, cin, cout)) / np.sqrt(9 * cin)).astype(np.float32),
                "b": (0.1 * rng.standard_normal(cout)).astype(np.float32)}
    return {"stem": conv(3, 8), "block1": {"a": conv(8, 8), "b": conv(8, 8)},
            "block2": {"a": conv(8, 8), "b": conv(8, 8)},
            "fc": {"w": (rng.standard_normal((8, 10)) / np.sqrt(8)).astype(np.float32)}}


@jax.jit
def _conv(x, c):
    y = jax.lax.conv_general_dilated(x, c["w"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + c["b"]


def _convnet(p, x):
    """A stem and two residual blocks (jitted convolutions, as layers often
    are), global average pooling, a dense layer; also returns the input
    scaled, an output carried from the start."""
    h = jax.nn.relu(_conv(x, p["stem"]))
    for blk in ("block1", "block2"):
        h = jax.nn.relu(h + _conv(jax.nn.relu(_conv(h, p[blk]["a"])), p[blk]["b"]))
    return jnp.mean(h, axis=(1, 2)) @ p["fc"]["w"], x * 0.5


@pytest.mark.parametrize("stages", [2, 3])
def test_swap_in_stages_convnet(tmp_path, pjserve, stages):
    params = _convnet_params()
    path = pe.export_jax(_convnet, params, [np.zeros((1, 8, 8, 3), np.float32)], tmp_path,
                         name="convnet", batch_sizes=[1, 2], input_names=["x"],
                         output_names=["logits", "half"], swap_in_stages=stages)
    m, order = check_swap_in_bundle(path)
    assert len(m.swap_in_stages) == stages
    result = pjserve("check", path)
    assert result.returncode == 0, result.stderr
    # Every carried tensor is an activation with the batch axis first.
    assert all(t.batched for st in m.swap_in_stages for t in st.outputs)
    # The stem's weights are copied with the first stage, the dense layer's with the last.
    assert {"stem.b", "stem.w"} <= set(m.swap_in_stages[0].weights)
    assert "fc.w" in m.swap_in_stages[-1].weights and order[-1] == "fc.w"
    x = np.random.default_rng(8).standard_normal((2, 8, 8, 3)).astype(np.float32)
    want = [np.asarray(a) for a in _convnet(params, x)]
    got = run_stages_through_pjserve(pjserve, path, 2, {"x": x}, tmp_path / "run")
    np.testing.assert_allclose(got["logits"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["half"], want[1], rtol=1e-6, atol=0)


def _odd(p, x, k):
    return x @ p["w"], x, jnp.arange(3.0), k + 1, p["v"]


def test_swap_in_stages_without_batch_axis_and_odd_outputs(tmp_path, pjserve):
    """A model without batch axis: one module per stage (b1), fixed-shape
    carries; outputs that are an input, a constant and a weight still come
    out of the last stage."""
    params = {"w": np.arange(16, dtype=np.float32).reshape(4, 4), "v": np.ones(2, np.float32)}
    path = pe.export_jax(_odd, params, [np.zeros((3, 4), np.float32), np.zeros(2, np.int32)],
                         tmp_path, name="odd", batch_sizes=None, input_names=["x", "k"],
                         output_names=["a", "b", "c", "d", "e"], swap_in_stages=2)
    m, order = check_swap_in_bundle(path)
    assert sorted(p.name for p in path.glob("swap_in.*")) == ["swap_in.s0.b1.mlir",
                                                             "swap_in.s1.b1.mlir"]
    assert [st.weights for st in m.swap_in_stages] == [["w"], ["v"]]
    assert not any(t.batched for t in m.swap_in_stages[0].outputs)
    result = pjserve("check", path)
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    k = np.array([3, -4], np.int32)
    got = run_stages_through_pjserve(pjserve, path, 1, {"x": x, "k": k}, tmp_path / "run")
    for name, want in zip("abcde", _odd(params, x, k)):
        np.testing.assert_allclose(got[name], np.asarray(want), rtol=1e-6, err_msg=name)


def test_swap_in_stages_resnet_passes_through(tmp_path):
    from pjserve_export import resnet
    path = resnet.resnet_model(depth=18, width=4, image=32, classes=10).export(
        tmp_path, batch_sizes=[1], swap_in_stages=3)
    m, _ = check_swap_in_bundle(path)
    assert len(m.swap_in_stages) == 3


def test_swap_in_auto_uses_the_plan(tmp_path, monkeypatch):
    """"auto" groups the fine segments as plan_stages says for the measured
    numbers (here made up: a slow copy and equal segments)."""
    monkeypatch.setattr(S, "_measure_bandwidth", lambda arrays: 1e6)      # 1 MB/s
    monkeypatch.setattr(S, "_measure_segments",
                        lambda p, segments, weights, inputs: [5e-3] * len(segments))
    path = export_mlp(tmp_path, swap_in_stages="auto")
    m, _ = check_swap_in_bundle(path)
    assert len(m.swap_in_stages) >= 2
    # A copy that costs nothing: one stage is best, and the model is exported whole.
    monkeypatch.setattr(S, "_measure_bandwidth", lambda arrays: float("inf"))
    with pytest.warns(UserWarning, match="one stage has the least modelled cold latency"):
        path = export_mlp(tmp_path, swap_in_stages="auto")
    assert not list(path.glob("swap_in.*"))


def test_swap_in_auto_measures_on_this_device(tmp_path):
    """Real measurements: whatever plan they make, the bundle is consistent."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = export_mlp(tmp_path, swap_in_stages="auto")
    if pe.read_manifest(path).swap_in_stages:
        check_swap_in_bundle(path)
    else:
        assert not list(path.glob("swap_in.*"))


def test_plan_stages_compute_heavy_vs_transfer_heavy():
    # 8 segments of 10 MB at 10 GB/s: 1 ms of copy each.
    mb10 = [10e6] * 8
    # Computation dwarfs the copies: a first stage as small as can be, whose
    # computation hides all the rest of the copy; more stages only cost.
    heavy = S.plan_stages(mb10, [10e-3] * 8, 10e9)
    assert heavy.ends == [1, 8]
    # Copy-bound with a little less computation than copying: every stage
    # hides the next one's copy, so as many stages as segments.
    transfer = S.plan_stages(mb10, [0.9e-3] * 8, 10e9)
    assert transfer.ends == list(range(1, 9))
    assert transfer.latency_s < transfer.by_stages[1]
    # Tiny weights: nothing to hide, every stage only adds overheads.
    tiny = S.plan_stages([1e3] * 8, [10e-3] * 8, 10e9)
    assert tiny.ends == [8] and tiny.latency_s == tiny.by_stages[1]


def test_plan_stages_model():
    # One stage: copy everything (2 s at 1 B/s... here 1 B/s, 2 bytes), then compute 3 s.
    one = S.plan_stages([1, 1], [1.5, 1.5], 1.0, copy_overhead_s=0, launch_overhead_s=0,
                        max_stages=1)
    assert one.ends == [2] and one.latency_s == pytest.approx(5.0)
    # Two stages: X0 = 1, C0 = 2.5; X1 = 2, C1 = max(2, 2.5) + 1.5 = 4.
    two = S.plan_stages([1, 1], [1.5, 1.5], 1.0, copy_overhead_s=0, launch_overhead_s=0)
    assert two.ends == [1, 2] and two.latency_s == pytest.approx(4.0)
    assert two.by_stages == {1: pytest.approx(5.0), 2: pytest.approx(4.0)}
    # Overheads: (k + 1) copies and k + 1 launches by the end of stage k.
    o = S.plan_stages([1, 1], [1.5, 1.5], 1.0, copy_overhead_s=0.25, launch_overhead_s=0.5)
    assert o.by_stages[1] == pytest.approx(2 + 0.25 + 3 + 0.5)
    assert o.by_stages[2] == pytest.approx(max(2 + 0.5, 1 + 0.25 + 1.5 + 0.5) + 1.5 + 0.5)
    # Uneven segments: the cut goes where the copy behind it is hidden best.
    uneven = S.plan_stages([1, 8, 1], [9, 0.5, 0.5], 1.0, copy_overhead_s=0,
                           launch_overhead_s=0, max_stages=2)
    assert uneven.ends == [1, 3]


def test_balanced_cuts():
    # Candidates before 10, 20, ..., 90 of 100 bytes: 4 stages of about 25.
    amounts = list(range(10, 100, 10))
    cuts = [0] + [amounts[i] for i in S.balanced_cuts(amounts, 100, 4)] + [100]
    assert sorted(b - a for a, b in zip(cuts, cuts[1:])) == [20, 20, 30, 30]
    assert S.balanced_cuts(amounts, 100, 2) == [4]        # 50
    assert S.balanced_cuts([40], 100, 5) == [0]           # fewer candidates than cuts
    assert S.balanced_cuts([], 100, 3) == []
