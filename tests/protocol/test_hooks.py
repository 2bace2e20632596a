"""The rules of pre/post hooks, against the real server with tritonclient.

mlp_hooked is a hooked copy of the demo mlp (x f32 [batch,16] -> y f32
[batch,4]): clients send X f64 [batch,16] and get Y f64 [batch,4] (+ OFFSET);
its preprocess refuses NaN, and misbehaves on purpose when the request id
asks it to (fail, take scratch twice, call a sub-model; postprocess: a wrong
extent or byte count). Beside it, bundles the loader must refuse: an ABI
version of 99, no ABI symbol, model.c newer than model.so, model.c alone,
client_inputs without pjserve_preprocess, pjserve_run in a kind: model.

One server (static mode) serves the module; the reload test starts its own
in dynamic mode.
"""

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle_code import (build_hooks, copy_bundle, mark_source_newer, start_server, stop_server,
                         tensor_yaml, write_hooked, write_source)
from protocol_util import assert_matches, grpc_code, http_json, serve_only

HOOKED = "mlp_hooked"
CLIENT_INPUTS = tensor_yaml("X", "f64", ["batch", 16])
CLIENT_OUTPUTS = tensor_yaml("Y", "f64", ["batch", 4])

# mlp_hooked's hooks. The request ids fail-internal, scratch-twice,
# call-start, post-extent and post-nbytes make them misbehave on purpose.
MLP_HOOKS_C = """\
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <time.h>
#include <pjserve/model.h>

#define OFFSET {offset}

static int asked(pjserve_ctx *ctx, const char *what)
{{
    return strcmp(pjserve_request_id(ctx), what) == 0;
}}

/* X f64 [n,16] -> x f32 [n,16] */
int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                       pjserve_tensor *out, size_t n_out)
{{
    (void)n_in, (void)n_out;
    const double *X = in[0].data;
    int64_t rows = in[0].shape[0];
    if (asked(ctx, "fail-internal")) {{
        pjserve_error(ctx, "the hook failed on purpose");
        return PJSERVE_INTERNAL;
    }}
    if (asked(ctx, "scratch-twice")) {{
        size_t size = 64;
        void *p;
        int rc = pjserve_scratch(ctx, &size, 1, &p);
        return rc != PJSERVE_OK ? rc : pjserve_scratch(ctx, &size, 1, &p);
    }}
    if (asked(ctx, "call-start")) {{
        pjserve_subcall *call;
        return pjserve_call_start(ctx, "mlp", in, 1, &call);
    }}
    if (asked(ctx, "spin-until-cancelled")) {{
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        double spun = 0;
        while (!pjserve_cancelled(ctx) && spun < 5.0) {{
            clock_gettime(CLOCK_MONOTONIC, &now);
            spun = (double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
        }}
        if (spun >= 5.0) {{
            pjserve_error(ctx, "not cancelled after 5 s of spinning");
            return PJSERVE_INTERNAL;
        }}
        pjserve_error(ctx, "cancelled after %.0f ms of spinning; remaining %lld ns",
                      spun * 1e3, (long long)pjserve_remaining_ns(ctx));
        return PJSERVE_DEADLINE_EXCEEDED;
    }}
    for (int64_t i = 0; i < rows * 16; i++)
        if (isnan(X[i])) {{
            pjserve_error(ctx, "X[%lld][%lld] is NaN: send finite numbers", (long long)(i / 16),
                          (long long)(i % 16));
            return PJSERVE_INVALID_ARGUMENT;
        }}
    float *x = pjserve_alloc(ctx, (size_t)rows * 16 * sizeof *x);
    if (x == NULL) {{
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }}
    for (int64_t i = 0; i < rows * 16; i++)
        x[i] = (float)X[i];
    out[0].shape[0] = rows;
    out[0].data = x;
    out[0].nbytes = (size_t)rows * 16 * sizeof *x;
    return PJSERVE_OK;
}}

/* y f32 [n,4] -> Y f64 [n,4] + OFFSET */
int pjserve_postprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                        pjserve_tensor *out, size_t n_out)
{{
    (void)n_in, (void)n_out;
    const float *y = in[0].data;
    int64_t rows = in[0].shape[0];
    double *Y = pjserve_alloc(ctx, (size_t)rows * 4 * sizeof *Y);
    if (Y == NULL) {{
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }}
    for (int64_t i = 0; i < rows * 4; i++)
        Y[i] = (double)y[i] + OFFSET;
    out[0].shape[0] = rows;
    out[0].data = Y;
    out[0].nbytes = (size_t)rows * 4 * sizeof *Y;
    if (asked(ctx, "post-extent"))
        out[0].shape[1] = 5;
    if (asked(ctx, "post-nbytes"))
        out[0].nbytes -= sizeof *Y;
    return PJSERVE_OK;
}}
"""


def mlp_hooks_source(offset: float) -> str:
    return MLP_HOOKS_C.format(offset=repr(float(offset)))


# Entry points declared without the header (plain pointers, the same calling
# convention), so the ABI symbol is whatever the source says.
NO_HEADER_C = """\
#include <stddef.h>
{abi_line}
int pjserve_preprocess(void *ctx, const void *in, size_t n_in, void *out, size_t n_out)
{{
    (void)ctx, (void)in, (void)n_in, (void)out, (void)n_out;
    return 7;
}}

int pjserve_postprocess(void *ctx, const void *in, size_t n_in, void *out, size_t n_out)
{{
    (void)ctx, (void)in, (void)n_in, (void)out, (void)n_out;
    return 7;
}}
"""

POSTPROCESS_ONLY_C = """\
#include <pjserve/model.h>

int pjserve_postprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                        pjserve_tensor *out, size_t n_out)
{
    (void)ctx, (void)in, (void)n_in, (void)out, (void)n_out;
    return PJSERVE_INTERNAL;
}
"""

RUN_IN_MODEL_C = MLP_HOOKS_C.format(offset="0.0") + """
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)ctx, (void)in, (void)n_in, (void)out, (void)n_out;
    return PJSERVE_INTERNAL;
}
"""

# Bundles the loader refuses, and what the repository index must say.
REFUSED = {
    "abi_99": ["built for bundle ABI version 99", "this server wants version 1",
               "pjserve build-hooks"],
    "abi_missing": ["no pjserve_model_abi_version symbol", "<pjserve/model.h>",
                    "wants ABI version 1"],
    "source_newer": ["model.c is newer than model.so", "pjserve build-hooks"],
    "source_only": ["model.c has no model.so beside it", "pjserve build-hooks"],
    "no_preprocess": ["declares client_inputs", "does not export pjserve_preprocess"],
    "run_in_model": ["exports pjserve_run", "only kind: meta bundles"],
}


def write_refused_bundles(repo, mlp, pjserve_bin):
    def hooked(name, source, build=True):
        return write_hooked(repo, mlp, name, CLIENT_INPUTS, CLIENT_OUTPUTS, source,
                            pjserve_bin if build else None)

    hooked("abi_99", NO_HEADER_C.format(
        abi_line="const unsigned pjserve_model_abi_version = 99;"))
    hooked("abi_missing", NO_HEADER_C.format(abi_line=""))
    mark_source_newer(hooked("source_newer", mlp_hooks_source(0)))
    hooked("source_only", mlp_hooks_source(0), build=False)
    hooked("no_preprocess", POSTPROCESS_ONLY_C)
    hooked("run_in_model", RUN_IN_MODEL_C)


@pytest.fixture(scope="module")
def hooks_server(pjserve_bin, plugin_path, cache_dir, exported, tmp_path_factory):
    repo = tmp_path_factory.mktemp("hooks-repository")
    mlp = exported["mlp"].path
    copy_bundle(repo, mlp, "mlp")
    write_hooked(repo, mlp, HOOKED, CLIENT_INPUTS, CLIENT_OUTPUTS, mlp_hooks_source(0),
                 pjserve_bin)
    write_refused_bundles(repo, mlp, pjserve_bin)
    s = start_server(pjserve_bin, plugin_path, repo, cache_dir,
                     tmp_path_factory.mktemp("hooks-server"),
                     ["--model-control-mode", "static"], "hooks", refuses_some=True)
    yield s
    stop_server(s)


@pytest.fixture
def srv(hooks_server):
    assert hooks_server.alive(), hooks_server.describe()
    yield hooks_server
    assert hooks_server.alive(), f"the server died during this test\n{hooks_server.describe()}"


@pytest.fixture(scope="module")
def mlp_reference(exported):
    model = exported["mlp"].model

    def reference(X: np.ndarray, offset: float = 0.0) -> np.ndarray:
        (y,) = model.reference(X.astype(np.float32))
        return np.asarray(y).astype(np.float64) + offset
    return reference


def sample_X(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 16))


def hooked_infer(url: str, proto: str, X: np.ndarray, request_id: str = "", model=HOOKED,
                 **kw) -> np.ndarray:
    """Y from mlp_hooked over gRPC, HTTP binary or HTTP JSON."""
    if proto == "grpc":
        with grpcclient.InferenceServerClient(url) as c:
            i = grpcclient.InferInput("X", list(X.shape), "FP64")
            i.set_data_from_numpy(X)
            return c.infer(model, [i], request_id=request_id, **kw).as_numpy("Y")
    binary = proto == "http-binary"
    with httpclient.InferenceServerClient(url) as c:
        i = httpclient.InferInput("X", list(X.shape), "FP64")
        i.set_data_from_numpy(X, binary_data=binary)
        out = [httpclient.InferRequestedOutput("Y", binary_data=binary)]
        return c.infer(model, [i], outputs=out, request_id=request_id, **kw).as_numpy("Y")


def url_of(s, proto: str) -> str:
    return s.grpc_url if proto == "grpc" else s.http_url


def expect_error(s, proto: str, X: np.ndarray, request_id: str, grpc_status: str,
                 http_status: int, message: str):
    with pytest.raises(InferenceServerException) as ei:
        hooked_infer(url_of(s, proto), proto, X, request_id)
    e = ei.value
    if proto == "grpc":
        assert grpc_code(e) == grpc_status, f"{request_id}: {e}"
    else:
        assert e.status() == str(http_status), f"{request_id}: {e}"
    assert message in e.message(), f"{request_id}: {e.message()!r} lacks {message!r}"


PROTOCOLS = ("grpc", "http-binary", "http-json")


# ---- 1. the round trip and what clients see -----------------------------------

@pytest.mark.parametrize("proto", PROTOCOLS)
def test_round_trip_matches_reference(srv, mlp_reference, proto):
    for rows, seed in ((1, 11), (3, 12), (8, 13)):
        X = sample_X(rows, seed)
        Y = hooked_infer(url_of(srv, proto), proto, X)
        assert_matches("mlp", "Y", Y, mlp_reference(X), f"{proto} rows={rows}")


def test_metadata_and_config_show_client_tensors(srv):
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        md = c.get_model_metadata(HOOKED, as_json=True)
        cfg = c.get_model_config(HOOKED, as_json=True)["config"]
    with httpclient.InferenceServerClient(srv.http_url) as c:
        hmd = c.get_model_metadata(HOOKED)
        hcfg = c.get_model_config(HOOKED)
    for what, m in (("gRPC", md), ("REST", hmd)):
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in m["inputs"]] \
            == [("X", "FP64", [-1, 16])], f"{what} metadata inputs: {m['inputs']}"
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in m["outputs"]] \
            == [("Y", "FP64", [-1, 4])], f"{what} metadata outputs: {m['outputs']}"
    for what, c in (("gRPC", cfg), ("REST", hcfg)):
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in c["input"]] \
            == [("X", "TYPE_FP64", [16])], f"{what} config inputs: {c['input']}"
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in c["output"]] \
            == [("Y", "TYPE_FP64", [4])], f"{what} config outputs: {c['output']}"
        assert int(c["max_batch_size"]) == 8, f"{what} config: {c}"


def test_executable_tensors_are_not_what_clients_send(srv):
    """The executable's x (f32) is not a client input of the hooked model."""
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        i = grpcclient.InferInput("x", [1, 16], "FP32")
        i.set_data_from_numpy(np.zeros((1, 16), np.float32))
        with pytest.raises(InferenceServerException) as ei:
            c.infer(HOOKED, [i])
    assert grpc_code(ei.value) == "INVALID_ARGUMENT", str(ei.value)
    assert f'model {HOOKED}: unexpected input "x"' in ei.value.message(), ei.value.message()
    assert "X" in ei.value.message().split("inputs:")[-1], ei.value.message()


# ---- 2. hook errors ---------------------------------------------------------------

NAN_MESSAGE = f"model {HOOKED}: preprocess: X[1][5] is NaN: send finite numbers"


def nan_X() -> np.ndarray:
    X = sample_X(3, 21)
    X[1, 5] = np.nan
    return X


# (JSON has no NaN: HTTP JSON cannot send this input.)
@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_hook_invalid_argument_carries_its_message(srv, proto):
    expect_error(srv, proto, nan_X(), "", "INVALID_ARGUMENT", 400, NAN_MESSAGE)


@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_hook_internal_carries_its_message(srv, proto):
    expect_error(srv, proto, sample_X(2, 22), "fail-internal", "INTERNAL", 500,
                 f"model {HOOKED}: preprocess: the hook failed on purpose")


@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_postprocess_wrong_output_is_internal_naming_the_tensor(srv, proto):
    X = sample_X(3, 23)
    expect_error(srv, proto, X, "post-extent", "INTERNAL", 500,
                 f'model {HOOKED}: postprocess gave tensor "Y" extent 5 in dimension 1; '
                 "it is declared 4")
    expect_error(srv, proto, X, "post-nbytes", "INTERNAL", 500,
                 f'model {HOOKED}: postprocess gave tensor "Y" 88 bytes; its shape and dtype '
                 "make 96")


def test_hook_errors_do_not_disturb_other_requests(srv, mlp_reference, cases):
    """Good and failing requests interleaved from 6 threads, both protocols:
    every good one is right, every failing one fails as it should."""
    mlp_case = cases.get("mlp", 3, seed=31)
    X = sample_X(4, 32)
    want = mlp_reference(X)
    rounds = 8

    def mlp_ok(proto, url):
        x = mlp_case.inputs["x"]
        mod = grpcclient if proto == "grpc" else httpclient
        with mod.InferenceServerClient(url) as c:
            i = mod.InferInput("x", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            got = c.infer("mlp", [i]).as_numpy("y")
        assert_matches("mlp", "y", got, mlp_case.expected["y"], f"mlp over {proto}")

    def hooked_ok(proto, url):
        assert_matches("mlp", "Y", hooked_infer(url, proto, X), want, f"{HOOKED} over {proto}")

    def failing(request_id, status, http, message, data=None):
        def check(proto, url):
            with pytest.raises(InferenceServerException) as ei:
                hooked_infer(url, proto, X if data is None else data, request_id)
            got = grpc_code(ei.value) if proto == "grpc" else ei.value.status()
            assert got == (status if proto == "grpc" else str(http)), str(ei.value)
            assert message in ei.value.message(), ei.value.message()
        return check

    kinds = [mlp_ok, hooked_ok,
             failing("", "INVALID_ARGUMENT", 400, NAN_MESSAGE, nan_X()),
             failing("fail-internal", "INTERNAL", 500, "the hook failed on purpose"),
             failing("post-extent", "INTERNAL", 500, 'tensor "Y" extent 5'),
             failing("post-nbytes", "INTERNAL", 500, 'tensor "Y" 120 bytes')]
    errors, done = [], [0]
    lock = threading.Lock()

    def worker(tid):
        try:
            for r in range(rounds):
                proto = ("grpc", "http-binary")[(tid + r) % 2]
                kinds[(tid + r) % len(kinds)](proto, url_of(srv, proto))
                with lock:
                    done[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append((tid, e))

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "requests hang"
    assert not errors, errors
    assert done[0] == 6 * rounds


# ---- 3, 4. bundles refused at load -------------------------------------------------

def index_entries(s):
    with grpcclient.InferenceServerClient(s.grpc_url) as c:
        g = {m.name: (m.state, m.reason) for m in c.get_model_repository_index().models}
    status, doc, raw = http_json(s.http_url, "POST", "/v2/repository/index", {})
    assert status == 200, raw
    h = {m["name"]: (m.get("state"), m.get("reason", "")) for m in doc}
    return g, h


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_load_with_the_reason(srv, name):
    g, h = index_entries(srv)
    for what, entries in (("gRPC", g), ("REST", h)):
        assert name in entries, f"{what} index lacks {name}: {entries}"
        state, reason = entries[name]
        assert state == "UNAVAILABLE", f"{what} index: {name} is {state}"
        for part in REFUSED[name]:
            assert part in reason, f"{what} index: {name}: {reason!r} lacks {part!r}"
    # Requests are refused with the same reason.
    with pytest.raises(InferenceServerException) as ei:
        hooked_infer(srv.grpc_url, "grpc", sample_X(1, 41), model=name)
    assert grpc_code(ei.value) == "UNAVAILABLE", str(ei.value)
    assert REFUSED[name][0] in ei.value.message(), ei.value.message()


def test_serving_models_listed_ready(srv):
    g, h = index_entries(srv)
    for entries in (g, h):
        assert entries["mlp"][0] == "READY" and entries[HOOKED][0] == "READY", entries


# ---- 6. services a hook may not use the way it tried --------------------------------

@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_scratch_twice_refused(srv, proto):
    expect_error(srv, proto, sample_X(1, 51), "scratch-twice", "INVALID_ARGUMENT", 400,
                 f"model {HOOKED}: preprocess: pjserve_scratch was already called for this "
                 "request: ask for every buffer in one call")


@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_hook_sees_the_deadline_pass(srv, proto):
    """A hook spinning until pjserve_cancelled (at most 5 s) with a 200 ms
    timeout stops at the deadline: DEADLINE_EXCEEDED with its own message,
    within 2 s; the server answers the next request."""
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as ei:
        hooked_infer(url_of(srv, proto), proto, sample_X(1, 0), "spin-until-cancelled",
                     timeout=200_000)
    took = time.monotonic() - started
    e = ei.value
    if proto == "grpc":
        assert grpc_code(e) == "DEADLINE_EXCEEDED", e
    assert f"model {HOOKED}: preprocess: cancelled after " in e.message(), e.message()
    assert "remaining 0 ns" in e.message(), e.message()
    assert took < 2.0, took
    assert hooked_infer(url_of(srv, proto), proto, sample_X(2, 1)).shape == (2, 4)


@pytest.mark.parametrize("proto", ("grpc", "http-binary"))
def test_call_start_from_a_hook_unsupported(srv, proto):
    # PJSERVE_UNSUPPORTED is gRPC UNIMPLEMENTED, HTTP 501.
    expect_error(srv, proto, sample_X(1, 52), "call-start", "UNIMPLEMENTED", 501,
                 f"model {HOOKED}: preprocess: pjserve_call_start: sub-model calls are made by "
                 "meta models (kind: meta) from pjserve_run, not by hooks")


# ---- 5. reload in dynamic mode under traffic ----------------------------------------

POLL_MS = 100
NEW_OFFSET = 1000.0


@serve_only("workers reload a bundle each at its own moment")
def test_hook_reload_under_traffic_loses_nothing(pjserve_bin, plugin_path, cache_dir, exported,
                                                 mlp_reference, tmp_path):
    """4 threads call mlp_hooked without pause while its model.c is rewritten
    (postprocess adds 1000) and rebuilt: every request succeeds with the old
    or the new answer, each thread switches once and never back, and the new
    answer arrives."""
    repo = tmp_path / "repo"
    repo.mkdir()
    bundle = write_hooked(repo, exported["mlp"].path, HOOKED, CLIENT_INPUTS, CLIENT_OUTPUTS,
                          mlp_hooks_source(0), pjserve_bin)
    s = start_server(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "srv",
                     ["--model-control-mode", "dynamic", "--repository-poll-ms", str(POLL_MS)],
                     "reload")
    try:
        X = sample_X(2, 61)
        old, new = mlp_reference(X), mlp_reference(X, NEW_OFFSET)
        stop = threading.Event()
        seen = [[] for _ in range(4)]  # per thread: "old" / "new" in order
        failures = []

        def worker(tid):
            proto = ("grpc", "http-binary")[tid % 2]
            url = url_of(s, proto)
            try:
                while not stop.is_set():
                    Y = hooked_infer(url, proto, X)
                    if np.allclose(Y, old, atol=1e-4):
                        seen[tid].append("old")
                    elif np.allclose(Y, new, atol=1e-4):
                        seen[tid].append("new")
                    else:
                        failures.append((tid, f"unexpected answer {Y}"))
                        return
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append((tid, e))

        threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        write_source(bundle, mlp_hooks_source(NEW_OFFSET))
        build_hooks(pjserve_bin, bundle)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not failures:
            if all(sq and sq[-1] == "new" for sq in seen):
                break
            time.sleep(0.05)
        time.sleep(0.3)  # more traffic on the new version
        stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "requests hang"
        assert not failures, failures
        for tid, sq in enumerate(seen):
            assert sq and sq[-1] == "new", \
                f"thread {tid} never saw the rebuilt hooks ({len(sq)} answers)\n{s.describe()}"
            first_new = sq.index("new")
            assert first_new > 0, f"thread {tid} saw no answer of the old hooks"
            assert "old" not in sq[first_new:], f"thread {tid} went back to the old hooks"
    finally:
        # The reload may first see model.c newer than model.so and keep the old
        # version serving (a WARN); nothing else may be logged as an error.
        stop_server(s)


def test_client_rows_past_the_largest_batch_size_are_invalid_argument(srv):
    """Batched client inputs are rows of the executable's batch: more than its
    largest compiled size (8, what the configuration reports) is the
    client's mistake, refused before preprocess runs."""
    X = np.zeros((20, 16))
    for proto in ("grpc", "http"):
        expect_error(srv, proto, X, f"rows-{proto}", "INVALID_ARGUMENT", 400, "20")
