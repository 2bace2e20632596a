#!/usr/bin/env python3
"""The XLA CPU plugin's thread count: latency and server CPU per request.

    .venv/bin/python bench/cpu_threads.py [--parts overhead,crossover] [--rounds 2]

Serves bench models with `pjserve serve --cpu-intra-op-threads N` for each
thread setting and drives them with perf_analyzer over gRPC, measuring per
setting: throughput and p50 latency (perf_analyzer), the server's CPU time
per request (utime + stime of its process from /proc over the requests the
server counted in nv_inference_request_success), and how much of it the
plugin's two pools took (threads named tf_XLAEigen: the intra-op pool; the
threads created right after them: the client pool that runs executions).

  overhead   the demo `mlp` at concurrency 1 and 4, batch-1 requests, under
             the plugin's own count (four threads on a machine of up to four
             CPUs: --pjrt-option cpu_device_count=4), two threads, and what
             auto picks (one thread for this model)
  crossover  where splitting one execution over threads starts to pay: bench
             models of growing size (dense256-512-512-10, dense256-2048-2048-10,
             the scheduler benchmark's convnet on 24x24x3) at concurrency 1 with
             batch-N requests, one thread against one per CPU

Settings and models are measured in rotating order, --rounds times; the
medians are reported. Writes bench/results/cpu_threads.json and prints the
tables that docs/runtime.md ("CPU plugin threads") quotes, with the load
average seen during the runs (the machine is shared: say how noisy it was).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (PERF_ANALYZER, PJSERVE, ROOT, PjserveProcess, git_revision, log,
                      machine_info, metric, missing_tools, model_fingerprint, parse_parts,
                      read_pa_csv, save_result, tree_cpu_seconds)

sys.path.insert(0, str(ROOT / "python"))

MODELS_DIR = ROOT / "build" / "bench-models" / "cpu_threads"
PARTS = ("overhead", "crossover")
CROSSOVER = (("dense512", (1, 8, 32)), ("dense2048", (1, 8, 32)), ("convnet24", (1, 8, 32)))


# ---- the bench model ----------------------------------------------------------

def export_models(force):
    """The demo mlp and the crossover models, exported into MODELS_DIR/bundles
    (skipped when the stamp matches); returns that directory."""
    import hashlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    from pjserve_export import export_jax
    from pjserve_export.demo import demo_models

    bundles = MODELS_DIR / "bundles"
    definition, exporter = model_fingerprint(__file__)
    want = hashlib.sha256(json.dumps({"jax": jax.__version__, "exporter": exporter,
                                      "code": definition}).encode()).hexdigest()
    stamp = bundles / ".stamp"
    if not force and stamp.exists() and stamp.read_text().strip() == want:
        return bundles
    bundles.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    demo_models(["mlp"])[0].export(bundles, batch_sizes=(1, 4, 8))

    def layer(key, shape):
        kw, kb = jax.random.split(key)
        fan_in = int(np.prod(shape[:-1]))
        return {"w": jax.random.normal(kw, shape) * np.sqrt(2.0 / fan_in),
                "b": 0.1 * jax.random.normal(kb, (shape[-1],))}

    def dense_fn(p, x):
        y = jax.nn.relu(x @ p["d1"]["w"] + p["d1"]["b"])
        y = jax.nn.relu(y @ p["d2"]["w"] + p["d2"]["b"])
        return y @ p["d3"]["w"] + p["d3"]["b"]

    for h in (512, 2048):
        k = jax.random.split(jax.random.PRNGKey(h), 3)
        params = {"d1": layer(k[0], (256, h)), "d2": layer(k[1], (h, h)), "d3": layer(k[2], (h, 10))}
        export_jax(dense_fn, params, [np.zeros((1, 256), np.float32)], bundles, name=f"dense{h}",
                   batch_sizes=(1, 8, 32), input_names=["x"], output_names=["y"],
                   description=f"dense 256->{h}->{h}->10")

    def block(x, p):
        y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jax.nn.relu(y + p["b"])
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def convnet(p, x):
        y = block(block(x, p["c1"]), p["c2"])
        y = jax.nn.relu(y.reshape(y.shape[0], -1) @ p["d1"]["w"] + p["d1"]["b"])
        return y @ p["d2"]["w"] + p["d2"]["b"]

    k = jax.random.split(jax.random.PRNGKey(24), 4)
    params = {"c1": layer(k[0], (3, 3, 3, 32)), "c2": layer(k[1], (3, 3, 32, 64)),
              "d1": layer(k[2], (6 * 6 * 64, 256)), "d2": layer(k[3], (256, 10))}
    export_jax(convnet, params, [np.zeros((1, 24, 24, 3), np.float32)], bundles, name="convnet24",
               batch_sizes=(1, 8, 32), input_names=["x"], output_names=["logits"],
               description="conv3x3(32)+relu+maxpool, conv3x3(64)+relu+maxpool, dense 2304->256->10")
    stamp.write_text(want + "\n")
    return bundles


# ---- servers ------------------------------------------------------------------

class Server(PjserveProcess):
    def __init__(self, binary, repository, cache, extra, log_path):
        self.binary, self.repository, self.cache = binary, repository, cache
        self.extra, self.log_path = extra, log_path
        self.proc = None

    def start(self, model):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        self.start_process()
        self.wait_models_ready([model], time.monotonic() + 300, 300, 0.1)
        tids = sorted(int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task"))
        names = {t: thread_name(self.proc.pid, t) for t in tids}
        intra = [t for t in tids if names[t].startswith("tf_XLAEigen")]
        # The plugin builds its client pool right after the intra-op pool,
        # with as many threads.
        client = [t for t in tids if intra and t > intra[-1]][:len(intra)]
        self.pools = {"intra_op": intra, "client": client}

    def pool_cpu(self):
        return {k: sum(thread_cpu(self.proc.pid, t) for t in v) for k, v in self.pools.items()}


def thread_name(pid, tid):
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def thread_cpu(pid, tid):
    try:
        text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return 0.0
    f = text[text.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def measure(server, model, concurrency, batch, seconds, work):
    """One perf_analyzer run (three windows of seconds/3); returns the row."""
    csv_path = work / "pa.csv"
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", f"127.0.0.1:{server.grpc}", "-i", "grpc",
           "-b", str(batch), "--concurrency-range", str(concurrency),
           "--measurement-interval", str(int(seconds * 1000 / 3)), "--max-trials", "3",
           "--stability-percentage", "1000", "-f", str(csv_path), "--verbose-csv"]
    before = (server.scrape(), tree_cpu_seconds(server.proc.pid), server.pool_cpu(),
              os.getloadavg()[0])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    after = (server.scrape(), tree_cpu_seconds(server.proc.pid), server.pool_cpu())
    if out.returncode != 0 or not csv_path.exists():
        raise RuntimeError(f"perf_analyzer failed:\n{' '.join(cmd)}\n{out.stdout[-2000:]}"
                           f"{out.stderr[-2000:]}")
    row = read_pa_csv(csv_path)
    requests = (metric(after[0], "nv_inference_request_success", model)
                - metric(before[0], "nv_inference_request_success", model))
    us = lambda s: round(s * 1e6 / requests, 1)  # noqa: E731
    return {"throughput": float(row["Inferences/Second"]) / batch,
            "p50_us": int(row["p50 latency"]), "p99_us": int(row["p99 latency"]),
            "requests": int(requests), "server_cpu_us": us(after[1] - before[1]),
            "intra_op_cpu_us": us(after[2]["intra_op"] - before[2]["intra_op"]),
            "client_pool_cpu_us": us(after[2]["client"] - before[2]["client"]),
            "load": before[3]}


def run_setting(binary, bundles, cache, model, setting, points, seconds, work):
    """Serves `model` alone under `setting` (label, extra args); measures each
    (concurrency, batch) point."""
    repo = work / f"repo-{model}"
    repo.mkdir(exist_ok=True)
    if not (repo / model).exists():
        (repo / model).symlink_to(bundles / model)
    server = Server(binary, repo, cache, setting[1], work / "pjserve.log")
    try:
        server.start(model)
        threads = len(server.pools["intra_op"])
        subprocess.run([str(PERF_ANALYZER), "-m", model, "-u", f"127.0.0.1:{server.grpc}", "-i",
                        "grpc", "--concurrency-range", "1", "--measurement-interval", "500",
                        "--max-trials", "3", "--stability-percentage", "1000"],
                       capture_output=True, timeout=120, cwd=ROOT)  # warm-up
        return [dict(measure(server, model, c, b, seconds, work), concurrency=c, batch=b,
                     model=model, setting=setting[0], threads=threads) for c, b in points]
    finally:
        server.stop()


def medians(rows, keys):
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        m = dict(zip(keys, key), rounds=len(rs), threads=rs[0]["threads"])
        for f in ("throughput", "p50_us", "p99_us", "server_cpu_us", "intra_op_cpu_us",
                  "client_pool_cpu_us", "load"):
            m[f] = round(statistics.median(r[f] for r in rs), 1)
        out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help="overhead,crossover")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (3 windows)")
    ap.add_argument("--force-export", action="store_true")
    ap.add_argument("--build-dir", type=Path, default=PJSERVE.parent,
                    help="where pjserve is (default build/)")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "cpu_threads.json")
    a = ap.parse_args()
    parts = parse_parts(ap, a.parts, PARTS)
    build = a.build_dir.absolute()
    problems = missing_tools(build)
    if problems:
        sys.exit("cpu_threads.py: " + "; ".join(problems))
    started = time.time()
    bundles = export_models(a.force_export)
    cpus = len(os.sched_getaffinity(0))
    plugin_own = ("plugin default", ["--pjrt-option", "cpu_device_count=4",
                                     "--cpu-intra-op-threads", str(cpus)])
    one, every = ("1 thread", ["--cpu-intra-op-threads", "1"]), \
        (f"{cpus} threads", ["--cpu-intra-op-threads", str(cpus)])
    jobs = []
    if "overhead" in parts:
        auto = ("auto", ["--cpu-intra-op-threads", "auto"])
        settings = [plugin_own] + ([every] if cpus != 4 else []) + [auto]
        jobs += [("mlp", s, [(1, 1), (4, 1)]) for s in settings]
    if "crossover" in parts:
        jobs += [(m, s, [(1, b) for b in sizes]) for m, sizes in CROSSOVER for s in (one, every)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pjs-bench-threads-") as tmp:
        work = Path(tmp)
        for r in range(a.rounds):
            for i in range(len(jobs)):
                model, setting, points = jobs[(i + r) % len(jobs)]
                log(f"round {r + 1}: {model} with {setting[0]}")
                rows += run_setting(build / PJSERVE.name, bundles, work / "cache", model,
                                    setting, points, a.seconds, work)
    summary = medians(rows, ("model", "setting", "concurrency", "batch"))
    loads = [r["load"] for r in rows]
    result = {"benchmark": "cpu_threads", "revision": git_revision(), "machine": machine_info(),
              "cpus": cpus, "rounds": a.rounds, "seconds": a.seconds,
              "load_average": {"min": min(loads), "median": statistics.median(loads),
                               "max": max(loads)},
              "summary": summary, "runs": rows}
    save_result(result, started, a.json)
    print(f"\nload average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f}, "
          f"median {statistics.median(loads):.2f}; medians of {a.rounds} rounds")
    print(f"{'model':<10} {'setting':<15} {'thr':>3} {'c':>2} {'b':>3} {'req/s':>7} "
          f"{'p50 us':>8} {'cpu us/req':>10} {'intra-op':>9} {'client pool':>11}")
    for m in summary:
        print(f"{m['model']:<10} {m['setting']:<15} {m['threads']:>3} {m['concurrency']:>2} "
              f"{m['batch']:>3} {m['throughput']:>7.0f} {m['p50_us']:>8.0f} "
              f"{m['server_cpu_us']:>10.1f} {m['intra_op_cpu_us']:>9.1f} "
              f"{m['client_pool_cpu_us']:>11.1f}")


if __name__ == "__main__":
    main()
