#!/usr/bin/env python3
"""Shared host weights benchmark: the memory of N `pjserve serve` workers on
one machine with and without --shared-weights.

    .venv/bin/python bench/shared_weights.py [--workers 1,2,3,4] [--models 3]
                                             [--size-mib 64] [--pjserve build/pjserve]

A repository of --models dense models, x f32 [batch,K] -> x @ W + b with W f32
[K,K] of about --size-mib MiB each, different weights each (so one segment per
model). For each worker count N, N workers are started on it, each its own
process on free loopback ports: first with private host weights (the
default), then with `--shared-weights DIR` on a fresh directory under
/dev/shm. Once every worker answers one request to every model, each worker's
/proc/PID/smaps_rollup is read: Rss (pages it maps, shared ones counted in
full by each), Pss (each shared page divided among the processes that map
it, so the workers' Pss add up to the memory they take together), and Pss
split into anonymous memory (the CPU plugin's device copies, the private host
floors, the server itself) and shared memory (the segments). The segments'
size on the tmpfs is read too.

On the CPU plugin the "device" is host memory: each worker also holds its own
device copy of every weight, which the store does not share (loads copy host
-> device, as without it). On a GPU the device copy lives in device memory, so
there the store divides the host cost of weights by N.

Writes bench/results/shared_weights.json and .md (the table of
docs/benchmarks.md, section Shared host weights). The bench models are
exported once into build/bench-models/shared_weights/ (again when their
definition, jax or the exporter changes).
"""

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from benchlib import (PJSERVE, ROOT, PjserveProcess, git_revision, log, machine_info,
                      model_fingerprint, write_report)

sys.path.insert(0, str(ROOT / "python"))

MODELS_DIR = ROOT / "build" / "bench-models" / "shared_weights"
RESULTS = ROOT / "bench" / "results" / "shared_weights.json"
MIB = 1 << 20
READY_TIMEOUT_S = 600


# ---- the bench model ----------------------------------------------------------

def side(size_mib):
    return max(1, round((size_mib * MIB / 4) ** 0.5))


def export_models(n, size_mib, force):
    """n dense models of about size_mib MiB into MODELS_DIR/<size>m-<n>/ (skipped
    when the stamp matches). Returns the repository path."""
    import jax
    import numpy as np
    from pjserve_export import export_jax

    repo = MODELS_DIR / f"{size_mib}m-{n}"
    definition, exporter = model_fingerprint(__file__)
    want = hashlib.sha256(json.dumps({"n": n, "size": size_mib, "jax": jax.__version__,
                                      "exporter": exporter, "code": definition},
                                     sort_keys=True).encode()).hexdigest()
    stamp = repo / ".stamp"
    if not force and stamp.exists() and stamp.read_text().strip() == want:
        return repo
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    k = side(size_mib)
    for i in range(n):
        rng = np.random.default_rng(1000 + i)
        params = {"w": rng.standard_normal((k, k), dtype=np.float32) / np.float32(k ** 0.5),
                  "b": rng.standard_normal((k,), dtype=np.float32)}
        export_jax(lambda p, x: x @ p["w"] + p["b"], params, [np.zeros((1, k), np.float32)],
                   repo, name=f"dense{i}", batch_sizes=(1,), input_names=["x"],
                   output_names=["y"],
                   description=f"shared weights benchmark: dense {k}x{k} f32")
        log(f"exported dense{i} ({4 * (k * k + k) / MIB:.1f} MiB of weights)")
    stamp.write_text(want + "\n")
    return repo


# ---- servers ------------------------------------------------------------------

class Worker(PjserveProcess):
    def __init__(self, binary, repository, cache, extra, log_path):
        self.binary, self.repository, self.cache, self.extra = binary, repository, cache, extra
        self.log_path = log_path
        self.proc = None

    def start(self):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        self.start_process()


def smaps_rollup(pid):
    """The kB fields of /proc/PID/smaps_rollup, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields = value.split()
        if len(fields) == 2 and fields[1] == "kB":
            out[name] = int(fields[0]) / 1024
    return out


def infer_once(worker, model, k):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, k], "datatype": "FP32",
                                   "data": [0.5] * k}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{worker.http}/v2/models/{model}/infer",
                                 data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        if r.status != 200:
            raise RuntimeError(f"{model}: HTTP {r.status}")


def measure(binary, repo, models, k, n_workers, store, work):
    """Starts n_workers workers (with the store directory `store`, or none),
    waits for them, sends one request per model to each, reads their memory,
    stops them. Returns the row."""
    cache = work / "cache"
    extra = ["--shared-weights", str(store)] if store else []
    tag = "shared" if store else "private"
    workers = [Worker(binary, repo, cache, extra, work / f"{tag}-{n_workers}-{i}.log")
               for i in range(n_workers)]
    try:
        t0 = time.monotonic()
        for w in workers:
            w.start()
        for w in workers:
            w.wait_models_ready(models, t0 + READY_TIMEOUT_S, READY_TIMEOUT_S, 0.2)
        ready_s = time.monotonic() - t0
        for w in workers:
            for m in models:
                infer_once(w, m, k)
        per = [smaps_rollup(w.proc.pid) for w in workers]
        segments = sum(p.stat().st_size for p in store.glob("*.weights")) / MIB if store else 0
        n_segments = len(list(store.glob("*.weights"))) if store else 0
    finally:
        for w in workers:
            w.stop()
    if store and list(store.glob("*.weights")):
        raise RuntimeError(f"segments left in {store} after every worker stopped")

    def mean(key):
        return sum(p.get(key, 0) for p in per) / len(per)

    return {"workers": n_workers, "store": tag, "ready_s": round(ready_s, 2),
            "rss_mib": round(mean("Rss"), 1), "pss_mib": round(mean("Pss"), 1),
            "pss_anon_mib": round(mean("Pss_Anon"), 1),
            "pss_shmem_mib": round(mean("Pss_Shmem"), 1),
            "pss_total_mib": round(sum(p["Pss"] for p in per), 1),
            "data_total_mib": round(sum(p.get("Pss_Anon", 0) + p.get("Pss_Shmem", 0)
                                        for p in per), 1),
            "segments": n_segments, "segments_mib": round(segments, 1), "per_worker": per}


def markdown(result):
    c = result["config"]
    lines = [
        f"{c['models']} dense models of {c['weights_mib_per_model']:.1f} MiB of f32 weights "
        f"each ({c['weights_mib']:.1f} MiB in all), residency `host` (the default: a host "
        "floor plus the device copy); means per worker, and the workers' Pss added up. "
        f"{result['machine']['cores']} cores, {result['machine'].get('memory_gib', '?')} GiB, "
        f"CPU plugin; revision {result['revision']}.",
        "",
        "| workers | host weights | Rss / worker (MiB) | Pss / worker (MiB) | "
        "of which anonymous | of which shared | Pss, all workers (MiB) | "
        "anonymous + shared, all workers (MiB) | segments (MiB) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        seg = f"{r['segments']} ({r['segments_mib']:.1f})" if r["store"] == "shared" else "-"
        lines.append(f"| {r['workers']} | {r['store']} | {r['rss_mib']:.1f} | "
                     f"{r['pss_mib']:.1f} | {r['pss_anon_mib']:.1f} | "
                     f"{r['pss_shmem_mib']:.1f} | {r['pss_total_mib']:.1f} | "
                     f"{r['data_total_mib']:.1f} | {seg} |")
    lines.append("")
    for n in sorted({r["workers"] for r in result["rows"]}):
        by = {r["store"]: r for r in result["rows"] if r["workers"] == n}
        if len(by) == 2:
            saved = round(by["private"]["data_total_mib"] - by["shared"]["data_total_mib"]) + 0
            lines.append(f"- {n} worker{'s' if n > 1 else ''}: the store saves "
                         f"{saved:.0f} MiB of the workers' "
                         f"{by['private']['data_total_mib']:.0f} MiB of anonymous and shared "
                         f"memory ({saved / c['weights_mib']:.2f} copies of the weights; "
                         f"{n - 1} expected)")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,3,4", help="worker counts (default %(default)s)")
    ap.add_argument("--models", type=int, default=3, help="models (default %(default)s)")
    ap.add_argument("--size-mib", type=int, default=64,
                    help="MiB of weights per model (default %(default)s)")
    ap.add_argument("--pjserve", type=Path, default=PJSERVE, help="the binary (build/pjserve)")
    ap.add_argument("--force-export", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the workers' logs")
    a = ap.parse_args(argv)
    counts = [int(n) for n in a.workers.split(",")]
    if not a.pjserve.exists():
        ap.error(f"{a.pjserve} is missing (cmake --build build)")
    started = time.time()
    repo = export_models(a.models, a.size_mib, a.force_export)
    models = [f"dense{i}" for i in range(a.models)]
    k = side(a.size_mib)
    work = Path(tempfile.mkdtemp(prefix="pjserve-bench-shared-"))
    rows = []
    try:
        # One start first fills the executable cache: every measured start
        # loads its executables instead of compiling (a compile's code pages
        # would count in the first start's memory only).
        measure(a.pjserve, repo, models, k, 1, None, work)
        for n in counts:
            for shared in (False, True):
                store = Path("/dev/shm") / f"pjserve-bench-{uuid.uuid4().hex[:12]}" \
                    if shared else None
                try:
                    row = measure(a.pjserve, repo, models, k, n, store, work)
                finally:
                    if store:
                        shutil.rmtree(store, ignore_errors=True)
                log(f"{n} workers, {row['store']}: Pss {row['pss_mib']:.1f} MiB / worker, "
                    f"{row['pss_total_mib']:.1f} MiB in all")
                rows.append(row)
    finally:
        if a.keep:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    weights = 4 * (k * k + k) / MIB
    result = {"config": {"models": a.models, "side": k, "weights_mib_per_model": weights,
                         "weights_mib": weights * a.models, "workers": counts,
                         "command": " ".join(["bench/shared_weights.py"] + (argv or sys.argv[1:]))},
              "machine": machine_info(), "revision": git_revision(), "rows": rows}
    write_report(result, started, RESULTS, markdown)


if __name__ == "__main__":
    main()
