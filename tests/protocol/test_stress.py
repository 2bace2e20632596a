"""A concurrency stress run, written to be run under ThreadSanitizer as well
(`make tsan` runs this suite against the TSan-instrumented server, which
halts on the first data race).

For a fixed wall time (DURATION_S, whatever the machine's speed) 24 client
threads drive one server over gRPC unary, gRPC streaming, HTTP binary and
HTTP JSON at once, on four models (mlp, two_io, convnet, mlp_bf16) plus a
copy of mlp (mlp_reload) that another thread unloads and loads again through
the repository API while requests for it are in flight. Requests have random
batch sizes, most carry a random `timeout` parameter (50 us .. 20 ms, so a
good share expire while queued) and a few have invalid shapes.

Every reply must be one of: the correct output (JAX within tolerance);
DEADLINE_EXCEEDED / 504 for a request that had a timeout; INVALID_ARGUMENT /
400 for an invalid shape; UNAVAILABLE / 503 for mlp_reload (unloaded for a
while). Afterwards the server has nothing queued or in flight, each of the
four models' statistics account for every request it received (success =
correct replies, fail = expired + invalid), and SIGTERM stops it with exit
code 0 and no error or sanitizer line in its log.

Nothing here depends on timing: how many requests run, expire or coalesce
varies with the machine and only the accounting is asserted.
"""

import queue
import random
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protocol_util import (RELOAD_MODEL, Case, grpc_code, grpc_infer_case, grpc_inputs,
                           http_infer_case, metric, parse_metrics, run_threads, scrape)

DURATION_S = 8.0
THREADS = 24
MODELS = ("mlp", "two_io", "convnet", "mlp_bf16")
ALL = MODELS + (RELOAD_MODEL,)
ROWS = (1, 1, 1, 2, 3, 8)
SEEDS = (0, 1)
P_TIMEOUT = 0.6                  # share of requests with a `timeout` parameter
TIMEOUT_US = (50, 20_000)        # their range (log-uniform)
P_INVALID = 0.03                 # share of requests with an invalid shape
STREAM_WINDOW = 4                # requests in flight on one stream
ROLES = ("grpc", "grpc-stream", "http-binary", "http-json")
# Generous bounds for a slow (sanitized, 2-core) machine; never reached normally.
JOIN_TIMEOUT_S = DURATION_S + 600
REPLY_TIMEOUT_S = 300

# What a request may legitimately end as, besides a correct output.
OK, DEADLINE, INVALID, UNAVAILABLE = "ok", "deadline", "invalid", "unavailable"


def invalid_case(case: Case) -> Case:
    """The case with its first input one column short (byte size consistent
    with the wrong shape, so the request decodes and fails validation)."""
    inputs = dict(case.inputs)
    name = case.input_specs()[0].name
    a = inputs[name]
    inputs[name] = np.ascontiguousarray(a[..., :-1])
    return Case(case.model, case.n, inputs, {}, case.manifest)


def classify(e: InferenceServerException, proto: str) -> str:
    """The kind of an error reply, or a description of an unexpected one."""
    text = str(e)
    if proto == "grpc-stream":     # error_message only: no status code
        low = text.lower()
        if "deadline" in low:
            return DEADLINE
        if "is not loaded" in low:
            return UNAVAILABLE
        if "does not match" in low or "shape" in low:
            return INVALID
        return f"unexpected stream error: {text}"
    code = grpc_code(e) if proto == "grpc" else str(e.status())
    kind = {"DEADLINE_EXCEEDED": DEADLINE, "504": DEADLINE,
            "INVALID_ARGUMENT": INVALID, "400": INVALID,
            "UNAVAILABLE": UNAVAILABLE, "503": UNAVAILABLE}.get(code)
    return kind or f"unexpected error {code}: {text}"


class Tally:
    """Per model: replies by kind; unexpected replies, kept for the report."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_model = {m: {OK: 0, DEADLINE: 0, INVALID: 0, UNAVAILABLE: 0} for m in ALL}
        self.unexpected = []

    def add(self, model, kind, what=""):
        with self.lock:
            if kind in self.by_model[model]:
                self.by_model[model][kind] += 1
            else:
                self.unexpected.append(f"{what}: {kind}")


def judge(tally: Tally, case: Case, invalid: bool, timeout, proto: str, got=None, error=None,
          what=""):
    """Records one reply, checking it is an allowed outcome for its request."""
    model = case.model
    if error is None:
        if invalid:
            tally.add(model, "an invalid request succeeded", what)
            return
        try:
            case.check(got, what)
        except AssertionError as e:
            tally.add(model, f"wrong output: {e}", what)
            return
        tally.add(model, OK, what)
        return
    kind = classify(error, proto)
    allowed = {INVALID} if invalid else set()
    if timeout is not None:
        allowed.add(DEADLINE)
    if model == RELOAD_MODEL:
        allowed.add(UNAVAILABLE)
    if kind in (OK, DEADLINE, INVALID, UNAVAILABLE) and kind not in allowed:
        kind = f"{kind} not expected (invalid={invalid}, timeout={timeout}): {error}"
    elif kind == DEADLINE and f"model {model}" not in str(error):
        kind = f"the deadline message does not name model {model}: {error}"
    tally.add(model, kind, what)


# Both ways of running the next execution (serve --hand-off): a woken
# worker, or the thread that ran the last one (auto picks by CPU count).
@pytest.mark.parametrize("hand_off", ["on", "off"])
def test_stress_mixed_protocols_timeouts_reload(server_factory, cases, hand_off):
    srv = server_factory(names=ALL, extra_args=("--hand-off", hand_off))
    pool = {m: [cases.get(m, n, seed=500 + s) for n in sorted(set(ROWS)) for s in SEEDS]
            for m in ALL}
    tally = Tally()
    stop_at = time.monotonic() + DURATION_S
    sent = [0] * THREADS

    def next_request(rng):
        model = rng.choice(ALL)
        case = rng.choice(pool[model])
        if rng.random() < P_INVALID:
            case, invalid = invalid_case(case), True
        else:
            invalid = False
        timeout = None
        if rng.random() < P_TIMEOUT:
            lo, hi = np.log10(TIMEOUT_US[0]), np.log10(TIMEOUT_US[1])
            timeout = int(10 ** rng.uniform(lo, hi))
        return case, invalid, timeout

    def unary(tid, proto, rng):
        if proto == "grpc":
            c = grpcclient.InferenceServerClient(srv.grpc_url)
        else:
            c = httpclient.InferenceServerClient(srv.http_url, network_timeout=REPLY_TIMEOUT_S,
                                                 connection_timeout=60)
        try:
            while time.monotonic() < stop_at:
                case, invalid, timeout = next_request(rng)
                kw = {} if timeout is None else {"timeout": timeout}
                what = f"thread {tid} {proto} #{sent[tid]} {case.model} n={case.n}"
                sent[tid] += 1
                try:
                    if proto == "grpc":
                        got, _ = grpc_infer_case(c, case, **kw)
                    elif proto == "http-binary":
                        got, _ = http_infer_case(c, case, **kw)
                    else:
                        bf16 = any(s.dtype == "bf16" for s in case.input_specs())
                        got, _ = http_infer_case(c, case, binary_in=bf16, binary_out=False,
                                                 **kw)
                except InferenceServerException as e:
                    judge(tally, case, invalid, timeout, proto, error=e, what=what)
                    continue
                judge(tally, case, invalid, timeout, proto, got=got, what=what)
        finally:
            c.close()

    def stream(tid, rng):
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        replies = queue.Queue()
        c.start_stream(callback=lambda result, error: replies.put((result, error)))
        try:
            while time.monotonic() < stop_at:
                window = {}
                for _ in range(STREAM_WINDOW):
                    case, invalid, timeout = next_request(rng)
                    rid = f"t{tid}-{sent[tid]}"
                    sent[tid] += 1
                    window[rid] = (case, invalid, timeout)
                    kw = {} if timeout is None else {"timeout": timeout}
                    c.async_stream_infer(case.model, grpc_inputs(case), request_id=rid, **kw)
                for _ in range(STREAM_WINDOW):
                    result, error = replies.get(timeout=REPLY_TIMEOUT_S)
                    if error is None:
                        rid = result.get_response().id
                        case, invalid, timeout = window.pop(rid)
                        got = {n: result.as_numpy(n) for n in case.output_names()}
                        judge(tally, case, invalid, timeout, "grpc-stream", got=got,
                              what=f"thread {tid} stream {rid} {case.model} n={case.n}")
                    else:
                        # An error_message carries no id: the stream answers in
                        # order, so it belongs to the oldest request unanswered.
                        rid = next(iter(window))
                        case, invalid, timeout = window.pop(rid)
                        judge(tally, case, invalid, timeout, "grpc-stream", error=error,
                              what=f"thread {tid} stream {rid} {case.model} n={case.n}")
        finally:
            c.stop_stream()
            c.close()

    def worker(tid):
        rng = random.Random(7000 + tid)
        role = ROLES[tid % len(ROLES)]
        if role == "grpc-stream":
            stream(tid, rng)
        else:
            unary(tid, role, rng)

    reloads = {"cycles": 0, "errors": []}

    def reloader():
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            while time.monotonic() < stop_at - 1.0:
                time.sleep(1.0)
                try:
                    c.unload_model(RELOAD_MODEL)
                    time.sleep(0.5)
                finally:
                    c.load_model(RELOAD_MODEL)   # always leave it loaded
                reloads["cycles"] += 1
        except InferenceServerException as e:
            reloads["errors"].append(str(e))
        finally:
            c.close()

    r = threading.Thread(target=reloader, daemon=True)
    r.start()
    _, errors = run_threads(worker, THREADS, JOIN_TIMEOUT_S)
    r.join(JOIN_TIMEOUT_S)
    assert not r.is_alive(), "the unload/load thread hangs"
    assert srv.alive(), f"the server died under the stress run\n{srv.describe()}"
    assert not errors, (f"{len(errors)} of {THREADS} client threads failed; first: thread "
                        f"{errors[0][0]}: {errors[0][1]!r}\n{srv.describe()}")
    assert not tally.unexpected, (f"{len(tally.unexpected)} unexpected replies; first ones:\n"
                                  + "\n".join(tally.unexpected[:10]) + "\n" + srv.describe())
    assert not reloads["errors"], reloads["errors"]
    assert reloads["cycles"] >= 1, "mlp_reload was never unloaded and loaded again"
    total = sum(sum(k.values()) for k in tally.by_model.values())
    assert total == sum(sent), (total, sum(sent))
    print(f"stress: {total} requests, {reloads['cycles']} unload/load cycles: "
          f"{tally.by_model}")

    # Nothing left queued or in flight (polled: completions may still be
    # finishing when the last reply has been read).
    deadline = time.monotonic() + 60
    while True:
        samples = parse_metrics(scrape(srv.metrics_url))[0]
        in_flight = metric(samples, "pjserve_requests_in_flight")
        depth = metric(samples, "pjserve_queue_depth")
        if (in_flight, depth) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (in_flight, depth) == (0, 0), f"in flight {in_flight}, queued {depth} when idle"

    # Every request each model received is accounted for.
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        stats = {s.name: s for s in c.get_inference_statistics().model_stats}
    finally:
        c.close()
    for m in MODELS:
        st, t = stats[m].inference_stats, tally.by_model[m]
        assert st.success.count == t[OK], (m, st.success.count, t)
        assert st.fail.count == t[DEADLINE] + t[INVALID], (m, st.fail.count, t)
        assert t[UNAVAILABLE] == 0, (m, t)
        assert stats[m].inference_count >= stats[m].execution_count, stats[m]
        assert st.queue.count == st.success.count, stats[m]

    problems = srv.stop_and_check()
    assert not problems, "\n".join(problems) + "\n" + srv.describe()
