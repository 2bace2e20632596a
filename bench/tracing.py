"""What tracing costs a request: p50 and server CPU per request with tracing
off, 1 % of requests sampled and 100 %, on the demo mlp over gRPC.

    .venv/bin/python bench/tracing.py [--seconds S] [--rounds N] [--concurrency 1,4]
                                      [--out bench/results/tracing.json]

One `pjserve serve` per setting, each exporting to the same OTLP/HTTP
receiver in this process (a plain HTTP server that counts the spans it is
sent, as a collector's receiver would take them): "off" has no
--trace-endpoint, "1 %" has --trace-rate 0.01, "100 %" --trace-rate 1. The
load is pjs_bench_grpc_floor's C client (requests without a traceparent, so
the server's rate decides), at each concurrency for --seconds after 1 s of
warm-up; the server's CPU is its process tree's over the client's run,
divided by the client's calls. Each round runs every setting, starting with
a different one, and the table shows the median over rounds. It writes JSON and a markdown table
beside it. Needs build/pjserve and build/pjs_bench_grpc_floor (make build).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchlib import (FLOOR, PJSERVE, ROOT, PjserveProcess, fmt, log, machine_info,
                      git_revision, tree_cpu_seconds, write_report)

sys.path.insert(0, str(ROOT / "python"))

MODEL = "mlp"
SETTINGS = (("off", None), ("1 %", "0.01"), ("100 %", "1"))


class Receiver:
    """Counts the spans POSTed to /v1/traces (each has one "spanId")."""

    def __init__(self):
        self.spans = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                # counted, not parsed: the receiver shares the machine's CPUs
                n = self.rfile.read(int(self.headers["Content-Length"])).count(b'"spanId"')
                with lock:
                    receiver.spans += n
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


class Server(PjserveProcess):
    def __init__(self, repository, cache, workdir, name, extra):
        self.repository, self.cache, self.extra = repository, cache, extra
        self.log_path = workdir / f"{name}.log"
        self.proc = None

    def start(self):
        self.serve_command()
        self.start_process()
        self.wait_models_ready([MODEL], time.monotonic() + 300, 300, 0.2)


def client_run(server, concurrency, seconds):
    cmd = [str(FLOOR), "client", "--target", f"127.0.0.1:{server.grpc}", "--method", "infer",
           "--model", MODEL, "--input", "x", "--shape", "1,16",
           "--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", "1",
           "--json"]
    cpu = tree_cpu_seconds(server.proc.pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    cpu = tree_cpu_seconds(server.proc.pid) - cpu
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"], "throughput": r["throughput"],
            "calls": r["calls_total"],
            "server_cpu_us_per_request": cpu * 1e6 / r["calls_total"]}


def markdown(res):
    lines = [f"# What tracing costs ({res['model']}, gRPC, C client)", "",
             f"{res['machine']['cpu']}, {res['machine']['cores']} CPUs; {res['seconds']} s per "
             f"run, median of {res['rounds']} rounds; revision {res['revision']}", "",
             "| tracing | c | p50 us | p99 us | requests/s | server CPU us/req | spans per "
             "request |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in res["table"]:
        lines.append(f"| {row['setting']} | {row['concurrency']} | {fmt(row['p50_us'], '.0f')} "
                     f"| {fmt(row['p99_us'], '.0f')} | {fmt(row['throughput'], ',.0f')} | "
                     f"{fmt(row['server_cpu_us_per_request'], '.1f')} | "
                     f"{fmt(row['spans_per_request'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tracing.json"))
    args = ap.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    for tool in (PJSERVE, FLOOR):
        if not tool.exists():
            sys.exit(f"{tool} is missing: run make build")
    started = time.time()
    from pjserve_export.demo import demo_models
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-tracing-"))
    repo = work / "repo"
    demo_models([MODEL])[0].export(repo, batch_sizes=(1, 4, 8))
    receiver = Receiver()
    runs = {}
    for rnd in range(args.rounds):
        for name, rate in SETTINGS[rnd % 3:] + SETTINGS[:rnd % 3]:
            extra = [] if rate is None else ["--trace-endpoint", receiver.url,
                                             "--trace-rate", rate]
            server = Server(repo, work / "cache", work, f"{name.replace(' %', 'pct')}-{rnd}",
                            extra)
            server.start()
            try:
                for c in concurrencies:
                    spans = receiver.spans
                    r = client_run(server, c, args.seconds)
                    time.sleep(0.5)  # the last spans' export
                    r["spans_per_request"] = (receiver.spans - spans) / r["calls"]
                    runs.setdefault((name, c), []).append(r)
                    log(f"round {rnd + 1} tracing {name:6s} c={c}: p50 {r['p50_us']:.0f} us, "
                        f"{r['throughput']:,.0f}/s, server CPU "
                        f"{r['server_cpu_us_per_request']:.1f} us/req, "
                        f"{r['spans_per_request']:.2f} spans/req")
            finally:
                server.stop()
    table = []
    for name, _ in SETTINGS:
        for c in concurrencies:
            rs = runs[(name, c)]
            row = {"setting": name, "concurrency": c}
            for k in ("p50_us", "p99_us", "throughput", "server_cpu_us_per_request",
                      "spans_per_request"):
                row[k] = statistics.median(r[k] for r in rs)
            table.append(row)
    result = {"model": MODEL, "seconds": args.seconds, "rounds": args.rounds,
              "machine": machine_info(), "revision": git_revision(), "table": table,
              "runs": {f"{k[0]} c={k[1]}": v for k, v in runs.items()}}
    write_report(result, started, Path(args.out), markdown)


if __name__ == "__main__":
    main()
