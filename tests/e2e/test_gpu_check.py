"""scripts/gpu-check: the package it makes for a GPU machine, tested here.

The package must run where pjserve's build dependencies are absent: the
binary finds every library it needs but the C and C++ runtimes in the
package's lib/ (checked with ldd), and runs --help and info with only
LD_LIBRARY_PATH pointing there. Checking without a GPU says so and exits 2
without running anything; with --pjrt-plugin it runs the whole check (info,
check, serve, the mlp's answer against JAX, weight loads from /metrics) on the
CPU plugin, which takes the pageable host memory fallback; its CUDA shared
memory step says it is skipped where python3 has no CuPy (and this machine
no GPU), and so do Triton's cudashm example clients, which the package carries
with the wheels they need (here stand-ins: packaging is checked, not them).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import REPO, nvidia_gpu_here  # noqa: E402

SCRIPT = REPO / "scripts" / "gpu-check"
CARRY_LIMIT = 64 << 20
SYSTEM_LIBRARIES = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6",
                    "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
                    "libutil.so.1", "libanl.so.1", "libstdc++.so.6", "libgcc_s.so.1"}


def run(argv, env=None, timeout=600):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def packaged_env(pkg):
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = str(pkg / "lib")
    return env


TRITON_EXAMPLES = ("simple_grpc_cudashm_client.py", "simple_http_cudashm_client.py")


@pytest.fixture(scope="module")
def triton_client_dir(tmp_path_factory):
    """Stand-ins for Triton's two example clients and one wheel: given wheels,
    packaging downloads nothing."""
    d = tmp_path_factory.mktemp("triton-client")
    for f in TRITON_EXAMPLES:
        (d / f).write_text(f"print('PASS: {f}')\n")
    (d / "tritonclient-0.0.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + bytes(18))
    return d


@pytest.fixture(scope="module")
def package(pjserve_bin, tmp_path_factory, triton_client_dir):
    out = tmp_path_factory.mktemp("gpu-check") / "pkg"
    r = run([sys.executable, SCRIPT, "--package-only", "--pjserve", pjserve_bin, "--out", out,
             "--load-mib", "1", "--triton-client", triton_client_dir])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"packaged {out}" in r.stdout
    assert f"Triton's cudashm example clients: 1 wheels from {triton_client_dir}" in r.stdout
    return out


def test_package_holds_the_binary_its_libraries_and_the_bundles(package):
    for f in ("bin/pjserve", "gpu-check", "expected.json", "package.json",
              "models/mlp/manifest.yaml", "models/mlp/weights.safetensors",
              "models/load/manifest.yaml", "models/load/weights.header",
              "models/simple/manifest.yaml", *(f"triton-client/{f}" for f in TRITON_EXAMPLES),
              "triton-client/wheels/tritonclient-0.0.0-py3-none-any.whl"):
        assert (package / f).is_file(), f
    assert not (package / "models" / "load" / "weights.safetensors").exists()
    info = json.loads((package / "package.json").read_text())
    assert sorted(p.name for p in (package / "lib").iterdir()) == info["libraries"]
    assert not SYSTEM_LIBRARIES & set(info["libraries"])
    size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
    assert size < CARRY_LIMIT
    expected = json.loads((package / "expected.json").read_text())
    k = expected["load"]["k"]
    assert expected["load"]["weight_bytes"] == 4 * (k * k + k)
    assert len(expected["mlp"]["y"]) == expected["mlp"]["y_shape"][0] * expected["mlp"]["y_shape"][1]


def test_packaged_binary_finds_every_library_in_the_package(package):
    r = run(["ldd", package / "bin" / "pjserve"], env=packaged_env(package))
    assert r.returncode == 0, r.stderr
    assert "not found" not in r.stdout
    for line in r.stdout.splitlines():
        parts = line.split()
        name = Path(parts[0]).name
        if name in SYSTEM_LIBRARIES:
            continue
        assert "=>" in parts and parts[2].startswith(str(package / "lib") + "/"), line


def test_packaged_binary_runs_help_and_info_on_packaged_libraries(package, plugin_path):
    env = packaged_env(package)
    r = run([package / "bin" / "pjserve", "--help"], env=env)
    assert r.returncode == 0, r.stderr
    assert "usage: pjserve COMMAND" in r.stdout
    r = run([package / "bin" / "pjserve", "info", "--pjrt-plugin", plugin_path,
             package / "models" / "mlp"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "platform: cpu" in r.stdout
    assert "devices: 1" in r.stdout


def test_check_without_a_gpu_says_so_and_runs_nothing(package):
    if nvidia_gpu_here():
        pytest.skip("this machine has an NVIDIA GPU")
    r = run([package / "gpu-check", "--run-only"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no NVIDIA GPU here" in r.stdout
    assert "Nothing was checked" in r.stdout
    assert "ok" not in r.stdout.split()


def test_packaging_refuses_to_run_from_a_package(package):
    r = run([package / "gpu-check", "--package-only"])
    assert r.returncode == 3
    assert "give --run-only" in r.stdout


def test_packaging_without_triton_examples_says_where_they_are(pjserve_bin, tmp_path):
    (tmp_path / TRITON_EXAMPLES[0]).write_text("print('PASS')\n")
    r = run([sys.executable, SCRIPT, "--package-only", "--pjserve", pjserve_bin,
             "--out", tmp_path / "pkg", "--load-mib", "1", "--triton-client", tmp_path])
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"no {TRITON_EXAMPLES[1]} there" in r.stdout
    assert "triton-inference-server/client, src/python/examples" in r.stdout


def test_whole_check_on_the_cpu_plugin(package, plugin_path):
    r = run([package / "gpu-check", "--run-only", "--pjrt-plugin", plugin_path, "--rounds", "2"])
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split("  ")[1].strip(): line for line in r.stdout.splitlines()
            if line.startswith("  ")}
    assert "platform cpu" in rows["pjserve info"]
    assert " ok " in rows["pjserve check"] and "modules: 3" in rows["pjserve check"]
    assert " ok " in rows["serve: mlp answer"]
    assert "pageable memory" in rows["host weights"]
    assert " ok " in rows["weight loads"] and "4 loads of 1.0 MiB (expected 4)" in rows[
        "weight loads"]
    assert "skipped" in rows["link"]
    for f in TRITON_EXAMPLES:
        assert "skipped" in rows[f"triton: {f}"] and "no CUDA device memory" in rows[
            f"triton: {f}"]
    if not _has_cupy():
        assert "skipped" in rows["cuda shared memory"] and "no CuPy" in rows[
            "cuda shared memory"]


def _has_cupy():
    return run(["python3", "-c", "import cupy; cupy.cuda.runtime.getDeviceCount()"]
               ).returncode == 0
