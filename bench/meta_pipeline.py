#!/usr/bin/env python3
"""Composition benchmark: a two-stage detector as a pjserve meta model, against
the same stages orchestrated by the client and against Triton's BLS.

    .venv/bin/python bench/meta_pipeline.py      # or: make bench-meta

The pipeline is the `detector` example (python/pjserve_export/pipelines.py,
examples/bundles/detector/model.c): detector_stage1 (backbone + proposals)
over one f32 [3, 64, 64] image, glue that keeps the anchors above a score
threshold (greedy NMS) and pools each kept box's features into a [16, 4, 4]
grid, then detector_stage2 (a head) over the pooled boxes. Three ways to run
it, all driven over gRPC by the same client:

  meta     pjserve serve with the detector meta: one request; the C glue and
           both stage calls run inside the server, tensors by reference
  client   pjserve serve with the two stages public (a second repository in
           which no meta calls them): the client calls detector_stage1, runs
           the glue in numpy (bench/peers/composition.py), calls
           detector_stage2 (once per 16 boxes, stage 2's largest batch)
  bls      Triton server 2.51.0 from the nvidia-pytriton wheel
           (bench/peers/triton_bls_server.py, in .venv-bench-pytriton): both
           stages as jitted JAX in Python-backend stubs, and a detector model
           whose Python calls them with BLS (pb_utils.InferenceRequest.exec())
           and runs the same numpy glue in between

and the added cost of one sub-call: the demo mlp called directly, against a
meta whose run makes one pjserve_call of it (written here), and on Triton
the mlp against a BLS model making one exec() of it.

The image and threshold are picked so that --boxes boxes survive NMS (every
decision clear of float32 rounding); before timing, each pipeline answers the
detector's edge cases (zero boxes to 64) and the benchmark input, compared
with the numpy reference (pipeline_reference.py: float64, written
independently): same boxes kept and labels, max abs error printed.

Clients: a pool of worker processes (tritonclient gRPC, one synchronous
request at a time each, a closed loop); at concurrency c, c of them run. Each
measurement is --warmup seconds, then --seconds counted: requests completed
in the window, p50/p90/p99 latency, and CPU time per request of the server's
process tree (Triton's stubs included) and of the client processes, and the
server-side time (the growth of nv_inference_request_duration_us of the
models behind one client request, divided by the requests). Also recorded per
window: the cores that processes outside this benchmark used (the machine's
busy time from /proc/stat minus this benchmark's process tree). On a shared
machine the driver waits before each measurement for half a second in which
they used at most --max-other-cpu cores, and repeats a window in which they
used more (up to --retries times, the quietest kept), spending at most
--quiet-budget seconds on this in all. --rounds rounds in rotating order,
medians reported; the added cost of one sub-call is the median over rounds
of the difference between the two, measured one after the other.

Where the time goes, in one process before the servers start: each stage's
raw PJRT time (build/pjs_bench_raw_execute: upload, execute, read back), the
jitted JAX call of each stage (what Triton's stubs pay) and the numpy glue.

Writes bench/results/meta_pipeline.json (everything), .md (the tables of
docs/benchmarks.md) and docs/img/meta_pipeline.png (bench/plot_meta_pipeline.py,
with the matplotlib of .venv-bench-plot). Needs build/pjserve and
build/pjs_bench_raw_execute, .venv (scripts/bootstrap) and
.venv-bench-pytriton (scripts/bootstrap-bench pytriton). Servers listen on
127.0.0.1 with free ports.
"""

import argparse
import json
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (PJSERVE, RAW, ROOT, PjserveProcess, ServerProcess, find_plotter,
                      free_ports, git_revision, http_get, log, machine_info, metric,
                      missing_tools, parse_metrics, remove_workdir, tree_cpu_seconds,
                      write_report)

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

PLOT = ROOT / "bench" / "plot_meta_pipeline.py"
PYTRITON = ROOT / ".venv-bench-pytriton" / "bin" / "python"
TRITON_SCRIPT = ROOT / "bench" / "peers" / "triton_bls_server.py"

PIPELINES = {"meta": "pjserve meta (C glue in-process)",
             "client": "client-orchestrated (pjserve stages, numpy glue over gRPC)",
             "bls": "Triton BLS (Python backend, numpy glue)"}
SUBCALLS = {"pjserve_direct": "pjserve: mlp directly",
            "pjserve_meta": "pjserve: meta with one sub-call of mlp",
            "triton_direct": "Triton: mlp directly (Python backend)",
            "triton_bls": "Triton: BLS model with one exec() of mlp"}
# The pairs whose p50 difference is the cost of one sub-call.
SUBCALL_PAIRS = (("pjserve", "pjserve_direct", "pjserve_meta"),
                 ("Triton", "triton_direct", "triton_bls"))
TRITON_MODELS = ("detector_stage1", "detector_stage2", "detector", "mlp", "mlp_bls")

# ---- the bench models --------------------------------------------------------------

# One sub-call, nothing else: the client's x goes to mlp by reference and
# mlp's y comes back to the client as it is.
MLP_META_C = b"""\
/* mlp_meta: the demo mlp behind a meta that calls it once (bench/meta_pipeline.py). */
#include <pjserve/model.h>

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    const pjserve_tensor *y;
    size_t n_y;
    int rc = pjserve_call(ctx, "mlp", in, 1, &y, &n_y);
    if (rc != PJSERVE_OK)
        return rc;
    out[0].shape[0] = y[0].shape[0];
    out[0].data = y[0].data;
    out[0].nbytes = y[0].nbytes;
    return PJSERVE_OK;
}
"""


def export_models(repo, pjserve_bin):
    """The detector's three bundles, the demo mlp and mlp_meta into repo;
    returns {name: path}."""
    from pjserve_export import hooks as H
    from pjserve_export import pipelines as P
    from pjserve_export.demo import demo_models

    build = H.hooks_builder(pjserve_bin)
    paths = P.export_pipeline("detector", repo, build=build)
    paths["mlp"] = demo_models(["mlp"])[0].export(repo, batch_sizes=(1, 2, 4, 8))
    paths["mlp_meta"] = H.export_meta(
        repo, name="mlp_meta", calls=["mlp"], client_inputs=[("x", "f32", [1, 16])],
        client_outputs=[("y", "f32", [1, 4])], source=MLP_META_C, build=build,
        description="the demo mlp behind one sub-call (bench/meta_pipeline.py)")
    return paths


def public_repository(paths, repo):
    """A second repository, of links to the stages and mlp only: no meta calls
    them there, so clients may."""
    repo.mkdir(parents=True)
    for name in ("detector_stage1", "detector_stage2", "mlp"):
        (repo / name).symlink_to(paths[name], target_is_directory=True)
    return repo


def benchmark_input(ref, boxes):
    """(IMAGE, SCORE_THRESHOLD) with exactly `boxes` boxes after NMS, every
    decision clear of float32 rounding: of the first image that has such a
    threshold, the lowest one (the most candidates for NMS to drop)."""
    import numpy as np
    from pjserve_export import pipeline_reference as R
    rng = np.random.default_rng(7)
    for _ in range(50):
        image = rng.standard_normal((3, 64, 64)).astype(np.float32)
        _, scores, _ = ref.stage1(image)
        found = None
        for candidates in range(boxes, 8 * boxes + 1):
            threshold = np.float32(R.threshold_for(scores, candidates))
            d = ref(image, threshold)
            if len(d.boxes) > boxes:
                break
            if len(d.boxes) == boxes and d.margin > R.MIN_MARGIN:
                found = (image, threshold)
        if found is not None:
            return found
    raise RuntimeError(f"no input found with {boxes} boxes clear of float32 rounding")


# ---- servers ----------------------------------------------------------------------

class Pjserve(PjserveProcess):
    def __init__(self, key, binary, repository, cache, log_path):
        self.key, self.binary, self.repository, self.cache, self.log_path = (
            key, binary, repository, cache, log_path)
        self.extra, self.proc = [], None

    def start(self, models, timeout=300):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        self.start_process()
        self.models = models
        self.timeout = timeout

    def wait_ready(self):
        self.wait_models_ready(self.models, time.monotonic() + self.timeout, self.timeout, 0.2)

    @property
    def url(self):
        return f"127.0.0.1:{self.grpc}"


class TritonBls(ServerProcess):
    key = "triton"

    def __init__(self, bundles, work, bls_instances):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.log_path = work / "triton.log"
        self.cmd = [str(PYTRITON), str(TRITON_SCRIPT), "--bundles", str(bundles),
                    "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                    "--metrics-port", str(self.metrics), "--workdir", str(work / "triton"),
                    "--bls-instances", str(bls_instances)]
        self.proc = None

    def start(self):
        self.start_process()

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        pending = list(TRITON_MODELS)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with status {self.proc.returncode}:\n"
                                   + self.log_tail())
            if time.monotonic() > deadline:
                raise RuntimeError(f"Triton: {pending} not ready after {timeout} s:\n"
                                   + self.log_tail())
            if http_get(f"http://127.0.0.1:{self.http}/v2/models/{pending[0]}/ready",
                        timeout=5.0)[0] == 200:
                pending.pop(0)
            else:
                time.sleep(0.5)
        meta = json.loads(http_get(f"http://127.0.0.1:{self.http}/v2", timeout=5.0)[1])
        self.version = f"{meta.get('name', '?')} {meta.get('version', '?')}"

    @property
    def url(self):
        return f"127.0.0.1:{self.grpc}"

    def stop(self):
        if self.proc is None:
            return
        self.terminate("tritonserver", 40)
        try:    # whatever is left of its process group (the backend stubs)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log_file.close()
        self.proc = None


# ---- clients ----------------------------------------------------------------------

def worker_main(conn):
    """A client process: runs the tasks the driver sends until it sends None.
    A task: {"url", "kind": "infer" (one request to "model" with "inputs",
    asking for "outputs") or "detect" (the client-orchestrated detector on
    "image" and "threshold"), and either "once" (answer the outputs of one
    request) or "warm_end" and "end" (time.monotonic() instants: requests
    until warm_end warm up; those completing by end are counted)}."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    import composition

    clients = {}

    def infer(client, model, inputs, outputs):
        ins = []
        for name, array in inputs.items():
            t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            t.set_data_from_numpy(array)
            ins.append(t)
        r = client.infer(model, ins,
                         outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
        return [r.as_numpy(n) for n in outputs]

    def request_fn(task):
        client = clients.get(task["url"])
        if client is None:
            client = clients[task["url"]] = grpcclient.InferenceServerClient(task["url"])
        if task["kind"] == "infer":
            return lambda: infer(client, task["model"], task["inputs"], task["outputs"])

        def stage1(image):
            return infer(client, composition.STAGE1, {"image": image},
                         composition.STAGE1_OUTPUTS)

        def stage2(rois):
            return infer(client, composition.STAGE2, {"rois": rois},
                         composition.STAGE2_OUTPUTS)
        return lambda: composition.detect(stage1, stage2, task["image"], task["threshold"])

    def cpu_seconds():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    while True:
        task = conn.recv()
        if task is None:
            break
        try:
            request = request_fn(task)
            if task.get("once"):
                conn.send({"outputs": [np.asarray(o) for o in request()]})
                continue
            while time.monotonic() < task["warm_end"]:
                request()
            latencies, cpu0 = [], cpu_seconds()
            while True:
                t0 = time.perf_counter()
                request()
                done = time.perf_counter()
                if time.monotonic() > task["end"]:
                    break
                latencies.append((done - t0) * 1e6)
            conn.send({"latencies_us": latencies, "cpu_s": cpu_seconds() - cpu0})
        except Exception as e:  # reported by the driver, which stops
            conn.send({"error": f"{type(e).__name__}: {e}"})
    for c in clients.values():
        c.close()


class ClientPool:
    def __init__(self, n):
        ctx = multiprocessing.get_context("spawn")   # the driver has started jax's threads
        self.workers = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(child,), daemon=True)
            p.start()
            self.workers.append((p, parent))

    def run(self, tasks):
        """Each task to its own worker; their answers in order."""
        for (_, conn), task in zip(self.workers, tasks):
            conn.send(task)
        answers = [conn.recv() for (_, conn), _ in zip(self.workers, tasks)]
        for a in answers:
            if "error" in a:
                raise RuntimeError(f"a client failed: {a['error']}")
        return answers

    def close(self):
        for p, conn in self.workers:
            conn.send(None)
        for p, _ in self.workers:
            p.join(timeout=10)


def busy_seconds():
    """CPU seconds the whole machine has been busy (all cores, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def our_cpu_seconds():
    """CPU seconds of this benchmark: this process and every process below
    it (the servers with Triton's stubs, the clients)."""
    return tree_cpu_seconds(os.getpid())


class QuietWaits:
    """Before a measurement, waits for half a second in which processes outside
    this benchmark used at most `limit` cores; at most `budget` seconds over
    the whole run, retried measurements included (then measures regardless)."""

    def __init__(self, limit, budget):
        self.limit, self.budget = limit, budget

    def spend(self, seconds):
        was = self.budget
        self.budget -= seconds
        if was > 0 >= self.budget:
            log("the time allowed for waiting for a quiet machine is spent: measuring "
                "regardless (see other_cpu_cores in the results)")

    def wait(self):
        while self.budget > 0:
            t0, busy0, ours0 = time.monotonic(), busy_seconds(), our_cpu_seconds()
            time.sleep(0.5)
            took = time.monotonic() - t0
            other = ((busy_seconds() - busy0) - (our_cpu_seconds() - ours0)) / took
            if other <= self.limit:
                return
            self.spend(took)


def percentile(sorted_values, q):
    """The q-th percentile of sorted values (nearest rank)."""
    last = len(sorted_values) - 1
    return sorted_values[min(last, int(round(q / 100 * last)))]


def request_us(server, models):
    """Microseconds the server has spent on successful requests of `models`
    (its nv_inference_request_duration_us counters), summed."""
    status, body = http_get(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10.0)
    if status != 200:
        raise RuntimeError(f"{server.key}: GET /metrics answered {status}")
    sample = parse_metrics(body.decode(errors="replace"))
    return sum(metric(sample, "nv_inference_request_duration_us", m) for m in models)


def measure(pool, task, concurrency, server, models, warmup_s, seconds):
    """One closed-loop measurement of `task` with `concurrency` clients."""
    start = time.monotonic() + 0.2
    warm_end, end = start + warmup_s, start + warmup_s + seconds
    for (_, conn) in pool.workers[:concurrency]:
        conn.send(dict(task, warm_end=warm_end, end=end))
    time.sleep(max(0.0, warm_end - time.monotonic()))
    # The scrape first, so that its own CPU stays outside the window.
    begin = (request_us(server, models), tree_cpu_seconds(server.proc.pid), our_cpu_seconds(),
             busy_seconds())
    time.sleep(max(0.0, end - time.monotonic()))
    after = (None, tree_cpu_seconds(server.proc.pid), our_cpu_seconds(), busy_seconds())
    answers = [conn.recv() for (_, conn) in pool.workers[:concurrency]]
    for a in answers:
        if "error" in a:
            raise RuntimeError(f"a client failed: {a['error']}")
    served_us = request_us(server, models) - begin[0]
    lat = sorted(v for a in answers for v in a["latencies_us"])
    n = len(lat)
    if n == 0:
        raise RuntimeError("no request completed in the window")
    return {"requests": n, "throughput": n / seconds,
            "p50_us": percentile(lat, 50), "p90_us": percentile(lat, 90),
            "p99_us": percentile(lat, 99), "mean_us": statistics.fmean(lat),
            "server_side_mean_us": served_us / n,
            "server_cpu_us_per_request": (after[1] - begin[1]) * 1e6 / n,
            "client_cpu_us_per_request": sum(a["cpu_s"] for a in answers) * 1e6 / n,
            "other_cpu_cores": max(0.0, (after[3] - begin[3]) - (after[2] - begin[2])) / seconds}


# ---- where the time goes ---------------------------------------------------------

def run_raw(raw, bundle, batch_size, iterations):
    out = subprocess.run([str(raw), str(bundle), "--batch-size", str(batch_size),
                          "--iterations", str(iterations), "--warmup", str(iterations // 10),
                          "--json"], check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def time_us(fn, iterations):
    """p50 and mean microseconds of fn() after iterations // 10 warm-up calls."""
    for _ in range(iterations // 10):
        fn()
    t = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e6)
    return {"p50": statistics.median(t), "mean": statistics.fmean(t)}


def in_process(paths, image, threshold, boxes, raw_bin, iterations):
    """Raw PJRT and jitted JAX time of each stage, and of the numpy glue."""
    import numpy as np

    import composition as C
    from pjserve_export import pipelines as P
    stage2_batch = next(b for b in P.DET_STAGE2_BATCH_SIZES if b >= min(boxes, 16))
    s1 = C.load_stage(C.STAGE1, paths[C.STAGE1], [np.zeros((3, 64, 64), np.float32)], 1)
    s2 = C.load_stage(C.STAGE2, paths[C.STAGE2], [np.zeros((16, 4, 4), np.float32)],
                      min(boxes, C.STAGE2_MAX_BATCH))
    mlp = C.load_stage("mlp", paths["mlp"], [np.zeros(16, np.float32)], 1)
    features, scores, anchors = s1(image[None])
    keep = C.select(scores[0], anchors[0], threshold)
    rois = C.pool(features[0], anchors[0][keep])
    logits, deltas = s2(rois[:C.STAGE2_MAX_BATCH])
    x = np.zeros((1, 16), np.float32)
    raw = {f"{C.STAGE1} (batch 1)": run_raw(raw_bin, paths[C.STAGE1], 1, iterations),
           f"{C.STAGE2} (batch {stage2_batch})": run_raw(raw_bin, paths[C.STAGE2],
                                                        stage2_batch, iterations),
           "mlp (batch 1)": run_raw(raw_bin, paths["mlp"], 1, iterations)}
    return {
        "raw_pjrt_us": {k: {"round_trip_p50": v["round_trip_us"]["p50"],
                            "execute_p50": v["execute_us"]["p50"]} for k, v in raw.items()},
        "jax_us": {f"{C.STAGE1} (batch 1)": time_us(lambda: s1(image[None]), iterations),
                   f"{C.STAGE2} ({len(rois[:C.STAGE2_MAX_BATCH])} rows)":
                       time_us(lambda: s2(rois[:C.STAGE2_MAX_BATCH]), iterations),
                   "mlp (batch 1)": time_us(lambda: mlp(x), iterations)},
        "numpy_glue_us": {
            "select (threshold + NMS)": time_us(
                lambda: C.select(scores[0], anchors[0], threshold), iterations),
            "pool": time_us(lambda: C.pool(features[0], anchors[0][keep]), iterations),
            "finish": time_us(lambda: C.finish(logits, deltas, scores[0][keep[:len(logits)]],
                                               anchors[0][keep[:len(logits)]]), iterations)}}


# ---- checks -------------------------------------------------------------------------

def detector_task(key, servers, image, threshold):
    if key == "client":
        return {"kind": "detect", "url": servers["public"].url, "image": image,
                "threshold": float(threshold)}
    import numpy as np
    return {"kind": "infer", "url": servers["meta" if key == "meta" else "triton"].url,
            "model": "detector", "outputs": ["BOXES", "SCORES", "LABELS"],
            "inputs": {"IMAGE": image, "SCORE_THRESHOLD": np.asarray([threshold], np.float32)}}


def subcall_task(key, servers, x):
    server, model = {"pjserve_direct": ("public", "mlp"), "pjserve_meta": ("meta", "mlp_meta"),
                     "triton_direct": ("triton", "mlp"), "triton_bls": ("triton", "mlp_bls")}[key]
    return {"kind": "infer", "url": servers[server].url, "model": model, "inputs": {"x": x},
            "outputs": ["y"]}


# The server each configuration talks to, and the models whose request
# durations (nv_inference_request_duration_us) make up one client request.
SERVED_BY = {"meta": ("meta", ["detector"]),
             "client": ("public", ["detector_stage1", "detector_stage2"]),
             "bls": ("triton", ["detector"]),
             "pjserve_direct": ("public", ["mlp"]), "pjserve_meta": ("meta", ["mlp_meta"]),
             "triton_direct": ("triton", ["mlp"]), "triton_bls": ("triton", ["mlp_bls"])}


def verify(pool, servers, ref, cases, mlp_weights, x):
    """Every pipeline against the numpy references: {key: {...}}."""
    import numpy as np
    out = {}
    for key in PIPELINES:
        worst_box = worst_score = 0.0
        for image, threshold, edge in cases:
            want = ref(image, threshold)
            boxes, scores, labels = pool.run(
                [dict(detector_task(key, servers, image, threshold), once=True)])[0]["outputs"]
            if len(boxes) != len(want.boxes) or not np.array_equal(labels, want.labels):
                raise RuntimeError(f"{key}, {edge}: {len(boxes)} boxes, labels {labels}; "
                                   f"the reference keeps {len(want.boxes)}, {want.labels}")
            if len(boxes):
                worst_box = max(worst_box, float(np.abs(boxes - want.boxes).max()))
                worst_score = max(worst_score, float(np.abs(scores - want.scores).max()))
        out[key] = {"cases": [edge for _, _, edge in cases],
                    "max_abs_error_boxes": worst_box, "max_abs_error_scores": worst_score}
        log(f"{PIPELINES[key]}: {len(cases)} inputs, same boxes and labels as the reference; "
            f"max abs error boxes {worst_box:.2g}, scores {worst_score:.2g}")
    w = mlp_weights
    want = np.maximum(x.astype(np.float64) @ w["dense1.w"] + w["dense1.b"], 0) \
        @ w["dense2.w"] + w["dense2.b"]
    for key in SUBCALLS:
        y = pool.run([dict(subcall_task(key, servers, x), once=True)])[0]["outputs"][0]
        out[key] = {"max_abs_error": float(np.abs(y - want).max())}
        log(f"{SUBCALLS[key]}: max abs error {out[key]['max_abs_error']:.2g}")
    return out


# ---- report --------------------------------------------------------------------------

def summarize(runs):
    keys = []
    for r in runs:
        if (r["key"], r["concurrency"]) not in keys:
            keys.append((r["key"], r["concurrency"]))
    out = []
    for key, c in keys:
        rs = [r for r in runs if (r["key"], r["concurrency"]) == (key, c)]
        out.append({"key": key, "concurrency": c, "rounds": len(rs),
                    **{k: statistics.median(r[k] for r in rs)
                       for k in ("throughput", "p50_us", "p90_us", "p99_us", "mean_us",
                                 "server_side_mean_us", "server_cpu_us_per_request",
                                 "client_cpu_us_per_request", "other_cpu_cores")}})
    return out


def paired(runs, direct, via, field):
    """The median over rounds of via's `field` minus direct's in the same round
    (measured one after the other: the machine's drift between rounds cancels)."""
    by = {(r["key"], r["round"]): r[field] for r in runs if r["concurrency"] == 1}
    diffs = [by[(via, n)] - by[(direct, n)] for (k, n) in by if k == direct and (via, n) in by]
    return statistics.median(diffs) if diffs else None


def derived(summary, runs, concurrencies):
    by = {(s["key"], s["concurrency"]): s for s in summary}
    ratios = []
    for c in concurrencies:
        meta = by.get(("meta", c))
        if meta is None:
            continue
        for key in ("client", "bls"):
            other = by.get((key, c))
            if other:
                ratios.append({"concurrency": c, "versus": key,
                               "p50_over_meta": other["p50_us"] / meta["p50_us"],
                               "p99_over_meta": other["p99_us"] / meta["p99_us"],
                               "meta_throughput_over": meta["throughput"] / other["throughput"]})
    subcalls = []
    for server, direct, via in SUBCALL_PAIRS:
        d, v = by.get((direct, 1)), by.get((via, 1))
        if d and v:
            subcalls.append({"server": server, "direct_p50_us": d["p50_us"],
                             "via_p50_us": v["p50_us"],
                             "added_p50_us": paired(runs, direct, via, "p50_us"),
                             "added_mean_us": paired(runs, direct, via, "mean_us"),
                             "added_server_side_us": paired(runs, direct, via,
                                                            "server_side_mean_us"),
                             "added_server_cpu_us": paired(runs, direct, via,
                                                           "server_cpu_us_per_request")})
    return ratios, subcalls


LABELS = {**PIPELINES, **SUBCALLS}


def markdown(result):
    lines = []
    ip = result.get("in_process")
    if ip:
        lines += ["| in one process | p50 us |", "|---|---:|"]
        for k, v in ip["raw_pjrt_us"].items():
            lines.append(f"| raw PJRT {k}: upload + execute + read back | "
                         f"{v['round_trip_p50']:.0f} |")
        for k, v in ip["jax_us"].items():
            lines.append(f"| jitted JAX call, {k} | {v['p50']:.0f} |")
        for k, v in ip["numpy_glue_us"].items():
            lines.append(f"| numpy glue: {k} | {v['p50']:.0f} |")
        lines.append("")
    lines += ["| pipeline | concurrency | requests/s | p50 us | p90 us | p99 us | mean us | "
              "server-side mean us | server CPU us/request | client CPU us/request |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in result["summary"]:
        name = LABELS[s["key"]]
        name = f"**{name}**" if s["key"] in ("meta", "pjserve_meta") else name
        lines.append(f"| {name} | {s['concurrency']} | {s['throughput']:.0f} | "
                     f"{s['p50_us']:.0f} | {s['p90_us']:.0f} | {s['p99_us']:.0f} | "
                     f"{s['mean_us']:.0f} | {s['server_side_mean_us']:.0f} | "
                     f"{s['server_cpu_us_per_request']:.0f} | "
                     f"{s['client_cpu_us_per_request']:.0f} |")
    if result["ratios"]:
        lines += ["", "| concurrency | against the meta | its p50 / meta p50 | "
                  "its p99 / meta p99 | meta requests/s / its requests/s |",
                  "|---:|---|---:|---:|---:|"]
        for r in result["ratios"]:
            lines.append(f"| {r['concurrency']} | {LABELS[r['versus']]} | "
                         f"{r['p50_over_meta']:.2f}x | {r['p99_over_meta']:.2f}x | "
                         f"{r['meta_throughput_over']:.2f}x |")
    if result["subcalls"]:
        lines += ["", "| server | direct p50 us | through one sub-call p50 us | added: p50 us | "
                  "mean us | server-side mean us | server CPU us/request |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in result["subcalls"]:
            lines.append(f"| {r['server']} | {r['direct_p50_us']:.0f} | {r['via_p50_us']:.0f} | "
                         f"**{r['added_p50_us']:.0f}** | {r['added_mean_us']:.0f} | "
                         f"{r['added_server_side_us']:.0f} | {r['added_server_cpu_us']:.0f} |")
    other = result["other_cpu_cores"]
    lines += ["", f"CPU used by other processes during the measurement windows: median "
              f"{other['median']:.2f} cores, max {other['max']:.2f} "
              f"(of {result['machine']['cores']}); load average "
              f"{result['loadavg_start'][0]:.2f} at the start."]
    return "\n".join(lines) + "\n"


def print_run(r):
    log(f"round {r['round'] + 1} {r['key']:15s} c={r['concurrency']}: "
        f"{r['throughput']:7.0f} req/s  p50 {r['p50_us']:7.0f} us  p99 {r['p99_us']:7.0f} us  "
        f"server-side {r['server_side_mean_us']:6.0f} us  server CPU "
        f"{r['server_cpu_us_per_request']:6.0f} us/req  client CPU "
        f"{r['client_cpu_us_per_request']:6.0f} us/req  other load {r['other_cpu_cores']:.2f}")


# ---- main ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8", help="comma-separated (default 1,8)")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="measured seconds per configuration and round (default 5)")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="seconds of traffic before each measurement (default 1)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds over every configuration, medians reported (default 3)")
    ap.add_argument("--max-other-cpu", type=float, default=0.25,
                    help="a measurement waits until processes outside the benchmark use at "
                         "most this many cores, and one during which they used more is "
                         "repeated (default 0.25)")
    ap.add_argument("--retries", type=int, default=2,
                    help="repeats of such a measurement; the quietest attempt is kept "
                         "(default 2)")
    ap.add_argument("--quiet-budget", type=float, default=180.0,
                    help="seconds the run may spend waiting for a quiet machine and "
                         "repeating measurements, in all (default 180)")
    ap.add_argument("--boxes", type=int, default=16,
                    help="boxes the benchmark image keeps after NMS (default 16: one "
                         "stage-2 execution of its largest compiled batch)")
    ap.add_argument("--bls-instances", type=int, default=2,
                    help="Triton stubs per BLS model (default 2, as pjserve's meta "
                         "concurrency)")
    ap.add_argument("--no-subcall", action="store_true",
                    help="skip the added cost of one sub-call")
    ap.add_argument("--iterations", type=int, default=2000,
                    help="iterations of each in-process timing (default 2000)")
    ap.add_argument("--build-dir", type=Path, default=PJSERVE.parent,
                    help="where pjserve and pjs_bench_raw_execute are (default build/)")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "meta_pipeline.json",
                    help="where the results go (default bench/results/meta_pipeline.json); "
                         "the tables go beside it as .md")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "meta_pipeline.png",
                    help="the plot (default docs/img/meta_pipeline.png)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    if a.boxes < 1 or a.boxes > 64:
        ap.error("--boxes: 1 to 64 (the detector keeps at most 64)")
    build = a.build_dir.absolute()
    pjserve_bin, raw_bin = build / PJSERVE.name, build / RAW.name
    problems = [p for p in missing_tools(build) if "perf_analyzer" not in p]
    if not PYTRITON.exists():
        problems.append(".venv-bench-pytriton is missing (scripts/bootstrap-bench pytriton)")
    if problems:
        sys.exit("meta_pipeline: " + "; ".join(problems))

    import numpy as np

    from pjserve_export import pipeline_reference as R

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-meta-"))
    servers, pool = {}, None
    result = {"machine": machine_info(glibc=True), "loadavg_start": os.getloadavg(),
              "revision": git_revision(),
              "settings": {"concurrency": concurrencies, "seconds": a.seconds,
                           "warmup_s": a.warmup, "rounds": a.rounds, "boxes": a.boxes,
                           "max_other_cpu": a.max_other_cpu, "retries": a.retries,
                           "quiet_budget_s": a.quiet_budget,
                           "bls_instances": a.bls_instances, "build_dir": str(build),
                           "client": "tritonclient gRPC, one synchronous request at a time "
                                     "per client process"}}
    try:
        log(f"exporting the detector, mlp and mlp_meta into {work}/repo")
        paths = export_models(work / "repo", pjserve_bin)
        ref = R.DetectorReference(paths["detector_stage1"], paths["detector_stage2"])
        image, threshold = benchmark_input(ref, a.boxes)
        cases = R.detector_cases(ref) + [(image, threshold, f"the benchmark input "
                                                             f"({a.boxes} boxes)")]
        result["input"] = {"boxes": a.boxes, "score_threshold": float(threshold),
                           "candidates_above_threshold": ref(image, threshold).candidates}
        log(f"benchmark input: {a.boxes} boxes kept of "
            f"{result['input']['candidates_above_threshold']} above the threshold "
            f"{float(threshold):.4f}")

        log("timing in one process: raw PJRT and jitted JAX per stage, the numpy glue")
        result["in_process"] = in_process(paths, image, threshold, a.boxes, raw_bin,
                                          a.iterations)

        cache = build / "bench-models" / "meta_pipeline" / "cache"
        servers["meta"] = Pjserve("pjserve (meta)", pjserve_bin, work / "repo", cache,
                                  work / "pjserve-meta.log")
        servers["public"] = Pjserve("pjserve (public stages)", pjserve_bin,
                                    public_repository(paths, work / "public"), cache,
                                    work / "pjserve-public.log")
        servers["triton"] = TritonBls(work / "repo", work, a.bls_instances)
        log("starting Triton (5 Python-backend models, 2 of them BLS) and two pjserve servers")
        servers["triton"].start()
        servers["meta"].start(["detector", "mlp_meta"])
        servers["meta"].wait_ready()
        servers["public"].start(["detector_stage1", "detector_stage2", "mlp"])
        servers["public"].wait_ready()
        servers["triton"].wait_ready()
        log(f"all ready; Triton: {servers['triton'].version}")
        pool = ClientPool(max(concurrencies))

        from pjserve_export.pipeline_reference import load_weights
        x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
        result["verification"] = verify(pool, servers, ref, cases, load_weights(paths["mlp"]), x)

        plan = [(key, c) for c in concurrencies for key in PIPELINES]
        if not a.no_subcall:
            plan += [(key, 1) for key in SUBCALLS]
        log(f"measuring {len(plan)} configurations x {a.rounds} rounds of "
            f"{a.warmup:g} + {a.seconds:g} s (about "
            f"{len(plan) * a.rounds * (a.warmup + a.seconds + 0.5) / 60:.1f} min)")
        runs, quiet = [], QuietWaits(a.max_other_cpu, a.quiet_budget)
        for rnd in range(a.rounds):
            order = plan[rnd % len(plan):] + plan[:rnd % len(plan)]
            for key, c in order:
                task = (detector_task(key, servers, image, threshold) if key in PIPELINES
                        else subcall_task(key, servers, x))
                server, models = SERVED_BY[key]
                attempts = []
                while True:
                    quiet.wait()
                    attempts.append(measure(pool, task, c, servers[server], models, a.warmup,
                                            a.seconds))
                    if attempts[-1]["other_cpu_cores"] <= a.max_other_cpu:
                        break
                    again = len(attempts) <= a.retries and quiet.budget > 0
                    log(f"{key} c={c}: other processes used "
                        f"{attempts[-1]['other_cpu_cores']:.2f} cores"
                        + (", measuring again" if again else ""))
                    if not again:
                        break
                    quiet.spend(a.warmup + a.seconds)
                r = min(attempts, key=lambda m: m["other_cpu_cores"])
                r.update(key=key, concurrency=c, round=rnd, attempts=len(attempts))
                runs.append(r)
                print_run(r)
        result["runs"] = runs
        result["summary"] = summarize(runs)
        result["ratios"], result["subcalls"] = derived(result["summary"], runs, concurrencies)
        other = [r["other_cpu_cores"] for r in runs]
        result["other_cpu_cores"] = {"median": statistics.median(other), "max": max(other)}
    finally:
        if pool is not None:
            pool.close()
        for s in servers.values():
            s.stop()
        remove_workdir(work, a.keep)

    write_report(result, started, a.json, markdown)
    plotter = find_plotter()
    if plotter is None:
        log("no plot: matplotlib lives in .venv-bench-plot (scripts/bootstrap-bench plot)")
    else:
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(plotter), str(PLOT), str(a.json), str(a.plot)], check=True)
        log(f"wrote {a.plot}")
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
