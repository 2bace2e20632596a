"""examples/client.py, the first thing the README has a new user run, against
`pjserve serve` over the whole demo repository exactly as `make models`
builds it (examples/make_demo_models.py with --pjserve, every bundle).

The client must exit 0 having called every model the repository index lists
the way that model must be called, printing a PASS line for each on gRPC and
on HTTP: the decoupled ones (greedy_decoder_stream, repeat_int32) over a gRPC
stream instead, the sequence models with a sequence id, image_bytes_classifier
with real JPEG files, and the further checks it makes (two_io_chain against
two_io called twice, the streamed tokens against greedy_decoder's).
Under PJSERVE_PROTOCOL_NODE_WORKERS the same runs through a node's gateway.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from protocol_util import REPO, ServerProcess, finish_checked, start_or_fail

# Bundles only a meta calls: the repository index does not list them.
CALLED_BY_METAS = {"detector_stage1", "detector_stage2", "decoder_step"}
DECOUPLED = {"greedy_decoder_stream", "repeat_int32"}
SEQUENCES = {"simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence"}


@pytest.fixture(scope="module")
def demo_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-make-models")
    subprocess.run([sys.executable, str(REPO / "examples" / "make_demo_models.py"), str(repo),
                    "--pjserve", str(pjserve_bin)], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL, timeout=600)
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-make-models"), [], "make-models")
    start_or_fail(s)
    yield s
    finish_checked(s)


def lines_of(out: str, model: str, protocol: str):
    return [line for line in out.splitlines()
            if re.match(rf"{re.escape(model)}\s+{re.escape(protocol)}\s{{2,}}", line)]


def test_example_client_passes_every_demo_model(demo_server):
    r = subprocess.run([sys.executable, str(REPO / "examples" / "client.py"),
                        "--host", "127.0.0.1", "--grpc-port", str(demo_server.grpc_port),
                        "--http-port", str(demo_server.http_port),
                        "--model-repository", str(demo_server.repository)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    out = r.stdout + r.stderr
    print(out)
    assert r.returncode == 0, out
    served = {p.name for p in Path(demo_server.repository).iterdir()} - CALLED_BY_METAS
    assert len(served) == 22, sorted(served)
    for model in sorted(served):
        grpc_lines = lines_of(out, model, "gRPC stream" if model in DECOUPLED else "gRPC")
        assert grpc_lines and all(" PASS " in line for line in grpc_lines), (model, out)
        http = lines_of(out, model, "HTTP")
        want = "skipped: a decoupled model" if model in DECOUPLED else " PASS "
        assert len(http) == 1 and want in http[0], (model, out)
    for model in SEQUENCES:
        assert "3 steps (start ... end)" in lines_of(out, model, "gRPC")[0], out
    assert any("the same as calling two_io, then two_io on its sum" in line
               for line in lines_of(out, "two_io_chain", "gRPC")), out
    assert any("the same tokens as greedy_decoder" in line
               for line in lines_of(out, "greedy_decoder_stream", "gRPC stream")), out
    assert " FAIL " not in out and "Traceback" not in out, out
