#!/usr/bin/env python3
"""Residency benchmark: the device weight cache of pjserve serve.

    .venv/bin/python bench/residency.py          # or: make bench-residency

Every model's weights live in host RAM; a model's weights are copied to the
device when it runs and stay there while --device-weight-budget has room,
the least recently used evicted first. Two parts (each can be picked with
--parts):

  load    cold-load time and bandwidth against model size. For each --sizes
          S (MiB, default 1,4,16,64,256) a model with one dense layer,
          x f32 [batch,K] -> x @ W + b with W f32 [K,K] (K*K*4 bytes = S MiB),
          and a copy of it under a second name; a server whose budget (1.5 S)
          holds one of the two. Requests alternate between them, so each
          loads S bytes (a miss); the same request repeated at once is a hit.
          Load time per load = delta pjserve_weight_load_seconds_total /
          delta pjserve_weight_loads_total over the run; the client's miss
          minus hit latency (medians) as a cross-check. Compared with host
          memory copies of the same size measured in the same run with numpy
          (np.copyto, one thread): into a buffer already written once, and
          into a newly allocated one (np.empty, then copyto: pays the page
          faults, as a fresh device allocation on the CPU plugin may).
  zipf    many models. N models (--models, default 5,10,20,40) of one size
          (--zipf-size-mib, default 16) under a budget of --budget-fraction
          (default 0.2) of their weights together; --threads Python threads
          (default 8) each send batch-1 gRPC requests back to back
          (tritonclient), each to a model drawn from a Zipf law (--zipf-s,
          default 1.1; model ranks shuffled with a fixed seed). After
          --settle seconds, --seconds of measurement: p50/p99 client latency,
          requests/s, and from /metrics the hit rate, 1 - delta loads / delta
          requests (and per execution, since concurrent requests for one model
          may run as one). The same traffic against a server with no budget
          (every model stays resident) is the reference. For comparison: the
          hit rate an LRU cache of the same number of models has on a
          sequential stream drawn from the same law (simulated), and that of
          keeping the most popular models resident.
  curve   throughput and p99 against the number of models. N models
          (--curve-models, default 5 to 200) of --curve-size-mib (4.5) under
          budgets of --curve-budgets (10 % and 20 %) of their weights, the
          Zipf traffic of `zipf`. For every N and budget, one run of each
          configuration of --configs (extra `pjserve serve` arguments: lru,
          lfu, lfu+defer, each without prefetch, and default, the server's
          defaults: lfu, deferral and prefetch; --config NAME=ARGS defines
          more), and, with
          --pjserve-baseline BIN, the same traffic against that binary with
          no extra arguments ("baseline"), each on a freshly started server,
          their order rotating from one N and budget to the next. The
          reference: no budget, every model resident, run per N and binary
          before and after the budgeted runs (--curve-reference-runs); the
          run of more requests/s counts.
          Per run: requests/s, p50, p99, both against the reference of the
          same binary, hit rate per request and per execution, time loading,
          loads/s. The requests the clients sent in the first configuration's
          run (time, thread, model; the first --trace-requests) go to
          --trace-dir/N<N>_<budget>pct.csv, for replaying eviction policies.
          40 models at 10 % is the setting of the goal: at least 0.8 of the
          all-resident throughput with p99 at most 2x; printed at the end.

Writes bench/results/residency.json (everything), bench/results/residency.md
(the tables of docs/benchmarks.md), docs/img/residency.png (load, zipf) and
docs/img/residency_curve.png (curve) (bench/plot_residency.py, run with a
Python that has matplotlib: .venv-bench-plot from `scripts/bootstrap-bench
plot`). --quick: a short run of every part for development, its results under
build/bench-residency-quick/ unless --json, --plot-dir or --trace-dir say
otherwise. Needs build/pjserve (cmake --build build) and .venv
(scripts/bootstrap). The bench models are exported once into
build/bench-models/residency/ (again when their definition, jax or the
exporter changes); the copies under other names are hard links. Servers
listen on 127.0.0.1 with free ports.
"""

import argparse
import csv
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import (PJSERVE, ROOT, PjserveProcess, find_plotter, fmt, git_revision, log,
                      machine_info, model_fingerprint, parse_parts, remove_workdir, write_report)

sys.path.insert(0, str(ROOT / "python"))

PLOT = ROOT / "bench" / "plot_residency.py"
MODELS_DIR = ROOT / "build" / "bench-models" / "residency"
PARTS = ("load", "zipf", "curve")
MIB = 1 << 20

LOADS = "pjserve_weight_loads_total"
EVICTIONS = "pjserve_weight_evictions_total"
RESIDENT = "pjserve_weight_resident_bytes"
LOAD_SECONDS = "pjserve_weight_load_seconds_total"
BUDGET = "pjserve_weight_cache_budget_bytes"
USED = "pjserve_weight_cache_used_bytes"
REQUIRED_METRICS = (LOADS, EVICTIONS, RESIDENT, LOAD_SECONDS, BUDGET, USED)


# ---- the bench model ----------------------------------------------------------

def side(size_mib):
    """K of the K x K f32 weight matrix of a model of about size_mib MiB."""
    return max(1, round((size_mib * MIB / 4) ** 0.5))


def weight_bytes(k):
    return 4 * (k * k + k)


def base_name(size_mib):
    return f"dense_{size_mib:g}m".replace(".", "_")


def export_models(sizes, force):
    """Exports one dense model per size into MODELS_DIR/bundles (skipped when
    the stamp says the same definitions were exported by the same exporter and
    jax before). Returns {size: bundle path}."""
    import jax
    import numpy as np
    from pjserve_export import export_jax

    bundles = MODELS_DIR / "bundles"
    definition, exporter = model_fingerprint(__file__)
    paths = {s: bundles / base_name(s) for s in sizes}
    for s, path in paths.items():
        want = hashlib.sha256(json.dumps({"size": s, "jax": jax.__version__,
                                          "exporter": exporter,
                                          "code": definition}, sort_keys=True).encode()
                              ).hexdigest()
        stamp = bundles / f".stamp-{path.name}"
        if (not force and stamp.exists() and stamp.read_text().strip() == want
                and (path / "manifest.yaml").exists()):
            continue
        stamp.unlink(missing_ok=True)
        t0 = time.monotonic()
        k = side(s)
        rng = np.random.default_rng(k)
        params = {"w": rng.standard_normal((k, k), dtype=np.float32) / np.float32(k ** 0.5),
                  "b": np.float32(0.1) * rng.standard_normal((k,), dtype=np.float32)}

        def dense(p, x):
            return x @ p["w"] + p["b"]

        bundles.mkdir(parents=True, exist_ok=True)
        export_jax(dense, params, [np.zeros((1, k), np.float32)], bundles, name=path.name,
                   batch_sizes=(1, 2, 4, 8), input_names=["x"], output_names=["y"],
                   description=f"residency benchmark: one dense layer {k}x{k} f32 "
                               f"({weight_bytes(k) / MIB:.1f} MiB of weights)")
        stamp.write_text(want + "\n")
        log(f"exported {path.name} ({weight_bytes(k) / MIB:.1f} MiB of weights) in "
            f"{time.monotonic() - t0:.1f} s")
    return paths


def copy_bundle(src, name, dest_dir):
    """src under another name: hard links to its modules and weights (copies
    where links fail), its manifest with the name replaced."""
    dst = dest_dir / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == "manifest.yaml":
            text = f.read_text()
            old = f'name: "{src.name}"\n'
            if old not in text:
                raise RuntimeError(f"{f}: no line {old!r}")
            (dst / f.name).write_text(text.replace(old, f'name: "{name}"\n'))
            continue
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)
    return dst


def make_repository(bundles, path):
    """A model repository of symbolic links to the given bundle paths."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for b in bundles:
        (path / b.name).symlink_to(b, target_is_directory=True)
    return path


# ---- servers ------------------------------------------------------------------

class Pjserve(PjserveProcess):
    scrape_timeout = 10.0

    def __init__(self, repository, cache, log_path, extra, binary=PJSERVE):
        self.repository, self.cache, self.log_path, self.extra = (repository, cache, log_path,
                                                                  list(extra))
        self.binary = binary
        self.proc = None

    def start(self, models, timeout=600):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        t0 = time.monotonic()
        self.start_process()
        self.wait_models_ready(models, t0 + timeout, timeout, 0.1,
                               shown=lambda pending: f"{pending[:3]}...")
        self.start_s = time.monotonic() - t0
        names = {n for n, _ in self.scrape()}
        missing = [n for n in REQUIRED_METRICS if n not in names]
        if missing:
            raise RuntimeError("pjserve's /metrics lacks " + ", ".join(missing)
                               + " (the device weight cache's metrics)")


def total(sample, name, models=None):
    """Sum of `name` over the models (all when None)."""
    out = 0.0
    for (n, ls), v in sample.items():
        if n == name and (models is None or dict(ls).get("model") in models):
            out += v
    return out


def gauge(sample, name):
    return next((v for (n, ls), v in sample.items() if n == name and not ls), None)


class Client:
    """A tritonclient gRPC client sending one fixed [1,K] input."""

    def __init__(self, server, k, seed=0):
        import numpy as np
        import tritonclient.grpc as grpcclient
        self.grpcclient = grpcclient
        self.c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        self.x = np.random.default_rng(seed).standard_normal((1, k), dtype=np.float32)

    def infer(self, model):
        i = self.grpcclient.InferInput("x", list(self.x.shape), "FP32")
        i.set_data_from_numpy(self.x)
        r = self.c.infer(model, [i])
        if r.as_numpy("y") is None:
            raise RuntimeError(f"{model}: no output")

    def timed(self, model):
        t0 = time.perf_counter()
        self.infer(model)
        return time.perf_counter() - t0

    def close(self):
        self.c.close()


# ---- part 1: load time against size --------------------------------------------

def host_copy(nbytes, reps):
    """Median seconds of numpy copies of nbytes: into a buffer written before
    ("warm") and into a fresh np.empty allocation ("fresh", page faults
    included)."""
    import numpy as np
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    dst.fill(0)
    warm, fresh = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        d = np.empty_like(src)
        np.copyto(d, src)
        fresh.append(time.perf_counter() - t0)
        del d
    return statistics.median(warm), statistics.median(fresh)


def load_part(paths, sizes, rounds, copy_reps, cache, work, server_args, binary):
    rows = []
    copies = MODELS_DIR / "copies"
    for s in sizes:
        k = side(s)
        nbytes = weight_bytes(k)
        a = paths[s]
        b = copy_bundle(a, a.name + "_b", copies)
        repo = make_repository([a, b], work / f"repo-load-{a.name}")
        budget = int(1.5 * nbytes)
        server = Pjserve(repo, cache, work / f"pjserve-load-{a.name}.log",
                         ["--device-weight-budget", str(budget), "--warmup-runs", "0",
                          *server_args], binary=binary)
        log(f"load: {a.name} ({nbytes / MIB:.1f} MiB), budget {budget / MIB:.1f} MiB")
        server.start([a.name, b.name])
        client = Client(server, k)
        try:
            for m in (a.name, b.name, a.name, a.name):   # first executions, then a resident
                client.infer(m)
            before = prev = server.scrape()
            misses, hits, per_load, odd = [], [], [], 0
            t0 = time.monotonic()
            for _ in range(rounds):
                for m in (b.name, a.name):
                    misses.append(client.timed(m))
                    # each interval between two scrapes holds exactly one load
                    cur = server.scrape()
                    if total(cur, LOADS) - total(prev, LOADS) == 1:
                        per_load.append(total(cur, LOAD_SECONDS) - total(prev, LOAD_SECONDS))
                    else:
                        odd += 1
                    prev = cur
                    hits.append(client.timed(m))
            wall = time.monotonic() - t0
            after = server.scrape()
        finally:
            client.close()
            server.stop()
        loads = total(after, LOADS) - total(before, LOADS)
        load_s = total(after, LOAD_SECONDS) - total(before, LOAD_SECONDS)
        warm_s, fresh_s = host_copy(nbytes, copy_reps)
        p50 = statistics.median(per_load) if per_load else None
        miss_p50, hit_p50 = statistics.median(misses), statistics.median(hits)
        row = {"size_mib": s, "k": k, "weight_bytes": nbytes, "budget_bytes": budget,
               "requests_miss": len(misses), "loads": loads,
               "expected_loads": len(misses), "intervals_without_one_load": odd,
               "load_seconds": load_s, "load_seconds_each": per_load,
               "load_ms": None if p50 is None else p50 * 1e3,
               "load_ms_mean": load_s / loads * 1e3 if loads else None,
               "load_ms_min": min(per_load) * 1e3 if per_load else None,
               "load_ms_max": max(per_load) * 1e3 if per_load else None,
               "load_gb_per_s": None if not p50 else nbytes / p50 / 1e9,
               "miss_p50_ms": miss_p50 * 1e3, "hit_p50_ms": hit_p50 * 1e3,
               "miss_minus_hit_ms": (miss_p50 - hit_p50) * 1e3,
               "miss_minus_hit_gb_per_s": (nbytes / (miss_p50 - hit_p50) / 1e9
                                           if miss_p50 > hit_p50 else None),
               "memcpy_warm_ms": warm_s * 1e3, "memcpy_warm_gb_per_s": nbytes / warm_s / 1e9,
               "memcpy_fresh_ms": fresh_s * 1e3,
               "memcpy_fresh_gb_per_s": nbytes / fresh_s / 1e9,
               "wall_s": wall, "server_start_s": server.start_s,
               "server_command": server.cmd}
        rows.append(row)
        log(f"  {loads:.0f} loads (expected {len(misses)}): "
            f"{fmt(row['load_ms'], '.2f')} ms per load (median; mean "
            f"{fmt(row['load_ms_mean'], '.2f')}), {fmt(row['load_gb_per_s'], '.2f')} GB/s; "
            f"client miss {miss_p50 * 1e3:.2f} ms, hit {hit_p50 * 1e3:.2f} ms; numpy copy "
            f"{warm_s * 1e3:.2f} ms warm ({row['memcpy_warm_gb_per_s']:.2f} GB/s), "
            f"{fresh_s * 1e3:.2f} ms fresh ({row['memcpy_fresh_gb_per_s']:.2f} GB/s)")
    return rows


# ---- part 2: many models, Zipf traffic -----------------------------------------

def zipf_probabilities(n, s):
    w = [1.0 / (r ** s) for r in range(1, n + 1)]
    z = sum(w)
    return [x / z for x in w]


def simulate_lru(probs, capacity, n_requests, seed):
    """Hit rate of an LRU cache of `capacity` items on an independent stream."""
    if capacity <= 0:
        return 0.0
    rng = random.Random(seed)
    items = list(range(len(probs)))
    stream = rng.choices(items, weights=probs, k=n_requests)
    lru, hits = [], 0
    for x in stream:
        if x in lru:
            hits += 1
            lru.remove(x)
        elif len(lru) >= capacity:
            lru.pop(0)
        lru.append(x)
    return hits / n_requests


def drive(server, names, probs, threads, k, settle_s, seconds, seed):
    """Closed-loop Zipf traffic from `threads` threads. Returns the sorted
    latencies of the requests that started after `settle_s` and finished
    within the measurement window, the window's length, the metric samples
    around it, and every request sent, as (seconds since the traffic
    started, thread, model index), in the order they were sent."""
    stop = threading.Event()
    lats = [[] for _ in range(threads)]
    sends = [[] for _ in range(threads)]
    errors = []
    window = {}
    start_evt = threading.Event()
    indices = list(range(len(names)))

    def body(i):
        rng = random.Random(seed * 1000 + i)
        client = Client(server, k, seed=i)
        try:
            start_evt.wait()
            origin = window["origin"]
            while not stop.is_set():
                m = rng.choices(indices, weights=probs)[0]
                t0 = time.perf_counter()
                sends[i].append((t0 - origin, i, m))
                client.infer(names[m])
                t1 = time.perf_counter()
                if "t0" in window and t0 >= window["t0"] and "t1" not in window:
                    lats[i].append(t1 - t0)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(repr(e))
        finally:
            client.close()

    ts = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    window["origin"] = time.perf_counter()
    start_evt.set()
    time.sleep(settle_s)
    before = server.scrape()
    window["t0"] = time.perf_counter()
    time.sleep(seconds)
    window["t1"] = time.perf_counter()
    after = server.scrape()
    stop.set()
    for t in ts:
        t.join(60)
    if errors:
        raise RuntimeError(f"{len(errors)} client threads failed; first: {errors[0]}")
    return (sorted(x for per in lats for x in per), window["t1"] - window["t0"], before, after,
            sorted(x for per in sends for x in per))


def percentile(sorted_xs, q):
    if not sorted_xs:
        return None
    i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[i]


def measure(server, names, probs, threads, k, settle_s, seconds, seed, budget, nbytes):
    """drive(), summed up: (the run's numbers, the requests sent)."""
    lats, measured, before, after, sends = drive(server, names, probs, threads, k, settle_s,
                                                 seconds, seed)

    def d(name):
        return total(after, name) - total(before, name)
    requests = d("nv_inference_request_success")
    loads = d(LOADS)
    execs = d("pjserve_model_dispatches_total")
    load_s = d(LOAD_SECONDS)
    run = {"budget_bytes": budget,
           "models_fitting": (budget // nbytes) if budget else len(names),
           "requests": requests, "requests_per_s": requests / measured,
           "client_requests": len(lats), "measure_s": measured,
           "p50_ms": percentile(lats, 0.5) * 1e3 if lats else None,
           "p90_ms": percentile(lats, 0.9) * 1e3 if lats else None,
           "p99_ms": percentile(lats, 0.99) * 1e3 if lats else None,
           "mean_ms": statistics.mean(lats) * 1e3 if lats else None,
           "loads": loads, "loads_per_s": loads / measured, "evictions": d(EVICTIONS),
           "executions": execs,
           "hit_rate": 1 - loads / requests if requests else None,
           "hit_rate_per_execution": 1 - loads / execs if execs else None,
           "load_seconds": load_s, "load_busy": load_s / measured,
           "load_ms_mean": load_s / loads * 1e3 if loads else None,
           "device_seconds": d("pjserve_model_device_seconds_total"),
           "failures": d("nv_inference_request_failure"),
           "used_bytes_end": gauge(after, USED), "budget_metric": gauge(after, BUDGET),
           "resident_models_end": sum(1 for (n, _), v in after.items()
                                      if n == RESIDENT and v > 0)}
    return run, sends


def zipf_run(server, names, probs, a, k, budget, nbytes, seed):
    run, _ = measure(server, names, probs, a.threads, k, a.settle,
                     a.seconds if budget else a.reference_seconds, seed, budget, nbytes)
    return run


def zipf_part(base, size_mib, ns, a, cache, work):
    k = side(size_mib)
    nbytes = weight_bytes(k)
    copies = MODELS_DIR / "copies"
    out = []
    for n in ns:
        names = [f"zipf_{i:02d}" for i in range(n)]
        bundles = [copy_bundle(base, nm, copies) for nm in names]
        repo = make_repository(bundles, work / f"repo-zipf-{n}")
        ranks = list(range(n))
        random.Random(a.seed + n).shuffle(ranks)          # model i has popularity rank ranks[i]
        probs_by_rank = zipf_probabilities(n, a.zipf_s)
        probs = [probs_by_rank[r] for r in ranks]
        budget = int(a.budget_fraction * n * nbytes)
        capacity = budget // nbytes
        entry = {"models": n, "model_bytes": nbytes, "zipf_s": a.zipf_s,
                 "budget_fraction": a.budget_fraction,
                 "lru_simulated_hit_rate": simulate_lru(probs_by_rank, capacity, 200000, a.seed),
                 "top_models_hit_rate": sum(probs_by_rank[:capacity]),
                 "top_model_share": probs_by_rank[0]}
        runs = (("budget", ["--device-weight-budget", str(budget)], budget),
                ("unlimited", [], 0))
        per_round = {key: [] for key, _, _ in runs}
        for rnd in range(a.rounds):
            # a fresh server per run; the order alternates between rounds
            for key, extra, b in (runs if rnd % 2 == 0 else runs[::-1]):
                server = Pjserve(repo, cache, work / f"pjserve-zipf-{n}-{key}-{rnd + 1}.log",
                                 extra + a.server_arg, binary=a.pjserve)
                log(f"zipf round {rnd + 1}/{a.rounds}: {n} models of {nbytes / MIB:.1f} MiB, "
                    + (f"budget {budget / MIB:.1f} MiB ({capacity} models)" if b
                       else "no budget")
                    + f": {a.threads} threads, {a.settle:g} s settle + "
                    f"{a.seconds if b else a.reference_seconds:g} s")
                server.start(names)
                try:
                    r = zipf_run(server, names, probs, a, k, b, nbytes,
                                 a.seed + 100 * rnd + n)
                finally:
                    server.stop()
                r["server_start_s"] = server.start_s
                r["server_command"] = server.cmd
                per_round[key].append(r)
                log(f"  {r['requests_per_s']:.0f} requests/s, p50 {fmt(r['p50_ms'], '.2f')} "
                    f"ms, p99 {fmt(r['p99_ms'], '.2f')} ms, hit rate "
                    f"{fmt(r['hit_rate'], '.3f')} ({r['loads']:.0f} loads / "
                    f"{r['requests']:.0f} requests, {r['executions']:.0f} executions), "
                    f"loading {100 * r['load_busy']:.0f}% of the time")
        for key in per_round:
            entry[key] = median_run(per_round[key])
            entry[key + "_rounds"] = per_round[key]
        log(f"  LRU simulated {entry['lru_simulated_hit_rate']:.3f}, top-{capacity} "
            f"{entry['top_models_hit_rate']:.3f}")
        out.append(entry)
    return out


def median_run(runs):
    """Per numeric field, the median over rounds (the first round's others)."""
    out = dict(runs[0])
    for key, v in runs[0].items():
        vals = [r[key] for r in runs]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and None not in vals:
            out[key] = statistics.median(vals)
    return out


# ---- part 3: the curve: throughput and p99 against the number of models ---------

# Configurations of a budgeted run: name -> (binary, extra `pjserve serve`
# arguments). Binary "new" is build/pjserve (or --pjserve), "baseline" the one
# given with --pjserve-baseline (an older build, run without extra arguments).
# --config NAME=ARGS adds one for the new binary or replaces one.
CONFIGS = {
    # one mechanism added at a time: lru alone (the policy before lfu), lfu,
    # lfu with cold-model deferral, and the defaults (lfu, deferral, prefetch)
    "lru": ("new", ["--eviction-policy", "lru", "--cold-model-defer-ms", "0",
                    "--weight-prefetch", "false"]),
    "lfu": ("new", ["--eviction-policy", "lfu", "--cold-model-defer-ms", "0",
                    "--weight-prefetch", "false"]),
    "lfu+defer": ("new", ["--eviction-policy", "lfu", "--weight-prefetch", "false"]),
    "default": ("new", []),
    "baseline": ("baseline", []),
}
DEFAULT_CONFIGS = "lru,lfu,lfu+defer,default"
REFERENCE = "all-resident"        # no budget: every model stays on the device
GOAL = {"models": 40, "budget_fraction": 0.1, "throughput_ratio": 0.8, "p99_ratio": 2.0}


def reference_key(binary):
    return REFERENCE if binary == "new" else f"{binary} {REFERENCE}"


def budget_label(fraction):
    return f"{100 * fraction:g}pct"


def server_flags(help_text):
    """The options a `pjserve serve --help` text lists."""
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))


def check_configs(configs, binaries, server_args):
    """Exits with what to do when a binary lacks an option a configuration
    (or --server-arg) passes to it, before anything runs."""
    for binary, path in binaries.items():
        if not Path(path).exists():
            sys.exit(f"residency: {path} is missing")
        out = subprocess.run([str(path), "serve", "--help"], capture_output=True, text=True)
        known = server_flags(out.stdout + out.stderr)
        for name, (b, extra) in configs.items():
            for arg in (extra + server_args if b == binary else []):
                flag = arg.split("=", 1)[0]
                if flag.startswith("--") and flag not in known:
                    sys.exit(f"residency: {path} serve has no {flag} (configuration {name!r}: "
                             f"{shlex.join(extra) or 'no extra arguments'}): rebuild it "
                             "(make) or leave the configuration out of --configs")


def shown_path(path):
    """path relative to the repository when it is inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def binary_info(path):
    """What identifies a pjserve binary: its path, --version, modification
    time and the start of its sha256."""
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True)
    return {"path": str(path), "version": (version.stdout or version.stderr).strip(),
            "modified": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime)),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def write_trace(path, sends, names, cap):
    """The first `cap` requests sent: seconds since the traffic started,
    client thread, model name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "thread", "model"])
        for t, thread, m in sends[:cap]:
            w.writerow([f"{t:.5f}", thread, names[m]])
    return min(cap, len(sends))


def curve_part(base, size_mib, a, configs, binaries, cache, work):
    k = side(size_mib)
    nbytes = weight_bytes(k)
    copies = MODELS_DIR / "copies"
    for stale in a.trace_dir.glob("N*_*pct.csv"):         # the traces of this run only
        stale.unlink()
    all_names = [f"curve_{i:03d}" for i in range(max(a.curve_models))]
    all_bundles = [copy_bundle(base, nm, copies) for nm in all_names]
    used_binaries = sorted({configs[c][0] for c in configs}, key=lambda b: b != "new")
    references = [(reference_key(b), b, []) for b in used_binaries]
    budgeted = [(name, b, extra) for name, (b, extra) in configs.items()]
    planned = a.curve_rounds * len(a.curve_models) * (
        a.curve_reference_runs * len(references) + len(a.curve_budgets) * len(budgeted))
    log(f"curve: {planned} runs of {a.curve_settle + a.curve_seconds:g} s of traffic, each on "
        f"a server started for it ({', '.join(key for key, _, _ in budgeted)}; "
        f"{', '.join(key for key, _, _ in references)})")
    out = []
    turn = 0
    for ni, n in enumerate(a.curve_models):
        names = all_names[:n]
        repo = make_repository(all_bundles[:n], work / f"repo-curve-{n}")
        ranks = list(range(n))
        random.Random(a.seed + n).shuffle(ranks)          # model i has popularity rank ranks[i]
        probs_by_rank = zipf_probabilities(n, a.zipf_s)
        probs = [probs_by_rank[r] for r in ranks]
        entry = {"models": n, "model_bytes": nbytes,
                 "request_shares": dict(zip(names, probs)),   # what the traces draw from
                 "reference": {}, "budgets": []}
        per_round = {}
        for fraction in a.curve_budgets:
            budget = int(fraction * n * nbytes)
            capacity = budget // nbytes
            entry["budgets"].append({
                "fraction": fraction, "budget_bytes": budget, "models_fitting": capacity,
                "lru_simulated_hit_rate": simulate_lru(probs_by_rank, capacity, 200000, a.seed),
                "top_models_hit_rate": sum(probs_by_rank[:capacity]), "runs": {}})
        for rnd in range(a.curve_rounds):
            seed = a.seed + 100 * rnd + n                 # every run of a round: same draws
            # the references first, their order alternating; then per budget
            # every configuration, the order rotating by one each time; with
            # --curve-reference-runs 2 the references again at the end
            refs = references if (ni + rnd) % 2 == 0 else references[::-1]
            plan = [(key, b, extra, None) for key, b, extra in refs]
            for bi in range(len(a.curve_budgets)):
                shift = turn % len(budgeted)
                turn += 1
                plan += [(key, b, extra, bi) for key, b, extra in
                         budgeted[shift:] + budgeted[:shift]]
            if a.curve_reference_runs == 2:
                plan += [(key, b, extra, None) for key, b, extra in refs[::-1]]
            bracket = {}
            for i, (key, b, extra, bi) in enumerate(plan):
                budget = entry["budgets"][bi]["budget_bytes"] if bi is not None else 0
                what = (f"budget {budget / MIB:.1f} MiB "
                        f"({100 * a.curve_budgets[bi]:g} %, "
                        f"{entry['budgets'][bi]['models_fitting']} models)"
                        if bi is not None else "no budget")
                log(f"curve round {rnd + 1}/{a.curve_rounds}: {n} models of "
                    f"{nbytes / MIB:.2f} MiB, {what}, {key}")
                server = Pjserve(repo, cache,
                                 work / f"pjserve-curve-{n}-{rnd + 1}-{i:02d}-"
                                        f"{key.replace(' ', '_')}.log",
                                 (["--device-weight-budget", str(budget)] if budget else [])
                                 + extra + a.server_arg, binary=binaries[b])
                server.start(names)
                try:
                    r, sends = measure(server, names, probs, a.threads, k, a.curve_settle,
                                       a.curve_seconds, seed, budget, nbytes)
                finally:
                    server.stop()
                r.update(configuration=key, binary=b, server_start_s=server.start_s,
                         server_command=server.cmd)
                if bi is not None and rnd == 0 and key == budgeted[0][0]:
                    path = a.trace_dir / f"N{n}_{budget_label(a.curve_budgets[bi])}.csv"
                    rows = write_trace(path, sends, names, a.trace_requests)
                    entry["budgets"][bi]["trace"] = {
                        "path": shown_path(path),
                        "configuration": key, "requests": rows, "sent": len(sends)}
                if bi is None:
                    bracket.setdefault(key, []).append(r)
                else:
                    per_round.setdefault((key, bi), []).append(r)
                log(f"  {r['requests_per_s']:.0f} requests/s, p50 {fmt(r['p50_ms'], '.2f')} "
                    f"ms, p99 {fmt(r['p99_ms'], '.2f')} ms, hit rate "
                    f"{fmt(r['hit_rate'], '.3f')} / execution "
                    f"{fmt(r['hit_rate_per_execution'], '.3f')}, "
                    f"{r['loads_per_s']:.0f} loads/s, loading {100 * r['load_busy']:.0f}% "
                    f"of the time, server start {server.start_s:.1f} s")
            # a round's reference: the run of the most requests/s (the stricter
            # comparison when something else slowed the other down)
            for key, runs in bracket.items():
                best = dict(max(runs, key=lambda r: r["requests_per_s"]))
                best["reference_runs"] = [
                    {f: r[f] for f in ("requests_per_s", "p50_ms", "p99_ms")} for r in runs]
                per_round.setdefault((key, None), []).append(best)

        def summed_up(key, bi):
            runs = per_round[(key, bi)]
            run = median_run(runs)
            if len(runs) > 1:
                run["rounds"] = runs
            return run
        # in the order of --configs, whichever order they ran in
        entry["reference"] = {key: summed_up(key, None) for key, _, _ in references}
        for bi, bud in enumerate(entry["budgets"]):
            bud["runs"] = {key: summed_up(key, bi) for key, _, _ in budgeted}
        for bud in entry["budgets"]:
            for key, run in bud["runs"].items():
                ref = entry["reference"][reference_key(run["binary"])]
                run["throughput_ratio"] = (run["requests_per_s"] / ref["requests_per_s"]
                                           if ref["requests_per_s"] else None)
                run["p99_ratio"] = (run["p99_ms"] / ref["p99_ms"]
                                    if run["p99_ms"] and ref["p99_ms"] else None)
        out.append(entry)
    return out


def goal_rows(curve):
    """The runs of the goal's setting: [(configuration, run)], [] when the
    curve has no such N and budget."""
    for e in curve:
        if e["models"] != GOAL["models"]:
            continue
        for bud in e["budgets"]:
            if abs(bud["fraction"] - GOAL["budget_fraction"]) < 1e-9:
                return list(bud["runs"].items())
    return []


def meets_goal(run):
    return (run.get("throughput_ratio") is not None and run.get("p99_ratio") is not None
            and run["throughput_ratio"] >= GOAL["throughput_ratio"]
            and run["p99_ratio"] <= GOAL["p99_ratio"])


def goal_lines(curve):
    rows = goal_rows(curve)
    if not rows:
        return []
    lines = [f"The goal's setting: {GOAL['models']} models, budget "
             f"{100 * GOAL['budget_fraction']:g} % of their weights; goal: at least "
             f"{GOAL['throughput_ratio']} of the all-resident throughput with p99 at most "
             f"{GOAL['p99_ratio']:g}x:"]
    for key, r in rows:
        lines.append(f"  {key:<14} {r['requests_per_s']:7.0f} requests/s = "
                     f"{fmt(r['throughput_ratio'], '.2f')} of all-resident, p99 "
                     f"{fmt(r['p99_ms'], '.1f')} ms = {fmt(r['p99_ratio'], '.2f')}x: "
                     + ("goal met" if meets_goal(r) else "goal NOT met"))
    return lines


# ---- report ----------------------------------------------------------------------

def markdown(result):
    lines = []
    load = result.get("load")
    if load:
        lines += ["Cold loads against model size: one dense layer, a budget of 1.5 models, "
                  "requests alternating between two copies so that each loads the weights; "
                  "each load's time from the delta of `pjserve_weight_load_seconds_total` "
                  "around it (median, and mean over the run); GB/s = 10^9 bytes/s from the "
                  "median; numpy `copyto` of the same bytes in the same run (median of "
                  f"{result['settings']['copy_reps']}):", "",
                  "| weights MiB | loads | ms per load (median) | mean | min - max | GB/s | "
                  "client p50 ms: miss | hit | miss - hit | numpy copy ms (GB/s) | "
                  "into a fresh buffer ms (GB/s) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in load:
            lines.append(
                f"| {r['weight_bytes'] / MIB:.1f} | {r['loads']:.0f} | "
                f"{fmt(r['load_ms'], '.2f')} | {fmt(r['load_ms_mean'], '.2f')} | "
                f"{fmt(r['load_ms_min'], '.2f')} - {fmt(r['load_ms_max'], '.2f')} | "
                f"**{fmt(r['load_gb_per_s'], '.2f')}** | {r['miss_p50_ms']:.2f} | "
                f"{r['hit_p50_ms']:.2f} | {r['miss_minus_hit_ms']:.2f} | "
                f"{r['memcpy_warm_ms']:.2f} ({r['memcpy_warm_gb_per_s']:.2f}) | "
                f"{r['memcpy_fresh_ms']:.2f} ({r['memcpy_fresh_gb_per_s']:.2f}) |")
        lines.append("")
    zipf = result.get("zipf")
    if zipf:
        s = result["settings"]
        rounds = s.get("rounds", 1)
        lines += [f"N models of {zipf[0]['model_bytes'] / MIB:.1f} MiB, Zipf traffic "
                  f"(s = {s['zipf_s']}) from {s['threads']} client threads (batch-1 gRPC "
                  f"requests, closed loop), {s['seconds']:g} s measured per run "
                  f"({s['reference_seconds']:g} s without a budget), median of {rounds} "
                  f"round{'s' if rounds != 1 else ''}; hit rate = 1 - Δloads / Δrequests "
                  "(per execution: / Δexecutions) from /metrics; time loading = "
                  "Δ`pjserve_weight_load_seconds_total` / wall time:", "",
                  "| N | budget (models) | requests/s | p50 ms | p99 ms | hit rate | "
                  "requests / execution | hit rate per execution | LRU simulated | most "
                  "popular resident | ms per load | time loading | no budget: requests/s | "
                  "p50 ms | p99 ms |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for e in zipf:
            b, u = e["budget"], e["unlimited"]
            rpe = b["requests"] / b["executions"] if b["executions"] else None
            lines.append(
                f"| {e['models']} | {b['budget_bytes'] / MIB:.0f} MiB ({b['models_fitting']:.0f}) | "
                f"{b['requests_per_s']:.0f} | {fmt(b['p50_ms'], '.2f')} | "
                f"{fmt(b['p99_ms'], '.2f')} | **{fmt(b['hit_rate'], '.3f')}** | "
                f"{fmt(rpe, '.2f')} | {fmt(b['hit_rate_per_execution'], '.3f')} | "
                f"{e['lru_simulated_hit_rate']:.3f} | {e['top_models_hit_rate']:.3f} | "
                f"{fmt(b['load_ms_mean'], '.2f')} | {100 * b['load_busy']:.0f}% | "
                f"{u['requests_per_s']:.0f} | {fmt(u['p50_ms'], '.2f')} | "
                f"{fmt(u['p99_ms'], '.2f')} |")
        lines.append("")
    curve = result.get("curve")
    if curve:
        lines += curve_markdown(curve, result["settings"])
    return "\n".join(lines)


def curve_markdown(curve, s):
    lines = []
    goal = goal_rows(curve)
    if goal:
        ref = next(e for e in curve if e["models"] == GOAL["models"])["reference"]
        lines += [f"The goal's setting, {GOAL['models']} models and a budget of "
                  f"{100 * GOAL['budget_fraction']:g} % of their weights: at least "
                  f"{GOAL['throughput_ratio']} of the all-resident throughput with p99 at most "
                  f"{GOAL['p99_ratio']:g}x ("
                  + "; ".join(f"{key}: {r['requests_per_s']:.0f} requests/s, p99 "
                              f"{fmt(r['p99_ms'], '.1f')} ms" for key, r in ref.items())
                  + "):", "",
                  "| configuration | requests/s | of all-resident | p50 ms | p99 ms | "
                  "p99 / all-resident | hit rate | per execution | time loading | goal |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for key, r in goal:
            lines.append(
                f"| {key} | {r['requests_per_s']:.0f} | **{fmt(r['throughput_ratio'], '.2f')}** "
                f"| {fmt(r['p50_ms'], '.2f')} | {fmt(r['p99_ms'], '.2f')} | "
                f"**{fmt(r['p99_ratio'], '.2f')}x** | {fmt(r['hit_rate'], '.3f')} | "
                f"{fmt(r['hit_rate_per_execution'], '.3f')} | {100 * r['load_busy']:.0f}% | "
                + ("met" if meets_goal(r) else "not met") + " |")
        lines.append("")
    rounds = s["curve_rounds"]
    configs = "; ".join(f"`{name}`: " + (f"`{s['pjserve_baseline']}`" if b == "baseline"
                                         else f"`{s['pjserve']}`")
                        + (f" `{shlex.join(extra)}`" if extra else " with no extra arguments")
                        for name, (b, extra) in s["configs"].items())
    for bi, fraction in enumerate(s["curve_budgets"]):
        lines += [f"N models of {curve[0]['model_bytes'] / MIB:.2f} MiB, budget "
                  f"{100 * fraction:g} % of their weights; Zipf traffic (s = {s['zipf_s']}) from "
                  f"{s['threads']} client threads (batch-1 gRPC requests, closed loop), "
                  f"{s['curve_settle']:g} s settle + {s['curve_seconds']:g} s measured per run"
                  + (f", median of {rounds} rounds" if rounds > 1 else "")
                  + f"; {configs}; {REFERENCE}: no budget"
                  + (", the run of more requests/s of one before and one after the budgeted "
                     "runs of that N (the other in parentheses)"
                     if s.get("curve_reference_runs", 1) == 2 else "")
                  + f". Ratios against the {REFERENCE} run of the same binary; hit rate = "
                  "1 - Δloads / Δrequests (per execution: / Δexecutions); time loading = "
                  "Δ`pjserve_weight_load_seconds_total` / wall time:", "",
                  "| N | budget MiB (models) | configuration | requests/s | of all-resident | "
                  "p50 ms | p99 ms | p99 / all-resident | hit rate | per execution | "
                  "LRU simulated | most popular resident | time loading | loads/s | "
                  "ms per load |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for e in curve:
            bud = e["budgets"][bi]
            for key, r in e["reference"].items():
                others = [x for x in r.get("reference_runs", [])
                          if x["requests_per_s"] != r["requests_per_s"]]
                lines.append(f"| {e['models']} | - | {key} | {r['requests_per_s']:.0f}"
                             + "".join(f" ({x['requests_per_s']:.0f})" for x in others)
                             + f" | 1 | {fmt(r['p50_ms'], '.2f')} | {fmt(r['p99_ms'], '.2f')}"
                             + "".join(f" ({fmt(x['p99_ms'], '.2f')})" for x in others)
                             + " | 1 | | | | | | | |")
            for key, r in bud["runs"].items():
                lines.append(
                    f"| {e['models']} | {bud['budget_bytes'] / MIB:.1f} "
                    f"({bud['models_fitting']}) | {key} | {r['requests_per_s']:.0f} | "
                    f"**{fmt(r['throughput_ratio'], '.2f')}** | {fmt(r['p50_ms'], '.2f')} | "
                    f"{fmt(r['p99_ms'], '.2f')} | {fmt(r['p99_ratio'], '.2f')} | "
                    f"{fmt(r['hit_rate'], '.3f')} | {fmt(r['hit_rate_per_execution'], '.3f')} | "
                    f"{bud['lru_simulated_hit_rate']:.3f} | {bud['top_models_hit_rate']:.3f} | "
                    f"{100 * r['load_busy']:.0f}% | {r['loads_per_s']:.0f} | "
                    f"{fmt(r['load_ms_mean'], '.2f')} |")
        lines.append("")
    return lines


# ---- main ------------------------------------------------------------------------

# Knobs whose default --quick changes: name -> (type, default, with --quick, help).
KNOBS = {
    "sizes": (str, "1,4,16,64,256", "1,16", "load: model sizes in MiB"),
    "load_rounds": (int, 15, 3, "load: rounds of (miss, hit) on each of the two copies"),
    "copy_reps": (int, 7, 3, "load: numpy copies per size, the median"),
    "models": (str, "5,10,20,40", "5,10", "zipf: numbers of models"),
    "settle": (float, 3.0, 1.0, "zipf: seconds of traffic before measuring"),
    "seconds": (float, 10.0, 2.0, "zipf: seconds measured with the budget"),
    "reference_seconds": (float, 5.0, 2.0, "zipf: seconds measured without a budget"),
    "rounds": (int, 2, 1, "zipf: rounds, each on freshly started servers; the tables show "
                          "the median"),
    "curve_models": (str, "5,10,20,40,80,120,200", "5,40",
                     "curve: numbers of models"),
    "curve_settle": (float, 1.0, 0.5, "curve: seconds of traffic before measuring"),
    "curve_seconds": (float, 4.0, 1.5, "curve: seconds measured per run (references too)"),
    "curve_rounds": (int, 1, 1, "curve: rounds, each on freshly started servers; the "
                                "tables show the median"),
    "curve_reference_runs": (int, 2, 1, "curve: all-resident runs per N, binary and round: "
                                        "1 before the budgeted runs, 2 also after them; the "
                                        "reference is the one of more requests/s"),
}
QUICK_OUT = ROOT / "build" / "bench-residency-quick"


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Parts: load (cold loads against model "
        "size), zipf (many models of 16 MiB at one budget), curve (throughput and p99 "
        "against the number of models at budgets of 10 and 20 %, per configuration); "
        "the module's docstring says what each measures.")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run for development (the defaults after '--quick:' below); "
                         f"results under {QUICK_OUT.relative_to(ROOT)}/")
    for name, (typ, full, quick, text) in KNOBS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=typ, default=None,
                        help=f"{text} (default {full}; --quick: {quick})")
    ap.add_argument("--zipf-size-mib", type=float, default=16,
                    help="zipf: weights per model, MiB (default %(default)s)")
    ap.add_argument("--zipf-s", type=float, default=1.1,
                    help="zipf, curve: exponent of the popularity law (default %(default)s)")
    ap.add_argument("--budget-fraction", type=float, default=0.2,
                    help="zipf: budget as a share of all the models' weights "
                         "(default %(default)s)")
    ap.add_argument("--threads", type=int, default=8,
                    help="zipf, curve: client threads (default %(default)s)")
    ap.add_argument("--curve-size-mib", type=float, default=4.5,
                    help="curve: weights per model, MiB (default %(default)s: K = 1086, "
                         "4.50 MiB with the bias)")
    ap.add_argument("--curve-budgets", default="0.1,0.2",
                    help="curve: budgets as shares of all the models' weights "
                         "(default %(default)s)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="curve: comma-separated configurations run at each N and budget "
                         f"(default %(default)s; 'baseline' is added with --pjserve-baseline). "
                         "Known: " + "; ".join(
                             f"{n} = " + ("the --pjserve-baseline binary" if b == "baseline"
                                          else "build/pjserve")
                             + (" " + " ".join(x) if x else " with no extra arguments")
                             for n, (b, x) in CONFIGS.items()))
    ap.add_argument("--config", action="append", default=[], metavar="NAME=ARGS",
                    help="curve: defines (or redefines) configuration NAME as build/pjserve "
                         "with the extra serve arguments ARGS (split as a shell would), e.g. "
                         "--config 'lfu+defer30=--eviction-policy lfu "
                         "--cold-model-defer-ms 30'; repeatable; name it in --configs")
    ap.add_argument("--pjserve", type=Path, default=PJSERVE, metavar="BIN",
                    help="the pjserve binary of every part (default build/pjserve)")
    ap.add_argument("--pjserve-baseline", type=Path, metavar="BIN",
                    help="curve: also run configuration 'baseline': the same traffic against "
                         "this pjserve binary (an older build) with no extra arguments, and "
                         "its own all-resident reference, interleaved with the others")
    ap.add_argument("--trace-dir", type=Path,
                    help="curve: where the request traces go, N<N>_<budget>pct.csv "
                         "(default bench/results/residency_traces)")
    ap.add_argument("--trace-requests", type=int, default=3000,
                    help="curve: requests kept per trace, the first sent (default %(default)s)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for every pjserve serve (repeatable), e.g. "
                         "--server-arg=--scheduler-discipline=fifo")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reexport", action="store_true", help="export the bench models again")
    ap.add_argument("--json", type=Path,
                    help="results (default bench/results/residency.json; the tables go next "
                         "to it as .md)")
    ap.add_argument("--plot-dir", type=Path,
                    help="where residency.png and residency_curve.png go (default docs/img)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    for name, (_, full, quick, _) in KNOBS.items():
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)
    out = QUICK_OUT if a.quick else None
    a.json = a.json or (out or ROOT / "bench" / "results") / "residency.json"
    a.plot_dir = a.plot_dir or (out or ROOT / "docs" / "img")
    a.trace_dir = (a.trace_dir or (out or ROOT / "bench" / "results") / "residency_traces")
    parts = parse_parts(ap, a.parts, PARTS)
    sizes = [float(s) if "." in s else int(s) for s in a.sizes.split(",")]
    ns = [int(n) for n in a.models.split(",")]
    a.curve_models = [int(n) for n in a.curve_models.split(",")]
    if a.curve_reference_runs not in (1, 2):
        ap.error("--curve-reference-runs: 1 or 2")
    a.curve_budgets = [float(f) for f in a.curve_budgets.split(",")]
    known = dict(CONFIGS)
    for d in a.config:
        name, sep, args = d.partition("=")
        if not sep or not name or "," in name or name == "baseline":
            ap.error(f"--config {d!r}: expected NAME=ARGS, NAME without commas and not "
                     "baseline (--pjserve-baseline's)")
        known[name] = ("new", shlex.split(args))
    chosen = [c.strip() for c in a.configs.split(",") if c.strip()]
    if a.pjserve_baseline and "baseline" not in chosen:
        chosen.append("baseline")
    unknown = [c for c in chosen if c not in known]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; known: {', '.join(known)} "
                 "(--config NAME=ARGS defines more)")
    if "baseline" in chosen and not a.pjserve_baseline:
        ap.error("--configs baseline needs --pjserve-baseline BIN")
    configs = {c: known[c] for c in chosen}
    a.pjserve = a.pjserve.resolve()
    binaries = {"new": a.pjserve}
    if a.pjserve_baseline:
        binaries["baseline"] = a.pjserve_baseline.resolve()
    if not binaries["new"].exists():
        sys.exit(f"residency: {a.pjserve} is missing (cmake --build build)")
    if "curve" in parts:
        check_configs(configs, binaries, a.server_arg)

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-residency-"))
    result = {"machine": machine_info(), "loadavg_start": os.getloadavg(),
              "settings": {"parts": parts, "quick": a.quick, "sizes_mib": sizes,
                           "load_rounds": a.load_rounds,
                           "copy_reps": a.copy_reps, "models": ns,
                           "zipf_size_mib": a.zipf_size_mib, "zipf_s": a.zipf_s,
                           "budget_fraction": a.budget_fraction, "threads": a.threads,
                           "settle": a.settle, "seconds": a.seconds,
                           "reference_seconds": a.reference_seconds, "rounds": a.rounds,
                           "curve_models": a.curve_models, "curve_size_mib": a.curve_size_mib,
                           "curve_budgets": a.curve_budgets, "curve_settle": a.curve_settle,
                           "curve_seconds": a.curve_seconds, "curve_rounds": a.curve_rounds,
                           "curve_reference_runs": a.curve_reference_runs,
                           "configs": configs, "pjserve": shown_path(a.pjserve),
                           "pjserve_baseline": (shown_path(a.pjserve_baseline)
                                                if a.pjserve_baseline else None),
                           "trace_requests": a.trace_requests,
                           "seed": a.seed,
                           "server_args": a.server_arg,
                           "protocol": "grpc", "request_batch": 1,
                           "host_copy": "numpy.copyto of uint8 arrays, one thread"},
              "versions": {"pjserve": git_revision(),
                           "binaries": {b: binary_info(path) for b, path in binaries.items()}}}
    try:
        want = sorted(set((sizes if "load" in parts else [])
                          + ([a.zipf_size_mib] if "zipf" in parts else [])
                          + ([a.curve_size_mib] if "curve" in parts else [])))
        log(f"exporting the bench models into {MODELS_DIR.relative_to(ROOT)}")
        paths = export_models(want, a.reexport)
        cache = MODELS_DIR / "cache"
        if "load" in parts:
            result["load"] = load_part(paths, sizes, a.load_rounds, a.copy_reps, cache, work,
                                       a.server_arg, a.pjserve)
        if "zipf" in parts:
            result["zipf"] = zipf_part(paths[a.zipf_size_mib], a.zipf_size_mib, ns, a, cache,
                                       work)
        if "curve" in parts:
            result["curve"] = curve_part(paths[a.curve_size_mib], a.curve_size_mib, a, configs,
                                         binaries, cache, work)
    finally:
        remove_workdir(work, a.keep)

    write_report(result, started, a.json, markdown)
    plots = ([("residency.png", [])] if {"load", "zipf"} & set(parts) else []) + \
        ([("residency_curve.png", ["--curve"])] if "curve" in parts else [])
    plotter = find_plotter()
    if plotter is None:
        log("no plot: no Python with matplotlib (scripts/bootstrap-bench plot makes "
            ".venv-bench-plot)")
    else:
        a.plot_dir.mkdir(parents=True, exist_ok=True)
        for name, which in plots:
            subprocess.run([str(plotter), str(PLOT), *which, str(a.json),
                            str(a.plot_dir / name)], check=True)
            log(f"wrote {a.plot_dir / name}")
    for line in goal_lines(result.get("curve") or []):
        log(line)
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
