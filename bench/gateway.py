#!/usr/bin/env python3
"""Gateway benchmark: what one hop through `pjserve gateway` costs, and what a
second worker buys.

    .venv/bin/python bench/gateway.py      # or: make bench-gateway

Two parts, each measured with perf_analyzer (batch-1 requests, closed loop,
p50 as the stability criterion):

  hop       the demo mlp (a tiny model: the request path dominates) served by
            a `pjserve serve` worker, measured directly on the worker's TCP
            ports and through a gateway in front of it, over gRPC and HTTP
            at concurrency 1 and 8: throughput, p50 and p99, the gateway's
            added p50 / p99, and the gateway's CPU time per request (its
            process's CPU seconds over the requests it forwarded in the
            measurement, from its own metrics). The gateway reaches its
            worker two ways, each measured: over TCP (a standalone gateway
            in front of `--worker grpc=HOST:PORT,...`) and over Unix
            sockets (as `pjserve node` connects its gateway to its
            workers: a second, identical worker listening on unix:
            addresses only).
  scale     a compute-bound model, dense_stack (x f32 [1, 1024] through
            DENSE_LAYERS dense 1024x1024 tanh layers: about 12 MFLOP per
            request, compiled for batch 1 only, so a worker runs one request
            at a time and no coalescing hides the compute) through a gateway
            over 1 and then 2 workers at concurrency 8 over gRPC: throughput
            and latency. Each worker's CPU plugin gets one
            thread (--cpu-intra-op-threads 1), so a worker uses one core for
            execution: on a machine with C cores the ceiling for W workers is
            min(W, C) times one worker's throughput, shared with the gateway
            and the client's own cores.

Writes bench/results/gateway.json and .md (the tables of docs/benchmarks.md).
Needs build/pjserve, .venv (scripts/bootstrap) and perf_analyzer
(.venv-perf). Servers listen on free loopback ports; their logs go to a
temporary directory, kept with --keep.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (PJSERVE, ROOT, PjserveProcess, fmt, free_ports, git_revision, log,
                      machine_info, missing_tools, pa_command, read_pa_csv, remove_workdir,
                      run_perf_analyzer, tree_cpu_seconds, write_report)

sys.path.insert(0, str(ROOT / "python"))
from pjserve_export import demo  # noqa: E402

RESULT = ROOT / "bench" / "results" / "gateway.json"


class Worker(PjserveProcess):
    def __init__(self, repository, cache, work, name, extra=()):
        self.repository, self.cache = repository, cache
        self.extra = list(extra)
        self.log_path = work / f"{name}.log"
        self.proc = None
        self.serve_command()

    def start(self, models, timeout=300):
        self.start_process()
        self.wait_models_ready(models, time.monotonic() + timeout, timeout, 0.2)

    def spec(self):
        """The gateway's --worker value for this worker."""
        return f"grpc=127.0.0.1:{self.grpc},http=127.0.0.1:{self.http}"


class UnixWorker(Worker):
    """A worker listening on Unix sockets in `sockets` only, as a node's
    workers do; ready is checked through the gateway in front of it."""

    def __init__(self, repository, cache, work, name, sockets, extra=()):
        super().__init__(repository, cache, work, name, extra)
        self.paths = {k: sockets / f"{name}.{k}" for k in ("grpc", "http", "metrics")}
        self.cmd = [str(PJSERVE), "serve", "--model-repository", str(repository),
                    "--grpc-host", f"unix:{self.paths['grpc']}",
                    "--http-host", f"unix:{self.paths['http']}",
                    "--metrics-host", f"unix:{self.paths['metrics']}",
                    "--cache-dir", str(cache), *self.extra]

    def start(self, models, timeout=300):
        self.start_process()

    def spec(self):
        return f"grpc=unix:{self.paths['grpc']},http=unix:{self.paths['http']}"


class Gateway(PjserveProcess):
    def __init__(self, workers, work, extra=(), name=None):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.log_path = work / f"gateway-{name or len(workers)}.log"
        self.proc = None
        self.cmd = [str(PJSERVE), "gateway", "--host", "127.0.0.1",
                    "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                    "--metrics-port", str(self.metrics), *extra]
        for w in workers:
            self.cmd += ["--worker", w.spec()]

    def start(self, models, n_workers, timeout=300):
        self.start_process()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the gateway exited:\n" + self.log_tail())
            text = self.log_path.read_text(errors="replace")
            if text.count("is ready with") >= n_workers:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the gateway's workers were not ready:\n" + self.log_tail())
        self.wait_models_ready(models, deadline, timeout, 0.1)


def measure(server, key, model, protocol, concurrency, args, work):
    csv_path = work / f"pa-{key}-{model}-{protocol}-c{concurrency}.csv"
    port = server.grpc if protocol == "grpc" else server.http

    def command(tolerance):
        return pa_command(model, f"127.0.0.1:{port}", protocol, concurrency, args.window_ms,
                          tolerance, 8, csv_path)

    run_perf_analyzer(command, csv_path, args.stability, f"against {key} ({protocol}, "
                      f"concurrency {concurrency})", f"{key} {protocol} c={concurrency}")
    row = read_pa_csv(csv_path)
    r = {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
         "p99_us": float(row["p99 latency"])}
    log(f"{key:>10} {model} {protocol} c={concurrency}: {r['throughput']:8.0f} req/s  "
        f"p50 {r['p50_us']:7.0f} us  p99 {r['p99_us']:7.0f} us")
    return r


def gateway_cpu_and_count(gateway):
    """(CPU seconds of the gateway process so far, requests it forwarded)."""
    forwarded = sum(v for (name, _), v in gateway.scrape().items()
                    if name == "pjserve_gateway_forwarded_total")
    return tree_cpu_seconds(gateway.proc.pid), forwarded


def part_hop(repo, cache, work, args):
    options = ["--cpu-intra-op-threads", "1"]
    sockets = Path(tempfile.mkdtemp(prefix="pjserve-bench-sockets-"))  # short paths
    worker = Worker(repo, cache, work, "hop-worker", options)
    unix_worker = UnixWorker(repo, cache, work, "hop-unix-worker", sockets, options)
    gateways = {}
    rows = []
    try:
        worker.start(["mlp"])
        unix_worker.start(["mlp"])
        gateways["tcp"] = Gateway([worker], work, name="tcp")
        gateways["unix"] = Gateway([unix_worker], work, name="unix")
        for g in gateways.values():
            g.start(["mlp"], 1)
        for protocol in ("grpc", "http"):
            for c in (1, 8):
                row = {"protocol": protocol, "concurrency": c,
                       "direct": measure(worker, "direct", "mlp", protocol, c, args, work)}
                for hop, gateway in gateways.items():
                    cpu0, n0 = gateway_cpu_and_count(gateway)
                    through = measure(gateway, f"via {hop}", "mlp", protocol, c, args, work)
                    cpu1, n1 = gateway_cpu_and_count(gateway)
                    through["gateway_cpu_us"] = (cpu1 - cpu0) / max(n1 - n0, 1) * 1e6
                    through["added_p50_us"] = through["p50_us"] - row["direct"]["p50_us"]
                    through["added_p99_us"] = through["p99_us"] - row["direct"]["p99_us"]
                    row[hop] = through
                rows.append(row)
    finally:
        for g in gateways.values():
            g.stop()
        worker.stop()
        unix_worker.stop()
        remove_workdir(sockets, False)
    return rows


DENSE_LAYERS = 6
DENSE_MODEL = "dense_stack"


def export_dense_stack(repo):
    """The compute-bound model of part `scale` (fixed weights)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from pjserve_export import export_jax

    keys = jax.random.split(jax.random.PRNGKey(7), DENSE_LAYERS)
    params = {f"w{i}": jax.random.normal(k, (1024, 1024)) * (1 / 32) for i, k in enumerate(keys)}

    def dense_stack(p, x):
        for i in range(DENSE_LAYERS):
            x = jnp.tanh(x @ p[f"w{i}"])
        return x

    export_jax(dense_stack, params, [np.zeros((1, 1024), np.float32)], repo, name=DENSE_MODEL,
               batch_sizes=(1,), input_names=["x"], output_names=["y"],
               description=f"gateway benchmark: {DENSE_LAYERS} dense 1024x1024 tanh layers")


def part_scale(repo, cache, work, args):
    export_dense_stack(repo)
    model = DENSE_MODEL
    rows = []
    for n in (1, 2):
        workers = [Worker(repo, cache, work, f"scale{n}-w{i}", ["--cpu-intra-op-threads", "1"])
                   for i in range(n)]
        gateway = None
        try:
            for w in workers:
                w.start([model])
            gateway = Gateway(workers, work)
            gateway.start([model], n)
            r = measure(gateway, f"{n} worker{'s' if n > 1 else ''}", model, "grpc", 8, args,
                        work)
            rows.append({"workers": n, **r})
        finally:
            if gateway is not None:
                gateway.stop()
            for w in workers:
                w.stop()
    return rows


def markdown(result):
    lines = ["#### One hop through the gateway (mlp, one worker, batch-1 requests)", "",
             "The gateway reaches its worker over TCP (a standalone gateway) or over Unix "
             "sockets (as in `pjserve node`).", "",
             "| protocol | concurrency | worker via | direct req/s | gateway req/s "
             "| direct p50 / p99 (µs) | gateway p50 / p99 (µs) | added p50 / p99 (µs) "
             "| gateway CPU / request (µs) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["hop"]:
        d = r["direct"]
        for hop in ("tcp", "unix"):
            g = r[hop]
            lines.append(f"| {r['protocol']} | {r['concurrency']} | {hop} | "
                         f"{fmt(d['throughput'], '.0f')} | {fmt(g['throughput'], '.0f')} | "
                         f"{d['p50_us']:.0f} / {d['p99_us']:.0f} | "
                         f"{g['p50_us']:.0f} / {g['p99_us']:.0f} | "
                         f"{g['added_p50_us']:.0f} / {g['added_p99_us']:.0f} | "
                         f"{g['gateway_cpu_us']:.0f} |")
    lines += ["", f"#### Workers behind one gateway ({DENSE_MODEL}: {DENSE_LAYERS} dense "
              "1024x1024 layers, batch 1, gRPC, concurrency 8)", "",
              "| workers | req/s | p50 (µs) | p99 (µs) |", "|---:|---:|---:|---:|"]
    for r in result["scale"]:
        lines.append(f"| {r['workers']} | {r['throughput']:.0f} | {r['p50_us']:.0f} | "
                     f"{r['p99_us']:.0f} |")
    m = result["machine"]
    lines += ["", f"{m['cpu']}, {m['cores']} cores; pjserve {result['revision']}; "
              f"{result['date']}; `make bench-gateway`."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer window")
    ap.add_argument("--stability", type=int, default=10, help="perf_analyzer stability (%%)")
    ap.add_argument("--keep", action="store_true", help="keep the servers' logs")
    args = ap.parse_args(argv)
    problems = missing_tools()
    if problems:
        sys.exit("bench/gateway.py: " + "; ".join(problems))
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjserve-bench-gateway-"))
    repo, cache = work / "models", work / "cache"
    for m in demo.demo_models(["mlp"]):
        m.export(repo)
    result = {"machine": machine_info(), "revision": git_revision()}
    result["hop"] = part_hop(repo, cache, work, args)
    result["scale"] = part_scale(repo, cache, work, args)
    write_report(result, started, RESULT, markdown)
    remove_workdir(work, args.keep)


if __name__ == "__main__":
    main()
