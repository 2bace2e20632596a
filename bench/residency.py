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

Writes bench/results/residency.json (everything), bench/results/residency.md
(the tables of docs/benchmarks.md) and docs/img/residency.png
(bench/plot_residency.py, run with a Python that has matplotlib:
.venv-bench-plot from `scripts/bootstrap-bench plot`). Needs build/pjserve
(cmake --build build) and .venv (scripts/bootstrap). The bench models are
exported once into build/bench-models/residency/ (again when their definition,
jax or the exporter changes); the copies under other names are hard links.
Servers listen on 127.0.0.1 with free ports.
"""

import argparse
import hashlib
import json
import os
import random
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
PARTS = ("load", "zipf")
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

    def __init__(self, repository, cache, log_path, extra):
        self.repository, self.cache, self.log_path, self.extra = (repository, cache, log_path,
                                                                  list(extra))
        self.proc = None

    def start(self, models, timeout=600):
        self.serve_command()
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


def load_part(paths, sizes, rounds, copy_reps, cache, work, server_args):
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
                          *server_args])
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
    """Closed-loop Zipf traffic from `threads` threads; returns the latencies
    and counts of requests that started after `settle_s` and finished within
    the measurement window, and the metric samples around it."""
    stop = threading.Event()
    lats = [[] for _ in range(threads)]
    errors = []
    window = {}
    start_evt = threading.Event()

    def body(i):
        rng = random.Random(seed * 1000 + i)
        client = Client(server, k, seed=i)
        try:
            start_evt.wait()
            while not stop.is_set():
                m = rng.choices(names, weights=probs)[0]
                t0 = time.perf_counter()
                client.infer(m)
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
    return sorted(x for per in lats for x in per), window["t1"] - window["t0"], before, after


def percentile(sorted_xs, q):
    if not sorted_xs:
        return None
    i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[i]


def zipf_run(server, names, probs, a, k, budget, nbytes, seed):
    lats, measured, before, after = drive(server, names, probs, a.threads, k, a.settle,
                                          a.seconds if budget else a.reference_seconds, seed)

    def d(name):
        return total(after, name) - total(before, name)
    requests = d("nv_inference_request_success")
    loads = d(LOADS)
    execs = d("pjserve_model_dispatches_total")
    load_s = d(LOAD_SECONDS)
    return {"budget_bytes": budget, "models_fitting": (budget // nbytes) if budget else len(names),
            "requests": requests, "requests_per_s": requests / measured,
            "client_requests": len(lats), "measure_s": measured,
            "p50_ms": percentile(lats, 0.5) * 1e3 if lats else None,
            "p90_ms": percentile(lats, 0.9) * 1e3 if lats else None,
            "p99_ms": percentile(lats, 0.99) * 1e3 if lats else None,
            "mean_ms": statistics.mean(lats) * 1e3 if lats else None,
            "loads": loads, "evictions": d(EVICTIONS), "executions": execs,
            "hit_rate": 1 - loads / requests if requests else None,
            "hit_rate_per_execution": 1 - loads / execs if execs else None,
            "load_seconds": load_s, "load_busy": load_s / measured,
            "load_ms_mean": load_s / loads * 1e3 if loads else None,
            "device_seconds": d("pjserve_model_device_seconds_total"),
            "failures": d("nv_inference_request_failure"),
            "used_bytes_end": gauge(after, USED), "budget_metric": gauge(after, BUDGET),
            "resident_models_end": sum(1 for (n, _), v in after.items()
                                       if n == RESIDENT and v > 0)}


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
                                 extra + a.server_arg)
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
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--sizes", default="1,4,16,64,256",
                    help="load: model sizes in MiB (default %(default)s)")
    ap.add_argument("--load-rounds", type=int, default=15,
                    help="load: rounds of (miss, hit) on each of the two copies "
                         "(default %(default)s)")
    ap.add_argument("--copy-reps", type=int, default=7,
                    help="load: numpy copies per size, the median (default %(default)s)")
    ap.add_argument("--models", default="5,10,20,40",
                    help="zipf: numbers of models (default %(default)s)")
    ap.add_argument("--zipf-size-mib", type=float, default=16,
                    help="zipf: weights per model, MiB (default %(default)s)")
    ap.add_argument("--zipf-s", type=float, default=1.1,
                    help="zipf: exponent of the popularity law (default %(default)s)")
    ap.add_argument("--budget-fraction", type=float, default=0.2,
                    help="zipf: budget as a share of all the models' weights "
                         "(default %(default)s)")
    ap.add_argument("--threads", type=int, default=8,
                    help="zipf: client threads (default %(default)s)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="zipf: seconds of traffic before measuring (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="zipf: seconds measured with the budget (default %(default)s)")
    ap.add_argument("--reference-seconds", type=float, default=10.0,
                    help="zipf: seconds measured without a budget (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="zipf: rounds, each on freshly started servers; the tables show the "
                         "median (default %(default)s)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for every pjserve serve (repeatable), e.g. "
                         "--server-arg=--scheduler-discipline=fifo")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reexport", action="store_true", help="export the bench models again")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "residency.json")
    ap.add_argument("--plot-dir", type=Path, default=ROOT / "docs" / "img",
                    help="where residency.png goes")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    parts = parse_parts(ap, a.parts, PARTS)
    sizes = [float(s) if "." in s else int(s) for s in a.sizes.split(",")]
    ns = [int(n) for n in a.models.split(",")]
    if not PJSERVE.exists():
        sys.exit(f"residency: {PJSERVE.relative_to(ROOT)} is missing (cmake --build build)")

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-residency-"))
    result = {"machine": machine_info(), "loadavg_start": os.getloadavg(),
              "settings": {"parts": parts, "sizes_mib": sizes, "load_rounds": a.load_rounds,
                           "copy_reps": a.copy_reps, "models": ns,
                           "zipf_size_mib": a.zipf_size_mib, "zipf_s": a.zipf_s,
                           "budget_fraction": a.budget_fraction, "threads": a.threads,
                           "settle": a.settle, "seconds": a.seconds,
                           "reference_seconds": a.reference_seconds, "rounds": a.rounds,
                           "seed": a.seed,
                           "server_args": a.server_arg,
                           "protocol": "grpc", "request_batch": 1,
                           "host_copy": "numpy.copyto of uint8 arrays, one thread"},
              "versions": {"pjserve": git_revision()}}
    try:
        want = sorted(set((sizes if "load" in parts else [])
                          + ([a.zipf_size_mib] if "zipf" in parts else [])))
        log(f"exporting the bench models into {MODELS_DIR.relative_to(ROOT)}")
        paths = export_models(want, a.reexport)
        cache = MODELS_DIR / "cache"
        if "load" in parts:
            result["load"] = load_part(paths, sizes, a.load_rounds, a.copy_reps, cache, work,
                                       a.server_arg)
        if "zipf" in parts:
            result["zipf"] = zipf_part(paths[a.zipf_size_mib], a.zipf_size_mib, ns, a, cache,
                                       work)
    finally:
        remove_workdir(work, a.keep)

    write_report(result, started, a.json, markdown)
    plotter = find_plotter()
    if plotter is None:
        log("no plot: no Python with matplotlib (scripts/bootstrap-bench plot makes "
            ".venv-bench-plot)")
    else:
        a.plot_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(plotter), str(PLOT), str(a.json), str(a.plot_dir / "residency.png")],
                       check=True)
        log(f"wrote {a.plot_dir / 'residency.png'}")
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
