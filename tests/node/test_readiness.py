"""Readiness means the same on every front (--strict-readiness, as Triton's).

A repository holds mlp, two_io and `broken`, a copy of mlp whose manifest
does not parse. `pjserve serve`, `pjserve node --workers 1`, `pjserve node
--workers 2` (its gateway in front) and `pjserve gateway` over two serve
workers all answer GET /v2/health/ready and gRPC ServerReady alike: not
ready by default (strict: a model that should be loaded is not READY),
ready with --strict-readiness false; on every one mlp answers inference all
the same.

An ensemble (two_io_chain: two_io, then two_io on its sum) whose step is
unloaded on request is UNAVAILABLE in the repository index, with a reason
naming the step, as /v2/models/NAME/ready, gRPC ModelReady and inference
say; loaded again, it is READY everywhere. The server stays ready meanwhile
(a model unloaded on request does not count, nor the ensemble following it).

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_readiness.py
"""

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

from gateway_util import GatewayProcess  # noqa: E402
from node_util import NodeProcess  # noqa: E402
from protocol_util import (ServerProcess, finish_checked, grpc_code,  # noqa: E402
                           grpc_infer_case, http_json, start_or_fail)

import tritonclient.grpc as grpcclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

# The ensemble as `make models` writes it (examples/make_demo_models.py).
_demo_spec = importlib.util.spec_from_file_location(
    "make_demo_models", Path(__file__).resolve().parents[2] / "examples" / "make_demo_models.py")
demo_models = importlib.util.module_from_spec(_demo_spec)
_demo_spec.loader.exec_module(demo_models)

# The load refusal of `broken`, logged as a warning by every worker.
BROKEN_REFUSED = [r"model broken not loaded"]
# How long the answers are watched for a change (a gateway probes every
# 500 ms).
SETTLE_S = 1.5


def make_repository(exported, dest: Path, broken: bool, ensemble: bool) -> Path:
    dest.mkdir(parents=True)
    for name in ("mlp", "two_io"):
        shutil.copytree(exported[name].path, dest / name)
    if broken:
        shutil.copytree(exported["mlp"].path, dest / "broken")
        (dest / "broken" / "manifest.yaml").write_text("format_version: [this is not\n")
    if ensemble:
        demo_models.export_ensemble("two_io_chain", dest)
    return dest


class Front:
    """One deployment under test: the process clients talk to and the ones
    behind it, stopped together."""

    def __init__(self, public, behind=()):
        self.public = public
        self.behind = list(behind)

    def processes(self):
        return [self.public] + self.behind

    def describe(self) -> str:
        return "\n\n".join(p.describe() for p in self.processes())

    def finish(self, expected_errors):
        for p in self.processes():
            finish_checked(p, expected_errors)

    def kill(self):
        for p in self.processes():
            if isinstance(p, NodeProcess):
                p.kill_all()
            else:
                p.kill()


@pytest.fixture
def front_factory(pjserve_bin, plugin_path, cache_dir, tmp_path):
    """start(kind, repo, args) -> a started Front: kind serve, node1, node2
    or gateway (two serve workers behind `pjserve gateway`, args given to
    each). Started waiting for /v2/health/live only: readiness is what the
    tests look at."""
    fronts = []

    def start(kind, repo, args):
        i = len(fronts)
        work = tmp_path / f"{kind}{i}"

        def server(name, extra):
            s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, work / name,
                              list(extra), name)
            s.health_route = "live"
            return s

        if kind == "serve":
            front = Front(server("serve", args))
        elif kind in ("node1", "node2"):
            n = NodeProcess(pjserve_bin, plugin_path, repo, cache_dir, work / "node",
                            ["--workers", kind[-1]] + list(args), "node")
            n.health_route = "live"
            front = Front(n)
        else:
            workers = [server(f"worker{k}", args) for k in range(2)]
            front = Front(GatewayProcess(pjserve_bin, workers, work / "gateway", list(args)),
                          workers)
            front.public.health_route = "live"
        fronts.append(front)
        for p in reversed(front.processes()):
            start_or_fail(p)
        return front

    yield start
    for f in fronts:
        f.kill()


def http_ready(url: str):
    status, doc, _ = http_json(url, "GET", "/v2/health/ready", timeout=10)
    return status, doc


def grpc_ready(url: str) -> bool:
    with grpcclient.InferenceServerClient(url) as c:
        return c.is_server_ready()


def wait_mlp_served(front: Front, cases, timeout: float = 60):
    """mlp answers through the public endpoint, right (a gateway's pool
    takes it once a probe saw a worker)."""
    case = cases.get("mlp", 4)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with grpcclient.InferenceServerClient(front.public.grpc_url) as c:
                got, _ = grpc_infer_case(c, case)
            case.check(got, "mlp beside a bundle that failed to load")
            status, doc, raw = http_json(front.public.http_url, "POST", "/v2/models/mlp/infer",
                                         {"inputs": [{"name": "x", "datatype": "FP32",
                                                      "shape": [1, 16],
                                                      "data": [0.5] * 16}]})
            assert status == 200, raw
            return
        except InferenceServerException as e:
            last = e
            time.sleep(0.2)
    pytest.fail(f"mlp not served within {timeout} s: {last}\n{front.describe()}", pytrace=False)


def assert_readiness_stays(front: Front, ready: bool):
    """HTTP and gRPC answer `ready` now and for SETTLE_S (the gateway's
    probes may change nothing)."""
    want_http = (200, {"ready": True}) if ready else (400, {"ready": False})
    deadline = time.monotonic() + SETTLE_S
    while True:
        assert http_ready(front.public.http_url) == want_http, front.describe()
        assert grpc_ready(front.public.grpc_url) is ready, front.describe()
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)


FRONTS = ("serve", "node1", "node2", "gateway")
# Both spellings of the flag: `--strict-readiness false` and `=false`.
NOT_STRICT = {"serve": ["--strict-readiness", "false"],
              "node1": ["--strict-readiness=false"],
              "node2": ["--strict-readiness=false"],
              "gateway": ["--strict-readiness", "false"]}


@pytest.mark.parametrize("kind", FRONTS)
def test_a_bundle_that_fails_to_load_keeps_strict_readiness_false(front_factory, exported,
                                                                  cases, tmp_path, kind):
    repo = make_repository(exported, tmp_path / "repo", broken=True, ensemble=False)
    front = front_factory(kind, repo, [])
    wait_mlp_served(front, cases)
    assert_readiness_stays(front, False)
    # The index says why.
    status, index, raw = http_json(front.public.http_url, "POST", "/v2/repository/index", {})
    assert status == 200, raw
    states = {e["name"]: e["state"] for e in index}
    assert states == {"broken": "UNAVAILABLE", "mlp": "READY", "two_io": "READY"}, index
    wait_mlp_served(front, cases)
    front.finish(BROKEN_REFUSED)


@pytest.mark.parametrize("kind", FRONTS)
def test_not_strict_readiness_is_ready_beside_a_broken_bundle(front_factory, exported, cases,
                                                              tmp_path, kind):
    repo = make_repository(exported, tmp_path / "repo", broken=True, ensemble=False)
    front = front_factory(kind, repo, NOT_STRICT[kind])
    wait_mlp_served(front, cases)
    # A gateway is ready once a probe saw a worker; then it stays so.
    deadline = time.monotonic() + 10
    while http_ready(front.public.http_url)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_readiness_stays(front, True)
    front.finish(BROKEN_REFUSED)


def test_strict_readiness_takes_true_and_refuses_other_values(pjserve_bin, tmp_path):
    import subprocess
    for cmd in (["serve", "--model-repository", str(tmp_path)],
                ["gateway", "--worker", "127.0.0.1"],
                ["node", "--model-repository", str(tmp_path), "--workers", "2"]):
        r = subprocess.run([str(pjserve_bin), *cmd, "--strict-readiness", "yes"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "--strict-readiness yes: expected true or false" in r.stderr, (cmd, r.stderr)


# ---- an ensemble whose step is unloaded ------------------------------------------------

def chain_inputs():
    rng = np.random.default_rng(5)
    return rng.standard_normal((2, 8)).astype(np.float32), \
        rng.integers(-4, 4, (2, 3)).astype(np.int32)


def grpc_infer(url, model, arrays):
    with grpcclient.InferenceServerClient(url) as c:
        ins = []
        for name, a in arrays.items():
            t = grpcclient.InferInput(name, list(a.shape),
                                      "FP32" if a.dtype == np.float32 else "INT32")
            t.set_data_from_numpy(a)
            ins.append(t)
        r = c.infer(model, ins)
        return {o["name"]: r.as_numpy(o["name"]) for o in r.get_response(as_json=True)["outputs"]}


def http_chain_body(a, b):
    return {"inputs": [{"name": "a", "datatype": "FP32", "shape": list(a.shape),
                        "data": a.ravel().tolist()},
                       {"name": "b", "datatype": "INT32", "shape": list(b.shape),
                        "data": b.ravel().tolist()}]}


def index_entry(front: Front, name: str):
    """(HTTP entry, gRPC entry) of `name` in the repository index."""
    status, index, raw = http_json(front.public.http_url, "POST", "/v2/repository/index", {})
    assert status == 200, raw
    http_entry = next(e for e in index if e["name"] == name)
    with grpcclient.InferenceServerClient(front.public.grpc_url) as c:
        grpc_entry = next(m for m in c.get_model_repository_index(as_json=True)["models"]
                          if m["name"] == name)
    return http_entry, grpc_entry


def chain_answers(front: Front):
    """The chain's answer equals two_io called twice, on both protocols."""
    a, b = chain_inputs()
    url = front.public.grpc_url
    first = grpc_infer(url, "two_io", {"a": a, "b": b})
    second = grpc_infer(url, "two_io", {"a": first["sum"], "b": b})
    got = grpc_infer(url, "two_io_chain", {"a": a, "b": b})
    np.testing.assert_allclose(got["sum"], second["sum"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["first_argmax"], first["argmax"])
    status, doc, raw = http_json(front.public.http_url, "POST", "/v2/models/two_io_chain/infer",
                                 http_chain_body(a, b))
    assert status == 200, raw


@pytest.mark.parametrize("kind", ("serve", "node2"))
def test_ensemble_with_a_step_unloaded_is_unavailable_everywhere(front_factory, exported,
                                                                 tmp_path, kind):
    repo = make_repository(exported, tmp_path / "repo", broken=False, ensemble=True)
    front = front_factory(kind, repo, [])
    url = front.public.grpc_url
    deadline = time.monotonic() + 30
    while http_ready(front.public.http_url)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    chain_answers(front)
    assert all(e["state"] == "READY" for e in index_entry(front, "two_io_chain"))

    with grpcclient.InferenceServerClient(url) as c:
        c.unload_model("two_io")
        step_missing = 'the model it calls, "two_io", is not loaded'
        for what, entry in zip(("HTTP", "gRPC"), index_entry(front, "two_io_chain")):
            assert entry["state"] == "UNAVAILABLE", (what, entry)
            assert step_missing in entry["reason"], (what, entry)
        status, index, _ = http_json(front.public.http_url, "POST", "/v2/repository/index",
                                     {"ready": True})
        assert sorted(e["name"] for e in index) == ["mlp"], index
        assert not c.is_model_ready("two_io_chain")
        assert http_json(front.public.http_url, "GET",
                         "/v2/models/two_io_chain/ready")[0] == 400
        a, b = chain_inputs()
        with pytest.raises(InferenceServerException) as e:
            grpc_infer(url, "two_io_chain", {"a": a, "b": b})
        assert grpc_code(e.value) == "UNAVAILABLE", e.value
        assert step_missing in e.value.message(), e.value
        status, doc, raw = http_json(front.public.http_url, "POST",
                                     "/v2/models/two_io_chain/infer", http_chain_body(a, b))
        assert status == 503 and step_missing in doc["error"], raw
        # Unloaded on request: the server stays ready, the ensemble with it.
        assert_readiness_stays(front, True)

        c.load_model("two_io")
        for what, entry in zip(("HTTP", "gRPC"), index_entry(front, "two_io_chain")):
            assert entry["state"] == "READY", (what, entry)
        assert c.is_model_ready("two_io_chain")
        assert http_json(front.public.http_url, "GET",
                         "/v2/models/two_io_chain/ready")[0] == 200
    chain_answers(front)
    assert_readiness_stays(front, True)
    front.finish(())
