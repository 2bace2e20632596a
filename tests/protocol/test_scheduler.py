"""The scheduler through the real server (tritonclient, gRPC and HTTP):
coalescing of concurrent requests into compiled batch sizes, the fifo and edf
disciplines with request timeouts, per-model default timeouts, the warm-up
pass at load and per-model queue depths.

What "correct" means for a coalesced request. Every reply is checked
against JAX within tests/common.py's tolerance, and against the server's own
batch-1 execution of the same input, each row sent alone before the
concurrent phase:

  - mlp: within the same tolerance, not bit-exact. On XLA CPU a row's result
    depends on the compiled size it ran at (batch 1 is a matrix-vector
    product; ~1 ulp from batch 4 and 8), and even the batch-1 executable is
    not bit-reproducible: identical input bytes at the same address give one
    of two results 1 ulp apart from one execution to the next.
  - two_io (elementwise ops and a 3-long dot): bit-exact, at every compiled
    size and position (argmax, an integer, is exact anyway).

The servers here are dedicated (server_factory), so statistics start at zero
and flags can differ.
"""

import contextlib
import random
import re
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protocol_util import (NODE_WORKERS, SLOW, Case, assert_matches, grpc_code,
                           grpc_infer_case, grpc_inputs, http_infer_case, metric, parse_metrics,
                           run_threads, scrape, serve_only, slow_model)

MAX_BATCH = 8                   # the largest compiled size of the demo bundles (1, 4, 8)
THREADS = 32
INPUTS_PER_THREAD = 3
ROUNDS = 8                      # each thread sends each of its inputs this often
ROW_CHOICES = (1, 1, 1, 1, 1, 2, 3)   # mostly batch 1, some 2 and 3
JOIN_TIMEOUT_S = 600


# ---- clients and replies ----------------------------------------------------------

def grpc_client(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def http_client(server):
    return httpclient.InferenceServerClient(server.http_url, network_timeout=300,
                                            connection_timeout=60)


def infer(client, proto: str, case: Case, **kw):
    """{output name: array} over gRPC or HTTP (binary tensors both ways)."""
    if proto == "grpc":
        return grpc_infer_case(client, case, **kw)[0]
    return http_infer_case(client, case, **kw)[0]


def is_deadline_error(e: InferenceServerException, proto: str) -> bool:
    if proto == "grpc":
        return grpc_code(e) == "DEADLINE_EXCEEDED"
    return str(e.status()) == "504"


def error_code(e: InferenceServerException, proto: str) -> str:
    return grpc_code(e) if proto == "grpc" else f"HTTP {e.status()}"


# ---- statistics ----------------------------------------------------------------------

def grpc_stats(server, model: str) -> dict:
    """The model's ModelStatistics over gRPC, as plain numbers."""
    c = grpc_client(server)
    try:
        s = c.get_inference_statistics(model).model_stats[0]
    finally:
        c.close()
    return {"inference_count": s.inference_count, "execution_count": s.execution_count,
            "success": s.inference_stats.success.count, "fail": s.inference_stats.fail.count,
            "batch": {b.batch_size: b.compute_infer.count for b in s.batch_stats}}


def http_stats(server, model: str) -> dict:
    """The same from GET /v2/models/{model}/stats."""
    c = http_client(server)
    try:
        s = c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()
    st = s["inference_stats"]
    return {"inference_count": s["inference_count"], "execution_count": s["execution_count"],
            "success": st["success"]["count"], "fail": st["fail"]["count"],
            "batch": {b["batch_size"]: b["compute_infer"]["count"]
                      for b in s.get("batch_stats", [])}}


def stats_delta(after: dict, before: dict) -> dict:
    d = {k: after[k] - before[k] for k in ("inference_count", "execution_count", "success",
                                           "fail")}
    d["batch"] = {b: n - before["batch"].get(b, 0) for b, n in after["batch"].items()
                  if n - before["batch"].get(b, 0)}
    return d


def metrics_samples(server):
    return parse_metrics(scrape(server.metrics_url))[0]


def dropped_count(samples, model: str):
    """(expired, shed) of a model from /metrics; None when a family is missing."""
    return tuple(metric(samples, f"pjserve_model_requests_{k}_total", model=model, version="1")
                 for k in ("expired", "shed"))


# ---- coalescing ---------------------------------------------------------------------------

# Models whose coalesced outputs equal their batch-1 outputs bit for bit on
# XLA CPU (see the module docstring); the others are compared within tolerance.
EXACT_VS_BATCH1 = {"mlp": False, "two_io": True}


class ClientInput:
    """One client's input, its JAX reference (case.expected) and the
    server's batch-1 result of each of its rows (batch1)."""

    def __init__(self, case: Case):
        self.case = case
        self.rows = case.n
        self.batch1 = None   # {output: array [rows, ...]}

    def row_inputs(self, r: int):
        return {k: v[r:r + 1] for k, v in self.case.inputs.items()}


def take_batch1_references(server, model: str, manifest, inputs):
    """Sends every row of every input alone (batch 1, one at a time, so
    nothing coalesces) and keeps the results."""
    c = grpc_client(server)
    try:
        for ci in inputs:
            rows = [infer(c, "grpc", Case(model, 1, ci.row_inputs(r), {}, manifest))
                    for r in range(ci.rows)]
            ci.batch1 = {o.name: np.concatenate([g[o.name] for g in rows])
                         for o in manifest.outputs}
    finally:
        c.close()


def check_coalesced(model: str, ci: ClientInput, got: dict, what: str):
    case = ci.case
    for name in case.output_names():
        assert_matches(model, name, got[name], case.expected[name], what)
        if EXACT_VS_BATCH1[model]:
            np.testing.assert_array_equal(
                got[name], ci.batch1[name],
                err_msg=f"{model}.{name} {what}: differs from the server's batch-1 result")
        else:
            assert_matches(model, name, got[name], ci.batch1[name],
                           what + " vs the server's batch-1 result")


@pytest.fixture(scope="module")
def slow_bundle(tmp_path_factory):
    """The slow model's bundle (compiled at batch 1 only)."""
    return slow_model().export(tmp_path_factory.mktemp("slow"), batch_sizes=(1,))


@contextlib.contextmanager
def device_kept_busy(server):
    """Sends the slow model's requests one after another, on a thread of its
    own, for as long as the block runs. While one executes (~10 ms) the
    requests of other models queue, so they meet a queue to be coalesced
    with: Python client threads alone send more slowly than the server
    executes two_io, and found the device idle every time (768 requests
    in 768 executions)."""
    stop = threading.Event()
    failure = []

    def loop():
        client = grpc_client(server)
        x = grpcclient.InferInput("x", [1, 64], "FP32")
        x.set_data_from_numpy(np.zeros((1, 64), np.float32))
        try:
            while not stop.is_set():
                client.infer(SLOW, [x])
        except Exception as e:  # noqa: BLE001 - reported below
            failure.append(e)
        finally:
            client.close()

    busy = threading.Thread(target=loop, daemon=True)
    busy.start()
    try:
        yield
    finally:
        stop.set()
        busy.join(JOIN_TIMEOUT_S)
    assert not busy.is_alive(), "a request of the slow model hangs"
    assert not failure, f"the slow model's requests failed: {failure[0]}"


@pytest.mark.parametrize("model", ["mlp", "two_io"])
def test_coalescing_is_exact_and_counted(server_factory, cases, exported, slow_bundle, model):
    """32 client threads (half gRPC, half HTTP binary), each sending its own
    inputs (batch 1, some 2 and 3) again and again while the slow model keeps
    the device busy: every reply is that client's own result, and the
    statistics show coalesced executions."""
    srv = server_factory(names=("mlp", "two_io"), bundles=(slow_bundle,))
    manifest = exported[model].manifest
    rng = random.Random(1234)
    mine = [[ClientInput(cases.get(model, rng.choice(ROW_CHOICES), seed=10_000 + 10 * t + i))
             for i in range(INPUTS_PER_THREAD)] for t in range(THREADS)]
    every_input = [ci for inputs in mine for ci in inputs]
    take_batch1_references(srv, model, manifest, every_input)

    before_g, before_h = grpc_stats(srv, model), http_stats(srv, model)
    assert before_g == before_h, (before_g, before_h)

    def worker(tid):
        proto = "grpc" if tid % 2 == 0 else "http"
        client = grpc_client(srv) if proto == "grpc" else http_client(srv)
        order = random.Random(tid)
        sent = 0
        try:
            for rnd in range(ROUNDS):
                for ci in order.sample(mine[tid], len(mine[tid])):
                    got = infer(client, proto, ci.case)
                    check_coalesced(model, ci, got, f"thread {tid} {proto} round {rnd} "
                                                    f"n={ci.rows}")
                    sent += 1
            return sent
        finally:
            client.close()

    with device_kept_busy(srv):
        results, errors = run_threads(worker, THREADS, JOIN_TIMEOUT_S)
    assert not errors, (f"{len(errors)} of {THREADS} threads failed; first: thread "
                        f"{errors[0][0]}: {errors[0][1]}")
    requests = sum(results)
    rows = sum(ci.rows for ci in every_input) * ROUNDS
    assert requests == THREADS * INPUTS_PER_THREAD * ROUNDS

    after_g, after_h = grpc_stats(srv, model), http_stats(srv, model)
    assert after_g == after_h, f"gRPC and HTTP statistics differ: {after_g} vs {after_h}"
    d = stats_delta(after_g, before_g)
    print(f"{model}: {requests} requests ({rows} rows) in {d['execution_count']} executions; "
          f"executions by rows served: {dict(sorted(d['batch'].items()))}")
    assert d["success"] == requests and d["fail"] == 0, d
    assert d["inference_count"] == rows, d
    # Coalescing: fewer executions than requests, some serving several rows.
    # Behind a node the gateway hands each worker (one gRPC thread) its calls
    # one by one, and a worker that keeps up has no queue to coalesce: there
    # only the accounting is checked (as in test_sequence).
    if NODE_WORKERS:
        assert d["execution_count"] <= requests, d
    else:
        assert d["execution_count"] < requests, \
            f"{requests} concurrent requests ran in {d['execution_count']} executions: none coalesced"
    assert any(b > 1 for b in d["batch"]), d
    assert all(1 <= b <= MAX_BATCH for b in d["batch"]), d
    # batch_stats account for every execution and every row.
    assert sum(d["batch"].values()) == d["execution_count"], d
    assert sum(b * n for b, n in d["batch"].items()) == rows, d
    srv_problems = srv.stop_and_check()
    assert not srv_problems, srv_problems


# ---- disciplines ------------------------------------------------------------------------------

DISCIPLINE_MODELS = ("mlp", "two_io", "convnet")
DISCIPLINE_THREADS = 16
DISCIPLINE_REQUESTS = 30        # per thread


def _timeout_us(rng: random.Random):
    """None (no timeout) for about 40% of the requests, else 1 us .. 20 ms
    spread evenly in log scale: the shortest pass before admission, the
    middle ones often in the queue, the longest rarely."""
    if rng.random() < 0.4:
        return None
    return int(10 ** rng.uniform(0, np.log10(20_000)))


@serve_only("the scheduler gauges are each worker's")
@pytest.mark.parametrize("discipline", ["fifo", "edf"])
def test_discipline_timeouts(server_factory, cases, discipline):
    """Concurrent clients on three models with and without `timeout`: each
    reply is correct, or DEADLINE_EXCEEDED / 504 naming the model for a
    request that had a timeout, never another error; the number of those
    equals the increase of expired + shed in /metrics (shed stays 0 under
    fifo)."""
    srv = server_factory(["--scheduler-discipline", discipline], names=DISCIPLINE_MODELS)
    assert re.search(rf"\bscheduler: {discipline},", srv.stderr_text()), srv.describe()
    samples = metrics_samples(srv)
    assert metric(samples, "pjserve_scheduler_info", discipline=discipline) == 1
    before = {m: dropped_count(samples, m) for m in DISCIPLINE_MODELS}
    missing = [m for m, v in before.items() if None in v]
    plan = [cases.get(m, n, seed=300 + n) for m in DISCIPLINE_MODELS for n in (1, 2, 3, 5, 8)]
    lock = threading.Lock()
    tally = {m: {"ok": 0, "deadline": 0} for m in DISCIPLINE_MODELS}

    def worker(tid):
        proto = "grpc" if tid % 2 == 0 else "http"
        client = grpc_client(srv) if proto == "grpc" else http_client(srv)
        rng = random.Random(100 + tid)
        try:
            for i in range(DISCIPLINE_REQUESTS):
                case = rng.choice(plan)
                timeout = _timeout_us(rng)
                kw = {} if timeout is None else {"timeout": timeout}
                what = f"thread {tid} {proto} request {i} {case.model} n={case.n} " \
                       f"timeout={timeout}"
                try:
                    got = infer(client, proto, case, **kw)
                except InferenceServerException as e:
                    assert timeout is not None and is_deadline_error(e, proto), \
                        f"{what}: unexpected error {error_code(e, proto)}: {e}"
                    msg = str(e)
                    assert "deadline" in msg.lower() and f"model {case.model}" in msg, \
                        f"{what}: the message does not say deadline and name the model: {msg}"
                    with lock:
                        tally[case.model]["deadline"] += 1
                    continue
                case.check(got, what)
                with lock:
                    tally[case.model]["ok"] += 1
        finally:
            client.close()

    _, errors = run_threads(worker, DISCIPLINE_THREADS, JOIN_TIMEOUT_S)
    assert not errors, (f"{len(errors)} of {DISCIPLINE_THREADS} threads failed; first: thread "
                        f"{errors[0][0]}: {errors[0][1]}")
    print(f"{discipline}: {tally}")
    total = sum(t["ok"] + t["deadline"] for t in tally.values())
    assert total == DISCIPLINE_THREADS * DISCIPLINE_REQUESTS
    assert sum(t["deadline"] for t in tally.values()) > 0, \
        f"no request expired, not even those with a 1 us timeout: {tally}"
    assert sum(t["ok"] for t in tally.values()) > 0, tally

    for m in DISCIPLINE_MODELS:
        st = grpc_stats(srv, m)
        assert st["success"] == tally[m]["ok"], (m, st, tally[m])
        assert st["fail"] == tally[m]["deadline"], (m, st, tally[m])
    if missing:
        pytest.skip(f"/metrics has no pjserve_model_requests_expired_total / _shed_total for "
                    f"{missing}: the expired + shed accounting was not checked")
    after_samples = metrics_samples(srv)
    for m in DISCIPLINE_MODELS:
        (e0, s0), (e1, s1) = before[m], dropped_count(after_samples, m)
        assert (e1 - e0) + (s1 - s0) == tally[m]["deadline"], \
            (f"{m}: {tally[m]['deadline']} requests answered DEADLINE_EXCEEDED, but expired "
             f"rose by {e1 - e0} and shed by {s1 - s0}")
        print(f"{discipline} {m}: expired +{e1 - e0}, shed +{s1 - s0}")
        if discipline != "edf":
            assert s1 == s0, f"{m}: requests shed under {discipline}"
    problems = srv.stop_and_check()
    assert not problems, problems


# ---- default timeouts ------------------------------------------------------------------------

GENEROUS_US = 60_000_000


def _expect_deadline(client, proto, case, what):
    with pytest.raises(InferenceServerException) as ei:
        infer(client, proto, case)
    e = ei.value
    assert is_deadline_error(e, proto), f"{what}: {error_code(e, proto)}: {e}"
    assert "deadline" in str(e).lower() and f"model {case.model}" in str(e), f"{what}: {e}"
    assert "before it could be queued" in str(e), f"{what}: not refused at admission: {e}"


def test_per_model_default_timeout(server_factory, cases, tmp_path):
    """models.mlp.default_timeout_us: 1 in --config: every mlp request without
    a timeout of its own is refused at admission; one with a generous
    `timeout` succeeds (its own deadline wins); two_io is unaffected."""
    cfg = tmp_path / "sched.yaml"
    cfg.write_text("models:\n  mlp: {default_timeout_us: 1}\n")
    srv = server_factory(["--config", str(cfg)])
    assert "default timeout 1 us" in srv.stderr_text(), srv.describe()
    mlp, two = cases.get("mlp", 2), cases.get("two_io", 3)
    g, h = grpc_client(srv), http_client(srv)
    try:
        for proto, c in (("grpc", g), ("http", h)):
            for i in range(5):
                _expect_deadline(c, proto, mlp, f"{proto} mlp without timeout #{i}")
            mlp.check(infer(c, proto, mlp, timeout=GENEROUS_US), f"{proto} generous timeout")
            two.check(infer(c, proto, two), f"{proto} two_io (no default timeout)")
    finally:
        g.close()
        h.close()
    st = grpc_stats(srv, "mlp")
    assert st["fail"] == 10 and st["success"] == 2, st
    expired, _ = dropped_count(metrics_samples(srv), "mlp")
    assert expired in (None, 10), f"pjserve_model_requests_expired_total {expired}, expected 10"
    problems = srv.stop_and_check()
    assert not problems, problems


def test_default_timeout_flag(server_factory, cases, tmp_path):
    """--default-timeout-us 1 applies to every model, except one whose policy
    says default_timeout_us: 0 (none, even though the scheduler's is set)."""
    cfg = tmp_path / "sched.yaml"
    cfg.write_text("models:\n  two_io: {default_timeout_us: 0}\n")
    srv = server_factory(["--default-timeout-us", "1", "--config", str(cfg)])
    mlp, two = cases.get("mlp", 1), cases.get("two_io", 1)
    g, h = grpc_client(srv), http_client(srv)
    try:
        for proto, c in (("grpc", g), ("http", h)):
            _expect_deadline(c, proto, mlp, f"{proto} mlp without timeout")
            mlp.check(infer(c, proto, mlp, timeout=GENEROUS_US), f"{proto} generous timeout")
            two.check(infer(c, proto, two), f"{proto} two_io with policy default 0")
    finally:
        g.close()
        h.close()
    problems = srv.stop_and_check()
    assert not problems, problems


def test_edf_without_warm_up_still_runs_requests_that_fit(server_factory, cases):
    """edf + --warmup-runs 0: mlp runs a batch of 1 in well under 100 us, so
    requests one at a time with a 950 us timeout should mostly succeed.
    Regression: edf used to shed on the 1 ms/row prior of an unmeasured
    cost, refusing every such request forever."""
    srv = server_factory(["--scheduler-discipline", "edf", "--warmup-runs", "0"])
    case = cases.get("mlp", 1)
    c = grpc_client(srv)
    outcomes = []
    try:
        for _ in range(20):
            try:
                case.check(infer(c, "grpc", case, timeout=950), "edf without warm-up")
                outcomes.append("ok")
            except InferenceServerException as e:
                outcomes.append(str(e))
    finally:
        c.close()
    assert "ok" in outcomes, f"all 20 requests refused; last: {outcomes[-1]}"


# ---- warm-up ------------------------------------------------------------------------------------

READY_LINE = re.compile(r"model mlp ready: (.*)$", re.M)


def test_warm_up_logged(server_factory, cases):
    srv = server_factory()
    log = srv.stderr_text()
    m = READY_LINE.search(log)
    assert m, f"no 'model mlp ready:' line\n{srv.describe()}"
    assert re.search(r"warm-up b1 \d+(\.\d+)? ms, b4 \d+(\.\d+)? ms, b8 \d+(\.\d+)? ms",
                     m.group(1)), f"no warm-up timings for b1, b4, b8: {m.group(0)}"
    assert re.search(r"\bwarm-up runs 2\b", log), srv.describe()
    problems = srv.stop_and_check()
    assert not problems, problems


def test_no_warm_up(server_factory, cases):
    srv = server_factory(["--warmup-runs", "0"])
    log = srv.stderr_text()
    m = READY_LINE.search(log)
    assert m, f"no 'model mlp ready:' line\n{srv.describe()}"
    assert "warm-up" not in m.group(0), f"--warmup-runs 0 still warmed up: {m.group(0)}"
    assert re.search(r"\bwarm-up runs 0\b", log), srv.describe()
    # Unmeasured costs do not stop it serving (and coalescing) correctly.
    case = cases.get("mlp", 3)
    g, h = grpc_client(srv), http_client(srv)
    try:
        case.check(infer(g, "grpc", case), "gRPC without warm-up")
        case.check(infer(h, "http", case), "HTTP without warm-up")
    finally:
        g.close()
        h.close()
    before = grpc_stats(srv, "mlp")

    def worker(tid):
        c = grpc_client(srv)
        try:
            for i in range(10):
                case.check(infer(c, "grpc", case), f"thread {tid} request {i}")
        finally:
            c.close()

    _, errors = run_threads(worker, 8, JOIN_TIMEOUT_S)
    assert not errors, f"thread {errors[0][0]}: {errors[0][1]}"
    d = stats_delta(grpc_stats(srv, "mlp"), before)
    assert d["success"] == 80, d
    problems = srv.stop_and_check()
    assert not problems, problems


# ---- queue depth is per model -----------------------------------------------------------------

FLOOD_BURST = 48


def test_full_queue_of_one_model_does_not_refuse_another(server_factory, cases):
    """--max-queue-depth 2: convnet is flooded with bursts of async requests
    (most refused RESOURCE_EXHAUSTED) while a gRPC and an HTTP client send mlp
    requests one at a time; every mlp request succeeds."""
    srv = server_factory(["--max-queue-depth", "2"], names=("mlp", "convnet"))
    big, small = cases.get("convnet", 8), cases.get("mlp", 3)
    stop = threading.Event()
    lock = threading.Lock()
    convnet = {"ok": 0, "exhausted": 0, "other": [], "exhausted_during_mlp": 0}
    mlp_running = threading.Event()

    def flood():
        c = grpc_client(srv)
        try:
            while not stop.is_set():
                done = threading.Semaphore(0)

                def cb(result, error):
                    with lock:
                        if error is None:
                            convnet["ok"] += 1
                        elif (grpc_code(error) == "RESOURCE_EXHAUSTED"
                              and "model convnet" in str(error)):
                            convnet["exhausted"] += 1
                            convnet["exhausted_during_mlp"] += mlp_running.is_set()
                        else:
                            convnet["other"].append(f"{grpc_code(error)}: {error}")
                    done.release()

                for _ in range(FLOOD_BURST):
                    c.async_infer("convnet", grpc_inputs(big), cb)
                for _ in range(FLOOD_BURST):
                    assert done.acquire(timeout=JOIN_TIMEOUT_S), "a convnet reply never came"
        finally:
            c.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:   # wait until the flood hits the bound
            with lock:
                if convnet["exhausted"]:
                    break
            time.sleep(0.01)
        mlp_running.set()

        def mlp_client(i):
            proto = ("grpc", "http")[i]
            c = grpc_client(srv) if proto == "grpc" else http_client(srv)
            try:
                for k in range(40):
                    small.check(infer(c, proto, small), f"{proto} mlp request {k} during the flood")
            finally:
                c.close()

        _, errors = run_threads(mlp_client, 2, JOIN_TIMEOUT_S)
        mlp_running.clear()
    finally:
        stop.set()
        flooder.join(JOIN_TIMEOUT_S)
    assert not errors, f"mlp requests failed while convnet's queue was full: {errors[0][1]}"
    assert not convnet["other"], convnet["other"][:5]
    assert convnet["exhausted_during_mlp"] > 0, \
        f"convnet's queue was never full while mlp requests ran: {convnet}"
    assert convnet["ok"] > 0, convnet
    samples = metrics_samples(srv)
    rejected = metric(samples, "pjserve_model_requests_rejected_total", model="convnet",
                      version="1", reason="queue_full")
    if rejected is not None:
        assert rejected == convnet["exhausted"], (rejected, convnet)
        assert metric(samples, "pjserve_model_requests_rejected_total", model="mlp",
                      version="1", reason="queue_full") == 0
    problems = srv.stop_and_check()
    assert not problems, problems
