#!/usr/bin/env python3
"""Scheduler benchmark: coalescing and fair shares of pjserve serve on a compute-bound model.

    .venv/bin/python bench/scheduler.py          # or: make bench-scheduler

The model is a small convnet (bench-only, defined here, exported with
pjserve_export into build/bench-models/scheduler/): x f32 [batch,24,24,3]
-> conv3x3(32)+relu+maxpool -> conv3x3(64)+relu+maxpool -> dense(256)+relu
-> logits f32 [batch,10], compiled for batch sizes 1, 2, 4, 8, 16, 32. Unlike
the tiny mlp of bench/server_overhead.py, its device time dominates a request.

What runs, in order (each part can be picked with --parts):

  raw         build/pjs_bench_raw_execute per compiled batch size, in one
              process: upload, PJRT execute, read back; --raw-rounds rounds
              over all sizes, the median. images/s = batch size / mean round
              trip: the limit of the device at that batch size.
  sweep       build/pjserve serve (default options: the fair discipline) and
              perf_analyzer over gRPC with batch-1 requests at each
              --concurrency; images/s, p50 and p99 latency from perf_analyzer,
              and from /metrics scraped before and after each step: executions,
              rows per execution (coalesced requests), their histogram by
              compiled batch size, device seconds.
  unbatched   the same sweep against the same convnet exported with batch
              size 1 only (served by the same server), so nothing coalesces:
              what coalescing buys.
              Both sweeps run --rounds times, each round on a freshly started
              server (its own warm-up cost estimates); the median is reported.
  fair        two models saturated at once by two perf_analyzer processes in
              parallel, at each --fair-concurrency per model: (1) two copies of
              the convnet with weights --weights (default 3:1); (2) the convnet
              and a cheaper one (16x16 images, about two thirds of the device
              time per row) with weights 1:1. Each model's share of device time
              is the delta of pjserve_model_device_seconds_total over a window
              in which both are loaded, compared with its configured weight
              share; queue depths are sampled to show whether both stayed
              backlogged.

--model resnet50 runs raw, sweep and unbatched on ResNet-50 instead
(python/pjserve_export/resnet.py: x f32 [batch,224,224,3] -> logits
[batch,1000], 25.6 M parameters, random weights; compiled for batch sizes 1,
2, 4, 8, 16 by default; exported into build/bench-models/resnet50/) and
writes bench/results/scheduler_resnet50.{json,md} and
docs/img/scheduler_throughput_resnet50.png.

Writes bench/results/scheduler.json (everything), bench/results/scheduler.md
(the tables of docs/benchmarks.md), docs/img/scheduler_throughput.png and
docs/img/scheduler_fair_share.png (bench/plot_scheduler.py, run with a Python
that has matplotlib: .venv-bench-plot from `scripts/bootstrap-bench plot`).
Needs build/pjserve and build/pjs_bench_raw_execute (cmake --build build),
.venv and perf_analyzer (scripts/bootstrap). Servers listen on 127.0.0.1 with
free ports.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from benchlib import (RAW, ROOT, PjserveProcess, find_plotter, fmt, git_revision, log,
                      machine_info, metric, missing_tools, model_fingerprint, pa_command,
                      parse_parts, read_pa_csv, remove_workdir, run_perf_analyzer, write_report)

sys.path.insert(0, str(ROOT / "python"))

PLOT = ROOT / "bench" / "plot_scheduler.py"
MODELS_DIR = ROOT / "build" / "bench-models" / "scheduler"
PARTS = ("raw", "sweep", "unbatched", "fair")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)

# The bench models: name -> (image side, compiled batch sizes). One
# architecture; convnet_a/_b are the convnet under other names (one model per
# name is what the scheduler shares the device between).
MAIN, UNBATCHED, MODEL_A, MODEL_B, SMALL = (
    "convnet", "convnet_unbatched", "convnet_a", "convnet_b", "convnet_small")
IMAGE = 24
SMALL_IMAGE = 16
CONV1, CONV2, HIDDEN, CLASSES = 32, 64, 256, 10


# ---- the bench model ----------------------------------------------------------

def model_specs(batch_sizes):
    return {MAIN: (IMAGE, tuple(batch_sizes)), UNBATCHED: (IMAGE, (1,)),
            MODEL_A: (IMAGE, tuple(batch_sizes)), MODEL_B: (IMAGE, tuple(batch_sizes)),
            SMALL: (SMALL_IMAGE, tuple(batch_sizes))}


def describe_model(image):
    flat = (image // 4) ** 2 * CONV2
    return (f"x f32 [batch,{image},{image},3] NHWC -> conv3x3({CONV1})+relu+maxpool2 -> "
            f"conv3x3({CONV2})+relu+maxpool2 -> dense {flat}->{HIDDEN}+relu -> "
            f"dense {HIDDEN}->{CLASSES}: logits f32 [batch,{CLASSES}]")


def export_models(specs, force):
    """Exports every bench model into MODELS_DIR/bundles (skipped when the
    stamp says the same definitions were exported by the same exporter and
    jax before). Returns the bundles' directory."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from pjserve_export import export_jax

    bundles = MODELS_DIR / "bundles"
    # Exported again when the definitions, jax or the exporter change.
    definition, exporter = model_fingerprint(__file__)
    want = hashlib.sha256(json.dumps({"specs": specs, "jax": jax.__version__,
                                      "exporter": exporter, "code": definition},
                                     sort_keys=True).encode()).hexdigest()
    stamp = bundles / ".stamp"
    if not force and stamp.exists() and stamp.read_text().strip() == want and all(
            (bundles / n / "manifest.yaml").exists() for n in specs):
        log(f"bench models up to date in {bundles.relative_to(ROOT)}")
        return bundles

    def params(key, image):
        # He-normal weights from a fixed key per image size: every export
        # writes the same bytes.
        k = jax.random.split(key, 8)
        flat = (image // 4) ** 2 * CONV2

        def layer(kw, kb, shape):
            fan_in = int(np.prod(shape[:-1]))
            return {"w": jax.random.normal(kw, shape) * np.sqrt(2.0 / fan_in),
                    "b": 0.1 * jax.random.normal(kb, (shape[-1],))}
        return {"conv1": layer(k[0], k[1], (3, 3, 3, CONV1)),          # HWIO
                "conv2": layer(k[2], k[3], (3, 3, CONV1, CONV2)),
                "dense1": layer(k[4], k[5], (flat, HIDDEN)),
                "dense2": layer(k[6], k[7], (HIDDEN, CLASSES))}

    def conv_block(x, p):
        y = jax.lax.conv_general_dilated(x, p["w"], window_strides=(1, 1), padding="SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jax.nn.relu(y + p["b"])
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                     "VALID")

    def convnet(p, x):
        y = conv_block(conv_block(x, p["conv1"]), p["conv2"])
        y = jax.nn.relu(y.reshape(y.shape[0], -1) @ p["dense1"]["w"] + p["dense1"]["b"])
        return y @ p["dense2"]["w"] + p["dense2"]["b"]

    bundles.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    for name, (image, sizes) in specs.items():
        t0 = time.monotonic()
        export_jax(convnet, params(jax.random.PRNGKey(image), image),
                   [np.zeros((1, image, image, 3), np.float32)], bundles, name=name,
                   batch_sizes=sizes, input_names=["x"], output_names=["logits"],
                   description="scheduler benchmark convnet: " + describe_model(image))
        log(f"exported {name} (batch sizes {list(sizes)}) in {time.monotonic() - t0:.1f} s")
    stamp.write_text(want + "\n")
    return bundles


RESNET = "resnet50"
RESNET_UNBATCHED = "resnet50_unbatched"
RESNET_BATCH_SIZES = (1, 2, 4, 8, 16)
RESNET_DIR = ROOT / "build" / "bench-models" / RESNET


def export_resnet(batch_sizes, force):
    """ResNet-50 at `batch_sizes` and at batch size 1 alone (as
    RESNET_UNBATCHED) into RESNET_DIR/bundles, skipped when up to date.
    Returns the bundles' directory."""
    import dataclasses

    import jax
    from pjserve_export.resnet import resnet_model

    bundles = RESNET_DIR / "bundles"
    _, exporter = model_fingerprint(__file__)  # the exporter's sources hold resnet.py
    want = hashlib.sha256(json.dumps({"sizes": list(batch_sizes), "jax": jax.__version__,
                                      "exporter": exporter},
                                     sort_keys=True).encode()).hexdigest()
    stamp = bundles / ".stamp"
    if not force and stamp.exists() and stamp.read_text().strip() == want and all(
            (bundles / n / "manifest.yaml").exists() for n in (RESNET, RESNET_UNBATCHED)):
        log(f"bench models up to date in {bundles.relative_to(ROOT)}")
        return bundles
    bundles.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    model = resnet_model(50)
    for m, sizes in ((model, tuple(batch_sizes)),
                     (dataclasses.replace(model, name=RESNET_UNBATCHED), (1,))):
        t0 = time.monotonic()
        m.export(bundles, batch_sizes=sizes)
        log(f"exported {m.name} (batch sizes {list(sizes)}) in {time.monotonic() - t0:.1f} s")
    stamp.write_text(want + "\n")
    return bundles


def make_repository(bundles, names, path):
    """A model repository of symbolic links to some of the bundles."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for n in names:
        (path / n).symlink_to(bundles / n, target_is_directory=True)
    return path


# ---- servers ------------------------------------------------------------------

@dataclass
class Pjserve(PjserveProcess):
    repository: Path
    cache: Path
    log_path: Path
    extra: List[str]
    proc: Optional[subprocess.Popen] = None

    def start(self, models, timeout=300):
        self.serve_command()
        self.start_process()
        self.wait_models_ready(models, time.monotonic() + timeout, timeout, 0.25)
        sample = self.scrape()
        missing = sorted({f"{name}{{model=\"{m}\"}}" for name in REQUIRED_METRICS
                          for m in models
                          if not any(n == name and dict(ls).get("model") == m
                                     for n, ls in sample)})
        if missing:
            raise RuntimeError("pjserve's /metrics lacks " + ", ".join(missing))


# What the tables are computed from.
REQUIRED_METRICS = ("pjserve_model_device_seconds_total", "pjserve_model_dispatches_total",
                    "pjserve_model_queue_depth", "nv_inference_count",
                    "nv_inference_request_success", "pjserve_model_batch_rows_count")
def model_delta(before, after, model, seconds):
    """What the server did for `model` between two scrapes."""
    def d(name, **labels):
        return metric(after, name, model, **labels) - metric(before, name, model, **labels)

    execs = d("pjserve_model_dispatches_total")
    rows = d("nv_inference_count")
    requests = d("nv_inference_request_success")
    device_s = d("pjserve_model_device_seconds_total")
    buckets = {}
    for (n, ls), _ in after.items():
        lab = dict(ls)
        if n == "pjserve_model_batch_rows_bucket" and lab.get("model") == model:
            buckets[lab["le"]] = d(n, le=lab["le"])
    # Executions per bucket (rows in (previous size, size]) from the cumulative counts.
    hist, prev = {}, 0.0
    for le in sorted((k for k in buckets if k != "+Inf"), key=float):
        hist[le] = buckets[le] - prev
        prev = buckets[le]
    return {"seconds": seconds, "requests": requests, "requests_per_s": requests / seconds,
            "failures": d("nv_inference_request_failure"),
            "rows": rows, "executions": execs,
            "rows_per_execution": rows / execs if execs else None,
            "executions_by_rows_up_to": hist,
            "device_seconds": device_s, "device_utilization": device_s / seconds,
            "device_ms_per_execution": 1e3 * device_s / execs if execs else None,
            "queue_us_per_request": d("nv_inference_queue_duration_us") / requests
            if requests else None}


# ---- the raw limit -------------------------------------------------------------

def run_raw(bundle, batch, seconds):
    """pjs_bench_raw_execute for about `seconds` (iterations from a probe)."""
    def once(iterations, warmup):
        out = subprocess.run([str(RAW), str(bundle), "--batch-size", str(batch),
                              "--iterations", str(iterations), "--warmup", str(warmup), "--json"],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        return json.loads(out.stdout)
    probe = once(20, 5)
    iterations = max(50, int(seconds * 1e6 / probe["round_trip_us"]["mean"]))
    return once(iterations, max(10, iterations // 10))


def raw_limits(bundle, batch_sizes, rounds, seconds):
    """Every batch size once per round (sizes interleaved, so a burst of
    load on a shared machine hits one round, not one size); per size the
    median over rounds of each statistic."""
    per_size = {b: [] for b in batch_sizes}
    for rnd in range(rounds):
        for b in batch_sizes:
            r = run_raw(bundle, b, seconds)
            per_size[b].append(r)
            rt = r["round_trip_us"]
            log(f"raw round {rnd + 1} batch {b:3d}: mean {rt['mean'] / 1e3:6.2f} ms  p50 "
                f"{rt['p50'] / 1e3:6.2f} ms -> {b * 1e6 / rt['mean']:6.0f} images/s "
                f"({r['iterations']} iterations)")
    out = []
    for b, rs in per_size.items():
        med = {k: {q: statistics.median(r[k][q] for r in rs) for q in rs[0][k]}
               for k in ("round_trip_us", "execute_us")}
        out.append({"batch_size": b, "rounds": len(rs), **med,
                    "images_per_s_mean": b * 1e6 / med["round_trip_us"]["mean"],
                    "images_per_s_p50": b * 1e6 / med["round_trip_us"]["p50"],
                    "per_round": rs})
    return out


# ---- perf_analyzer ------------------------------------------------------------

def grpc_command(server, model, concurrency, window_ms, stability, max_trials, csv_path):
    return pa_command(model, f"127.0.0.1:{server.grpc}", "grpc", concurrency, window_ms,
                      stability, max_trials, csv_path)


def pa_result(csv_path):
    row = read_pa_csv(csv_path)
    return {"throughput": float(row["Inferences/Second"]),
            "p50_us": float(row["p50 latency"]), "p90_us": float(row["p90 latency"]),
            "p95_us": float(row["p95 latency"]), "p99_us": float(row["p99 latency"])}


def perf_analyzer(server, model, concurrency, window_ms, stability, workdir):
    """One measurement (three stable windows); on an unstable one, retries once
    with twice the tolerance."""
    csv_path = workdir / f"pa-{model}-c{concurrency}.csv"
    run = run_perf_analyzer(
        lambda tolerance: grpc_command(server, model, concurrency, window_ms, tolerance, 8,
                                       csv_path),
        csv_path, stability, f"({model}, concurrency {concurrency})", f"{model} c={concurrency}")
    return {**pa_result(csv_path), **run}


def sweep(server, model, concurrencies, window_ms, stability, workdir):
    steps = []
    for c in concurrencies:
        before, t0 = server.scrape(), time.monotonic()
        r = perf_analyzer(server, model, c, window_ms, stability, workdir)
        after, t1 = server.scrape(), time.monotonic()
        s = model_delta(before, after, model, t1 - t0)
        steps.append({"model": model, "concurrency": c, **r, "server": s})
        log(f"{model:18s} c={c:3d}: {r['throughput']:7.0f} images/s  p50 {r['p50_us'] / 1e3:7.2f} ms"
            f"  p99 {r['p99_us'] / 1e3:7.2f} ms  rows/execution "
            f"{s['rows_per_execution'] or 0:5.2f}  device busy {100 * s['device_utilization']:3.0f}%")
    return steps


def median_steps(rounds):
    """Per concurrency, the median over rounds of every number (top level and
    the server's), of the same model."""
    out = []
    for c in [s["concurrency"] for s in rounds[0]]:
        rs = [s for steps in rounds for s in steps if s["concurrency"] == c]
        med = {"model": rs[0]["model"], "concurrency": c, "rounds": len(rs)}
        for k, v in rs[0].items():
            if isinstance(v, (int, float)) and k not in med:
                med[k] = statistics.median(r[k] for r in rs)
        med["server"] = {k: statistics.median(r["server"][k] for r in rs)
                         for k, v in rs[0]["server"].items()
                         if isinstance(v, (int, float))
                         and all(r["server"][k] is not None for r in rs)}
        for k in ("rows_per_execution", "device_ms_per_execution"):
            med["server"].setdefault(k, None)
        out.append(med)
    return out


WARMUP_LINE = re.compile(r"model (\S+) ready: .*?warm-up ([^;]*);")


def warmup_costs(log_text):
    """{model: {batch size: ms}} from the server's "model X ready" log lines."""
    out = {}
    for m in WARMUP_LINE.finditer(log_text):
        out[m.group(1)] = {int(b): float(ms) for b, ms in
                           re.findall(r"b(\d+) ([0-9.]+) ms", m.group(2))}
    return out


def fair_run(server, weights, concurrency, settle_s, measure_s, workdir):
    """Saturates every model of `weights` at once with one perf_analyzer each;
    shares of device time over [settle_s, settle_s + measure_s] after start."""
    models = list(weights)
    window_ms = int(1000 * (settle_s + measure_s + 1.5) / 3)
    procs = []
    try:
        for m in models:
            csv_path = workdir / f"pa-fair-{m}.csv"
            # Three windows whatever their spread: the shares come from /metrics.
            cmd = grpc_command(server, m, concurrency, window_ms, 1000, 3, csv_path)
            procs.append((m, csv_path, cmd, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)))
        time.sleep(settle_s)
        before, t0 = server.scrape(), time.monotonic()
        # Queue depths sampled through the window: was each model backlogged?
        depths = {m: [] for m in models}
        while time.monotonic() < t0 + measure_s:
            time.sleep(min(0.2, max(0.0, t0 + measure_s - time.monotonic())))
            sample = server.scrape()
            for m in models:
                depths[m].append(metric(sample, "pjserve_model_queue_depth", m))
        after, t1 = server.scrape(), time.monotonic()
        pa = {}
        for m, csv_path, cmd, p in procs:
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            if p.returncode != 0 or not csv_path.exists():
                raise RuntimeError(f"perf_analyzer failed ({m}):\n{' '.join(cmd)}\n"
                                   f"{out[-2000:]}")
            pa[m] = pa_result(csv_path)
    finally:
        for _, _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    per = {m: model_delta(before, after, m, t1 - t0) for m in models}
    device = sum(per[m]["device_seconds"] for m in models)
    rps = sum(per[m]["requests_per_s"] for m in models)
    total_w = sum(weights.values())
    rows = []
    for m in models:
        rows.append({"model": m, "weight": weights[m], "configured_share": weights[m] / total_w,
                     "device_share": per[m]["device_seconds"] / device if device else None,
                     "request_share": per[m]["requests_per_s"] / rps if rps else None,
                     "queue_depth_mean": statistics.mean(depths[m]) if depths[m] else None,
                     "queue_empty_fraction": (sum(d == 0 for d in depths[m]) / len(depths[m])
                                              if depths[m] else None),
                     "perf_analyzer": pa[m], "server": per[m]})
        log(f"  {m:14s} weight {weights[m]:g}: device share "
            f"{rows[-1]['device_share']:.3f} (configured {rows[-1]['configured_share']:.3f}), "
            f"{per[m]['requests_per_s']:6.0f} requests/s, rows/execution "
            f"{per[m]['rows_per_execution'] or 0:.1f}, "
            f"{per[m]['device_ms_per_execution'] or 0:.2f} ms/execution, queue depth mean "
            f"{rows[-1]['queue_depth_mean'] or 0:.1f}, empty in "
            f"{100 * (rows[-1]['queue_empty_fraction'] or 0):.0f}% of samples")
    log(f"  device busy {100 * device / (t1 - t0):.0f}% of {t1 - t0:.1f} s")
    return {"concurrency_each": concurrency, "settle_s": settle_s, "measure_s": t1 - t0,
            "device_busy": device / (t1 - t0), "models": rows}


# ---- arguments -----------------------------------------------------------------

def parse_weights(text, default_names):
    """"3:1" (for the two default models) or "a=3,b=1"."""
    if "=" not in text:
        ws = [float(w) for w in text.split(":")]
        if len(ws) != len(default_names):
            raise ValueError(f"--weights {text!r}: expected {len(default_names)} weights")
        return dict(zip(default_names, ws))
    out = {}
    for part in text.split(","):
        name, w = part.split("=", 1)
        out[name.strip()] = float(w)
    return out


# ---- report ----------------------------------------------------------------------

def markdown(result):
    lines = []
    raw = result.get("raw")
    if raw:
        lines += ["Raw PJRT limit, in-process (`pjs_bench_raw_execute`: upload + execute + "
                  "read back):", "",
                  "| batch size | mean ms | p50 ms | p99 ms | images/s (batch / mean) | "
                  "per image us |", "|---:|---:|---:|---:|---:|---:|"]
        for r in raw:
            rt = r["round_trip_us"]
            lines.append(f"| {r['batch_size']} | {rt['mean'] / 1e3:.2f} | {rt['p50'] / 1e3:.2f} | "
                         f"{rt['p99'] / 1e3:.2f} | {r['images_per_s_mean']:.0f} | "
                         f"{rt['mean'] / r['batch_size']:.0f} |")
        lines.append("")
    raw_by = {r["batch_size"]: r["images_per_s_mean"] for r in raw or []}
    best_b = max(raw_by, key=raw_by.get) if raw_by else None
    rounds = result["settings"].get("rounds", 1)
    main_model = result["settings"].get("main_model", MAIN)
    unbatched_model = result["settings"].get("unbatched_model", UNBATCHED)
    for key, title in (("sweep", f"pjserve, `{main_model}` (batch sizes "
                        f"{', '.join(map(str, result['settings']['batch_sizes']))}), "
                        "perf_analyzer gRPC batch-1 requests"),
                       ("unbatched", f"pjserve, `{unbatched_model}` (batch size 1 only: nothing "
                        "coalesces), the same sweep")):
        steps = result.get(key)
        if not steps:
            continue
        vs = (f"vs raw b=1 | vs raw b={best_b} (best) |" if raw_by else "")
        lines += [f"{title} (median of {rounds} round{'s' if rounds != 1 else ''}):", "",
                  "| concurrency | images/s | p50 ms | p99 ms | rows / execution | "
                  "ms / execution | device busy | " + vs,
                  "|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if raw_by else "")]
        for s in steps:
            sv = s["server"]
            row = (f"| {s['concurrency']} | {s['throughput']:.0f} | "
                   f"{s['p50_us'] / 1e3:.2f} | {s['p99_us'] / 1e3:.2f} | "
                   f"{fmt(sv['rows_per_execution'], '.2f')} | "
                   f"{fmt(sv['device_ms_per_execution'], '.2f')} | "
                   f"{100 * sv['device_utilization']:.0f}% |")
            if raw_by:
                row += (f" {s['throughput'] / raw_by.get(1, float('nan')):.2f} | "
                        f"{s['throughput'] / raw_by[best_b]:.2f} |")
            lines.append(row)
        lines.append("")
    fair = result.get("fair")
    if fair:
        lines += ["Fair shares: two models saturated at once by one perf_analyzer each "
                  "(gRPC, batch-1 requests, the concurrency per model below); device time "
                  "is the delta of `pjserve_model_device_seconds_total` over "
                  f"{fair[0]['measure_s']:.0f} s, requests/s that of "
                  "`nv_inference_request_success`; p50/p99 from perf_analyzer:", "",
                  "| run | concurrency each | model | weight | configured share | "
                  "device-time share | requests/s | request share | rows / execution | "
                  "ms / execution | p50 ms | p99 ms |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for run in fair:
            for m in run["models"]:
                sv, pa = m["server"], m["perf_analyzer"]
                lines.append(f"| {run['name']} | {run['concurrency_each']} | `{m['model']}` | "
                             f"{m['weight']:g} | {m['configured_share']:.3f} | "
                             f"**{fmt(m['device_share'], '.3f')}** | "
                             f"{sv['requests_per_s']:.0f} | {fmt(m['request_share'], '.3f')} | "
                             f"{fmt(sv['rows_per_execution'], '.1f')} | "
                             f"{fmt(sv['device_ms_per_execution'], '.2f')} | "
                             f"{pa['p50_us'] / 1e3:.1f} | {pa['p99_us'] / 1e3:.1f} |")
        lines.append("")
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64",
                    help="perf_analyzer concurrencies of the sweeps (default %(default)s)")
    ap.add_argument("--unbatched-concurrency", default=None,
                    help="concurrencies of the unbatched sweep (default: --concurrency)")
    ap.add_argument("--seconds", type=float, default=6.0,
                    help="one sweep measurement: three perf_analyzer windows of SECONDS/3 "
                         "that agree within --stability (default %(default)s)")
    ap.add_argument("--stability", type=float, default=25.0,
                    help="perf_analyzer --stability-percentage (default %(default)s; retried "
                         "once at twice that)")
    ap.add_argument("--model", choices=("convnet", RESNET), default="convnet",
                    help="the model of the raw limit and the sweeps: the bench convnet "
                         "(default) or ResNet-50 (no fair part)")
    ap.add_argument("--batch-sizes", default=None,
                    help="compiled batch sizes (default: "
                         f"{','.join(map(str, BATCH_SIZES))}; ResNet-50: "
                         f"{','.join(map(str, RESNET_BATCH_SIZES))})")
    ap.add_argument("--rounds", type=int, default=2,
                    help="sweeps: rounds, each on a freshly started server; the tables show "
                         "the median (default %(default)s)")
    ap.add_argument("--raw-seconds", type=float, default=1.0,
                    help="raw limit: seconds per batch size and round (default %(default)s)")
    ap.add_argument("--raw-rounds", type=int, default=3,
                    help="raw limit: rounds over all batch sizes; the median is reported "
                         "(default %(default)s)")
    ap.add_argument("--weights", default="3:1",
                    help=f"fair run 1: weights of {MODEL_A}:{MODEL_B} (default %(default)s)")
    ap.add_argument("--fair-concurrency", default="16,64",
                    help="perf_analyzer concurrency per model in the fair runs, one "
                         "measurement each (default %(default)s)")
    ap.add_argument("--fair-seconds", type=float, default=20.0,
                    help="fair runs: seconds over which shares are measured (default "
                         "%(default)s)")
    ap.add_argument("--fair-settle", type=float, default=3.0,
                    help="fair runs: seconds of load before the measurement (default "
                         "%(default)s)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for every pjserve serve (repeatable), e.g. "
                         "--server-arg=--coalesce-discount=0.8")
    ap.add_argument("--reexport", action="store_true", help="export the bench models again")
    ap.add_argument("--json", type=Path, default=None,
                    help="default bench/results/scheduler.json (ResNet-50: "
                         "scheduler_resnet50.json)")
    ap.add_argument("--plot-dir", type=Path, default=ROOT / "docs" / "img",
                    help="where scheduler_throughput.png and scheduler_fair_share.png go "
                         "(ResNet-50: scheduler_throughput_resnet50.png)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    resnet = a.model == RESNET
    if resnet and a.parts == ",".join(PARTS):
        a.parts = "raw,sweep,unbatched"
    parts = parse_parts(ap, a.parts, PARTS)
    if resnet and "fair" in parts:
        ap.error("--model resnet50 runs raw, sweep and unbatched; the fair part is the convnet's")
    if a.json is None:
        a.json = ROOT / "bench" / "results" / ("scheduler_resnet50.json" if resnet
                                               else "scheduler.json")
    main_model, unbatched_model = (RESNET, RESNET_UNBATCHED) if resnet else (MAIN, UNBATCHED)
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    unbatched_conc = ([int(c) for c in a.unbatched_concurrency.split(",")]
                      if a.unbatched_concurrency else concurrencies)
    fair_conc = [int(c) for c in a.fair_concurrency.split(",")]
    batch_sizes = (sorted(int(b) for b in a.batch_sizes.split(",")) if a.batch_sizes else
                   list(RESNET_BATCH_SIZES if resnet else BATCH_SIZES))
    try:
        weights = parse_weights(a.weights, [MODEL_A, MODEL_B])
    except ValueError as e:
        ap.error(str(e))

    problems = missing_tools()
    if problems:
        sys.exit("scheduler: " + "; ".join(problems))

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-sched-"))
    specs = model_specs(batch_sizes)
    result = {"machine": machine_info(), "loadavg_start": os.getloadavg(),
              "settings": {"parts": parts, "concurrency": concurrencies,
                           "unbatched_concurrency": unbatched_conc, "seconds": a.seconds,
                           "perf_analyzer_window_ms": int(a.seconds * 1000 / 3),
                           "stability_percentage": a.stability, "batch_sizes": batch_sizes,
                           "rounds": a.rounds, "raw_seconds": a.raw_seconds,
                           "raw_rounds": a.raw_rounds, "fair_concurrency": fair_conc,
                           "fair_seconds": a.fair_seconds, "fair_settle": a.fair_settle,
                           "server_args": a.server_arg, "request_batch": 1,
                           "protocol": "grpc", "model": a.model, "main_model": main_model,
                           "unbatched_model": unbatched_model},
              "models": ({RESNET: {"input": "x f32 [batch,224,224,3]", "batch_sizes": batch_sizes,
                                   "function": "ResNet-50 v1.5 (python/pjserve_export/resnet.py), "
                                               "random weights: logits f32 [batch,1000]"}}
                         if resnet else
                         {n: {"input": f"x f32 [batch,{img},{img},3]", "batch_sizes": list(sz),
                              "function": describe_model(img)} for n, (img, sz) in specs.items()}),
              "versions": {"pjserve": git_revision()}}
    server = None
    try:
        if resnet:
            log(f"exporting ResNet-50 into {RESNET_DIR.relative_to(ROOT)}")
            bundles = export_resnet(batch_sizes, a.reexport)
        else:
            log(f"exporting the bench models into {MODELS_DIR.relative_to(ROOT)}")
            bundles = export_models(specs, a.reexport)
        cache = (RESNET_DIR if resnet else MODELS_DIR) / "cache"

        if "raw" in parts:
            log(f"raw limit: {len(batch_sizes)} batch sizes x {a.raw_rounds} rounds of about "
                f"{a.raw_seconds:g} s")
            result["raw"] = raw_limits(bundles / main_model, batch_sizes, a.raw_rounds,
                                       a.raw_seconds)

        sweeps = [(k, m, c) for k, m, c in (("sweep", main_model, concurrencies),
                                            ("unbatched", unbatched_model, unbatched_conc))
                  if k in parts]
        if sweeps:
            window_ms = int(a.seconds * 1000 / 3)
            rounds = {k: [] for k, _, _ in sweeps}
            result["warmup_ms"] = []
            for rnd in range(a.rounds):
                # A fresh server per round: its warm-up measures the costs anew.
                repo = make_repository(bundles, [main_model, unbatched_model],
                                       bundles.parent / "repo-sweep")
                server = Pjserve(repo, cache, work / f"pjserve-sweep{rnd + 1}.log", a.server_arg)
                log(f"round {rnd + 1}/{a.rounds}: starting pjserve on "
                    f"{repo.relative_to(ROOT)}")
                server.start([main_model, unbatched_model])
                result["server_command_sweep"] = server.cmd
                result["warmup_ms"].append(warmup_costs(server.log_path.read_text()))
                order = sweeps if rnd % 2 == 0 else sweeps[::-1]
                for key, model, concs in order:
                    log(f"round {rnd + 1}/{a.rounds}: sweep {model}, {len(concs)} steps of "
                        f"three {window_ms} ms windows")
                    rounds[key].append(sweep(server, model, concs, window_ms, a.stability,
                                             work))
                server.stop()
                server = None
            for key, _, _ in sweeps:
                result[key + "_rounds"] = rounds[key]
                result[key] = median_steps(rounds[key])

        if "fair" in parts:
            result["fair"] = []
            runs = [("weights " + ":".join(f"{w:g}" for w in weights.values()), weights),
                    ("unequal cost 1:1", {MODEL_A: 1.0, SMALL: 1.0})]
            for i, (name, ws) in enumerate(runs):
                repo = make_repository(bundles, list(ws), MODELS_DIR / f"repo-fair{i + 1}")
                extra = [x for m, w in ws.items() for x in ("--model-weight", f"{m}={w:g}")]
                server = Pjserve(repo, cache, work / f"pjserve-fair{i + 1}.log",
                                 a.server_arg + extra)
                log(f"fair run {i + 1} ({name}): starting pjserve with {' '.join(extra)}")
                server.start(list(ws))
                warm = warmup_costs(server.log_path.read_text())
                for c in fair_conc:
                    log(f"fair run {i + 1} ({name}): perf_analyzer concurrency {c} per model")
                    run = fair_run(server, ws, c, a.fair_settle, a.fair_seconds, work)
                    run.update({"name": name, "server_command": server.cmd,
                                "warmup_ms": warm})
                    result["fair"].append(run)
                server.stop()
                server = None
    finally:
        if server is not None:
            server.stop()
        remove_workdir(work, a.keep)

    write_report(result, started, a.json, markdown)

    plotter = find_plotter()
    if plotter is None:
        log("no plots: no Python with matplotlib (scripts/bootstrap-bench plot makes "
            ".venv-bench-plot)")
    else:
        a.plot_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(plotter), str(PLOT), str(a.json), str(a.plot_dir)], check=True)
        log(f"wrote the plots into {a.plot_dir}")
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
