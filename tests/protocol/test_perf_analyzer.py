"""Triton's perf_analyzer against pjserve: it reads ServerMetadata, ModelMetadata,
ModelConfig and ModelStatistics and then runs inference at two concurrency
levels. A short smoke run per protocol; exit 0 and a throughput line."""

import re
import subprocess

import pytest

from protocol_util import REPO, tail

PERF = REPO / "scripts" / "perf_analyzer"


def _run(args, timeout=120):
    try:
        return subprocess.run([str(PERF)] + args, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        pytest.fail(f"perf_analyzer did not finish within {timeout} s:\n{tail(out)}")


def test_perf_analyzer_installed():
    r = _run(["--version"], timeout=30)
    assert r.returncode == 0, (f"scripts/perf_analyzer --version failed (exit {r.returncode}); "
                               f"run scripts/bootstrap to install .venv-perf\n{r.stdout}\n{r.stderr}")


@pytest.mark.parametrize("protocol,extra,levels", [
    ("grpc", [], ["1", "2"]),
    ("http", [], ["1", "2"]),
    ("grpc", ["--streaming"], ["1", "2"]),
], ids=["grpc", "http", "grpc-streaming"])
def test_perf_analyzer_smoke(server, protocol, extra, levels):
    port = server.grpc_port if protocol == "grpc" else server.http_port
    args = ["-m", "mlp", "-i", protocol, "-u", f"127.0.0.1:{port}",
            "--concurrency-range", "1:2", "--measurement-interval", "500",
            "--stability-percentage", "1000", "--max-trials", "6"] + extra
    r = _run(args)
    out = r.stdout + "\n" + r.stderr
    assert r.returncode == 0, (f"perf_analyzer {' '.join(args)} exited {r.returncode}\n"
                               f"{tail(out, 80)}\n{server.describe()}")
    lines = re.findall(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec", out)
    assert [c for c, _ in lines] == levels, tail(out, 80)
    assert all(float(t) > 0 for _, t in lines), tail(out, 80)
    assert "Throughput:" in out, tail(out, 80)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_system_shared_memory(shm_server, protocol):
    """perf_analyzer --shared-memory system: registers regions, puts inputs and
    outputs there, unregisters everything (system and CUDA) at the end."""
    port = shm_server.grpc_port if protocol == "grpc" else shm_server.http_port
    args = ["-m", "two_io", "-i", protocol, "-u", f"127.0.0.1:{port}",
            "--concurrency-range", "1:2", "--measurement-interval", "500",
            "--stability-percentage", "1000", "--max-trials", "6",
            "--shared-memory", "system", "--output-shared-memory-size", "1024"]
    r = _run(args)
    out = r.stdout + "\n" + r.stderr
    assert r.returncode == 0, (f"perf_analyzer {' '.join(args)} exited {r.returncode}\n"
                               f"{tail(out, 80)}")
    lines = re.findall(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec", out)
    assert [c for c, _ in lines] == ["1", "2"], tail(out, 80)
    assert "Unable to unregister" not in out, \
        "perf_analyzer could not unregister its shared memory at the end:\n" + tail(out, 20)
