"""Model lifecycle (--model-control-mode): in dynamic mode the repository
watcher loads a bundle added to the repository, reloads one that changed
(replaced atomically or overwritten in place) and drops one removed, each
once it looked the same on two polls in a row, while clients keep sending
requests to the models that stay: none of those fails or is lost. A
half-written bundle is not served until it is complete; a corrupt change
leaves the old version serving. Static mode does not follow the repository.

One dynamic server (scanning every 100 ms) over a private repository of
copies of the exported mlp and two_io serves the dynamic-mode tests, with
clients sending to mlp and two_io (gRPC and HTTP) all along; after each test
their answers must match the server's statistics exactly. The copies of mlp
get other weights by scaling the exported ones; their reference outputs
come from jax with the scaled weights."""

import ctypes
import dataclasses
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import jax
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import pjserve_export as pe
from pjserve_export.jax_export import weight_names_and_arrays
from pjserve_export.safetensors_io import encode_header
from protocol_util import (Case, ServerFailure, ServerProcess, grpc_code, grpc_infer_case,
                           http_infer_case, http_json, serve_only, NODE_WORKERS)

POLL_MS = 100
WAIT_S = 120            # bound on any change being acted on (slow 2-core machines)
REQUEST_TIMEOUT_S = 60  # a request taking longer counts as lost
PAUSE_S = 0.005         # between one client thread's requests
STAYING = ("mlp", "two_io")
WEIGHTS = "weights.safetensors"


# ---- bundles -----------------------------------------------------------------

def scaled_mlp(exported, scale: float):
    """The demo mlp with every weight multiplied by scale."""
    m = exported["mlp"].model
    return dataclasses.replace(m, params=jax.tree_util.tree_map(lambda a: a * scale, m.params))


def weights_file(exported, scale: float) -> bytes:
    """weights.safetensors of the mlp scaled by `scale`, as the exporter writes it."""
    names, arrays = weight_names_and_arrays(scaled_mlp(exported, scale).params)
    _, meta = pe.read_safetensors(exported["mlp"].path / WEIGHTS)
    head, blobs = encode_header(dict(zip(names, arrays)), meta)
    return head + b"".join(blobs)


def write_mlp_copy(exported, dest: Path, name: str, scale: float = 1.0, files=None):
    """A copy of the exported mlp bundle named `name` (its files, or those
    named in `files`), with weights scaled by `scale`."""
    src = exported["mlp"].path
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if files is not None and f.name not in files:
            continue
        if f.name == pe.MANIFEST_FILE:
            text = f.read_text()
            assert 'name: "mlp"\n' in text
            (dest / f.name).write_text(text.replace('name: "mlp"\n', f'name: "{name}"\n'))
        elif f.name == WEIGHTS:
            (dest / f.name).write_bytes(weights_file(exported, scale))
        else:
            shutil.copyfile(f, dest / f.name)
    return dest


def infer_case(client, proto: str, case: Case):
    """Case's request over `proto` ("grpc" or "http"): the outputs."""
    if proto == "grpc":
        return grpc_infer_case(client, case, client_timeout=REQUEST_TIMEOUT_S)[0]
    return http_infer_case(client, case)[0]


def which_case(got, cands: Sequence[Case]) -> Optional[int]:
    """The index of the first case whose outputs `got` matches; None."""
    for k, case in enumerate(cands):
        try:
            case.check(got)
            return k
        except AssertionError:
            pass
    return None


def mlp_case(exported, name: str, scale: float, n: int = 3) -> Case:
    """Inputs for model `name` (a copy of mlp) and jax's outputs at `scale`."""
    man = exported["mlp"].manifest
    inputs = pe.random_inputs(man, n, seed=500 + n)
    (y,) = scaled_mlp(exported, scale).reference(inputs["x"])
    return Case(name, n, inputs, {"y": y}, man)


def exchange(a: Path, b: Path):
    """Swaps two directories atomically (renameat2 RENAME_EXCHANGE); where
    the file system cannot, with two renames."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD
        return
    tmp = a.with_name(a.name + ".x")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


# ---- waiting, the repository, the log ---------------------------------------

def wait_for(cond, what: str, srv: ServerProcess, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not srv.alive():
            pytest.fail(f"the server died while waiting for {what}\n{srv.describe()}",
                        pytrace=False)
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{srv.describe()}",
                pytrace=False)


def index(srv: ServerProcess):
    """{name: (state, reason)} from gRPC RepositoryIndex."""
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        return {m.name: (m.state, m.reason) for m in c.get_model_repository_index().models}


def http_index(srv: ServerProcess, ready_only: bool = False):
    """{name: state} from POST /v2/repository/index."""
    status, doc, raw = http_json(srv.http_url, "POST", "/v2/repository/index",
                                 {"ready": ready_only})
    assert status == 200, raw
    return {m["name"]: m.get("state") for m in doc}


def assert_index(srv: ServerProcess, want):
    """Both protocols' index is {name: state} `want` (while nothing changes)."""
    got = {n: s for n, (s, _) in index(srv).items()}
    assert got == want, f"gRPC repository index {index(srv)}"
    assert http_index(srv) == want
    assert http_index(srv, ready_only=True) == {n: s for n, s in want.items() if s == "READY"}


def state(srv, name):
    return index(srv).get(name, (None, ""))[0]


def log_lines(srv, needle: str):
    return [ln for ln in srv.stderr_text().splitlines() if needle in ln]


def serves(srv, case: Case) -> bool:
    """Whether `case` gets its expected outputs now over gRPC and HTTP."""
    try:
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            got, _ = grpc_infer_case(c, case, client_timeout=REQUEST_TIMEOUT_S)
        case.check(got, "grpc")
        h = httpclient.InferenceServerClient(srv.http_url, network_timeout=REQUEST_TIMEOUT_S)
        try:
            got, _ = http_infer_case(h, case)
        finally:
            h.close()
        case.check(got, "http")
        return True
    except (InferenceServerException, AssertionError):
        return False


def infer_errors(srv, case: Case):
    """(gRPC code, HTTP status) of a request that must fail."""
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        with pytest.raises(InferenceServerException) as g:
            grpc_infer_case(c, case, client_timeout=REQUEST_TIMEOUT_S)
    h = httpclient.InferenceServerClient(srv.http_url, network_timeout=REQUEST_TIMEOUT_S)
    try:
        with pytest.raises(InferenceServerException) as e:
            http_infer_case(h, case)
    finally:
        h.close()
    return grpc_code(g.value), e.value.status()


# ---- clients that keep sending ------------------------------------------------

class Clients:
    """One thread per (case, protocol), sending the case's request again and
    again. Each answer is compared with the candidates' expected outputs
    (Case objects of the same inputs; several while a model changes) and
    recorded by candidate index; anything else is a failure. pause() waits
    until no request is in flight."""

    def __init__(self, srv: ServerProcess, plan):
        """plan: [(protocol, [Case candidates])]."""
        self.srv = srv
        self.cond = threading.Condition()
        self.stopping = self.paused = False
        self.busy = 0
        self.answers = Counter()  # (model, protocol, candidate index) -> count
        self.history = {i: [] for i in range(len(plan))}  # thread -> candidate indexes
        self.failures = []
        self.threads = [threading.Thread(target=self._run, args=(i, proto, cands), daemon=True)
                        for i, (proto, cands) in enumerate(plan)]
        for t in self.threads:
            t.start()

    def _run(self, tid, proto, cands):
        client = (grpcclient.InferenceServerClient(self.srv.grpc_url) if proto == "grpc" else
                  httpclient.InferenceServerClient(self.srv.http_url,
                                                   network_timeout=REQUEST_TIMEOUT_S))
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.stopping or not self.paused)
                    if self.stopping:
                        return
                    self.busy += 1
                try:
                    k = which_case(infer_case(client, proto, cands[0]), cands)
                    outcome = k if k is not None else "outputs match no candidate"
                except Exception as e:  # noqa: BLE001 - every failure is recorded
                    outcome = repr(e)
                with self.cond:
                    self.busy -= 1
                    if isinstance(outcome, int):
                        self.answers[(cands[0].model, proto, outcome)] += 1
                        self.history[tid].append(outcome)
                    else:
                        self.failures.append(f"{cands[0].model} over {proto}: {outcome}")
                    self.cond.notify_all()
                time.sleep(PAUSE_S)
        finally:
            client.close()

    def count(self, model, proto=None, k=None) -> int:
        with self.cond:
            return sum(v for (m, p, c), v in self.answers.items()
                       if m == model and proto in (None, p) and k in (None, c))

    def wait_progress(self, what: str):
        """Every thread answers again (so requests flowed through what happened)."""
        with self.cond:
            before = {t: len(h) for t, h in self.history.items()}
        wait_for(lambda: all(len(self.history[t]) > n for t, n in before.items()) or
                 self.failures, f"requests after {what}", self.srv)

    def check(self, what: str):
        assert not self.failures, (f"requests failed during {what}:\n  " +
                                   "\n  ".join(self.failures[:20]))
        ended = [t for t in self.threads if not self.stopping and not t.is_alive()]
        assert not ended, f"{len(ended)} client threads ended early"

    def pause(self):
        with self.cond:
            self.paused = True
            assert self.cond.wait_for(lambda: self.busy == 0, REQUEST_TIMEOUT_S), \
                "requests still in flight (lost?)"

    def resume(self):
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def stop(self):
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for t in self.threads:
            t.join(REQUEST_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self.threads), "a request hangs"


@dataclasses.dataclass
class Lifecycle:
    srv: ServerProcess
    repo: Path
    staying: Clients


@pytest.fixture(scope="module")
def lifecycle(pjserve_bin, plugin_path, cache_dir, exported, cases, tmp_path_factory):
    repo = tmp_path_factory.mktemp("lifecycle-repository")
    for name in STAYING:
        shutil.copytree(exported[name].path, repo / name)
    for name in ("swap", "inplace", "doomed", "fragile"):
        write_mlp_copy(exported, repo / name, name)
    srv = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                        tmp_path_factory.mktemp("lifecycle-server"),
                        ["--repository-poll-ms", str(POLL_MS)], "lifecycle")
    try:
        srv.start()
    except ServerFailure as e:
        srv.kill()
        pytest.fail(str(e), pytrace=False)
    staying = Clients(srv, [(proto, [cases.get(name, 3, seed=77)])
                            for name in STAYING for proto in ("grpc", "http")])
    try:
        yield Lifecycle(srv, repo, staying)
    finally:
        staying.stop()
        problems = srv.stop_and_check()
        if problems:
            pytest.fail("the lifecycle server did not shut down cleanly:\n- " +
                        "\n- ".join(problems) + "\n" + srv.describe(), pytrace=False)


@pytest.fixture
def lc(lifecycle):
    """The dynamic server; after each test, the staying models' clients had
    no failure, and their requests match the server's statistics exactly."""
    lifecycle.staying.check("start-up")
    yield lifecycle
    st = lifecycle.staying
    st.wait_progress("this test")
    st.check("this test")
    st.pause()
    try:
        with grpcclient.InferenceServerClient(lifecycle.srv.grpc_url) as c:
            for name in STAYING:
                s = c.get_inference_statistics(name).model_stats[0].inference_stats
                assert s.fail.count == 0, f"{name}: {s.fail.count} failed requests"
                assert s.success.count == st.count(name), \
                    f"{name}: the server answered {s.success.count} requests, the clients " \
                    f"got {st.count(name)} answers"
    finally:
        st.resume()


# ---- dynamic mode -------------------------------------------------------------

def test_dynamic_is_the_default_and_logged(lc):
    assert log_lines(lc.srv, "model control mode dynamic")
    assert log_lines(lc.srv, "repository: watching")
    assert_index(lc.srv, {n: "READY" for n in index(lc.srv)})


def test_added_bundle_is_loaded(lc, exported):
    staging = write_mlp_copy(exported, lc.repo / ".newcomer.tmp", "newcomer", scale=0.5)
    os.rename(staging, lc.repo / "newcomer")
    wait_for(lambda: state(lc.srv, "newcomer") == "READY", "newcomer READY", lc.srv)
    assert serves(lc.srv, mlp_case(exported, "newcomer", 0.5))
    assert log_lines(lc.srv, "repository: model newcomer added, loading")


def _change(lc, exported, name, old_scale, new_scale, write):
    """Changes bundle `name` with write() while clients send to it: every
    request is answered with the old or the new weights, never an error, and
    once a thread got the new weights it never gets the old again (behind a
    node too: its one watcher reloads the workers in two halves, and the
    model's requests go to the half that has the new version)."""
    old, new = (mlp_case(exported, name, s) for s in (old_scale, new_scale))
    assert serves(lc.srv, old)
    probe = Clients(lc.srv, [("grpc", [old, new]), ("http", [old, new])])
    try:
        probe.wait_progress("the probe's start")
        write()
        wait_for(lambda: probe.count(name, "grpc", 1) and probe.count(name, "http", 1) or
                 probe.failures, f"{name} answering with its new weights", lc.srv)
        probe.wait_progress("the swap")
    finally:
        probe.stop()
    probe.check(f"the change of {name}")
    for tid, h in probe.history.items():
        first_new = h.index(1)
        assert 0 not in h[first_new:], f"thread {tid} got the old weights after the new"
    assert serves(lc.srv, new)
    assert log_lines(lc.srv, f"repository: model {name} changed, reloading")


def test_changed_bundle_replaced_atomically(lc, exported):
    def write():
        staging = write_mlp_copy(exported, lc.repo / ".swap.new", "swap", scale=2.0)
        exchange(lc.repo / "swap", staging)
        shutil.rmtree(staging)  # now the old version
    _change(lc, exported, "swap", 1.0, 2.0, write)


def test_changed_bundle_overwritten_in_place(lc, exported):
    """The new weights are written into the served bundle in two halves with
    a pause of several polls between: the half-written file may be tried and
    refused (the old version keeps serving) before the whole one loads."""
    data = weights_file(exported, -1.5)

    def write():
        with open(lc.repo / "inplace" / WEIGHTS, "r+b") as f:
            f.truncate(0)
            f.write(data[:len(data) // 2])
            f.flush()
            time.sleep(5 * POLL_MS / 1000)
            f.write(data[len(data) // 2:])
    _change(lc, exported, "inplace", 1.0, -1.5, write)


def test_removed_bundle_is_dropped(lc, exported):
    case = mlp_case(exported, "doomed", 1.0)
    assert serves(lc.srv, case)
    shutil.rmtree(lc.repo / "doomed")
    wait_for(lambda: "doomed" not in index(lc.srv), "doomed leaving the index", lc.srv)
    assert infer_errors(lc.srv, case) == ("NOT_FOUND", "404")
    assert "doomed" not in http_index(lc.srv)
    assert log_lines(lc.srv, "repository: model doomed removed")


@serve_only("each worker logs its own attempt")
def test_half_written_bundle_served_once_complete(lc, exported):
    d = lc.repo / "late"
    write_mlp_copy(exported, d, "late", scale=3.0, files={pe.MANIFEST_FILE})
    # Unchanged for two polls, the incomplete bundle is tried once and refused ...
    refused = "repository: new model late failed to load"
    wait_for(lambda: log_lines(lc.srv, refused), "the incomplete bundle's refusal", lc.srv)
    case = mlp_case(exported, "late", 3.0)
    assert state(lc.srv, "late") == "UNAVAILABLE"
    assert infer_errors(lc.srv, case) == ("UNAVAILABLE", "503")
    # ... and not again while it stays the same.
    time.sleep(8 * POLL_MS / 1000)
    assert len(log_lines(lc.srv, refused)) == 1
    write_mlp_copy(exported, d, "late", scale=3.0)
    wait_for(lambda: state(lc.srv, "late") == "READY", "late READY once complete", lc.srv)
    assert serves(lc.srv, case)


def test_corrupt_change_keeps_old_version(lc, exported):
    name = "fragile"
    old = mlp_case(exported, name, 1.0)
    assert serves(lc.srv, old)
    probe = Clients(lc.srv, [("grpc", [old]), ("http", [old])])
    kept = f"repository: changed model {name} failed to load, the previous version keeps serving"
    try:
        probe.wait_progress("the probe's start")
        weights = lc.repo / name / WEIGHTS
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
        lines = wait_for(lambda: log_lines(lc.srv, kept), "the refusal of the corrupt change",
                         lc.srv)
        probe.wait_progress("the refusal")
    finally:
        probe.stop()
    probe.check("the corrupt change")
    assert WEIGHTS in lines[0], f"the refusal does not name the bundle's problem: {lines[0]}"
    assert state(lc.srv, name) == "READY"
    assert serves(lc.srv, old)
    # Not retried while the bundle stays as it is; repaired, it loads.
    time.sleep(8 * POLL_MS / 1000)
    assert len(log_lines(lc.srv, kept)) == 1
    (lc.repo / name / WEIGHTS).write_bytes(weights_file(exported, 4.0))
    new = mlp_case(exported, name, 4.0)
    wait_for(lambda: serves(lc.srv, new), f"{name} serving the repaired bundle", lc.srv)


# ---- other modes and the command line -----------------------------------------------------

def test_static_mode_does_not_follow_the_repository(server_factory, exported, cases):
    srv = server_factory(["--model-control-mode", "static", "--repository-poll-ms",
                          str(POLL_MS)], names=("two_io",))
    assert log_lines(srv, "model control mode static")
    assert not log_lines(srv, "repository: watching")
    write_mlp_copy(exported, srv.repository / "newcomer", "newcomer")
    shutil.rmtree(srv.repository / "two_io")
    time.sleep(10 * POLL_MS / 1000)
    assert_index(srv, {"two_io": "READY"})
    assert serves(srv, cases.get("two_io", 2))
    assert infer_errors(srv, mlp_case(exported, "newcomer", 1.0))[0] == "NOT_FOUND"
    assert not srv.stop_and_check()


@pytest.mark.parametrize("args, complaint", [
    (["--model-control-mode", "manual"], "expected dynamic, static or explicit"),
    (["--repository-poll-ms", "0"], "expected at least 1"),
    (["--repository-poll-ms", "1.5"], "expected an integer"),
    (["--device-weight-budget", "1T"], "expected a number of bytes"),
    (["--device-weight-budget", "-5"], "expected a number of bytes"),
    (["--device-weight-budget", "99999999999Gi"], "expected a number of bytes"),
    (["--weight-fraction", "0"], "expected a number in (0, 1]"),
    (["--weight-fraction", "1.01"], "expected a number in (0, 1]"),
    (["--weight-fraction", "nan"], "expected a number in (0, 1]"),
])
def test_bad_lifecycle_flags_are_usage_errors(pjserve_bin, tmp_path, args, complaint):
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(tmp_path)] + args,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert complaint in r.stderr, r.stderr


def test_lifecycle_flags_accepted(pjserve_bin, tmp_path):
    """Good values pass the command line (the missing repository fails after)."""
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(tmp_path / "none"),
                        "--model-control-mode", "explicit", "--repository-poll-ms", "250",
                        "--device-weight-budget", "512Mi", "--weight-fraction", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "is not a directory" in r.stderr, r.stderr
