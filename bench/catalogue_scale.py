#!/usr/bin/env python3
"""Catalogue scale: how one `pjserve serve` copes as its repository grows from
100 to 1,000 to 10,000 models.

    .venv/bin/python bench/catalogue_scale.py [--sizes 100,1000,10000] [--quick]
                                               [--extra-args="--host-weight-budget 64Mi"]
                                               [--idle-seconds 20] [--requests 200]
                                               [--ready-timeout 1200] [--out FILE] [--keep]

The models: N copies of the demo mlp (x f32 [batch,16] -> y f32 [batch,4],
batch sizes 1, 4, 8), exported once; every copy has its own name and its own
weights (3 KiB, drawn from a seeded generator per copy) and hard links to the
one set of .mlir modules, so the executable cache (--cache-dir) compiles them
once (a server that shares the executables of identical modules between
models then holds one of each: the log says how many were shared). The
bundles are written once into a temporary directory; each size's repository
holds symbolic links to the first N. One start on a repository of a single
copy fills the cache first: every measured start loads its executables from
it (a warm cache, and the bundles in the page cache).

For each size, one `pjserve serve --model-control-mode static` (plus
--extra-args) on free loopback ports, measured in this order:

  start-up   from the process's start until GET /v2/health/ready answers 200
             (every model loaded: --strict-readiness is on by default);
             progress printed every 5 s from the server's "[i/N]" log lines.
             From those lines: the time before the first model loads (plugin,
             repository scan), loading itself, the time from the last model
             ready to "serving", and the mean per-model load time among
             the first and the last 10 % of the models (loads that slow down
             as the catalogue fills show there).
  memory     VmRSS and VmHWM from /proc/PID/status once ready; RSS per model
             beyond the smallest size's run: (rss_N - rss_min)/(N - N_min).
             Threads, open descriptors and memory mappings too.
  idle CPU   the server's utime + stime over --idle-seconds with no traffic,
             as % of one CPU, and the threads that used it (by name, from
             /proc/PID/task/*/stat).
  endpoints  GET /metrics (metrics port), POST /v2/repository/index and
             GET /v2/models/stats: median time of 5 fetches and the size of
             the body.
  requests   one inference (tritonclient HTTP) to a random copy, checked
             against that copy's output computed with numpy; one over gRPC
             (tritonclient; a failure is recorded, not raised); then
             --requests HTTP requests one after another, each to a random
             copy, every answer checked: p50, p99. RSS after them.
  stop       SIGTERM until the process exits.

A size whose server exits, finishes loading with models missing (strict
readiness then never answers 200: what serves is measured) or is not ready
within --ready-timeout gets a row saying where loading stood ("k of N
loaded, r models/s, m memory mappings") and the log's last complaints; the
notes project how many models vm.max_map_count leaves room for. Writes
bench/results/catalogue_scale.json and .md (--quick: 100 and 1,000, into
build/bench-catalogue-scale-quick/ unless --out). The binary (build/pjserve
or $PJSERVE_BIN) is copied at the start, so a rebuild during the run changes
no row; its sha256 is recorded. Timings are the driver's wall clock on a
shared machine: client and server share the CPUs. Needs build/pjserve
(cmake --build build) and .venv (scripts/bootstrap).
"""

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchlib import (CLOCK_TICKS, PJSERVE, ROOT, PjserveProcess, fmt, git_revision,
                      http_get, log, machine_info, write_report)

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

RESULTS = ROOT / "bench" / "results" / "catalogue_scale.json"
QUICK_RESULTS = ROOT / "build" / "bench-catalogue-scale-quick" / "catalogue_scale.json"
KIB = 1024
FETCHES = 5
# Output tolerance against numpy (tests/common.py F32_TOL: XLA and numpy may
# sum the dots in another order).
ATOL = RTOL = 1e-5


# ---- the bench model ----------------------------------------------------------

def name_of(i):
    return f"m{i:05d}"


def copy_weights(template, i):
    """Copy i's weights: the demo mlp's shapes and dtypes, values drawn from
    seed i (w ~ N(0, 2/fan_in) as the demo's, b ~ 0.1 N(0, 1))."""
    rng = np.random.default_rng(10_000 + i)
    out = {}
    for key, a in template.items():
        scale = (2.0 / a.shape[0]) ** 0.5 if key.endswith(".w") else 0.1
        out[key] = (rng.standard_normal(a.shape) * scale).astype(a.dtype)
    return out


def mlp_numpy(w, x):
    h = np.maximum(x @ w["dense1.w"] + w["dense1.b"], np.float32(0))
    return h @ w["dense2.w"] + w["dense2.b"]


def make_bundles(out, n):
    """The demo mlp exported into out/_export/, then n copies out/m00000.. with
    their own weights and names, the .mlir modules hard links. Returns the
    template weights (for copy_weights) and the bytes of one copy's weights file."""
    import pjserve_export as pe
    from pjserve_export.demo import demo_models

    src = demo_models(["mlp"])[0].export(out / "_export")
    template, metadata = pe.read_safetensors(src / pe.WEIGHTS_FILE)
    manifest = (src / pe.MANIFEST_FILE).read_text()
    if 'name: "mlp"\n' not in manifest:
        raise RuntimeError(f"unexpected manifest:\n{manifest}")
    modules = [p for p in src.iterdir() if p.suffix == ".mlir"]
    t0 = time.monotonic()
    for i in range(n):
        d = out / name_of(i)
        d.mkdir()
        for m in modules:
            os.link(m, d / m.name)
        pe.write_safetensors(d / pe.WEIGHTS_FILE, copy_weights(template, i), metadata)
        (d / pe.MANIFEST_FILE).write_text(
            manifest.replace('name: "mlp"\n', f'name: "{name_of(i)}"\n'))
        if (i + 1) % 2000 == 0:
            log(f"  {i + 1} of {n} copies written ({time.monotonic() - t0:.0f} s)")
    return template, (out / name_of(0) / pe.WEIGHTS_FILE).stat().st_size


def repository(bundles, dest, n):
    """dest/ with symbolic links to the first n copies."""
    dest.mkdir(parents=True)
    for i in range(n):
        (dest / name_of(i)).symlink_to(bundles / name_of(i), target_is_directory=True)
    return dest


# ---- servers ------------------------------------------------------------------

class Server(PjserveProcess):
    def __init__(self, binary, repository, cache, extra, log_path):
        self.binary, self.repository, self.cache, self.extra = binary, repository, cache, extra
        self.log_path = log_path
        self.proc = None

    def start(self):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.start_process()

    def url(self, path):
        return f"http://127.0.0.1:{self.http}{path}"


def proc_status(pid):
    """VmRSS, VmHWM (MiB) and Threads from /proc/PID/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


def map_count(pid):
    with open(f"/proc/{pid}/maps", "rb") as f:
        return f.read().count(b"\n")


def max_map_count():
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def thread_ticks(pid):
    """{(tid, name): utime + stime ticks} of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out[(int(tid), name)] = int(fields[11]) + int(fields[12])
    return out


def process_cpu(pid):
    fields = Path(f"/proc/{pid}/stat").read_text()
    fields = fields[fields.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def log_time(stamp):
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=timezone.utc).timestamp()


# "(3 modules from the executable cache, 0 shared with loaded models)"; older
# binaries share nothing and say only the first half.
MODULES = re.compile(r"\((\d+) modules from the executable cache(?:, (\d+) shared with "
                     r"loaded models)?\)")


def load_progress(text):
    """From the server log: {index: (loading at, ready at)} (wall-clock
    seconds), the first line's time, the "serving" line's time (or None) and
    the modules loaded from the executable cache and shared with a model
    already loaded, over every model."""
    loads, first, serving = {}, None, None
    modules = {"from_cache": 0, "shared": 0}
    for line in text.splitlines():
        m = MODULES.search(line)
        if m:
            modules["from_cache"] += int(m.group(1))
            modules["shared"] += int(m.group(2) or 0)
        if first is None and line[:4].isdigit():
            first = log_time(line.split()[0])
        if " serving: " in line:
            serving = log_time(line.split()[0])
            continue
        m = re.match(r"^(\S+Z) \w+\s+\[(\d+)/\d+\] (loading model|model \S+ ready)", line)
        if m:
            t, i = log_time(m.group(1)), int(m.group(2))
            start, end = loads.get(i, (None, None))
            loads[i] = (t, end) if m.group(3) == "loading model" else (start, t)
    return loads, first, serving, modules


def progress_line(server, n):
    """(models ready so far, text) from the log."""
    loads = load_progress(server.log_path.read_text(errors="replace"))[0]
    done = sorted(e for s, e in loads.values() if e is not None)
    k = len(done)
    recent = [t for t in done if t >= done[-1] - 10] if done else []
    rate = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) > 1 and \
        recent[-1] > recent[0] else None
    try:
        rss = proc_status(server.proc.pid).get("VmRSS")
        server.maps_seen = (k, map_count(server.proc.pid))
    except OSError:
        rss = None
    maps = getattr(server, "maps_seen", (None, None))
    return k, (f"{k} of {n} loaded, {fmt(rate, '.0f')} models/s over the last 10 s of the "
               f"log, RSS {fmt(rss, '.0f')} MiB, {fmt(maps[1], ',d')} memory mappings "
               f"(at {fmt(maps[0], ',d')} loaded)")


def load_breakdown(server, n):
    """Start-up split from the log (seconds): before the first load, loading,
    after the last; mean per-model load time (ms) of the first and last 10 %."""
    loads, first, serving, modules = load_progress(server.log_path.read_text(errors="replace"))
    out = {"models_logged_ready": sum(1 for s, e in loads.values() if e is not None),
           "modules_from_cache": modules["from_cache"], "modules_shared": modules["shared"]}
    if not loads or 1 not in loads:
        return out
    start = server.started_wall
    out["before_first_load_s"] = round(loads[1][0] - start, 3)
    last = max(e for s, e in loads.values() if e is not None)
    out["loading_s"] = round(last - loads[1][0], 3)
    if serving is not None:
        out["last_ready_to_serving_s"] = round(serving - last, 3)
    per = [(e - s) * 1e3 for i, (s, e) in sorted(loads.items())
           if s is not None and e is not None]
    tenth = max(1, len(per) // 10)
    # the log's times are in ms: a mean over many models resolves less
    out["load_ms_first_10pct_mean"] = round(statistics.fmean(per[:tenth]), 3)
    out["load_ms_last_10pct_mean"] = round(statistics.fmean(per[-tenth:]), 3)
    # the first model compiles or reads the cache; the rest are copies
    out["load_ms_max_after_first"] = round(max(per[1:]), 1) if len(per) > 1 else None
    # time between consecutive models (load + what the loop does between)
    if len(loads) == n and all(loads[i][0] for i in (1, n)):
        out["models_per_s"] = round((n - 1) / max(loads[n][0] - loads[1][0], 1e-9), 1)
    return out


# ---- measurements ----------------------------------------------------------------

def timed_fetch(url, method="GET", body=None, timeout=120):
    """(seconds, status, bytes of the body) of one request."""
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body else {})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        data, status = e.read(), e.code
    return time.perf_counter() - t0, status, data


def endpoint(url, method="GET", body=None, check=None):
    """Median time (ms) of FETCHES fetches and the body's size; check(body) on
    the last body returns a count (models listed) or raises."""
    times, data = [], b""
    for _ in range(FETCHES):
        t, status, data = timed_fetch(url, method, body)
        if status != 200:
            raise RuntimeError(f"{method} {url} answered {status}: {data[:300]!r}")
        times.append(t)
    out = {"ms": round(statistics.median(times) * 1e3, 2),
           "ms_min": round(min(times) * 1e3, 2), "bytes": len(data)}
    if check:
        out["entries"] = check(data)
    return out


def idle_cpu(pid, seconds):
    ticks0, cpu0 = thread_ticks(pid), process_cpu(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    ticks1, cpu1 = thread_ticks(pid), process_cpu(pid)
    wall = time.monotonic() - t0
    by_name = {}
    for key, v in ticks1.items():
        d = v - ticks0.get(key, 0)
        if d:
            by_name[key[1]] = by_name.get(key[1], 0) + d
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
    return {"idle_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 2),
            "idle_cpu_threads": {name: round(100 * t / CLOCK_TICKS / wall, 2)
                                 for name, t in top},
            "threads_by_name": _thread_names(ticks1)}


def _thread_names(ticks):
    names = {}
    for _, name in ticks:
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items(), key=lambda kv: -kv[1]))


def requests_run(server, template, ready, count, seed):
    """One checked inference, then `count` more to random copies; every answer
    checked against numpy."""
    import tritonclient.http as httpclient

    rng = np.random.default_rng(seed)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=120)
    times, models = [], set()
    try:
        for k in range(count + 1):
            i = ready[int(rng.integers(len(ready)))]
            x = rng.standard_normal((1, 16)).astype(np.float32)
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            t0 = time.perf_counter()
            res = client.infer(name_of(i), [inp])
            t = time.perf_counter() - t0
            got = res.as_numpy("y")
            want = mlp_numpy(copy_weights(template, i), x)
            if got is None or got.shape != want.shape or \
                    not np.allclose(got, want, atol=ATOL, rtol=RTOL):
                raise RuntimeError(f"{name_of(i)}: got {got}, expected {want}")
            if k == 0:
                first = {"model": name_of(i), "ms": round(t * 1e3, 3)}
            else:
                times.append(t)
                models.add(i)
    finally:
        client.close()
    times.sort()
    return {"first_request": first, "requests": count, "distinct_models": len(models),
            "p50_ms": round(statistics.median(times) * 1e3, 3),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3, 3),
            "max_ms": round(times[-1] * 1e3, 3)}


def log_problems(server, keep=5):
    """The count of WARN and ERROR lines of the server's log, and the first few
    (start-up's expected warnings included)."""
    lines = [l for l in server.log_path.read_text(errors="replace").splitlines()
             if re.match(r"^\S+Z (WARN|ERROR)", l)]
    return {"count": len(lines), "first": lines[:keep]}


def grpc_check(server, template, ready, seed):
    """One gRPC inference (tritonclient) to a random copy, checked: "ok" or
    what went wrong (a server short of file descriptors refuses connections)."""
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(seed)
    i = ready[int(rng.integers(len(ready)))]
    x = rng.standard_normal((1, 16)).astype(np.float32)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name_of(i), [inp], client_timeout=20).as_numpy("y")
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return f"failed: {str(e).splitlines()[0][:200]}"
    finally:
        client.close()
    want = mlp_numpy(copy_weights(template, i), x)
    if got is None or got.shape != want.shape or not np.allclose(got, want, atol=ATOL, rtol=RTOL):
        raise RuntimeError(f"{name_of(i)} over gRPC: got {got}, expected {want}")
    return "ok"


def count_models(key):
    def check(data):
        doc = json.loads(data)
        if isinstance(doc, dict):
            doc = doc.get(key, [])
        return len(doc)
    return check


def measure(binary, n, bundles, work, cache, extra, template, a):
    """One size: start, wait, measure, stop. Returns the row."""
    repo = repository(bundles, work / f"repo-{n}", n)
    server = Server(binary, repo, cache, extra, work / f"serve-{n}.log")
    row = {"models": n}
    server.start()
    try:
        log(f"{n} models: started pid {server.proc.pid}")
        deadline = server.started + a.ready_timeout
        next_report = server.started + 5
        loaded_at = None  # when the log said "k of N models loaded"
        while True:
            now = time.monotonic()
            if server.proc.poll() is not None:
                k, text = progress_line(server, n)
                row.update({"status": f"exited with status {server.proc.returncode} after "
                                      f"{now - server.started:.0f} s: {text}",
                            "loaded_at_exit": k, "log_problems": log_problems(server),
                            "log_last_non_info": [l for l in server.log_tail(12).splitlines()
                                                  if " INFO " not in l],
                            "maps_last_seen": getattr(server, "maps_seen", None)})
                row.update(load_breakdown(server, n))
                log(f"{n} models: {row['status']}\n{server.log_tail(15)}")
                return row
            status, _ = http_get(server.url("/v2/health/ready"), timeout=5.0)
            if status == 200:
                break
            if loaded_at is None and " models loaded from " in server.log_tail(40):
                loaded_at = now
            if loaded_at is not None and now - loaded_at > 10:
                # Loading ended, some models did not load: strict readiness
                # stays 400. Measure what serves.
                k, text = progress_line(server, n)
                summary = [l for l in server.log_path.read_text(errors="replace").splitlines()
                           if " models loaded from " in l]
                row["status"] = (f"serving but not ready: "
                                 f"{summary[-1].split('  ', 1)[-1] if summary else text}")
                break
            if now > deadline:
                k, text = progress_line(server, n)
                row.update({"status": f"not ready after {a.ready_timeout:.0f} s: {text}",
                            "loaded_at_timeout": k, "log_problems": log_problems(server),
                            "maps_last_seen": getattr(server, "maps_seen", None)})
                row.update(load_breakdown(server, n))
                log(f"{n} models: {row['status']}")
                return row
            if now >= next_report:
                log(f"  {n} models, {now - server.started:.0f} s: "
                    f"{progress_line(server, n)[1]}")
                next_report += 5
            time.sleep(0.1 if now - server.started < 5 else 0.5)
        row["ready_s"] = round(time.monotonic() - server.started, 3)
        row.setdefault("status", "ok")
        row.update(load_breakdown(server, n))
        row["log_problems"] = log_problems(server)
        row["grpc_limit_line"] = next(
            (l.split("gRPC limits: ", 1)[1] for l in
             server.log_path.read_text(errors="replace").splitlines()
             if "gRPC limits: " in l), None)
        log(f"{n} models: {row['status']} after {row['ready_s']:.2f} s")
        pid = server.proc.pid
        st = proc_status(pid)
        row.update({"rss_mib": round(st["VmRSS"], 1), "hwm_mib": round(st["VmHWM"], 1),
                    "threads": st["Threads"], "fds": len(os.listdir(f"/proc/{pid}/fd")),
                    "maps": map_count(pid)})
        row.update(idle_cpu(pid, a.idle_seconds))
        log(f"{n} models: RSS {row['rss_mib']:.0f} MiB, idle CPU {row['idle_cpu_pct']:.2f} % "
            f"({row['idle_cpu_threads']})")
        row["metrics"] = endpoint(f"http://127.0.0.1:{server.metrics}/metrics",
                                  check=lambda d: sum(1 for l in d.splitlines()
                                                      if l and not l.startswith(b"#")))
        row["index"] = endpoint(server.url("/v2/repository/index"), "POST", b"{}",
                                check=count_models("models"))
        row["stats"] = endpoint(server.url("/v2/models/stats"),
                                check=count_models("model_stats"))
        for key in ("metrics", "index", "stats"):
            log(f"{n} models: {key} {row[key]['ms']:.1f} ms, {row[key]['bytes'] / KIB:.0f} KiB")
        ready = list(range(n))
        if row["status"] != "ok":
            _, _, body = timed_fetch(server.url("/v2/repository/index"), "POST", b"{}")
            ready = [int(m["name"][1:]) for m in json.loads(body)
                     if m.get("state") == "READY" and re.fullmatch(r"m\d{5}", m["name"])]
            row["models_ready"] = len(ready)
            log(f"{n} models: {len(ready)} READY in the index; requests go to those")
        row["grpc_request"] = grpc_check(server, template, ready, seed=n + 1)
        log(f"{n} models: one gRPC request: {row['grpc_request']}")
        row.update(requests_run(server, template, ready, a.requests, seed=n))
        log(f"{n} models: first request ok ({row['first_request']['model']}); "
            f"{a.requests} requests p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms")
        st = proc_status(pid)
        row["rss_after_requests_mib"] = round(st["VmRSS"], 1)
        row["server_cpu_s"] = round(process_cpu(pid), 2)
    finally:
        t0 = time.monotonic()
        server.stop()
        row["stop_s"] = round(time.monotonic() - t0, 2)
        shutil.rmtree(repo, ignore_errors=True)
    return row


# ---- results --------------------------------------------------------------------

def per_model(rows):
    """RSS per model (KiB) beyond the smallest ready size's run."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("rss_mib")]
    if not ok:
        return
    base = min(ok, key=lambda r: r["models"])
    for r in ok:
        if r is not base:
            r["rss_per_model_kib"] = round(
                (r["rss_mib"] - base["rss_mib"]) * KIB / (r["models"] - base["models"]), 2)
            r["rss_per_model_baseline"] = base["models"]


def tables(result):
    rows = result["rows"]
    g = lambda r, *k: _get(r, *k)  # noqa: E731
    t1 = ["| models | ready s | before 1st load s | loading s | models/s | mean load ms "
          "first/last 10 % | RSS MiB | HWM MiB | RSS/model KiB | threads | fds | maps | "
          "idle CPU % | stop s |",
          "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    t2 = ["| models | /metrics ms | /metrics KiB | samples | index ms | index KiB | "
          "stats ms | stats KiB | first request | gRPC request | p50 ms | p99 ms | RSS after MiB |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        first_last = (f"{fmt(r.get('load_ms_first_10pct_mean'), '.2f')} / "
                      f"{fmt(r.get('load_ms_last_10pct_mean'), '.2f')}")
        t1.append(f"| {r['models']:,} | {fmt(r.get('ready_s'), '.2f')} | "
                  f"{fmt(r.get('before_first_load_s'), '.2f')} | "
                  f"{fmt(r.get('loading_s'), '.2f')} | {fmt(r.get('models_per_s'), ',.0f')} | "
                  f"{first_last} | {fmt(r.get('rss_mib'), ',.1f')} | "
                  f"{fmt(r.get('hwm_mib'), ',.1f')} | {fmt(r.get('rss_per_model_kib'), '.1f')} | "
                  f"{fmt(r.get('threads'), 'd')} | {fmt(r.get('fds'), 'd')} | "
                  f"{fmt(r.get('maps'), ',d')} | {fmt(r.get('idle_cpu_pct'), '.2f')} | "
                  f"{fmt(r.get('stop_s'), '.2f')} |")
        first = "ok" if r.get("first_request") else "-"
        grpc = r.get("grpc_request", "-")
        grpc = "failed" if grpc.startswith("failed") else grpc
        t2.append(f"| {r['models']:,} | {fmt(g(r, 'metrics', 'ms'), '.1f')} | "
                  f"{fmt(_kib(g(r, 'metrics', 'bytes')), ',.0f')} | "
                  f"{fmt(g(r, 'metrics', 'entries'), ',d')} | "
                  f"{fmt(g(r, 'index', 'ms'), '.1f')} | "
                  f"{fmt(_kib(g(r, 'index', 'bytes')), ',.0f')} | "
                  f"{fmt(g(r, 'stats', 'ms'), '.1f')} | "
                  f"{fmt(_kib(g(r, 'stats', 'bytes')), ',.0f')} | "
                  f"{first} | {grpc} | {fmt(r.get('p50_ms'), '.2f')} | "
                  f"{fmt(r.get('p99_ms'), '.2f')} | "
                  f"{fmt(r.get('rss_after_requests_mib'), ',.1f')} |")
    return t1, t2


def _get(r, *keys):
    for k in keys:
        if not isinstance(r, dict) or k not in r:
            return None
        r = r[k]
    return r


def _kib(v):
    return None if v is None else v / KIB


def markdown(result):
    c, m = result["config"], result["machine"]
    t1, t2 = tables(result)
    lines = [f"# Catalogue scale: one pjserve serve, {', '.join(f'{n:,}' for n in c['sizes'])} "
             "models", "",
             f"Copies of the demo mlp, {c['weights_bytes']:,} bytes of weights each (distinct), "
             f"batch sizes 1, 4, 8 (3 modules, shared through a warm executable cache); "
             f"`--model-control-mode static` {c['extra_args'] or '(no extra arguments)'}. "
             f"{m['cpu']}, {m['cores']} CPUs, {m.get('memory_gib', '?')} GiB, CPU plugin; "
             f"revision {result['revision']} (binary sha256 "
             f"{result.get('binary', {}).get('sha256', '?')[:12]}, built "
             f"{result.get('binary', {}).get('mtime', '?')}).", "",
             "Start-up (until /v2/health/ready is 200; the split from the server's log), "
             f"memory once ready, idle CPU over {c['idle_seconds']} s without traffic "
             "(% of one CPU), SIGTERM to exit:", "", *t1, "",
             f"Endpoints (median of {FETCHES} fetches), one gRPC request, and {c['requests']} "
             "HTTP requests one at a time to random models, every answer checked against "
             "numpy:", "", *t2, ""]
    ok = sorted((r for r in result["rows"] if r.get("maps")), key=lambda r: r["models"])
    limit = c.get("vm_max_map_count")
    if len(ok) >= 2 and ok[-1]["models"] > ok[0]["models"]:
        per = (ok[-1]["maps"] - ok[0]["maps"]) / (ok[-1]["models"] - ok[0]["models"])
        base = ok[0]["maps"] - per * ok[0]["models"]
        room = (f"leaves room for about {(limit - base) / per:,.0f} models"
                if limit and per >= 0.1 else "is not approached")
        lines.append(f"- memory mappings: {per:.1f} per model ({base:,.0f} without models); "
                     f"vm.max_map_count {fmt(limit, ',d')} {room}")
    for r in result["rows"]:
        if "modules_from_cache" in r:
            lines.append(f"- {r['models']:,} models: executables {r['modules_from_cache']:,} "
                         f"loaded from the cache, {r['modules_shared']:,} shared with a model "
                         "already loaded")
        if str(r.get("grpc_request", "")).startswith("failed"):
            lines.append(f"- {r['models']:,} models, the gRPC request {r['grpc_request']} "
                         f"({r.get('fds', '?')} file descriptors open; the log's gRPC limits: "
                         f"{r.get('grpc_limit_line', '?')})")
        if r.get("status") != "ok":
            lines.append(f"- {r['models']:,} models: {r.get('status')}")
            complaints = r.get("log_last_non_info") or (r.get("log_problems") or {}).get(
                "first", [])[:3]
            for l in complaints:
                lines.append(f"  `{l.strip()}`")
        elif r.get("idle_cpu_threads"):
            busy = ", ".join(f"{k} {v:.2f} %" for k, v in r["idle_cpu_threads"].items())
            lines.append(f"- {r['models']:,} models, idle CPU by thread: {busy}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--sizes", default="100,1000,10000",
                    help="catalogue sizes, comma-separated (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="sizes 100,1000")
    ap.add_argument("--extra-args", default="",
                    help='extra pjserve serve arguments, one string: '
                         '--extra-args="--host-weight-budget 64Mi"')
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--ready-timeout", type=float, default=1200.0,
                    help="seconds each start may take (default %(default)s)")
    ap.add_argument("--out", type=Path, help="results JSON (the .md beside it)")
    ap.add_argument("--keep", action="store_true", help="keep the bundles and the servers' logs")
    a = ap.parse_args(argv)
    sizes = [100, 1000] if a.quick else sorted(int(s) for s in a.sizes.split(",") if s.strip())
    if not sizes or min(sizes) < 1:
        ap.error("--sizes: positive counts")
    out = a.out or (QUICK_RESULTS if a.quick else RESULTS)
    if not PJSERVE.exists():
        ap.error(f"{PJSERVE} is missing (cmake --build build)")
    from common import plugin_path_or_message
    plugin, why = plugin_path_or_message()
    if plugin is None:
        ap.error(why)
    extra = ["--pjrt-plugin", str(plugin), "--model-control-mode", "static",
             *shlex.split(a.extra_args)]
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjserve-bench-catalogue-"))
    rows = []
    try:
        # A copy of the binary: a rebuild of build/pjserve during the run
        # changes no row.
        binary = work / "pjserve"
        shutil.copy2(PJSERVE, binary)
        built = {"path": str(PJSERVE), "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
                 "mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                                        time.localtime(PJSERVE.stat().st_mtime))}
        bundles = work / "bundles"
        bundles.mkdir()
        log(f"writing {max(sizes):,} copies of the mlp into {bundles}")
        template, weights_bytes = make_bundles(bundles, max(sizes))
        cache = work / "cache"
        # A start on one copy fills the executable cache: the measured starts
        # read it (the copies' modules are the same bytes).
        warm = Server(binary, repository(bundles, work / "repo-warm", 1), cache, extra,
                      work / "serve-warm.log")
        warm.start()
        try:
            warm.wait_models_ready([name_of(0)], warm.started + 300, 300, 0.1)
            log(f"warm-up start: ready after {time.monotonic() - warm.started:.2f} s "
                f"(compiles into {cache})")
        finally:
            warm.stop()
        for n in sizes:
            rows.append(measure(binary, n, bundles, work, cache, extra, template, a))
    finally:
        if a.keep:
            log(f"bundles and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    per_model(rows)
    result = {"config": {"sizes": sizes, "extra_args": a.extra_args,
                         "idle_seconds": a.idle_seconds, "requests": a.requests,
                         "ready_timeout_s": a.ready_timeout, "weights_bytes": weights_bytes,
                         "vm_max_map_count": max_map_count(),
                         "plugin": str(plugin),
                         "command": " ".join(["bench/catalogue_scale.py"] +
                                             [shlex.quote(x) for x in (argv or sys.argv[1:])])},
              "machine": machine_info(), "revision": git_revision(), "binary": built,
              "rows": rows}
    write_report(result, started, out, markdown)


if __name__ == "__main__":
    main()
