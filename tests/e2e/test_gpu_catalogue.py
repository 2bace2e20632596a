"""scripts/gpu-catalogue: the catalogue benchmark package for a GPU machine, run here on the CPU plugin.

The package carries pjserve and its libraries, ResNet-50 (bf16 and f32) and a
tiny network of the same shape, without their weights (written from the
header where it runs), and the trace generator. Without a GPU it says so and
exits 2. With --pjrt-plugin and --arch tiny it runs every phase on the CPU
plugin: bundles of distinct weights, jax's answers, cold requests from host
memory and from the files, warm ones, the catalogue trace at two rates; the
tiers pjserve reports must be the ones each phase is built to hit.
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

SCRIPT = REPO / "scripts" / "gpu-catalogue"
CARRY_LIMIT = 64 << 20


def run(argv, timeout=600):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def package(pjserve_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-catalogue") / "pkg"
    r = run([sys.executable, SCRIPT, "--package-only", "--pjserve", pjserve_bin, "--out", out])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"packaged {out}" in r.stdout
    return out


def load_script(package):
    """The packaged script as a module (its helpers beside it on sys.path)."""
    sys.path.insert(0, str(package))
    loader = importlib.machinery.SourceFileLoader("gpu_catalogue", str(package / "gpu-catalogue"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_catalogue",
                                                                              loader))
    sys.modules["gpu_catalogue"] = module  # its bundle writers are pickled by name
    loader.exec_module(module)
    return module


def test_package_holds_pjserve_the_modules_and_headers_only(package):
    for f in ("bin/pjserve", "gpu-catalogue", "gpu_package.py", "gpu_models.py",
              "catalogue_trace.py", "models/resnet50-bf16/model.b16.mlir",
              "models/resnet50-bf16/weights.header", "models/resnet50-f32/model.b1.mlir",
              "models/tiny-bf16/manifest.yaml", "models/tiny-f32/weights.header"):
        assert (package / f).is_file(), f
    assert not list(package.rglob("weights.safetensors"))
    size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
    assert size < CARRY_LIMIT


def test_without_a_gpu_it_says_so_and_runs_nothing(package):
    if nvidia_gpu_here():
        pytest.skip("this machine has an NVIDIA GPU")
    r = run([package / "gpu-catalogue", "--run-only"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no NVIDIA GPU here" in r.stdout and "nothing was run" in r.stdout
    assert not (package / "gpu_catalogue.json").exists()


def test_usage_errors(package):
    r = run([package / "gpu-catalogue", "--run-only", "--rates", "500,250"])
    assert r.returncode == 3 and "ascending" in r.stdout
    r = run([package / "gpu-catalogue", "--run-only", "--cold-rounds", "1"])
    assert r.returncode == 3 and "--cold-rounds" in r.stdout
    r = run([package / "gpu-catalogue", "--package-only"])
    assert r.returncode == 3 and "give --run-only" in r.stdout


def test_each_model_has_weights_of_its_own_drawn_as_jax_draws_them(package, tmp_path):
    import ml_dtypes
    import numpy as np
    try:
        gc = load_script(package)
        import gpu_models
        template = package / "models" / "resnet50-bf16"
        gc.write_bundles(template, ["m0000", "m0001", "m0002"], tmp_path)
    finally:
        sys.path.remove(str(package))
    header = (template / "weights.header").read_bytes()
    entries = gc.header_entries(header)
    files = [(tmp_path / n / "weights.safetensors").read_bytes() for n in
             ("m0000", "m0001", "m0002")]
    assert len({f for f in files}) == 3  # no two models share their bytes
    for i, data in enumerate(files):
        assert data[:len(header)] == header
        for k, (name, e) in enumerate(entries):
            lo, hi = e["data_offsets"]
            got = np.frombuffer(data[len(header) + lo:len(header) + hi], np.uint16)
            drawn = gpu_models.init_weight(name, tuple(e["shape"])).astype(ml_dtypes.bfloat16)
            want = np.roll(drawn.view(np.uint16).ravel(), (i * 7919 * (k + 1)) % got.size)
            assert np.array_equal(got, want), (i, name)
    for n in ("m0000", "m0002"):
        manifest = (tmp_path / n / "manifest.yaml").read_text()
        assert f'name: "{n}"' in manifest
        assert (tmp_path / n / "model.b4.mlir").read_bytes() == \
            (template / "model.b4.mlir").read_bytes()


def test_whole_benchmark_on_the_cpu_plugin(package, plugin_path, tmp_path):
    work = tmp_path / "work"
    # the python with numpy, grpcio and jax: a GPU machine's python3 has them
    r = run([sys.executable, package / "gpu-catalogue", "--run-only", "--pjrt-plugin",
             plugin_path, "--arch", "tiny", "--models", "24", "--rates", "20,40",
             "--seconds", "2", "--warmup", "1", "--cold-rounds", "2", "--clients", "2",
             "--device-weight-budget", "250K,10M", "--work", work, "--results", tmp_path])
    assert r.returncode == 0, r.stdout + r.stderr
    assert not work.exists()  # removed after the run
    res = json.loads((tmp_path / "gpu_catalogue.json").read_text())
    assert "error" not in res
    assert res["limits"]["file_read_gb_s"] > 0
    cold = {(c["tier"], c["dtype"]): c for c in res["cold"]}
    each = "host, a copy per weight"  # --weight-upload each, beside the default
    assert set(cold) == {(t, d) for t in ("host", each, "file", "device (warm)")
                         for d in ("bf16", "f32")}
    for (tier, dtype), c in cold.items():
        assert c["measured"] > 0 and c["p50_ms"] > 0
        # every measured request finds the tier the run is built to hit
        found = {t: d["requests"] for t, d in c["server_tiers"].items()}
        want = {"device (warm)": "device", each: "host"}.get(tier, tier)
        assert found[want] == c["requests"] == c["measured"], (tier, dtype, found)
        assert (c["device_load_ms"] is not None) == (want != "device")
        assert (c["host_load_ms"] is not None) == (tier == "file")
    assert res["checks"] and all(c["ok"] for c in res["checks"])
    # two bf16 models of their own weights and an f32 one, each from every tier
    assert {c["model"] for c in res["checks"]} == {"m0000", "m0001", "f0000"}
    assert {c["answer"] for c in res["checks"]} >= {"host last", "file first", "warm last",
                                                    "cold == warm, bit for bit"}
    small, large = res["catalogue"]  # one run per device budget, on the same traces
    assert (small["device_weight_budget"], large["device_weight_budget"]) == ("250K", "10M")
    assert small["models"] == 24 and small["device_capacity_models"] < 24
    assert large["device_capacity_models"] >= 24
    for cat in (small, large):
        assert [x["rate"] for x in cat["rates"]] == [20.0, 40.0]
        for x in cat["rates"]:
            assert x["requests"] > 0 and x["failed"] == 0 and x["errors"] == {}
            assert 0 < x["within_100ms"] <= 1 and x["p50_ms"] > 0
            assert sum(t["requests"] for t in x["tiers"].values()) > 0
            assert x["trace"]["models_requested"] > 1
            assert x["server"]["mean_batch"] >= 1 and x["server"]["compute_infer_ms"] > 0
            assert 0 < x["server"]["device_busy"] < 1
    assert [x["requests"] for x in small["rates"]] == [x["requests"] for x in large["rates"]]
    # a device budget of a few models under the trace moves weights; one of
    # them all loads each model once at most
    assert sum(x["weight_loads_per_s"] for x in small["rates"]) * 2 > 24
    assert sum(x["weight_loads_per_s"] for x in large["rates"]) * 2 <= 24
    table = (tmp_path / "gpu_catalogue.md").read_text()
    for heading in ("## Cold and warm requests", "What a load can at best cost",
                    "## 24 models on one GPU, the catalogue trace, device budget 250K",
                    "## 24 models on one GPU, the catalogue trace, device budget 10M",
                    "Where the server's time went", "## Answers"):
        assert heading in table
    assert "| 40 |" in table
    assert "server-catalogue-10M.log" in (tmp_path / "server_logs.txt").read_text()
