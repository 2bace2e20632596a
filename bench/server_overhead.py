#!/usr/bin/env python3
"""Server overhead: pjserve against the raw PJRT execute time, a bare gRPC echo and three peers.

    scripts/bootstrap-bench && .venv/bin/python bench/server_overhead.py

Serves one tiny JAX function (the demo `mlp`: x f32 [batch,16] -> y f32
[batch,4], see bench/peers/common.py) from

    pjserve   build/pjserve serve, on a bundle exported here by pjserve_export
    triton    Triton server 2.51.0 (the binary in the nvidia-pytriton wheel) with
              its Python backend calling jax in the backend's stub process
    pytriton  the same Triton server through PyTriton, which forwards every
              batch from the stub to the user's Python process over ZeroMQ
    mlserver  MLServer with a custom MLModel runtime (.venv-bench-mlserver)

(triton and pytriton share .venv-bench-pytriton; scripts in bench/peers/),
and with --pjserve-baseline PATH a second pjserve binary (an older build)
as "pjserve (baseline)", measured in the same run as the first.

checks that every server answers exactly what JAX computes (gRPC and HTTP),
then drives each with perf_analyzer (scripts/perf_analyzer) over gRPC and
HTTP at each concurrency: batch-1 requests, perf_analyzer's time windows of
--seconds/3 each until three in a row agree on throughput and p50 latency
within --stability percent (measured windows merged), the
whole repeated --rounds times with the servers in rotating order, the median
of the rounds reported. (perf_analyzer 2.51's --request-count mode is not
used: it rounds the measured time up to whole seconds, so its throughput is
wrong for short runs.) Around each measurement the CPU time of the server's
whole process tree (utime + stime from /proc, the server's pid and every
process below it or in its session: Triton's Python-backend stubs,
PyTriton's Python process) and the server's count of successful inference
requests (its metrics port) are read; their quotient is the server CPU per
request. The limit it is compared against is build/pjs_bench_raw_execute on
the same bundle: upload, PJRT execute, read back, in one process; the jitted
JAX call in-process is timed as well.

Placement (--placement): by default the clients (perf_analyzer, the C
client, and this driver) run on the last CPU this process may use and every
server (and the raw limit) on the others: a server in production has its
cores to itself and its clients elsewhere; with --placement shared they all share
every CPU, and on a 2-CPU virtual machine client and server then wake each
other across CPUs that have gone idle, which costs tens of microseconds
each time. Servers size their thread pools from the CPUs they are given.

The echo floor (unless --no-floor): build/pjs_bench_grpc_floor runs a bare
echo server on the same gRPC C core (bench/grpc_floor.c: one unary method
returning the request bytes, as many threads on one completion queue as
pjserve's gRPC front end takes by default), and its C
client measures, at each concurrency for --seconds after 1 s of warm-up,
the echo of a batch-1 ModelInferRequest's bytes and a real ModelInfer on
pjserve (and the baseline); the ratio of pjserve's p50 to the echo's is
what pjserve adds over the least a server on that library does. Server CPU
per request there is the process tree's CPU over the client's whole run
divided by every call it made.

Writes bench/results/server_overhead.json and docs/img/server_overhead.png
(plotted by bench/plot_server_overhead.py in .venv-bench-mlserver, which has
matplotlib), and prints the table and the ratios that docs/benchmarks.md
quotes. All servers run at once (idle while another is measured) on
127.0.0.1 with free ports. --build-dir points at another build of the tools.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from benchlib import (FLOOR, PJSERVE, PLACEMENTS, RAW, ROOT, ServerProcess, free_ports,
                      git_revision, http_get, log, machine_info, metric, missing_tools,
                      on_server_cpus, pa_command, parse_metrics, place, read_pa_csv,
                      remove_workdir, run_perf_analyzer, save_result, server_cpu_count,
                      tree_cpu_seconds)

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

import numpy as np  # noqa: E402

import common  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8)
MAX_BATCH = BATCH_SIZES[-1]
BASELINE = "pjserve_baseline"
LABELS = {"pjserve": "pjserve", BASELINE: "pjserve (baseline)",
          "triton": "Triton (Python backend)", "pytriton": "Triton via PyTriton",
          "mlserver": "MLServer"}
CHOICES = [k for k in LABELS if k != BASELINE]     # what --servers takes
PEERS = [k for k in LABELS if k != "pjserve"]      # compared with pjserve, if measured
PJSERVES = ("pjserve", BASELINE)
PEER_SCRIPTS = {"triton": "triton_server.py", "pytriton": "pytriton_server.py",
                "mlserver": "mlserver_server.py"}
# Each server's counter of successful inference requests, on its metrics port.
SUCCESS_METRIC = {"mlserver": "model_infer_request_success_total"}
# The echo floor's threads: what pjserve's gRPC front end takes by default,
# one per CPU it may run on, at most 4 (src/frontend/grpc/frontend.c).
ECHO_THREADS_MAX = 4
DEFAULT_SUCCESS_METRIC = "nv_inference_request_success"
ECHO = "echo"
ECHO_LABEL = "echo floor (gRPC C core)"
FLOOR_WARMUP_S = 1.0
FLOOR_GOAL = 1.5    # pjserve p50 / echo p50 at concurrency 1, the request path's target


@dataclass
class Server(ServerProcess):
    key: str
    cmd: List[str]
    http: int
    grpc: int
    metrics: int
    log_path: Path
    pa_extra: List[str] = field(default_factory=list)
    proc: Optional[subprocess.Popen] = None
    version: str = ""

    @property
    def label(self):
        return LABELS[self.key]

    def start(self):
        self.start_process()

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.http}/v2/models/{common.MODEL_NAME}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.key} exited with status {self.proc.returncode}:\n"
                                   + self.log_tail())
            if http_get(url, timeout=2.0)[0] == 200:
                status, body = http_get(f"http://127.0.0.1:{self.http}/v2", timeout=2.0)
                if status == 200:
                    meta = json.loads(body)
                    self.version = f"{meta.get('name', '?')} {meta.get('version', '?')}"
                return
            time.sleep(0.25)
        raise RuntimeError(f"{self.key} not ready after {timeout} s:\n" + self.log_tail())

    def served(self):
        """Successful inference requests of the model so far, by the server's
        own metrics (None when they cannot be read)."""
        status, body = http_get(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10.0)
        if status != 200:
            return None
        return metric(parse_metrics(body.decode(errors="replace")),
                      SUCCESS_METRIC.get(self.key, DEFAULT_SUCCESS_METRIC), common.MODEL_NAME)

    def cpu_seconds(self):
        return tree_cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc is None:
            return
        self.terminate(self.key, 40)
        # Whatever is left of the process group (Triton, its backend stubs).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log_file.close()


@dataclass
class EchoServer(ServerProcess):
    """pjs_bench_grpc_floor echo-server: no model, no metrics."""
    cmd: List[str]
    grpc: int
    log_path: Path
    key: str = ECHO
    proc: Optional[subprocess.Popen] = None

    @property
    def label(self):
        return ECHO_LABEL

    def start(self):
        self.start_process()

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the echo server exited with status {self.proc.returncode}:\n"
                                   + self.log_tail())
            if "listening on" in self.log_tail():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the echo server did not start in {timeout} s:\n" + self.log_tail())

    def served(self):
        return None

    def cpu_seconds(self):
        return tree_cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc is None:
            return
        if not self.terminate("the echo server", 20):
            self.proc.kill()
        self.proc.wait()
        self.log_file.close()
        self.proc = None


# ---- server CPU per request -------------------------------------------------

def usage_begin(server):
    """What usage_end needs: the server's request count (read first, so the
    scrape's own CPU stays outside) and its process tree's CPU seconds."""
    return server.served(), server.cpu_seconds()


def usage_end(server, begin, requests=None):
    """The server's CPU over the window since usage_begin, per request:
    `requests` if given, else the growth of its own request counter."""
    cpu = server.cpu_seconds() - begin[1]
    if requests is None and begin[0] is not None:
        after = server.served()
        requests = None if after is None else int(round(after - begin[0]))
    per_request = cpu * 1e6 / requests if requests else None
    if per_request is None:
        log(f"{server.key}: no request count, so no server CPU per request")
    return {"server_cpu_s": round(cpu, 3), "server_requests": requests,
            "server_cpu_us_per_request": per_request}


# ---- the model, the reference and the raw limit -----------------------------

def export_bundle(repo):
    from pjserve_export.demo import demo_models
    model = demo_models([common.MODEL_NAME])[0]
    return model.export(repo, batch_sizes=BATCH_SIZES)


def time_jax_inprocess(infer, iterations):
    x = np.random.default_rng(1).standard_normal((1,) + common.INPUT_SHAPE).astype(np.float32)
    for _ in range(iterations // 10):
        infer(x)
    t = np.empty(iterations)
    for i in range(iterations):
        t0 = time.perf_counter()
        infer(x)
        t[i] = time.perf_counter() - t0
    t *= 1e6
    return {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
            "p99": float(np.percentile(t, 99)), "mean": float(t.mean()), "min": float(t.min())}


def run_raw(raw, bundle, iterations):
    cmd = [str(raw), str(bundle), "--batch-size", "1", "--iterations", str(iterations),
           "--warmup", str(max(100, iterations // 10)), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         preexec_fn=on_server_cpus())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)


def verify(server, reference):
    """Asks the server over gRPC and HTTP for batches of 1 and 3 and compares
    with JAX. Returns {protocol: {"identical": bool, "max_abs_diff": float}}."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rng = np.random.default_rng(7)
    result = {}
    for protocol in ("grpc", "http"):
        worst, identical = 0.0, True
        for n in (1, 3):
            x = rng.standard_normal((n,) + common.INPUT_SHAPE).astype(np.float32)
            if protocol == "grpc":
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
                inp = grpcclient.InferInput(common.INPUT_NAME, list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                outs = [grpcclient.InferRequestedOutput(common.OUTPUT_NAME)]
            else:
                # JSON tensors (MLServer has no binary-data extension).
                client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
                inp = httpclient.InferInput(common.INPUT_NAME, list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=False)
                outs = [httpclient.InferRequestedOutput(common.OUTPUT_NAME, binary_data=False)]
            y = client.infer(common.MODEL_NAME, [inp], outputs=outs).as_numpy(common.OUTPUT_NAME)
            client.close()
            want = reference(x)
            if y is None or y.shape != want.shape or y.dtype != want.dtype:
                raise RuntimeError(f"{server.key} {protocol}: got "
                                   f"{None if y is None else (y.dtype, y.shape)}, want "
                                   f"{(want.dtype, want.shape)}")
            identical &= bool(np.array_equal(y, want))
            worst = max(worst, float(np.max(np.abs(y - want))))
            if not np.allclose(y, want, rtol=1e-6, atol=1e-6):
                raise RuntimeError(f"{server.key} {protocol}: output differs from JAX by up to "
                                   f"{worst:g}")
        result[protocol] = {"identical": identical, "max_abs_diff": worst}
    return result


# ---- perf_analyzer ----------------------------------------------------------

def perf_analyzer(server, protocol, concurrency, window_ms, stability, workdir):
    """One perf_analyzer measurement; on an unstable one, retries once with
    twice the tolerance. Raises RuntimeError when both fail."""
    csv_path = workdir / f"pa-{server.key}-{protocol}-c{concurrency}.csv"
    port = server.grpc if protocol == "grpc" else server.http

    def command(tolerance):
        cmd = [*pa_command(common.MODEL_NAME, f"127.0.0.1:{port}", protocol, concurrency,
                           window_ms, tolerance, 8, csv_path), *server.pa_extra]
        if protocol == "http":
            cmd += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
        return cmd

    begin = usage_begin(server)
    run = run_perf_analyzer(command, csv_path, stability,
                            f"against {server.key} ({protocol}, concurrency {concurrency})",
                            f"{server.key} {protocol} c={concurrency}")
    usage = usage_end(server, begin)
    row = read_pa_csv(csv_path)
    return {"throughput": float(row["Inferences/Second"]),
            "p50_us": float(row["p50 latency"]), "p90_us": float(row["p90 latency"]),
            "p99_us": float(row["p99 latency"]),
            # (perf_analyzer leaves the average out of the CSV with --percentile)
            "avg_us": float(row["Avg latency"]) if row.get("Avg latency") else None,
            **usage, **run}


# ---- the echo floor -----------------------------------------------------------

def floor_client(floor, server, method, concurrency, seconds):
    """One run of pjs_bench_grpc_floor's C client against `server` (the echo
    server or a pjserve), with the server's CPU per call over the client's
    whole run (warm-up included, as are its calls)."""
    cmd = [str(floor), "client", "--target", f"127.0.0.1:{server.grpc}", "--method", method,
           "--model", common.MODEL_NAME, "--input", common.INPUT_NAME,
           "--shape", f"1,{common.INPUT_SHAPE[0]}", "--concurrency", str(concurrency),
           "--seconds", str(seconds), "--warmup", str(FLOOR_WARMUP_S), "--json"]
    begin = (None, server.cpu_seconds())
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(cmd)} did not finish in {seconds + 120} s")
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n"
                           f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    usage = usage_end(server, begin, requests=r["calls_total"])
    return {"throughput": r["throughput"], "p50_us": r["p50_us"], "p90_us": r["p90_us"],
            "p99_us": r["p99_us"], "mean_us": r["mean_us"], "min_us": r["min_us"],
            "requests": r["requests"], "calls_total": r["calls_total"],
            "request_bytes": r["request_bytes"],
            "client_cpu_us_per_request": r["client_cpu_us_per_request"], **usage}


def measure_floor(floor, echo, pjserves, concurrencies, seconds, rounds):
    """The C client's runs: the echo server and each pjserve at every
    concurrency, `rounds` times, the targets in rotating order."""
    targets = [echo, *pjserves]
    runs = []
    for rnd in range(rounds):
        order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
        for c in concurrencies:
            for t in order:
                method = "echo" if t.key == ECHO else "infer"
                r = floor_client(floor, t, method, c, seconds)
                runs.append({"server": t.key, "method": method, "concurrency": c,
                             "round": rnd, **r})
                log(f"round {rnd + 1} C client {t.key:8s} {method:5s} c={c}: "
                    f"{r['throughput']:8.0f} req/s  p50 {r['p50_us']:8.0f} us  "
                    f"p99 {r['p99_us']:8.0f} us  server CPU {fmt_us(r['server_cpu_us_per_request'])}"
                    f" us/req")
    return runs


def floor_ratios(summary):
    """pjserve's (and the baseline's) p50 and throughput against the echo's,
    at each concurrency."""
    by = {(s["server"], s["concurrency"]): s for s in summary}
    out = []
    for (key, c), s in by.items():
        echo = by.get((ECHO, c))
        if key == ECHO or echo is None:
            continue
        out.append({"server": key, "concurrency": c,
                    "p50_over_echo_p50": s["p50_us"] / echo["p50_us"],
                    "p50_minus_echo_p50_us": s["p50_us"] - echo["p50_us"],
                    "throughput_over_echo": s["throughput"] / echo["throughput"]})
    return out


# ---- environment ------------------------------------------------------------

def peer_venv(key):
    return ROOT / (".venv-bench-mlserver" if key == "mlserver" else ".venv-bench-pytriton")


def peer_python(key):
    return peer_venv(key) / "bin" / "python"


def package_versions(python, names):
    code = ("import importlib.metadata as m, json, sys\n"
            "v = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try:\n"
            "        v[n] = m.version(n)\n"
            "    except m.PackageNotFoundError:\n"
            "        pass\n"
            "print(json.dumps(v))")
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


# ---- report -----------------------------------------------------------------

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_us(v):
    return "-" if v is None else f"{v:.0f}"


def summarize(runs, servers, protocols, concurrencies):
    summary = []
    for proto in protocols:
        for c in concurrencies:
            for key in servers:
                rs = [r for r in runs if (r["server"], r["protocol"], r["concurrency"]) ==
                      (key, proto, c)]
                if not rs:
                    continue
                summary.append({"server": key, "protocol": proto, "concurrency": c,
                                "rounds": len(rs),
                                **{k: statistics.median(r[k] for r in rs)
                                   for k in ("throughput", "p50_us", "p90_us", "p99_us")},
                                "server_cpu_us_per_request": median_or_none(
                                    r["server_cpu_us_per_request"] for r in rs)})
    return summary


def summarize_floor(runs, servers, concurrencies):
    summary = []
    for c in concurrencies:
        for key in servers:
            rs = [r for r in runs if (r["server"], r["concurrency"]) == (key, c)]
            if not rs:
                continue
            summary.append({"server": key, "method": rs[0]["method"], "concurrency": c,
                            "rounds": len(rs),
                            **{k: statistics.median(r[k] for r in rs)
                               for k in ("throughput", "p50_us", "p90_us", "p99_us", "mean_us",
                                         "client_cpu_us_per_request")},
                            "server_cpu_us_per_request": median_or_none(
                                r["server_cpu_us_per_request"] for r in rs)})
    return summary


def ratios(summary, raw):
    out = []
    by = {(s["server"], s["protocol"], s["concurrency"]): s for s in summary}
    raw_p50 = raw["round_trip_us"]["p50"]
    for (key, proto, c), s in by.items():
        if key != "pjserve":
            continue
        r = {"protocol": proto, "concurrency": c,
             "pjserve_p50_over_raw_p50": s["p50_us"] / raw_p50,
             "pjserve_p50_minus_raw_p50_us": s["p50_us"] - raw_p50}
        for peer in PEERS:
            p = by.get((peer, proto, c))
            if p is None:
                continue
            r[f"{peer}_p50_over_pjserve_p50"] = p["p50_us"] / s["p50_us"]
            r[f"{peer}_p99_over_pjserve_p99"] = p["p99_us"] / s["p99_us"]
            r[f"pjserve_throughput_over_{peer}"] = s["throughput"] / p["throughput"]
            if p["server_cpu_us_per_request"] and s["server_cpu_us_per_request"]:
                r[f"{peer}_cpu_over_pjserve_cpu"] = (p["server_cpu_us_per_request"] /
                                                     s["server_cpu_us_per_request"])
        out.append(r)
    return out


def cpu_ratio_text(r, peer):
    v = r.get(f"{peer}_cpu_over_pjserve_cpu")
    return "-" if v is None else f"{v:.1f}x"


def print_report(result):
    raw = result["raw"]
    st = result["settings"]
    print()
    print(f"placement {st['placement']}: clients on CPUs {st['client_cpus']}, "
          f"servers on {st['server_cpus']}")
    print(f"raw PJRT, batch 1, in-process ({raw['pjrt']['iterations']} iterations), microseconds:")
    for name, d in (("upload+execute+read back", raw["pjrt"]["round_trip_us"]),
                    ("execute only", raw["pjrt"]["execute_us"]),
                    ("jax.jit call (jax " + raw["jax_version"] + ")", raw["jax_inprocess_us"])):
        print(f"  {name:34s} p50 {d['p50']:9.1f}   p99 {d['p99']:9.1f}   mean {d['mean']:9.1f}")
    print()
    hdr = (f"{'server':24s} {'proto':5s} {'conc':>4s} {'infer/s':>9s} {'p50 us':>9s} "
           f"{'p90 us':>9s} {'p99 us':>9s} {'srv CPU us/req':>14s}")
    print(hdr)
    print("-" * len(hdr))
    for s in result["summary"]:
        print(f"{LABELS[s['server']]:24s} {s['protocol']:5s} {s['concurrency']:4d} "
              f"{s['throughput']:9.0f} {s['p50_us']:9.0f} {s['p90_us']:9.0f} {s['p99_us']:9.0f} "
              f"{fmt_us(s['server_cpu_us_per_request']):>14s}")
    print()
    for r in result["ratios"]:
        parts = [f"{r['protocol']} c={r['concurrency']}: pjserve p50 = "
                 f"{r['pjserve_p50_over_raw_p50']:.1f}x raw (+{r['pjserve_p50_minus_raw_p50_us']:.0f} us)"]
        for peer in PEERS:
            if f"{peer}_p50_over_pjserve_p50" in r:
                parts.append(f"{peer} p50 {r[f'{peer}_p50_over_pjserve_p50']:.1f}x, "
                             f"p99 {r[f'{peer}_p99_over_pjserve_p99']:.1f}x, pjserve throughput "
                             f"{r[f'pjserve_throughput_over_{peer}']:.1f}x, server CPU/request "
                             f"{cpu_ratio_text(r, peer)}")
        print("; ".join(parts))
    floor = result.get("floor")
    if floor is None:
        return
    print()
    print(f"C client (bench/grpc_floor.c), gRPC, {floor['request_bytes']}-byte requests "
          f"(median of {floor['rounds']} rounds):")
    hdr = (f"{'server':26s} {'method':6s} {'conc':>4s} {'req/s':>9s} {'p50 us':>9s} "
           f"{'p90 us':>9s} {'p99 us':>9s} {'mean us':>9s} {'srv CPU us/req':>14s} "
           f"{'client CPU us/req':>17s}")
    print(hdr)
    print("-" * len(hdr))
    for s in floor["summary"]:
        print(f"{floor_label(s['server']):26s} {s['method']:6s} {s['concurrency']:4d} "
              f"{s['throughput']:9.0f} {s['p50_us']:9.0f} {s['p90_us']:9.0f} {s['p99_us']:9.0f} "
              f"{s['mean_us']:9.0f} {fmt_us(s['server_cpu_us_per_request']):>14s} "
              f"{s['client_cpu_us_per_request']:17.0f}")
    for r in floor["ratios"]:
        print(f"c={r['concurrency']}: {LABELS[r['server']]} p50 = {r['p50_over_echo_p50']:.2f}x "
              f"the echo's (+{r['p50_minus_echo_p50_us']:.0f} us), throughput "
              f"{r['throughput_over_echo']:.2f}x"
              + (f" (goal at c=1: <= {FLOOR_GOAL}x)" if r["concurrency"] == 1 else ""))


def floor_label(key):
    return ECHO_LABEL if key == ECHO else LABELS[key]


def markdown(result):
    """The table and ratios of docs/benchmarks.md, as markdown."""
    raw = result["raw"]
    pj = raw["pjrt"]
    st = result["settings"]
    lines = [f"Placement: {st['placement']} (clients on CPUs {st['client_cpus']}, servers on "
             f"{st['server_cpus']}).", "",
             "| | p50 us | p99 us | mean us |", "|---|---:|---:|---:|"]
    for name, d in (("raw PJRT: upload + execute + read back", pj["round_trip_us"]),
                    ("raw PJRT: execute only", pj["execute_us"]),
                    (f"jax.jit call in-process (jax {raw['jax_version']})",
                     raw["jax_inprocess_us"])):
        lines.append(f"| {name} | {d['p50']:.0f} | {d['p99']:.0f} | {d['mean']:.0f} |")
    lines += ["", "| server | protocol | concurrency | infer/s | p50 us | p90 us | p99 us | "
              "server CPU us/request |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for s in result["summary"]:
        name = f"**{LABELS[s['server']]}**" if s["server"] == "pjserve" else LABELS[s["server"]]
        lines.append(f"| {name} | {s['protocol']} | {s['concurrency']} | "
                     f"{s['throughput']:.0f} | {s['p50_us']:.0f} | {s['p90_us']:.0f} | "
                     f"{s['p99_us']:.0f} | {fmt_us(s['server_cpu_us_per_request'])} |")
    lines += ["", "| protocol, concurrency | pjserve p50 / raw p50 | pjserve p50 - raw p50 |",
              "|---|---:|---:|"]
    for r in result["ratios"]:
        lines.append(f"| {r['protocol']} c={r['concurrency']} | "
                     f"{r['pjserve_p50_over_raw_p50']:.1f}x | "
                     f"{r['pjserve_p50_minus_raw_p50_us']:.0f} us |")
    lines += ["", "| protocol, concurrency | peer | peer p50 / pjserve p50 | "
              "peer p99 / pjserve p99 | pjserve infer/s / peer infer/s | "
              "peer CPU/request / pjserve CPU/request |",
              "|---|---|---:|---:|---:|---:|"]
    for r in result["ratios"]:
        for k in PEERS:
            if f"{k}_p50_over_pjserve_p50" in r:
                lines.append(f"| {r['protocol']} c={r['concurrency']} | {LABELS[k]} | "
                             f"{r[f'{k}_p50_over_pjserve_p50']:.1f}x | "
                             f"{r[f'{k}_p99_over_pjserve_p99']:.1f}x | "
                             f"{r[f'pjserve_throughput_over_{k}']:.1f}x | "
                             f"{cpu_ratio_text(r, k)} |")
    floor = result.get("floor")
    if floor is not None:
        lines += ["", "| server (C client, gRPC) | method | concurrency | req/s | p50 us | p90 us | "
                  "p99 us | mean us | server CPU us/request | client CPU us/request |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in floor["summary"]:
            name = floor_label(s["server"])
            name = f"**{name}**" if s["server"] == "pjserve" else name
            lines.append(f"| {name} | {s['method']} | {s['concurrency']} | "
                         f"{s['throughput']:.0f} | {s['p50_us']:.0f} | {s['p90_us']:.0f} | "
                         f"{s['p99_us']:.0f} | {s['mean_us']:.0f} | "
                         f"{fmt_us(s['server_cpu_us_per_request'])} | "
                         f"{s['client_cpu_us_per_request']:.0f} |")
        lines += ["", "| server, concurrency | p50 / echo p50 | p50 - echo p50 | "
                  "req/s / echo req/s |", "|---|---:|---:|---:|"]
        for r in floor["ratios"]:
            lines.append(f"| {LABELS[r['server']]} c={r['concurrency']} | "
                         f"{r['p50_over_echo_p50']:.2f}x | {r['p50_minus_echo_p50_us']:.0f} us | "
                         f"{r['throughput_over_echo']:.2f}x |")
    return "\n".join(lines) + "\n"


# ---- main -------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(CHOICES),
                    help=f"comma-separated subset of {','.join(CHOICES)} (default: all)")
    ap.add_argument("--protocols", default="grpc,http",
                    help="comma-separated subset of grpc,http (default both)")
    ap.add_argument("--concurrency", default="1,4", help="comma-separated (default 1,4)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="three perf_analyzer windows of SECONDS/3 make one measurement; "
                         "also the length of one C-client run of the echo floor "
                         "(default 3: perf_analyzer on one CPU takes tens of seconds to "
                         "digest a 2.5 s window of 30,000 requests/s)")
    ap.add_argument("--stability", type=float, default=25.0,
                    help="perf_analyzer --stability-percentage (default 25; a shared "
                         "2-core machine rarely holds 10)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="measurements per configuration; the median is reported (default 2)")
    ap.add_argument("--raw-iterations", type=int, default=20000,
                    help="iterations of pjs_bench_raw_execute (default 20000)")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the echo floor (pjs_bench_grpc_floor's echo server and C client)")
    ap.add_argument("--pjserve-baseline", type=Path, metavar="PATH",
                    help="a second pjserve binary (say, a build of an older commit), measured "
                         "in the same run as \"pjserve (baseline)\"")
    ap.add_argument("--build-dir", type=Path, default=PJSERVE.parent,
                    help="where pjserve, pjs_bench_raw_execute and pjs_bench_grpc_floor are "
                         "(default build/)")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "server_overhead.json",
                    help="where the results go (default bench/results/server_overhead.json); "
                         "the tables go beside it as .md")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "server_overhead.png",
                    help="the plot (default docs/img/server_overhead.png)")
    ap.add_argument("--placement", choices=PLACEMENTS, default="split",
                    help="split (default): the clients (perf_analyzer, the C client) on the "
                         "last CPU, every server on the others; shared: all on every CPU")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    keys = [k.strip() for k in a.servers.split(",") if k.strip()]
    protocols = [p.strip() for p in a.protocols.split(",") if p.strip()]
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    if not set(keys) <= set(CHOICES) or not set(protocols) <= {"grpc", "http"}:
        ap.error("unknown server or protocol")
    if a.pjserve_baseline is not None:
        a.pjserve_baseline = a.pjserve_baseline.absolute()
        if not os.access(a.pjserve_baseline, os.X_OK):
            ap.error(f"--pjserve-baseline {a.pjserve_baseline}: not an executable")
        keys.insert(keys.index("pjserve") + 1 if "pjserve" in keys else 0, BASELINE)
    build = a.build_dir.absolute()
    pjserve_bin, raw_bin, floor_bin = build / PJSERVE.name, build / RAW.name, build / FLOOR.name

    problems = missing_tools(build, extra=() if a.no_floor else (FLOOR.name,))
    for key in keys:
        if key not in PJSERVES and not peer_python(key).exists():
            problems.append(f"{peer_python(key).relative_to(ROOT)} is missing "
                            "(scripts/bootstrap-bench)")
    if problems:
        sys.exit("server_overhead: " + "; ".join(problems))

    placement = place(a.placement)
    echo_threads = min(server_cpu_count(), ECHO_THREADS_MAX)
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-"))
    servers: List[Server] = []
    echo: Optional[EchoServer] = None
    result = {"machine": machine_info(glibc=True), "loadavg_start": os.getloadavg(),
              "settings": {"servers": keys, "protocols": protocols,
                           "concurrency": concurrencies, "seconds": a.seconds,
                           "perf_analyzer_window_ms": int(a.seconds * 1000 / 3),
                           "stability_percentage": a.stability,
                           "rounds": a.rounds, "batch_size": 1,
                           "compiled_batch_sizes": list(BATCH_SIZES),
                           "http_tensor_format": "json",
                           **placement,
                           "build_dir": str(build),
                           "pjserve_baseline": str(a.pjserve_baseline)
                           if a.pjserve_baseline else None,
                           "server_cpu": "utime+stime (+cutime+cstime) of the server's "
                                         "process tree over each measurement / requests "
                                         "the server counted",
                           "floor": None if a.no_floor else {
                               "seconds": a.seconds, "warmup_s": FLOOR_WARMUP_S,
                               "echo_server_threads": echo_threads, "channels": "one per worker"}},
              "model": {"name": common.MODEL_NAME,
                        "input": f"{common.INPUT_NAME} FP32 [batch,{common.INPUT_SHAPE[0]}]",
                        "output": f"{common.OUTPUT_NAME} FP32 [batch,{common.OUTPUT_SHAPE[0]}]",
                        "function": "pjserve_export.demo.mlp_fn (dense 16->32, relu, dense 32->4)"}}
    try:
        log(f"exporting {common.MODEL_NAME} (batch sizes {list(BATCH_SIZES)}) into {work}/repo")
        bundle = export_bundle(work / "repo")
        reference = common.load_model(MAX_BATCH)

        log("timing the raw limit: pjs_bench_raw_execute and the jitted JAX call")
        import jax
        result["raw"] = {"pjrt": run_raw(raw_bin, bundle, a.raw_iterations),
                         "jax_inprocess_us": time_jax_inprocess(reference, 5000),
                         "jax_version": jax.__version__}

        ports = iter(free_ports(3 * len(keys) + 1))
        for key in keys:
            http, grpc, metrics = next(ports), next(ports), next(ports)
            if key in PJSERVES:
                binary = pjserve_bin if key == "pjserve" else a.pjserve_baseline
                cache = work / ("cache" if key == "pjserve" else "cache-baseline")
                cmd = [str(binary), "serve", "--model-repository", str(work / "repo"),
                       "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
                       "--metrics-port", str(metrics), "--cache-dir", str(cache)]
                extra = []
            else:
                cmd = [str(peer_python(key)), str(ROOT / "bench" / "peers" / PEER_SCRIPTS[key]),
                       "--http-port", str(http), "--grpc-port", str(grpc),
                       "--metrics-port", str(metrics), "--max-batch-size", str(MAX_BATCH)]
                if key != "pytriton":   # PyTriton keeps its own workspace (and removes it)
                    cmd += ["--workdir", str(work / key)]
                # MLServer does not batch: the client sends whole [1,16] tensors.
                extra = ["--shape", f"{common.INPUT_NAME}:1,{common.INPUT_SHAPE[0]}"] \
                    if key == "mlserver" else []
            servers.append(Server(key, cmd, http, grpc, metrics, work / f"{key}.log", extra))
        if not a.no_floor:
            port = next(ports)
            echo = EchoServer([str(floor_bin), "echo-server", "--host", "127.0.0.1",
                               "--port", str(port), "--threads", str(echo_threads)], port,
                              work / "echo.log")

        result["verification"] = {}
        for s in servers:
            log(f"starting {s.label}")
            s.start()
            s.wait_ready(timeout=240)
            result["verification"][s.key] = verify(s, reference)
            log(f"{s.label} ({s.version}) ready; outputs match JAX: "
                + ", ".join(f"{p} {'bit-identical' if v['identical'] else 'max diff %g' % v['max_abs_diff']}"
                            for p, v in result["verification"][s.key].items()))
        if echo is not None:
            log(f"starting the {ECHO_LABEL}")
            echo.start()
            echo.wait_ready(timeout=30)

        result["versions"] = {
            "pjserve": git_revision(), "servers": {s.key: s.version for s in servers},
            "perf_analyzer": package_versions(ROOT / ".venv-perf" / "bin" / "python",
                                              ["tritonclient"]).get("tritonclient", "?"),
            ".venv": package_versions(sys.executable, ["jax", "jaxlib", "numpy"])}
        if a.pjserve_baseline is not None:
            result["versions"]["pjserve_baseline"] = str(a.pjserve_baseline)
        for key in keys:
            if key not in PJSERVES:
                result["versions"][peer_venv(key).name] = package_versions(
                    peer_python(key), ["nvidia-pytriton", "mlserver", "jax", "jaxlib", "numpy"])

        window_ms = int(a.seconds * 1000 / 3)
        n_runs = a.rounds * len(protocols) * len(concurrencies) * len(servers)
        pjserves = [s for s in servers if s.key in PJSERVES]
        n_floor = 0 if echo is None else a.rounds * len(concurrencies) * (1 + len(pjserves))
        log(f"measuring: {n_runs} perf_analyzer runs of at least 3 x {window_ms} ms"
            + (f" and {n_floor} C-client runs of {FLOOR_WARMUP_S:g} + {a.seconds:g} s"
               if n_floor else "")
            + f" (about {(n_runs * (a.seconds * 1.2 + 2) + n_floor * (a.seconds + 2)) / 60:.1f} "
              "min or more)")

        runs = []
        for rnd in range(a.rounds):
            order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
            for proto in protocols:
                for c in concurrencies:
                    for s in order:
                        r = perf_analyzer(s, proto, c, window_ms, a.stability, work)
                        runs.append({"server": s.key, "protocol": proto, "concurrency": c,
                                     "round": rnd, **r})
                        log(f"round {rnd + 1} {s.key:8s} {proto:4s} c={c}: "
                            f"{r['throughput']:8.0f} infer/s  p50 {r['p50_us']:8.0f} us  "
                            f"p99 {r['p99_us']:8.0f} us  server CPU "
                            f"{fmt_us(r['server_cpu_us_per_request'])} us/req")
        result["runs"] = runs
        result["summary"] = summarize(runs, keys, protocols, concurrencies)
        result["ratios"] = ratios(result["summary"], result["raw"]["pjrt"])

        if echo is not None:
            floor_runs = measure_floor(floor_bin, echo, pjserves, concurrencies, a.seconds,
                                       a.rounds)
            floor_summary = summarize_floor(floor_runs, [ECHO, *(s.key for s in pjserves)],
                                            concurrencies)
            result["floor"] = {"request_bytes": floor_runs[0]["request_bytes"],
                               "rounds": a.rounds, "runs": floor_runs,
                               "summary": floor_summary,
                               "ratios": floor_ratios(floor_summary),
                               "goal_p50_over_echo_p50_at_c1": FLOOR_GOAL}
    finally:
        for s in servers:
            s.stop()
        if echo is not None:
            echo.stop()
        remove_workdir(work, a.keep)

    save_result(result, started, a.json)
    a.json.with_suffix(".md").write_text(markdown(result))
    print_report(result)
    log(f"wrote {a.json} and {a.json.with_suffix('.md')} (the tables of docs/benchmarks.md)")

    plotter = peer_python("mlserver")
    if plotter.exists():
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(plotter), str(ROOT / "bench" / "plot_server_overhead.py"),
                        str(a.json), str(a.plot)], check=True)
        log(f"wrote {a.plot.relative_to(ROOT) if a.plot.is_relative_to(ROOT) else a.plot}")
    else:
        log("no plot: matplotlib lives in .venv-bench-mlserver (scripts/bootstrap-bench)")
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
