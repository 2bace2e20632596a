"""scripts/gpu-catalogue: the catalogue benchmark package for a GPU machine, run here on the CPU plugin.

The package carries pjserve and its libraries, ResNet-50 (bf16 and f32, each
whole and split into swap-in stages) and a tiny network of the same shape,
without their weights (written from the header where it runs), and the trace
generator. Without a GPU it says so and exits 2. With --pjrt-plugin and --arch
tiny it runs every phase on the CPU plugin: bundles of distinct weights, jax's
answers, cold requests from host memory (whole, and staged with pipelined
swap-in) and from the files, warm ones, the catalogue trace at two rates; the
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
              "models/tiny-bf16/manifest.yaml", "models/tiny-f32/weights.header",
              "models/resnet50-bf16-staged/swap_in.s3.b1.mlir",
              "models/resnet50-f32-staged/weights.header",
              "models/tiny-bf16-staged/swap_in.s0.b1.mlir",
              "models/tiny-f32-staged/model.b1.mlir"):
        assert (package / f).is_file(), f
    for arch in ("resnet50", "tiny"):
        for dtype in ("bf16", "f32"):
            manifest = (package / "models" / f"{arch}-{dtype}-staged" / "manifest.yaml").read_text()
            assert "swap_in_stages:" in manifest and "batch_sizes: [1]" in manifest
            assert "swap_in_stages" not in \
                (package / "models" / f"{arch}-{dtype}" / "manifest.yaml").read_text()
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


@pytest.mark.parametrize("arch,dtype", [("resnet50", "bf16"), ("tiny", "bf16"), ("tiny", "f32")])
def test_a_staged_twin_holds_its_models_weights_by_name(package, tmp_path, arch, dtype):
    try:
        gc = load_script(package)
        whole = package / "models" / f"{arch}-{dtype}"
        staged = package / "models" / f"{arch}-{dtype}-staged"
        gc.write_bundles(whole, ["m0000", "m0001"], tmp_path)
        gc.write_bundles(staged, ["s0000", "s0001"], tmp_path, twin=whole)
    finally:
        sys.path.remove(str(package))

    def tensors(name):
        data = (tmp_path / name / "weights.safetensors").read_bytes()
        header = gc.split_safetensors(tmp_path / name / "weights.safetensors")[0]
        return [(n, e["shape"], data[len(header) + e["data_offsets"][0]:
                                     len(header) + e["data_offsets"][1]])
                for n, e in gc.header_entries(header)]
    for i in (0, 1):
        a, b = tensors(f"m000{i}"), tensors(f"s000{i}")
        assert [n for n, _, _ in a] != [n for n, _, _ in b]  # stage order, not the file's
        assert sorted(a) == sorted(b)  # but each name's values the same
    assert tensors("s0000") != tensors("s0001")  # and each twin weights of its own


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
    staged = "host, pipelined swap-in"  # the staged twins, --weight-upload block
    assert set(cold) == {(t, d) for t in ("host", staged, each, "file", "device (warm)")
                         for d in ("bf16", "f32")}
    for (tier, dtype), c in cold.items():
        assert c["measured"] > 0 and c["p50_ms"] > 0
        # every measured request finds the tier the run is built to hit
        found = {t: d["requests"] for t, d in c["server_tiers"].items()}
        want = {"device (warm)": "device", each: "host", staged: "host"}.get(tier, tier)
        assert found[want] == c["requests"] == c["measured"], (tier, dtype, found)
        assert (c["device_load_ms"] is not None) == (want != "device")
        assert (c["host_load_ms"] is not None) == (tier == "file")
        # every measured load of a staged twin was staged, per the debug log
        assert c.get("staged_loads") == (c["measured"] if tier == staged else None)
    goal = res["cold_goal"]
    assert goal["goal_ms"] == 10
    for dtype in ("bf16", "f32"):
        assert set(goal["dtypes"][dtype]) == {"host", staged}
        assert goal["dtypes"][dtype][staged]["staged_loads"] == cold[(staged, dtype)]["measured"]
    assert res["checks"] and all(c["ok"] for c in res["checks"])
    # two bf16 models of their own weights and an f32 one, each from every tier
    assert {c["model"] for c in res["checks"]} == {"m0000", "m0001", "f0000"}
    assert {c["answer"] for c in res["checks"]} >= {"host last", "file first", "warm last",
                                                    "cold == warm, bit for bit"}
    # the staged twins' cold answers, against jax's and the whole model's
    for model in ("m0000", "m0001", "f0000"):
        answers = {c["answer"] for c in res["checks"] if c["model"] == model}
        assert {f"{staged} first", f"{staged} last", f"{staged} first == host last",
                f"{staged} last == host last"} <= answers, answers
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
    assert f"| {staged} | bf16 |" in table and f"| {staged} | f32 |" in table
    assert "- Cold request, bf16, goal 10 ms: host p50 " in table
    assert "; host with pipelined swap-in p50 " in table
    for heading in ("## Cold and warm requests", "What a load can at best cost",
                    "## 24 models on one GPU, the catalogue trace, device budget 250K",
                    "## 24 models on one GPU, the catalogue trace, device budget 10M",
                    "Where the server's time went", "## Answers"):
        assert heading in table
    assert "| 40 |" in table
    assert "server-catalogue-10M.log" in (tmp_path / "server_logs.txt").read_text()
