"""The rules of meta models, against the real server with tritonclient.

The metas here call the demo mlp (x f32 [batch,16] -> y f32 [batch,4]):

    fanout      two calls of mlp started, then both waited for; y1 + y2
    timed       `rounds` times: call mlp, spin wait_ms; returns the last y
                and its run's start and end (CLOCK_MONOTONIC ns) as t
    undeclared  declares mlp, calls two_io
    compute     no calls (compute-only): spins wait_ms, returns t
    upper       no calls: upper-cases BYTES strings
    aligned     no calls: where its f64 input lies (its address modulo 8)
                and its sum
    meta_calls_meta, a_calls_meta, calls_missing
                refused at load (a meta calling a meta; a model that is not
                in the repository)

beside mlp, two_io (public) and `slow` (protocol_util), a public model whose executions take
~8 ms, to queue seconds of regular work.

Two servers serve the module, both static, scheduling FIFO: one with
--meta-concurrency 2 (most tests), one with 1. Timestamps are compared on
the server's clock only; times the client measures get margins of seconds.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pjserve_export.triton_examples import export_triton_example

from bundle_code import TIMING_C, copy_bundle, start_server, stop_server, tensor_yaml, write_meta
from protocol_util import (SLOW, assert_matches, grpc_code, http_json, parse_metrics, scrape,
                           serve_only, slow_model)

X_IN = tensor_yaml("x", "f32", [-1, 16])
Y_OUT = tensor_yaml("y", "f32", [-1, 4])
WAIT_IN = tensor_yaml("wait_ms", "i32", [1])
T_OUT = tensor_yaml("t", "i64", [2])

FANOUT_C = """\
#include <pjserve/model.h>

/* x f32 [n,16] -> y f32 [n,4] = mlp(x) + mlp(x), both calls in flight at once */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    pjserve_tensor x = in[0];
    x.name = "x";
    pjserve_subcall *a, *b;
    const pjserve_tensor *ya, *yb;
    size_t na, nb;
    int rc = pjserve_call_start(ctx, "mlp", &x, 1, &a);
    if (rc != PJSERVE_OK)
        return rc;
    if ((rc = pjserve_call_start(ctx, "mlp", &x, 1, &b)) != PJSERVE_OK)
        return rc;
    if ((rc = pjserve_call_wait(ctx, a, &ya, &na)) != PJSERVE_OK)
        return rc;
    if ((rc = pjserve_call_wait(ctx, b, &yb, &nb)) != PJSERVE_OK)
        return rc;
    int64_t n = ya[0].shape[0] * 4;
    float *y = pjserve_alloc(ctx, (size_t)n * sizeof *y);
    if (y == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    const float *p = ya[0].data, *q = yb[0].data;
    for (int64_t i = 0; i < n; i++)
        y[i] = p[i] + q[i];
    out[0].shape[0] = ya[0].shape[0];
    out[0].data = y;
    out[0].nbytes = (size_t)n * sizeof *y;
    return PJSERVE_OK;
}
"""

TIMED_C = TIMING_C + """
static int set_times(pjserve_ctx *ctx, pjserve_tensor *t, int64_t start)
{
    int64_t *v = pjserve_alloc(ctx, 2 * sizeof *v);
    if (v == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    v[0] = start;
    v[1] = now_ns();
    t->data = v;
    t->nbytes = 2 * sizeof *v;
    return PJSERVE_OK;
}

/* x f32 [n,16], wait_ms i32 [1], rounds i32 [1] -> y f32 [n,4], t i64 [2] */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    int64_t start = now_ns();
    pjserve_tensor x = in[0];
    x.name = "x";
    int32_t wait_ms = *(const int32_t *)in[1].data, rounds = *(const int32_t *)in[2].data;
    const pjserve_tensor *y = NULL;
    size_t ny;
    for (int32_t r = 0; r < rounds; r++) {
        int rc = pjserve_call(ctx, "mlp", &x, 1, &y, &ny);
        if (rc != PJSERVE_OK)
            return rc;
        busy_wait_ms(wait_ms);
    }
    if (y == NULL) {
        pjserve_error(ctx, "rounds must be at least 1");
        return PJSERVE_INVALID_ARGUMENT;
    }
    out[0].shape[0] = y[0].shape[0];
    out[0].data = y[0].data;
    out[0].nbytes = y[0].nbytes;
    return set_times(ctx, &out[1], start);
}
"""

COMPUTE_C = TIMING_C + """
/* wait_ms i32 [1] -> t i64 [2]: the run's start and end */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    int64_t *v = pjserve_alloc(ctx, 2 * sizeof *v);
    if (v == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    v[0] = now_ns();
    busy_wait_ms(*(const int32_t *)in[0].data);
    v[1] = now_ns();
    out[0].data = v;
    out[0].nbytes = 2 * sizeof *v;
    return PJSERVE_OK;
}
"""

ALIGNED_C = """\
#include <pjserve/model.h>

/* x f64 [n] -> offset i32 [1]: x's address modulo 8 (0: aligned for its
 * element type), total f64 [1]: the sum of x, read as doubles */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    int32_t *offset = pjserve_alloc(ctx, sizeof *offset);
    double *total = pjserve_alloc(ctx, sizeof *total);
    if (offset == NULL || total == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    *offset = (int32_t)((uintptr_t)in[0].data % 8);
    *total = 0;
    for (int64_t i = 0; *offset == 0 && i < in[0].shape[0]; i++)
        *total += ((const double *)in[0].data)[i];
    out[0].data = offset;
    out[0].nbytes = sizeof *offset;
    out[1].data = total;
    out[1].nbytes = sizeof *total;
    return PJSERVE_OK;
}
"""

UNDECLARED_C = """\
#include <pjserve/model.h>

/* Declares mlp; calls two_io. */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)out, (void)n_out;
    pjserve_tensor x = in[0];
    x.name = "a";
    pjserve_subcall *call;
    int rc = pjserve_call_start(ctx, "two_io", &x, 1, &call);
    if (rc != PJSERVE_OK)
        return rc;
    pjserve_error(ctx, "the call of two_io was accepted");
    return PJSERVE_INTERNAL;
}
"""

UPPER_C = """\
#include <pjserve/model.h>

/* s bytes [n] -> u bytes [n]: each string upper-cased (ASCII) */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    const pjserve_tensor *s = &in[0];
    int64_t count = pjserve_numel(s);
    pjserve_bytes_writer w;
    int rc = pjserve_bytes_reserve(ctx, &w, &out[0], s->nbytes - 4 * (size_t)count,
                                   (size_t)count);
    if (rc != PJSERVE_OK)
        return rc;
    pjserve_bytes_reader r = pjserve_bytes_begin(s);
    const char *e;
    uint32_t len;
    char buf[4096];
    while (pjserve_bytes_next(&r, &e, &len)) {
        if (len > sizeof buf) {
            pjserve_error(ctx, "a string of %u bytes: at most %zu", len, sizeof buf);
            return PJSERVE_INVALID_ARGUMENT;
        }
        for (uint32_t i = 0; i < len; i++)
            buf[i] = e[i] >= 'a' && e[i] <= 'z' ? (char)(e[i] - 'a' + 'A') : e[i];
        pjserve_bytes_put(&w, buf, len);
    }
    out[0].shape[0] = count;
    return PJSERVE_OK;
}
"""

NEVER_RUNS_C = """\
#include <pjserve/model.h>

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)in, (void)n_in, (void)out, (void)n_out;
    pjserve_error(ctx, "this meta should have been refused at load");
    return PJSERVE_INTERNAL;
}
"""

# The load refusals and what the repository index must say of them.
REFUSED = {
    "meta_calls_meta": ['"fanout" is a meta model', "a meta may not call a meta"],
    # Loaded before the meta it calls (metas load in name order): refused
    # with the same reason, read from the manifest of the meta not loaded yet.
    "a_calls_meta": ['meta.calls[0]', '"fanout" is a meta model', "a meta may not call a meta"],
    "calls_missing": ['no model "nosuch" in the repository'],
    # A sub-call carries no sequence, so a stateful model cannot be called.
    "calls_stateful": ['meta.calls[0]', 'model "simple_sequence" keeps state per sequence',
                       "carry no sequence"],
}

# The ERROR line an undeclared call logs (a loud error, on purpose).
UNDECLARED_LOG = r'model undeclared: pjserve_run called "two_io", which its meta\.calls'

def write_repository(repo, exported, pjserve_bin):
    for name in ("mlp", "two_io"):
        copy_bundle(repo, exported[name].path, name)
    slow_model().export(repo, batch_sizes=(1,))  # one execution per request: no coalescing
    meta = partial(write_meta, repo, pjserve_bin=pjserve_bin)
    meta("fanout", ["mlp"], X_IN, Y_OUT, FANOUT_C)
    meta("timed", ["mlp"], X_IN + WAIT_IN + tensor_yaml("rounds", "i32", [1]), Y_OUT + T_OUT,
         TIMED_C)
    meta("undeclared", ["mlp"], X_IN, Y_OUT, UNDECLARED_C)
    meta("compute", [], WAIT_IN, T_OUT, COMPUTE_C)
    meta("upper", [], tensor_yaml("s", "bytes", [-1]), tensor_yaml("u", "bytes", [-1]), UPPER_C)
    meta("aligned", [], tensor_yaml("x", "f64", [-1]),
         tensor_yaml("offset", "i32", [1]) + tensor_yaml("total", "f64", [1]), ALIGNED_C)
    meta("meta_calls_meta", ["fanout"], X_IN, Y_OUT, NEVER_RUNS_C)
    meta("a_calls_meta", ["fanout"], X_IN, Y_OUT, NEVER_RUNS_C)
    meta("calls_missing", ["nosuch"], X_IN, Y_OUT, NEVER_RUNS_C)
    export_triton_example("simple_sequence", repo)
    meta("calls_stateful", ["simple_sequence"], X_IN, Y_OUT, NEVER_RUNS_C)


def serve(pjserve_bin, plugin_path, cache_dir, repo, tmp_path_factory, permits: int):
    return start_server(pjserve_bin, plugin_path, repo, cache_dir,
                        tmp_path_factory.mktemp(f"meta-server-{permits}"),
                        ["--model-control-mode", "static", "--meta-concurrency", str(permits),
                         "--scheduler-discipline", "fifo"],
                        f"meta{permits}", refuses_some=True)


@pytest.fixture(scope="module")
def meta_repository(pjserve_bin, exported, tmp_path_factory):
    repo = tmp_path_factory.mktemp("meta-repository")
    write_repository(repo, exported, pjserve_bin)
    return repo


@pytest.fixture(scope="module")
def meta_server(pjserve_bin, plugin_path, cache_dir, meta_repository, tmp_path_factory):
    s = serve(pjserve_bin, plugin_path, cache_dir, meta_repository, tmp_path_factory, 2)
    yield s
    stop_server(s, [UNDECLARED_LOG])


@pytest.fixture(scope="module")
def one_permit_server(pjserve_bin, plugin_path, cache_dir, meta_repository, tmp_path_factory):
    s = serve(pjserve_bin, plugin_path, cache_dir, meta_repository, tmp_path_factory, 1)
    yield s
    stop_server(s, [UNDECLARED_LOG])


def guarded(s):
    assert s.alive(), s.describe()
    yield s
    assert s.alive(), f"the server died during this test\n{s.describe()}"


@pytest.fixture
def srv(meta_server):
    yield from guarded(meta_server)


@pytest.fixture
def srv1(one_permit_server):
    yield from guarded(one_permit_server)


@pytest.fixture(scope="module")
def mlp_ref(exported):
    model = exported["mlp"].model
    return lambda x: model.reference(x)[0]


# ---- clients ------------------------------------------------------------------------

def sample_x(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 16)).astype(np.float32)


def tensors(mod, arrays, binary=True):
    res = []
    for name, a in arrays.items():
        dt = {np.float32: "FP32", np.float64: "FP64", np.int32: "INT32",
              np.object_: "BYTES"}[a.dtype.type]
        t = mod.InferInput(name, list(a.shape), dt)
        if mod is httpclient:
            t.set_data_from_numpy(a, binary_data=binary)
        else:
            t.set_data_from_numpy(a)
        res.append(t)
    return res


def url_of(s, proto):
    return s.grpc_url if proto == "grpc" else s.http_url


def infer(url: str, model: str, arrays, outputs, proto="grpc", **kw):
    """{output: array} over gRPC, HTTP binary ("http-binary") or HTTP JSON."""
    if proto == "grpc":
        with grpcclient.InferenceServerClient(url) as c:
            r = c.infer(model, tensors(grpcclient, arrays), **kw)
            return {o: r.as_numpy(o) for o in outputs}
    binary = proto == "http-binary"
    with httpclient.InferenceServerClient(url, network_timeout=120) as c:
        req = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
        r = c.infer(model, tensors(httpclient, arrays, binary), outputs=req, **kw)
        return {o: r.as_numpy(o) for o in outputs}


def timed_inputs(x, wait_ms: int, rounds: int = 1):
    return {"x": x, "wait_ms": np.array([wait_ms], np.int32),
            "rounds": np.array([rounds], np.int32)}


def call_timed(url, x, wait_ms, rounds=1, **kw):
    return infer(url, "timed", timed_inputs(x, wait_ms, rounds), ["y", "t"], **kw)


def call_compute(url, wait_ms, **kw):
    return infer(url, "compute", {"wait_ms": np.array([wait_ms], np.int32)}, ["t"], **kw)["t"]


def max_overlap(intervals) -> int:
    """Most of the [start, end] intervals that hold one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


def model_metric(s, name: str, model: str) -> float:
    samples, _ = parse_metrics(scrape(s.metrics_url))
    found = [v for (n, labels), v in samples.items() if n == name and ("model", model) in labels]
    assert found, f"/metrics has no {name} for model {model}"
    return sum(found)


def server_metric(s, name: str) -> float:
    samples, _ = parse_metrics(scrape(s.metrics_url))
    found = [v for (n, _), v in samples.items() if n == name]
    assert len(found) == 1, f"/metrics: {name}: {found}"
    return found[0]


# ---- 7. fan-out and batches past the largest compiled size ---------------------------

@pytest.mark.parametrize("rows", (3, 20))
def test_fanout_sums_two_calls(srv, mlp_ref, rows):
    """Two calls in flight at once, summed: 2 * mlp(x). 20 rows are more than
    mlp's largest batch size (8): each call runs as 3 requests (8 + 8 + 4
    rows) whose outputs are joined."""
    x = sample_x(rows, 70 + rows)
    requests0 = model_metric(srv, "nv_inference_request_success", "mlp")
    rows0 = model_metric(srv, "nv_inference_count", "mlp")
    for proto in ("grpc", "http-binary"):
        y = infer(url_of(srv, proto), "fanout", {"x": x}, ["y"], proto=proto)["y"]
        assert_matches("mlp", "y", y, 2 * mlp_ref(x), f"fanout {proto} rows={rows}")
    parts = 2 * 2 * (-(-rows // 8))  # two protocols, two calls, ceil(rows / 8) parts each
    assert model_metric(srv, "nv_inference_request_success", "mlp") - requests0 == parts
    assert model_metric(srv, "nv_inference_count", "mlp") - rows0 == 2 * 2 * rows


# ---- 8. sub-models are internal -------------------------------------------------------

def unknown_model_answers(s, name: str):
    """What a client gets for `name`: gRPC infer, metadata, config, ready,
    statistics; REST infer, metadata, ready (status and body), statistics."""
    x = sample_x(1, 80)
    answers = {}
    with grpcclient.InferenceServerClient(s.grpc_url) as c:
        for what, fn in (("gRPC infer", lambda: c.infer(name, tensors(grpcclient, {"x": x}))),
                         ("gRPC metadata", lambda: c.get_model_metadata(name)),
                         ("gRPC config", lambda: c.get_model_config(name)),
                         ("gRPC ready", lambda: c.is_model_ready(name)),
                         ("gRPC statistics", lambda: c.get_inference_statistics(name))):
            try:
                got = fn()
                answers[what] = ("answered", got if what == "gRPC ready" else None)
            except InferenceServerException as e:
                answers[what] = (grpc_code(e), e.message())
    with httpclient.InferenceServerClient(s.http_url) as c:
        try:
            c.infer(name, tensors(httpclient, {"x": x}))
            answers["REST infer"] = ("answered", None)
        except InferenceServerException as e:
            answers["REST infer"] = (e.status(), e.message())
    for what, path in (("REST metadata", f"/v2/models/{name}"),
                       ("REST ready", f"/v2/models/{name}/ready"),
                       ("REST statistics", f"/v2/models/{name}/stats")):
        status, _, raw = http_json(s.http_url, "GET", path)
        answers[what] = (status, raw.decode(errors="replace"))
    return {k: (code, str(msg).replace(f"'{name}'", "'NAME'"))
            for k, (code, msg) in answers.items()}


def test_sub_model_not_addressable(srv):
    """mlp, called by the metas, answers every client exactly as a model that
    does not exist: NOT_FOUND / 404 "Request for unknown model: 'mlp' is not
    found" (ready: false / HTTP 400 with no body, which is what Triton's
    ModelReady answers for an unknown model too)."""
    got = unknown_model_answers(srv, "mlp")
    assert got == unknown_model_answers(srv, "no_such_model")
    unknown = "Request for unknown model: 'NAME' is not found"
    for what in ("gRPC infer", "gRPC metadata", "gRPC config", "gRPC statistics"):
        assert got[what][0] == "NOT_FOUND" and unknown in got[what][1], (what, got[what])
    for what in ("REST infer", "REST metadata", "REST statistics"):
        assert str(got[what][0]) == "404" and unknown in got[what][1], (what, got[what])
    assert got["gRPC ready"] == ("answered", "False"), got["gRPC ready"]
    assert got["REST ready"] == (400, ""), got["REST ready"]


def index_entries(s):
    with grpcclient.InferenceServerClient(s.grpc_url) as c:
        g = {m.name: (m.state, m.reason)
             for m in c.get_model_repository_index(as_json=False).models}
    status, doc, raw = http_json(s.http_url, "POST", "/v2/repository/index", {})
    assert status == 200, raw
    h = {m["name"]: (m.get("state"), m.get("reason", "")) for m in doc}
    return g, h


def test_sub_model_absent_from_index_meta_listed_ready(srv):
    g, h = index_entries(srv)
    for what, entries in (("gRPC", g), ("REST", h)):
        assert "mlp" not in entries, f"{what} index lists the internal mlp: {entries}"
        for meta in ("fanout", "timed", "compute", "upper"):
            assert entries.get(meta, (None,))[0] == "READY", f"{what} index: {meta}: {entries}"
        assert entries["two_io"][0] == "READY", entries  # not called by a meta: public
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        assert c.is_model_ready("fanout")
        md = c.get_model_metadata("timed", as_json=True)
    assert [(t["name"], t["datatype"]) for t in md["inputs"]] == \
        [("x", "FP32"), ("wait_ms", "INT32"), ("rounds", "INT32")], md
    assert [(t["name"], t["datatype"]) for t in md["outputs"]] == \
        [("y", "FP32"), ("t", "INT64")], md


# ---- 9. at most N metas inside their run at once ---------------------------------------

def overlap_of_concurrent_runs(s, clients: int, per_client: int, wait_ms: int):
    x = sample_x(2, 90)

    def client(i):
        return [tuple(call_timed(s.grpc_url, x, wait_ms)["t"]) for _ in range(per_client)]

    with ThreadPoolExecutor(clients) as pool:
        runs = [iv for ivs in pool.map(client, range(clients)) for iv in ivs]
    assert len(runs) == clients * per_client
    assert all(e > st for st, e in runs), runs
    return max_overlap(runs)


@serve_only("the meta gate is per worker")
def test_at_most_two_metas_run_at_once(srv):
    """8 clients, 4 requests each, each run holding its permit ~30 ms: two
    runs overlap, never three (and the server's own count agrees)."""
    assert overlap_of_concurrent_runs(srv, 8, 4, 30) == 2
    assert server_metric(srv, "pjserve_meta_runs_gated_peak") == 2


@serve_only("the meta gate is per worker")
def test_at_most_one_meta_runs_at_once(srv1):
    assert overlap_of_concurrent_runs(srv1, 4, 3, 30) == 1
    assert server_metric(srv1, "pjserve_meta_runs_gated_peak") == 1


# ---- 10. compute-only metas bypass the gate ---------------------------------------------

@serve_only("the meta gate is per worker")
def test_compute_only_bypasses_the_gate(srv):
    """Two gated runs hold both permits for 1.5 s; a third gated one waits for
    a permit, while compute-only runs start and finish inside the held
    ones."""
    x = sample_x(1, 100)
    with ThreadPoolExecutor(3) as pool:
        holders = [pool.submit(call_timed, srv.grpc_url, x, 1500) for _ in range(2)]
        time.sleep(0.5)  # both hold their permit (a run starts within ms of arriving)
        waiting = pool.submit(call_timed, srv.grpc_url, x, 0)
        computes = [call_compute(srv.grpc_url, 50) for _ in range(3)]
        held = [tuple(h.result(timeout=120)["t"]) for h in holders]
        third = tuple(waiting.result(timeout=120)["t"])
    for cs, ce in computes:
        assert ce - cs >= 50_000_000, (cs, ce)
        for hs, he in held:
            assert hs < cs and ce < he, \
                f"compute-only run [{cs}, {ce}] not inside the gated run [{hs}, {he}]"
    assert third[0] >= min(e for _, e in held), \
        f"a third gated run started at {third[0]}, before a permit was free: {held}"


# ---- 11. committed sub-calls go ahead of queued regular work ----------------------------

FLOOD = 240
# The flood's connections: gRPC shares one connection between channels to the
# same address unless told not to, and the server lets one connection have
# 128 calls open (--grpc-max-concurrent-streams); each flood client gets its
# own connection, with FLOOD / FLOOD_CLIENTS calls open on it.
FLOOD_CLIENTS = 2
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@serve_only("the queue a sub-call jumps is one worker's")
def test_sub_calls_ahead_of_queued_regular_work(srv):
    """FIFO scheduling, FLOOD requests of the slow model queued (~2 s of
    device time): a meta's sub-call is dispatched ahead of them, while a
    regular request sent with it waits behind the flood.

    Margins: of the flood requests still queued when both are sent, the meta
    must finish before a quarter of them have (it waits for the execution
    under way, ~8 ms, then runs its own: a couple of flood requests at most,
    against ~50 for the margin, ~0.4 s); the regular request must finish after
    three quarters of them have (FIFO puts it behind all of them)."""
    done_at = []
    lock = threading.Lock()
    failures = []

    def flood_done(result, error):
        with lock:
            if error is not None:
                failures.append(error)
            done_at.append(time.monotonic())

    clients = [grpcclient.InferenceServerClient(srv.grpc_url, channel_args=OWN_CONNECTION)
               for _ in range(FLOOD_CLIENTS)]
    try:
        x = np.zeros((1, 64), np.float32)
        for i in range(FLOOD):
            clients[i % FLOOD_CLIENTS].async_infer(SLOW, tensors(grpcclient, {"x": x}),
                                                   flood_done)
        deadline = time.monotonic() + 60
        while model_metric(srv, "pjserve_model_queue_depth", SLOW) < FLOOD * 3 // 4:
            assert not failures, failures
            assert time.monotonic() < deadline, "the flood never queued"
            time.sleep(0.01)
        # Read under one lock: every queued request is in flight, and more.
        samples, _ = parse_metrics(scrape(srv.metrics_url))
        queued, in_flight = (sum(v for (n, labels), v in samples.items()
                                 if n == name and ("model", SLOW) in labels)
                             for name in ("pjserve_model_queue_depth",
                                          "pjserve_model_requests_in_flight"))
        assert in_flight >= queued > 0, (in_flight, queued)
        two_io = {"a": np.zeros((1, 8), np.float32), "b": np.zeros((1, 3), np.int32)}
        with ThreadPoolExecutor(2) as pool:
            sent_at = time.monotonic()
            meta = pool.submit(lambda: (call_timed(srv.grpc_url, sample_x(1, 110), 0),
                                        time.monotonic()))
            regular = pool.submit(lambda: (infer(srv.grpc_url, "two_io", two_io, ["sum"]),
                                           time.monotonic()))
            _, meta_at = meta.result(timeout=120)
            _, regular_at = regular.result(timeout=120)
        deadline = time.monotonic() + 120
        while len(done_at) < FLOOD and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for c in clients:
            c.close()
    assert not failures, failures[:3]
    assert len(done_at) == FLOOD
    queued = sum(t >= sent_at for t in done_at)
    passed_meta = sum(sent_at <= t < meta_at for t in done_at)
    passed_regular = sum(sent_at <= t < regular_at for t in done_at)
    print(f"flood of {FLOOD}, {queued} still to finish when the meta and the regular request "
          f"were sent: {passed_meta} finished before the meta, {passed_regular} before the "
          "regular request")
    assert queued >= FLOOD // 2, f"only {queued} flood requests left: the flood drained early"
    assert passed_meta < queued // 4, \
        f"the meta finished after {passed_meta} of the {queued} queued requests"
    assert passed_regular > queued * 3 // 4, \
        f"the regular request finished after only {passed_regular} of {queued} queued requests"


# ---- 12. the deadline stops a meta at a stage boundary -----------------------------------

@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_deadline_stops_at_the_next_stage(srv, proto):
    """Call mlp, spin 300 ms, call mlp again, with a 150 ms timeout: the run
    stops before the second call (DEADLINE_EXCEEDED saying so); mlp ran once
    for it (its request count in /metrics: internal models are there)."""
    x = sample_x(1, 120)
    kw = {"client_timeout": 60} if proto == "grpc" else {}
    before = model_metric(srv, "nv_inference_request_success", "mlp")
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as ei:
        call_timed(url_of(srv, proto), x, 300, rounds=2, proto=proto, timeout=150_000, **kw)
    took = time.monotonic() - t0
    e = ei.value
    print(f"{proto}: answered after {took:.3f} s: {e}")
    if proto == "grpc":
        assert grpc_code(e) == "DEADLINE_EXCEEDED", str(e)
    else:
        assert e.status() == "504", str(e)
    assert "model timed: run: the request's deadline passed before the call of mlp: stopped " \
           "at that stage" in e.message(), e.message()
    assert took >= 0.3, f"answered after {took:.3f} s: before the run reached the stage"
    assert model_metric(srv, "nv_inference_request_success", "mlp") - before == 1


# ---- 13. a meta that cannot get a permit before its deadline ------------------------------

@serve_only("the meta gate is per worker")
def test_dropped_at_admission_when_no_permit_in_time(srv1):
    """One permit, held 2 s; a second meta with a 200 ms timeout is answered
    DEADLINE_EXCEEDED at its deadline, long before the permit frees."""
    x = sample_x(1, 130)
    expired0 = server_metric(srv1, "pjserve_meta_runs_expired_total")
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(call_timed, srv1.grpc_url, x, 2000)
        time.sleep(0.3)
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as ei:
            call_timed(srv1.grpc_url, x, 0, timeout=200_000, client_timeout=60)
        took = time.monotonic() - t0
        held = holder.result(timeout=120)["t"]
    assert grpc_code(ei.value) == "DEADLINE_EXCEEDED", str(ei.value)
    msg = ei.value.message()
    print(f"refused after {took:.3f} s: {msg}")
    for part in ("model timed: meta gate", "waiting for a permit", "--meta-concurrency"):
        assert part in msg, msg
    assert took < 1.2, f"refused after {took:.2f} s (the permit frees after 2 s)"
    assert held[1] - held[0] >= 2_000_000_000
    assert server_metric(srv1, "pjserve_meta_runs_expired_total") - expired0 == 1


# ---- 14. calls a meta may not make --------------------------------------------------------

@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_undeclared_call_refused(srv, proto):
    with pytest.raises(InferenceServerException) as ei:
        infer(url_of(srv, proto), "undeclared", {"x": sample_x(1, 140)}, ["y"], proto=proto)
    e = ei.value
    assert (grpc_code(e) if proto == "grpc" else e.status()) == \
        ("NOT_FOUND" if proto == "grpc" else "404"), str(e)
    assert 'model undeclared: run: pjserve_call_start: "two_io" is not in meta.calls [mlp]' \
        in e.message(), e.message()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_load(srv, name):
    g, h = index_entries(srv)
    for what, entries in (("gRPC", g), ("REST", h)):
        assert name in entries, f"{what} index lacks {name}: {entries}"
        state, reason = entries[name]
        assert state == "UNAVAILABLE", f"{what} index: {name} is {state}"
        for part in REFUSED[name]:
            assert part in reason, f"{what} index: {name}: {reason!r} lacks {part!r}"


# ---- 15. BYTES through a meta ---------------------------------------------------------------

@pytest.mark.parametrize("proto", ("grpc", "http-binary", "http-json"))
def test_bytes_round_trip(srv, proto):
    words = [b"hello", b"", b"Mixed Case 123", "h\u00e9llo".encode(), b"a" * 1000]
    s = np.array(words, dtype=np.object_)
    u = infer(url_of(srv, proto), "upper", {"s": s}, ["u"], proto=proto)["u"]
    assert u.shape == (len(words),), u
    got = [v if isinstance(v, bytes) else v.encode() for v in u]  # JSON: str
    assert got == [w.upper() for w in words], u  # ASCII letters only


@pytest.mark.parametrize("proto", ("grpc", "http-binary", "http-json"))
def test_inputs_are_aligned_for_their_type(srv, proto):
    """A client's tensor sits wherever its bytes fell in the message (request
    ids of 0 to 7 characters shift them); bundle code gets it aligned for
    its element type all the same, so it may read a FP64 tensor as double *
    (regression: misaligned reads, which UBSan reports, in a meta reading
    the image it was sent as floats)."""
    x = np.arange(1, 6, dtype=np.float64) / 4
    for n in range(8):
        got = infer(url_of(srv, proto), "aligned", {"x": x}, ["offset", "total"], proto=proto,
                    request_id="r" * n)
        assert got["offset"].tolist() == [0], f"request id of {n} characters: {got}"
        assert got["total"].tolist() == [x.sum()], got


def test_statistics_of_all_models_omit_internal_models(srv):
    """Every model's statistics (REST /v2/models/stats, gRPC ModelStatistics
    with no name) leave out the models only metas call, as their own
    statistics answer NOT_FOUND."""
    status, doc, raw = http_json(srv.http_url, "GET", "/v2/models/stats")
    assert status == 200, raw
    names = [m["name"] for m in doc["model_stats"]]
    assert "mlp" not in names and "fanout" in names, names
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        names = [m.name for m in c.get_inference_statistics("").model_stats]
    assert "mlp" not in names and "fanout" in names, names
