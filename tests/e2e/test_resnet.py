"""ResNet in plain JAX (pjserve_export.resnet): the architecture, run and served.

The definition is torchvision's ResNet v1.5, so its parameter counts are
torchvision's (less the batch-norm running statistics, which torchvision keeps
as buffers, not parameters). A small ResNet-18 (width 16, 64x64 images, 10
classes: the same blocks and strides as the full one, 0.7 M parameters) is
exported at batch sizes 1 and 4 and compared with JAX: through `pjserve run`
at 1 and at 3 rows (padded to 4 and sliced back), and served over gRPC and
HTTP with tritonclient, whose ModelConfig reports the input as NHWC. The max
absolute error is printed (pytest -s). ResNet-50 itself is exported by `make
models-large` and measured by the scheduler benchmark (docs/benchmarks.md).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import describe, save_inputs, serving  # noqa: E402
from pjserve_export.resnet import LAYOUTS, ResNetSpec, parameter_count, resnet_model, resnet_params  # noqa: E402

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

SMALL = dict(depth=18, width=16, image=64, classes=10)
# f32 convolutions through XLA in both: jax's and the plugin's; summation order may differ
ATOL = RTOL = 1e-4


def images(n, seed):
    return np.random.default_rng(seed).uniform(0, 1, (n, SMALL["image"], SMALL["image"], 3)) \
        .astype(np.float32)


def bn_statistics(depth, width=64):
    """Channels of every batch norm of a ResNet: each holds a mean and a variance."""
    blocks, bottleneck = LAYOUTS[depth]
    total, cin = width, width  # the stem's
    for s, n in enumerate(blocks):
        inner = width * 2 ** s
        cout = inner * 4 if bottleneck else inner
        for b in range(n):
            total += (2 * inner + cout) if bottleneck else (inner + cout)
            if (s > 0 and b == 0) or cin != cout:
                total += cout
            cin = cout
    return 2 * total


@pytest.mark.parametrize("depth,torchvision_parameters", [(18, 11_689_512), (50, 25_557_032)])
def test_parameter_counts_are_torchvision_s(depth, torchvision_parameters):
    params = resnet_params(ResNetSpec(depth))
    assert parameter_count(params) - bn_statistics(depth) == torchvision_parameters


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="depth 20"):
        ResNetSpec(depth=20)
    with pytest.raises(ValueError, match="image >= 32"):
        ResNetSpec(depth=18, image=16)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    m = resnet_model(**SMALL)
    path = m.export(tmp_path_factory.mktemp("resnet"), batch_sizes=(1, 4))
    return m, path


def compare(name, got, want):
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    print(f"{name}: max abs error {err:.3g} (logits std {float(want.std()):.3g})")
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("n", [1, 3])
def test_run_matches_jax(pjserve, small, tmp_path, n):
    m, path = small
    x = images(n, seed=n)
    out = tmp_path / "out"
    out.mkdir()
    r = pjserve("run", path, *save_inputs({"x": x}, tmp_path / "in"), "--output-dir", out,
                "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0, describe(r)
    (want,) = m.reference(x)
    compare(f"pjserve run {m.name} n={n}", np.load(out / "logits.npy"), want)


def test_served_matches_jax(pjserve_bin, plugin_path, small, tmp_path):
    m, path = small
    with serving(pjserve_bin, plugin_path, [path], tmp_path, "resnet") as s:
        x = images(4, seed=7)
        (want,) = m.reference(x)
        g = grpcclient.InferenceServerClient(s.grpc_url)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        compare(f"gRPC {m.name} n=4", g.infer(m.name, [inp]).as_numpy("logits"), want)
        config = g.get_model_config(m.name).config
        assert config.input[0].format == config.input[0].FORMAT_NHWC
        assert config.max_batch_size == 4

        h = httpclient.InferenceServerClient(s.http_url)
        hin = httpclient.InferInput("x", [1, *x.shape[1:]], "FP32")
        hin.set_data_from_numpy(x[:1], binary_data=True)
        compare(f"HTTP {m.name} n=1", h.infer(m.name, [hin]).as_numpy("logits"), want[:1])
