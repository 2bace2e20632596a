#!/usr/bin/env python3
"""Server overhead: pjserve against the raw PJRT execute time and two peers.

    scripts/bootstrap-bench && .venv/bin/python bench/server_overhead.py

Serves one tiny JAX function (the demo `mlp`: x f32 [batch,16] -> y f32
[batch,4], see bench/peers/common.py) from

    pjserve   build/pjserve serve, on a bundle exported here by pjserve_export
    triton    Triton server 2.51.0 (the binary in the nvidia-pytriton wheel) with
              its Python backend calling jax in the backend's stub process
    pytriton  the same Triton server through PyTriton, which forwards every
              batch from the stub to the user's Python process over ZeroMQ
    mlserver  MLServer with a custom MLModel runtime (.venv-bench-mlserver)

(triton and pytriton share .venv-bench-pytriton; scripts in bench/peers/)

checks that every server answers exactly what JAX computes (gRPC and HTTP),
then drives each with perf_analyzer (scripts/perf_analyzer) over gRPC and
HTTP at each concurrency: batch-1 requests, perf_analyzer's time windows of
--seconds/3 each until three in a row agree on throughput and p50 latency
within --stability percent (measured windows merged), the
whole repeated --rounds times with the servers in rotating order, the median
of the rounds reported. (perf_analyzer 2.51's --request-count mode is not
used: it rounds the measured time up to whole seconds, so its throughput is
wrong for short runs.) The limit it is compared against is
build/pjs_bench_raw_execute on the same bundle: upload, PJRT execute, read
back, in one process; the jitted JAX call in-process is timed as well.

Writes bench/results/server_overhead.json and docs/img/server_overhead.png
(plotted by bench/plot_server_overhead.py in .venv-bench-mlserver, which has
matplotlib), and prints the table and the ratios that docs/benchmarks.md
quotes. All three servers run at once (idle while another is measured) on
127.0.0.1 with free ports.
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

from benchlib import (PJSERVE, RAW, ROOT, ServerProcess, free_ports, git_revision,
                      http_get, log, machine_info, missing_tools, pa_command, read_pa_csv,
                      remove_workdir, run_perf_analyzer, save_result)

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

import numpy as np  # noqa: E402

import common  # noqa: E402

BATCH_SIZES = (1, 2, 4, 8)
MAX_BATCH = BATCH_SIZES[-1]
LABELS = {"pjserve": "pjserve", "triton": "Triton (Python backend)",
          "pytriton": "Triton via PyTriton", "mlserver": "MLServer"}
PEERS = [k for k in LABELS if k != "pjserve"]
PEER_SCRIPTS = {"triton": "triton_server.py", "pytriton": "pytriton_server.py",
                "mlserver": "mlserver_server.py"}


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


def run_raw(bundle, iterations):
    out = subprocess.run([str(RAW), str(bundle), "--batch-size", "1", "--iterations",
                          str(iterations), "--warmup", str(max(100, iterations // 10)), "--json"],
                         check=True, capture_output=True, text=True, cwd=ROOT)
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

    run = run_perf_analyzer(command, csv_path, stability,
                            f"against {server.key} ({protocol}, concurrency {concurrency})",
                            f"{server.key} {protocol} c={concurrency}")
    row = read_pa_csv(csv_path)
    return {"throughput": float(row["Inferences/Second"]),
            "p50_us": float(row["p50 latency"]), "p90_us": float(row["p90 latency"]),
            "p99_us": float(row["p99 latency"]),
            # (perf_analyzer leaves the average out of the CSV with --percentile)
            "avg_us": float(row["Avg latency"]) if row.get("Avg latency") else None,
            **run}


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
                                   for k in ("throughput", "p50_us", "p90_us", "p99_us")}})
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
        out.append(r)
    return out


def print_report(result):
    raw = result["raw"]
    print()
    print(f"raw PJRT, batch 1, in-process ({raw['pjrt']['iterations']} iterations), microseconds:")
    for name, d in (("upload+execute+read back", raw["pjrt"]["round_trip_us"]),
                    ("execute only", raw["pjrt"]["execute_us"]),
                    ("jax.jit call (jax " + raw["jax_version"] + ")", raw["jax_inprocess_us"])):
        print(f"  {name:34s} p50 {d['p50']:9.1f}   p99 {d['p99']:9.1f}   mean {d['mean']:9.1f}")
    print()
    hdr = (f"{'server':24s} {'proto':5s} {'conc':>4s} {'infer/s':>9s} {'p50 us':>9s} "
           f"{'p90 us':>9s} {'p99 us':>9s}")
    print(hdr)
    print("-" * len(hdr))
    for s in result["summary"]:
        print(f"{LABELS[s['server']]:24s} {s['protocol']:5s} {s['concurrency']:4d} "
              f"{s['throughput']:9.0f} {s['p50_us']:9.0f} {s['p90_us']:9.0f} {s['p99_us']:9.0f}")
    print()
    for r in result["ratios"]:
        parts = [f"{r['protocol']} c={r['concurrency']}: pjserve p50 = "
                 f"{r['pjserve_p50_over_raw_p50']:.1f}x raw (+{r['pjserve_p50_minus_raw_p50_us']:.0f} us)"]
        for peer in PEERS:
            if f"{peer}_p50_over_pjserve_p50" in r:
                parts.append(f"{peer} p50 {r[f'{peer}_p50_over_pjserve_p50']:.1f}x, "
                             f"p99 {r[f'{peer}_p99_over_pjserve_p99']:.1f}x, pjserve throughput "
                             f"{r[f'pjserve_throughput_over_{peer}']:.1f}x")
        print("; ".join(parts))


def markdown(result):
    """The table and ratios of docs/benchmarks.md, as markdown."""
    raw = result["raw"]
    pj = raw["pjrt"]
    lines = ["| | p50 us | p99 us | mean us |", "|---|---:|---:|---:|"]
    for name, d in (("raw PJRT: upload + execute + read back", pj["round_trip_us"]),
                    ("raw PJRT: execute only", pj["execute_us"]),
                    (f"jax.jit call in-process (jax {raw['jax_version']})",
                     raw["jax_inprocess_us"])):
        lines.append(f"| {name} | {d['p50']:.0f} | {d['p99']:.0f} | {d['mean']:.0f} |")
    lines += ["", "| server | protocol | concurrency | infer/s | p50 us | p90 us | p99 us |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for s in result["summary"]:
        name = f"**{LABELS[s['server']]}**" if s["server"] == "pjserve" else LABELS[s["server"]]
        lines.append(f"| {name} | {s['protocol']} | {s['concurrency']} | "
                     f"{s['throughput']:.0f} | {s['p50_us']:.0f} | {s['p90_us']:.0f} | "
                     f"{s['p99_us']:.0f} |")
    lines += ["", "| protocol, concurrency | pjserve p50 / raw p50 | pjserve p50 - raw p50 |",
              "|---|---:|---:|"]
    for r in result["ratios"]:
        lines.append(f"| {r['protocol']} c={r['concurrency']} | "
                     f"{r['pjserve_p50_over_raw_p50']:.1f}x | "
                     f"{r['pjserve_p50_minus_raw_p50_us']:.0f} us |")
    lines += ["", "| protocol, concurrency | peer | peer p50 / pjserve p50 | "
              "peer p99 / pjserve p99 | pjserve infer/s / peer infer/s |",
              "|---|---|---:|---:|---:|"]
    for r in result["ratios"]:
        for k in PEERS:
            if f"{k}_p50_over_pjserve_p50" in r:
                lines.append(f"| {r['protocol']} c={r['concurrency']} | {LABELS[k]} | "
                             f"{r[f'{k}_p50_over_pjserve_p50']:.1f}x | "
                             f"{r[f'{k}_p99_over_pjserve_p99']:.1f}x | "
                             f"{r[f'pjserve_throughput_over_{k}']:.1f}x |")
    return "\n".join(lines) + "\n"


# ---- main -------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(LABELS),
                    help=f"comma-separated subset of {','.join(LABELS)} (default: all)")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--concurrency", default="1,4", help="comma-separated (default 1,4)")
    ap.add_argument("--seconds", type=float, default=7.5,
                    help="three perf_analyzer windows of SECONDS/3 make one measurement "
                         "(default 7.5)")
    ap.add_argument("--stability", type=float, default=25.0,
                    help="perf_analyzer --stability-percentage (default 25; a shared "
                         "2-core machine rarely holds 10)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="measurements per configuration; the median is reported (default 2)")
    ap.add_argument("--raw-iterations", type=int, default=20000)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "server_overhead.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "server_overhead.png")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    keys = [k.strip() for k in a.servers.split(",") if k.strip()]
    protocols = [p.strip() for p in a.protocols.split(",") if p.strip()]
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    if not set(keys) <= set(LABELS) or not set(protocols) <= {"grpc", "http"}:
        ap.error("unknown server or protocol")

    problems = missing_tools()
    for key in keys:
        if key != "pjserve" and not peer_python(key).exists():
            problems.append(f"{peer_python(key).relative_to(ROOT)} is missing "
                            "(scripts/bootstrap-bench)")
    if problems:
        sys.exit("server_overhead: " + "; ".join(problems))

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-"))
    servers: List[Server] = []
    result = {"machine": machine_info(glibc=True), "loadavg_start": os.getloadavg(),
              "settings": {"servers": keys, "protocols": protocols,
                           "concurrency": concurrencies, "seconds": a.seconds,
                           "perf_analyzer_window_ms": int(a.seconds * 1000 / 3),
                           "stability_percentage": a.stability,
                           "rounds": a.rounds, "batch_size": 1,
                           "compiled_batch_sizes": list(BATCH_SIZES),
                           "http_tensor_format": "json"},
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
        result["raw"] = {"pjrt": run_raw(bundle, a.raw_iterations),
                         "jax_inprocess_us": time_jax_inprocess(reference, 5000),
                         "jax_version": jax.__version__}

        ports = iter(free_ports(3 * len(keys)))
        for key in keys:
            http, grpc, metrics = next(ports), next(ports), next(ports)
            if key == "pjserve":
                cmd = [str(PJSERVE), "serve", "--model-repository", str(work / "repo"),
                       "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
                       "--metrics-port", str(metrics), "--cache-dir", str(work / "cache")]
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

        result["verification"] = {}
        for s in servers:
            log(f"starting {s.label}")
            s.start()
            s.wait_ready(timeout=240)
            result["verification"][s.key] = verify(s, reference)
            log(f"{s.label} ({s.version}) ready; outputs match JAX: "
                + ", ".join(f"{p} {'bit-identical' if v['identical'] else 'max diff %g' % v['max_abs_diff']}"
                            for p, v in result["verification"][s.key].items()))

        result["versions"] = {
            "pjserve": git_revision(), "servers": {s.key: s.version for s in servers},
            "perf_analyzer": package_versions(ROOT / ".venv-perf" / "bin" / "python",
                                              ["tritonclient"]).get("tritonclient", "?"),
            ".venv": package_versions(sys.executable, ["jax", "jaxlib", "numpy"])}
        for key in keys:
            if key != "pjserve":
                result["versions"][peer_venv(key).name] = package_versions(
                    peer_python(key), ["nvidia-pytriton", "mlserver", "jax", "jaxlib", "numpy"])

        window_ms = int(a.seconds * 1000 / 3)
        n_runs = a.rounds * len(protocols) * len(concurrencies) * len(servers)
        log(f"measuring: {n_runs} perf_analyzer runs of at least 3 x {window_ms} ms "
            f"(about {n_runs * (a.seconds * 1.2 + 2) / 60:.1f} min or more)")

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
                            f"p99 {r['p99_us']:8.0f} us")
        result["runs"] = runs
        result["summary"] = summarize(runs, keys, protocols, concurrencies)
        result["ratios"] = ratios(result["summary"], result["raw"]["pjrt"])
    finally:
        for s in servers:
            s.stop()
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
