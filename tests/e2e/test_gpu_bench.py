"""scripts/gpu-bench: the benchmark package for a GPU machine, run here on the CPU plugin.

The package carries pjserve, the two bench tools, their libraries, the mlp and
ResNet-50 without its weights (written from the header where it runs), and a
baseline binary when given one. Without a GPU it says so and exits 2 without
running anything. With --pjrt-plugin it runs the whole benchmark on the CPU
plugin with tiny settings (the mlp only: ResNet-50 is minutes on two cores):
the floor with its CPU split by phase, the gRPC echo floor, the baseline, the
defaults and a lever with every run measured and the answers checked, the jax
peer; and the tables it writes name them all.
"""

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, nvidia_gpu_here  # noqa: E402

SCRIPT = REPO / "scripts" / "gpu-bench"
CARRY_LIMIT = 64 << 20
# A pjserve binary this large is a sanitizer build (a plain one is about 4 MiB).
SANITIZER_BUILD_BYTES = 12 << 20


def run(argv, timeout=600):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def with_baseline(pjserve_bin):
    return Path(pjserve_bin).stat().st_size < SANITIZER_BUILD_BYTES


@pytest.fixture(scope="module")
def package(pjserve_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-bench") / "pkg"
    build = Path(pjserve_bin).resolve().parent
    # The same binary again as the baseline, unless it is a sanitizer build:
    # twice that would not fit the carry limit (which the script enforces).
    baseline = ["--baseline", pjserve_bin] if with_baseline(pjserve_bin) else []
    r = run([sys.executable, SCRIPT, "--package-only", "--build-dir", build, "--out", out,
             *baseline])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"packaged {out}" in r.stdout
    return out


def test_package_holds_the_tools_the_models_and_the_baseline(package, pjserve_bin):
    assert (package / "bin" / "pjserve-baseline").is_file() == with_baseline(pjserve_bin)
    for f in ("bin/pjserve", "bin/pjs_bench_raw_execute",
              "bin/pjs_bench_grpc_floor", "gpu-bench", "gpu_package.py", "gpu_models.py",
              "expected.json", "models/mlp/model.b16.mlir", "models/resnet50/model.b16.mlir",
              "models/resnet50/weights.header"):
        assert (package / f).is_file(), f
    assert not (package / "models" / "resnet50" / "weights.safetensors").exists()
    size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
    assert size < CARRY_LIMIT


def test_without_a_gpu_it_says_so_and_runs_nothing(package):
    if nvidia_gpu_here():
        pytest.skip("this machine has an NVIDIA GPU")
    r = run([package / "gpu-bench", "--run-only"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no NVIDIA GPU here" in r.stdout and "Nothing was run" in r.stdout
    assert not (package / "gpu_bench.json").exists()


def test_resnet_weights_are_written_from_the_header_as_jax_draws_them(package, tmp_path):
    sys.path.insert(0, str(package))
    try:
        import numpy as np
        import gpu_models
        loader = importlib.machinery.SourceFileLoader("gpu_bench", str(package / "gpu-bench"))
        gpu_bench = importlib.util.module_from_spec(
            importlib.util.spec_from_loader("gpu_bench", loader))
        loader.exec_module(gpu_bench)
        repo = gpu_bench.make_repository(package, tmp_path, ["mlp", "resnet50"])
        weights = gpu_models.read_weights(repo / "resnet50" / "weights.safetensors")
    finally:
        sys.path.remove(str(package))
    shapes = gpu_models.param_shapes()
    assert set(weights) == set(shapes)
    for name in ("stem.w", "s3b2.c3.scale", "fc.bias"):
        assert weights[name].shape == shapes[name]
        assert np.array_equal(weights[name], gpu_models.init_weight(name, shapes[name]))


def test_whole_benchmark_on_the_cpu_plugin(package, plugin_path, pjserve_bin, tmp_path):
    # the python with numpy and jax: a GPU machine's python3 has them
    r = run([sys.executable, package / "gpu-bench", "--run-only", "--pjrt-plugin", plugin_path,
             "--models", "mlp",
             "--peers", "jax", "--configs", "default,execution-wait=callback", "--seconds", "0.3",
             "--warmup", "0.1", "--iterations", "100", "--results", tmp_path])
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert set(res["floor"]["mlp"]) == {"1", "4", "16"}
    variants = res["floor_variants"]["mlp"]
    assert set(variants) == {"await (default)", "callback", "blocking_sync",
                             "command buffers off", "idle 300 us between",
                             "idle 2000 us between"}
    assert variants["callback"]["execution_wait"] == "callback"
    assert variants["idle 300 us between"]["idle_us"] == 300
    assert variants["await (default)"]["idle_us"] == 0
    assert variants["await (default)"]["thread_cpu_us"]["launch"] > 0
    names = [c["name"] for c in res["configs"]]
    assert names == ["gRPC echo floor"] + (["baseline"] if with_baseline(pjserve_bin) else []) + [
        "default", "execution-wait=callback", "default (again)"]
    for cfg in res["configs"]:
        assert "error" not in cfg, cfg
        assert [(x["model"], x["concurrency"]) for x in cfg["runs"]] == (
            [("echo", 1), ("echo", 4)] if cfg["name"] == "gRPC echo floor"
            else [("mlp", 1), ("mlp", 4)])
        for x in cfg["runs"]:
            assert x["client"]["requests"] > 0 and x["client"]["errors"] == 0
            assert x["server_cpu_us"] > 0
        if cfg["name"] != "gRPC echo floor":
            assert cfg["answer_error"]["mlp"] < 1e-5
            assert cfg["runs"][0]["mean_batch"] == 1.0
            assert cfg["runs"][0]["phases_us"]["compute_infer"] > 0
    assert res["peers"]["jax"]["mlp"]["1"]["p50_us"] > 0
    table = (tmp_path / "gpu_bench.md").read_text()
    for heading in ("## Floor: raw PJRT", "## Floor at batch 1", "## pjserve over gRPC",
                    "## Where a request's time goes", "## Peers in-process"):
        assert heading in table
    assert ("| baseline | mlp | 4 |" in table) == with_baseline(pjserve_bin)


def test_an_unknown_model_set_is_a_usage_error(package):
    r = run([package / "gpu-bench", "--run-only", "--models", "resnet50"])
    assert r.returncode == 2
    assert "--models" in r.stderr
