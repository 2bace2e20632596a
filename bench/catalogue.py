#!/usr/bin/env python3
"""Catalogue benchmark: a model server under a realistic multi-model trace.

    .venv/bin/python bench/catalogue.py [--quick]      # or: make bench-catalogue

The models: --models (default 10,000) distinct models, each one dense layer,
x f32 [batch, 512] -> x @ W + b with W f32 [512, 512] and b f32 [512]
(1,050,624 bytes of weights: 1.00 MiB), batch sizes 1, 2, 4, 8. The layer is
exported once with pjserve_export.export_jax (build/bench-models/catalogue/
bundles/template); each model c00000, c00001, ... is a bundle of its own: hard
links to the template's .mlir modules, the manifest with its name, and a
weights.safetensors of its own: the template's header byte for byte (tensor
order, offsets, the exporter's argument_order metadata), then values drawn
from numpy's default_rng((7, i)) (W ~ N(0, 1/512), b ~ 0.1 N(0, 1)). 10,000
bundles are 10 GB on disk, written once (about a minute) and reused while the
stamp (bundles/.stamp: this file's bench-model section, jax's version, the
exporter's sources) holds; a run of more models adds the missing ones. Each
run serves a repository of symbolic links to the first --models bundles.

Trace. Deterministic (--seed, default 1; numpy's default_rng(seed)), open
loop, --seconds long (default 120) at a mean aggregate rate of --rate
requests/s (default 500: on this 2-CPU machine pjserve serves it with about
a third of a CPU and still keeps up at 1,500/s on the --quick catalogue,
PyTriton needs about one CPU for it, and Ray Serve's HTTP path tops out
near 250-300/s even when every model is cached, so Ray is overloaded at
this rate), generated as follows:

  1. popularity: ranks = rng.permutation(N); the model ranks[r-1] has rank r
     and mean rate lam_r = rate * r^-s / sum_k k^-s, s = --zipf-s (1.1):
     heavy-tailed per-model rates, most models rare, a few very hot (as in
     the Azure Functions trace: Shahrad et al., "Serverless in the Wild",
     ATC 2020, where invocation rates span 8 orders of magnitude and most
     functions are invoked rarely and in bursts).
  2. bursts: each model, in rank order, is an on/off process. Duty cycle
     d_r = clip(lam_r / (lam_r + 1 request/s), 0.05, 0.9): hot models are on most
     of the time, rare ones in short bursts. On periods ~ lognormal(median
     1 s, sigma 1) (mean 1.65 s); off periods ~ Pareto(alpha 1.5) with scale
     x_m = mean_off (alpha - 1) / alpha, mean_off = mean_on (1 - d_r) / d_r
     (heavy-tailed idle gaps, infinite variance). While on, requests arrive
     as a Poisson process of rate lam_r / d_r, so the long-run mean rate is
     lam_r. Drawing order per period: the on/off state starts on with
     probability d_r (one rng.random()), then per period its length
     (rng.lognormal / x_m (1 + rng.pareto)) and, for an on period, the count
     rng.poisson(lam_r / d_r * length) and the times t + length * rng.random(count).
     The process starts 60 s before 0 (burn-in); requests in [0, --seconds)
     are kept.
  3. all models' requests merged and sorted by time (stable).

The trace is written to a CSV (time_s, model), by default
build/bench-catalogue/trace-N-RATErps-Ss-seedK.csv (--quick: under
build/bench-catalogue-quick/); --trace FILE replays such a file instead.
The results record its statistics: requests, the rate per second (min, max),
models requested, the share of the top 1 % and 10 % of models, the
coefficient of variation of the inter-arrival times per model (median over
models with 10 or more requests: 1 for Poisson) and the hit rate an LRU of
the device's and of the host tier's capacity (in models) would have on it.

Replay. One asyncio event loop in this process sends request i at origin +
t_i as a task of its own (never waiting for earlier answers), so a slow
server gets a growing backlog, not fewer requests. Per request it records
the time sent, the latency (sent to answered or failed; --request-timeout,
default 30 s), ok or the error, and the tier the peer reported; these go to
requests-SYSTEM.csv beside the trace. The send lag (sent - scheduled) is
reported (p50, p99, max) and should stay under 10 ms at p99: the driver runs
at nice -10 and its servers at 0, garbage collection is off during the
replay, and the driver's wait for a CPU (schedstat run delay) is recorded. The
first --warmup seconds (default 20) fill the caches and are not measured;
throughput counts the answers that arrived within [warmup, seconds), latency
the requests scheduled there. Three models' answers are checked against numpy
on their files' weights before each replay.

Systems (--systems, default all, one after another on the same trace):

  tiered    pjserve serve --model-control-mode static --host-weight-budget
            2Gi --device-weight-budget 200Mi (for 10,000 models; both scaled
            with --models: 20 % and 2 % of the catalogue's weights), gRPC,
            tritonclient.grpc.aio over --channels (4) connections.
  host      the same without --host-weight-budget: every floor kept in host
            memory (10 GB: the all-in-host reference).
  ray       Ray Serve (bench/peers/catalogue_ray.py, .venv-bench-ray, pinned in
            bench/requirements-ray.txt): one deployment of --ray-replicas (1)
            replicas with @serve.multiplexed(max_num_models_per_replica =
            C / replicas), C = the host budget in models (2,044); the model id
            in the serve_multiplexed_model_id header of an HTTP POST (aiohttp);
            its loader reads the model's weights.safetensors into jax arrays.
  pytriton  Triton via PyTriton (bench/peers/catalogue_pytriton.py,
            .venv-bench-pytriton): PyTriton binds models at start and cannot
            unload one (a model bound later is a Python-backend stub process
            of its own, and there is no unbind), so it binds C weight slots
            behind one model, dense (x, slot) -> y, and a model load (slot,
            model) that reads a model's file into a slot; the client keeps
            the LRU (model -> slot, C entries) and calls load on a miss into
            the least recently used idle slot. Dynamic batching up to 8.

Every system serves x @ W + b of the requested model's own weights, read on
demand from the same files. pjserve's tiers come from
pjserve_request_tier_seconds (requests by the tier their model was in when
they were queued: device, host, file; received to executed), the
delta between a scrape at the end of the warm-up and one after the last
answer: counts -> shares, quantiles interpolated within its buckets (four
to an octave). --metrics-models 1 (the default) keeps those scrapes cheap: the
server-wide pjserve_all_models_* totals give failures, the tier counts the
requests that waited for an upload (host, file) or a read of their file
(file), and their cost is estimated as the extra received-to-executed time
over the device tier's mean; with --metrics-models all the per-model load
counters (pjserve_weight_load*, pjserve_host_weight_load*) are summed too:
the exact uploads and file reads and their seconds. The peers
tell a hit from a load per request (Ray: the x-tier header its replica sets;
PyTriton: the client's LRU). CPU per system: its process tree, the driver,
and the rest of the machine (another user's work shows there).

Goal (printed): for requests whose model was on the device or in host
memory, p99 of the tiered run within 1.5x of the all-in-host run, from the
merged device and host histograms of the two runs. Also printed: pjserve /
peer for throughput and p99.

Writes bench/results/catalogue.json and .md and docs/img/catalogue.png
(bench/plot_catalogue.py with .venv-bench-plot); --quick (1,000 models, 30 s,
5 s of warm-up) writes under build/bench-catalogue-quick/ instead. The
binary (build/pjserve) is copied first, so a rebuild during the run changes
nothing; pjserve gets a descriptor limit of 65,536 (see server_preexec). A
system that fails is reported and the others still run; every server is
stopped (SIGTERM, then SIGKILL to what is left of its session). Needs
build/pjserve, .venv, .venv-bench-pytriton (scripts/bootstrap-bench
pytriton), .venv-bench-ray (make bench-catalogue makes it) and
.venv-bench-plot (scripts/bootstrap-bench plot); a missing peer venv skips
that peer.
"""

import argparse
import asyncio
import csv
import gc
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from benchlib import (PJSERVE, ROOT, PjserveProcess, ServerProcess, find_plotter, fmt,
                      free_ports, git_revision, http_get, log, machine_info, model_fingerprint,
                      parse_metrics, remove_workdir, write_report)
from catalogue_trace import make_trace, trace_stats

sys.path.insert(0, str(ROOT / "python"))

MODELS_DIR = ROOT / "build" / "bench-models" / "catalogue"
BUNDLES = MODELS_DIR / "bundles"
RESULTS = ROOT / "bench" / "results" / "catalogue.json"
QUICK_OUT = ROOT / "build" / "bench-catalogue-quick"
PLOT = ROOT / "bench" / "plot_catalogue.py"
PEERS = ROOT / "bench" / "peers"
RAY_PYTHON = ROOT / ".venv-bench-ray" / "bin" / "python"
PYTRITON_PYTHON = ROOT / ".venv-bench-pytriton" / "bin" / "python"
MIB, GIB = 1 << 20, 1 << 30

# the metrics read from pjserve (docs/residency.md, What to watch)
TIER = "pjserve_request_tier_seconds"
TIERS = ("device", "host", "file")
DEFAULT_RATE = 500.0
NOTES = [
    "What the peers measure. Ray Serve: one deployment, @serve.multiplexed with "
    "max_num_models_per_replica = the host tier's capacity in models / replicas, model id per "
    "request over HTTP (its gRPC proxy needs a proto of its own); its workers run at nice 0 "
    "here (RAY_worker_niceness=0; Ray's default is 15). PyTriton cannot unload a model it "
    "bound (and a model bound while serving is a Python-backend process of its own), so it "
    "serves one model of weight slots (as many as the host tier holds models) and a load "
    "model, and the client keeps the LRU, calling load on a miss: Triton's own model "
    "load/unload is not what is measured. The peers have one tier (the CPU device is host "
    "memory): hit or load.",
    "Every server runs with a descriptor limit of 65,536, as a deployment would give a "
    "server of this many models; pjserve itself holds 16 descriptors at 10,000 models "
    "(bench/results/catalogue_scale.md).",
]


# ---- the trace ------------------------------------------------------------------

def write_trace(path, t, m):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "model"])
        for ti, mi in zip(t.tolist(), m.tolist()):
            w.writerow([f"{ti:.6f}", name_of(mi)])


def read_trace(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return (np.array([float(r["time_s"]) for r in rows]),
            np.array([int(r["model"][1:]) for r in rows], np.int32))


# ---- the bench model ----------------------------------------------------------

K = 512                                # x f32 [batch, K] -> x @ W + b, W f32 [K, K]
BATCH_SIZES = (1, 2, 4, 8)
WEIGHT_BYTES = 4 * (K * K + K)         # 1,050,624 bytes: 1.002 MiB
TEMPLATE = "template"


def name_of(i):
    return f"c{i:05d}"


def dense(p, x):
    return x @ p["w"] + p["b"]


def model_weights(seed, i):
    """Model i's weights: W ~ N(0, 1/K), b ~ 0.1 N(0, 1), from the generator
    seeded with (seed, i), so every model has values of its own."""
    rng = np.random.default_rng([seed, i])
    w = rng.standard_normal((K, K), dtype=np.float32) / np.float32(K ** 0.5)
    b = np.float32(0.1) * rng.standard_normal((K,), dtype=np.float32)
    return {"w": w, "b": b}


def bundles_stamp():
    # jax's version without importing jax: a driver that imported it forks
    # its servers from a multithreaded process (os.fork warns)
    from importlib.metadata import version
    definition, exporter = model_fingerprint(__file__)
    return hashlib.sha256(json.dumps({"jax": version("jax"), "exporter": exporter,
                                      "code": definition}, sort_keys=True).encode()).hexdigest()


def make_bundles(n, seed=7):
    """BUNDLES/c00000 .. c{n-1}: the dense model exported once (BUNDLES/template,
    with pjserve_export.export_jax), then a bundle per model: hard links to the
    template's .mlir modules, its manifest with the name replaced, and a
    weights.safetensors of its own: the template's header (tensor order,
    offsets and the exporter's argument_order metadata, byte for byte)
    followed by that model's values (model_weights). Made once: the stamp
    (BUNDLES/.stamp) records what made them and how many exist; a later call
    for more models adds the missing ones."""
    want = bundles_stamp()
    stamp = BUNDLES / ".stamp"
    have = json.loads(stamp.read_text()) if stamp.exists() else {}
    if have.get("code") != want or have.get("seed") != seed:
        shutil.rmtree(BUNDLES, ignore_errors=True)
        have = {"code": want, "seed": seed, "count": 0}
    if have["count"] >= n:
        return [BUNDLES / name_of(i) for i in range(n)]
    template = BUNDLES / TEMPLATE
    if not (template / "manifest.yaml").exists():
        from pjserve_export import export_jax   # imports jax: only when exporting
        BUNDLES.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        export_jax(dense, model_weights(seed + 1, 1 << 30), [np.zeros((1, K), np.float32)], BUNDLES,
                   name=TEMPLATE, batch_sizes=BATCH_SIZES, input_names=["x"],
                   output_names=["y"],
                   description=f"catalogue benchmark: one dense layer {K}x{K} f32 + bias")
        log(f"exported {TEMPLATE} in {time.monotonic() - t0:.1f} s")
    with open(template / "weights.safetensors", "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        head = f.read(8 + size)
    header = json.loads(head[8:])
    order = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    if [k for _, k in order] not in (["w", "b"], ["b", "w"]) or \
            header["w"]["shape"] != [K, K] or header["b"]["shape"] != [K]:
        raise RuntimeError(f"unexpected weights header: {header}")
    manifest = (template / "manifest.yaml").read_text()
    old = f'name: "{TEMPLATE}"\n'
    if old not in manifest:
        raise RuntimeError(f"no line {old!r} in the template's manifest")
    modules = sorted(p for p in template.iterdir() if p.suffix == ".mlir")
    t0 = time.monotonic()
    start = have["count"]
    for i in range(start, n):
        d = BUNDLES / name_of(i)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for m in modules:
            os.link(m, d / m.name)
        (d / "manifest.yaml").write_text(manifest.replace(old, f'name: "{name_of(i)}"\n'))
        p = model_weights(seed, i)
        with open(d / "weights.safetensors", "wb") as f:
            f.write(head)
            for _, key in order:
                f.write(p[key].tobytes())
        if (i + 1) % 1000 == 0 or i + 1 == n:
            have["count"] = i + 1
            stamp.write_text(json.dumps(have) + "\n")
            log(f"  {i + 1 - start} of {n - start} bundles written "
                f"({time.monotonic() - t0:.0f} s)")
    return [BUNDLES / name_of(i) for i in range(n)]


def read_weights(path):
    """(W, b) of a bundle's weights.safetensors (numpy f32), as the peers read
    them (bench/peers/catalogue_ray.py)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key in ("w", "b"):
        begin, end = header[key]["data_offsets"]
        out[key] = np.frombuffer(data, "<f4", (end - begin) // 4,
                                 8 + n + begin).reshape(header[key]["shape"])
    return out["w"], out["b"]


def make_repository(n, path):
    """A model repository of symbolic links to the first n bundles."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for i in range(n):
        (path / name_of(i)).symlink_to(BUNDLES / name_of(i), target_is_directory=True)
    return path


# ---- servers ------------------------------------------------------------------

FILE_LIMIT = 65536


CLIENT_NICE = -10


def server_preexec():
    """preexec_fn of every server: back to nice 0 (the driver, whose event loop
    sends the trace, runs at CLIENT_NICE: so that it sends on time while the
    servers keep the CPUs busy; it uses a fraction of one CPU), and the
    descriptor limit FILE_LIMIT (soft and hard; root may raise the hard
    limit), as a deployment would give a server of 10,000 models."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILE_LIMIT:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))
        except (ValueError, OSError):
            pass


def start_server(server):
    """server.cmd as its own session, its output into server.log_path."""
    server.log_file = open(server.log_path, "w")
    server.proc = subprocess.Popen(server.cmd, cwd=ROOT, stdout=server.log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=server_preexec)


def stop_tree(server, name, timeout=60):
    """SIGTERM to the server, then SIGKILL to what is left of it: its process,
    then every process still in the session it leads (start_new_session), each
    by its pid."""
    from benchlib import process_tree
    if server.proc is None:
        return
    root = server.proc.pid
    if not server.terminate(name, timeout):
        server.proc.kill()
        server.proc.wait()
    for _ in range(20):
        left = [p for p in process_tree(root) if p != root]
        if not left:
            break
        time.sleep(0.5)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            log(f"{name}: killed process {pid} left behind")
        except ProcessLookupError:
            pass
    server.log_file.close()
    server.proc = None


def wait_for(server, name, ready, timeout, progress=None):
    """Polls ready() until true; RuntimeError when the process exits or after
    `timeout` s; progress() logged every 15 s."""
    t0 = time.monotonic()
    shown = t0
    while not ready():
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {server.proc.returncode}:\n"
                               + server.log_tail())
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{name} not ready after {timeout} s:\n" + server.log_tail())
        if progress and time.monotonic() - shown > 15:
            shown = time.monotonic()
            log(f"  {name}: {progress()}")
        time.sleep(0.2)
    return time.monotonic() - t0


class Pjserve(PjserveProcess):
    name = "pjserve"

    def __init__(self, binary, repository, cache, log_path, extra):
        self.binary, self.repository, self.cache, self.log_path, self.extra = (
            binary, repository, cache, log_path, list(extra))
        self.proc = None

    def start(self, timeout):
        self.serve_command()
        self.cmd[0] = str(self.binary)
        start_server(self)

        def ready():
            return http_get(f"http://127.0.0.1:{self.http}/v2/health/ready", 5.0)[0] == 200

        def progress():
            text = self.log_path.read_text(errors="replace")
            i = text.rfind("] model ")
            j = text.rfind("[", 0, i)
            return (f"{text[j + 1:i]} models ready" if i > 0 and j >= 0 else
                    "no model ready yet")
        self.start_s = wait_for(self, "pjserve", ready, timeout, progress)

    def metrics_text(self):
        status, body = http_get(f"http://127.0.0.1:{self.metrics}/metrics", 30.0)
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        return body.decode()

    def stop(self):
        stop_tree(self, "pjserve")


class RayServe(ServerProcess):
    name = "ray"

    def __init__(self, repository, log_path, per_replica, replicas, max_ongoing):
        self.http = free_ports(1)[0]
        self.log_path = log_path
        self.proc = None
        self.cmd = [str(RAY_PYTHON), str(PEERS / "catalogue_ray.py"), "--port", str(self.http),
                    "--repository", str(repository), "--models-per-replica", str(per_replica),
                    "--replicas", str(replicas), "--max-ongoing", str(max_ongoing),
                    "--temp-dir", str(log_path.parent / "ray")]

    def start(self, timeout):
        # Ray starts its workers (the HTTP proxy, the controller, the replicas)
        # at nice 15 by default; every server here runs at 0
        os.environ["RAY_worker_niceness"] = "0"
        try:
            start_server(self)
        finally:
            del os.environ["RAY_worker_niceness"]
        self.start_s = wait_for(self, "ray", lambda: "ray: serving" in self.log_path.read_text(
            errors="replace"), timeout)

    def stop(self):
        stop_tree(self, "ray")


class PyTriton(ServerProcess):
    name = "pytriton"

    def __init__(self, repository, log_path, slots, max_batch):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.log_path = log_path
        self.proc = None
        self.cmd = [str(PYTRITON_PYTHON), str(PEERS / "catalogue_pytriton.py"),
                    "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                    "--metrics-port", str(self.metrics), "--repository", str(repository),
                    "--slots", str(slots), "--max-batch-size", str(max_batch)]

    def start(self, timeout):
        start_server(self)

        def ready():
            return ("pytriton: serving" in self.log_path.read_text(errors="replace") and
                    http_get(f"http://127.0.0.1:{self.http}/v2/models/dense/ready", 5.0)[0]
                    == 200)
        self.start_s = wait_for(self, "pytriton", ready, timeout)

    def stop(self):
        stop_tree(self, "pytriton")


# ---- clients ------------------------------------------------------------------

def example_input(seed=0):
    return np.random.default_rng(seed).standard_normal((1, K), dtype=np.float32)


class GrpcSender:
    """tritonclient.grpc.aio to pjserve: `channels` connections used in turn."""

    def __init__(self, port, channels, timeout):
        import tritonclient.grpc.aio as aio
        self.aio, self.timeout = aio, timeout
        self.clients = [aio.InferenceServerClient(f"127.0.0.1:{port}") for _ in range(channels)]
        self.x = example_input()
        self.inp = aio.InferInput("x", [1, K], "FP32")
        self.inp.set_data_from_numpy(self.x)
        self.turn = 0

    def client(self):
        self.turn += 1
        return self.clients[self.turn % len(self.clients)]

    async def send(self, model, check=False):
        r = await self.client().infer(name_of(model), [self.inp], client_timeout=self.timeout)
        return None, (r.as_numpy("y") if check else None)

    async def close(self):
        for c in self.clients:
            await c.close()


class SlotLRU:
    """The PyTriton peer's client-side LRU: model -> slot, `capacity` slots.
    acquire() returns (slot, "hit"|"load"); a miss loads the model into a
    free slot or the least recently used one with no request in flight
    (requests for a model being loaded wait for that load)."""

    def __init__(self, capacity, load):
        self.free = list(range(capacity))[::-1]
        self.slot_of = OrderedDict()
        self.busy = {}
        self.loading = {}
        self.load = load
        self.load_log = []       # (perf_counter at the start, seconds) of each load

    async def acquire(self, model):
        s = self.slot_of.get(model)
        if s is not None:
            self.slot_of.move_to_end(model)
            self.busy[s] = self.busy.get(s, 0) + 1
            return s, "hit"
        if model in self.loading:
            s = await asyncio.shield(self.loading[model])
            self.busy[s] = self.busy.get(s, 0) + 1
            return s, "load"
        fut = asyncio.get_running_loop().create_future()
        self.loading[model] = fut
        try:
            while True:
                if self.free:
                    s = self.free.pop()
                    break
                victim = next((m for m, v in self.slot_of.items() if not self.busy.get(v)), None)
                if victim is not None:
                    s = self.slot_of.pop(victim)
                    break
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()
            try:
                await self.load(s, model)
            except BaseException:
                self.free.append(s)
                raise
            self.load_log.append((t0, time.perf_counter() - t0))
        except BaseException as e:
            del self.loading[model]
            fut.set_exception(e)
            fut.exception()   # retrieved: no "never retrieved" warning when nobody waits
            raise
        del self.loading[model]
        self.slot_of[model] = s
        self.busy[s] = self.busy.get(s, 0) + 1
        fut.set_result(s)
        return s, "load"

    def release(self, s):
        self.busy[s] -= 1


class PyTritonSender(GrpcSender):
    """The PyTriton peer: load (on a miss of SlotLRU) and dense over gRPC."""

    def __init__(self, port, channels, timeout, capacity):
        super().__init__(port, channels, timeout)
        self.lru = SlotLRU(capacity, self._load)

    def _int(self, name, value):
        i = self.aio.InferInput(name, [1], "INT32")
        i.set_data_from_numpy(np.array([value], np.int32))
        return i

    async def _load(self, slot, model):
        await self.client().infer("load", [self._int("slot", slot), self._int("model", model)],
                                  client_timeout=self.timeout)

    async def send(self, model, check=False):
        slot, tier = await self.lru.acquire(model)
        try:
            s = self.aio.InferInput("slot", [1, 1], "INT32")
            s.set_data_from_numpy(np.array([[slot]], np.int32))
            x = self.aio.InferInput("x", [1, K], "FP32")
            x.set_data_from_numpy(self.x)
            r = await self.client().infer("dense", [x, s], client_timeout=self.timeout)
        finally:
            self.lru.release(slot)
        return tier, (r.as_numpy("y") if check else None)


class RaySender:
    """aiohttp to Ray Serve's HTTP proxy: x's raw bytes, the model in the
    serve_multiplexed_model_id header; the answer's x-tier header says
    whether the request waited for a load."""

    def __init__(self, port, timeout, connections=512):
        import aiohttp
        self.url = f"http://127.0.0.1:{port}/"
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=timeout))
        self.x = example_input()
        self.body = self.x.astype("<f4").tobytes()
        self.load_ms = []

    async def send(self, model, check=False):
        async with self.session.post(self.url, data=self.body,
                                     headers={"serve_multiplexed_model_id": name_of(model),
                                              "Content-Type": "application/octet-stream"}) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
            tier = r.headers.get("x-tier", "?")
            if "x-load-ms" in r.headers:
                self.load_ms.append((time.perf_counter(), float(r.headers["x-load-ms"])))
        return tier, (np.frombuffer(body, "<f4").reshape(1, K) if check else None)

    async def close(self):
        await self.session.close()


async def check_answers(sender, models):
    """Each model's answer against numpy on the weights in its file."""
    for i in models:
        _, y = await sender.send(i, check=True)
        w, b = read_weights(BUNDLES / name_of(i) / "weights.safetensors")
        want = sender.x @ w + b
        if y is None or y.shape != want.shape or not np.allclose(y, want, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{name_of(i)}: wrong answer (max error "
                               f"{np.abs(np.asarray(y) - want).max() if y is not None else '-'})")


def run_delay_seconds():
    """Time the driver's threads spent runnable but waiting for a CPU
    (/proc/self/task/*/schedstat, second field, ns)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def machine_busy_seconds():
    """CPU seconds every process of the machine has used (/proc/stat: all but
    idle and iowait)."""
    from benchlib import CLOCK_TICKS
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


class Snapshots(threading.Thread):
    """At origin + warmup (and once more by end()): the server's process tree
    CPU seconds, the driver's CPU seconds and, for pjserve, /metrics."""

    def __init__(self, server, at):
        super().__init__(daemon=True)
        self.server, self.at, self.snaps = server, at, []

    def take(self):
        from benchlib import tree_cpu_seconds
        snap = {"t": time.perf_counter(), "server_cpu": tree_cpu_seconds(self.server.proc.pid),
                "client_cpu": time.process_time(), "machine_cpu": machine_busy_seconds(),
                "client_run_delay": run_delay_seconds()}
        if isinstance(self.server, Pjserve):
            snap["metrics"] = self.server.metrics_text()
        return snap

    def run(self):
        time.sleep(max(0.0, self.at - time.perf_counter()))
        self.snaps.append(self.take())

    def end(self):
        self.join()
        self.snaps.append(self.take())
        return self.snaps


async def replay(sender, server, t, m, warmup, check_models, lead=1.0):
    """Sends request i at origin + t[i] (open loop: a task per request, never
    waiting for answers), origin `lead` s after the answers were checked.
    Returns per request: sent (s after origin), latency (s), ok, tier (the
    sender's label or ""), errors {message: count}, the snapshots."""
    await check_answers(sender, check_models)
    n = len(t)
    sent = np.full(n, np.nan)
    lat = np.full(n, np.nan)
    ok = np.zeros(n, bool)
    tiers = [""] * n
    errors = {}
    origin = time.perf_counter() + lead
    snaps = Snapshots(server, origin + warmup)
    snaps.start()

    async def one(i):
        s = time.perf_counter()
        sent[i] = s - origin
        try:
            tier, _ = await sender.send(int(m[i]))
            lat[i] = time.perf_counter() - s
            ok[i] = True
            tiers[i] = tier or ""
        except Exception as e:  # noqa: BLE001 - counted, the first of each kind kept
            msg = (str(e).splitlines() or [repr(e)])[0][:200] or type(e).__name__
            errors[msg] = errors.get(msg, 0) + 1
            lat[i] = time.perf_counter() - s

    stalls = []

    async def heartbeat():
        """How late the loop wakes from 5 ms sleeps: its own stalls."""
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            stalls.append(time.perf_counter() - t0 - 0.005)

    beat = asyncio.create_task(heartbeat())
    pending = set()
    gc.collect()
    gc.disable()     # no collection pauses while sending (the replay makes few cycles)
    for i in range(n):
        delay = origin + t[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(set(pending))
    gc.enable()
    beat.cancel()
    return {"sent": sent, "lat": lat, "ok": ok, "tiers": tiers, "errors": errors,
            "snaps": snaps.end(), "origin": origin, "loop_stalls": np.array(stalls)}


# ---- analysis -------------------------------------------------------------------

QUANTILES = (50, 90, 99, 99.9)
CDF_POINTS = [float(q) for q in np.linspace(0, 99, 100)] + [99.5, 99.9, 99.95, 99.99, 100.0]


def q_key(q):
    return f"p{q:g}".replace(".", "_")


def quantiles_ms(xs):
    if len(xs) == 0:
        return {q_key(q): None for q in QUANTILES}
    return {q_key(q): float(np.percentile(xs, q)) * 1e3 for q in QUANTILES}


def histograms(sample, name, label):
    """{label value: {"buckets": [(le, cumulative count)], "sum", "count"}}."""
    out = {}
    for (n, ls), v in sample.items():
        d = dict(ls)
        if label not in d:
            continue
        h = out.setdefault(d[label], {"buckets": [], "sum": 0.0, "count": 0.0})
        if n == name + "_bucket":
            h["buckets"].append((float(d["le"]), v))
        elif n == name + "_sum":
            h["sum"] = v
        elif n == name + "_count":
            h["count"] = v
    for h in out.values():
        h["buckets"].sort()
    return out


def hist_delta(after, before):
    """after - before, bucket by bucket (the same bucket bounds)."""
    b = {le: c for le, c in before["buckets"]} if before else {}
    return {"buckets": [(le, c - b.get(le, 0.0)) for le, c in after["buckets"]],
            "sum": after["sum"] - (before["sum"] if before else 0.0),
            "count": after["count"] - (before["count"] if before else 0.0)}


def hist_merge(hs):
    hs = [h for h in hs if h]
    if not hs:
        return None
    les = [le for le, _ in hs[0]["buckets"]]
    return {"buckets": [(le, sum(dict(h["buckets"]).get(le, 0.0) for h in hs)) for le in les],
            "sum": sum(h["sum"] for h in hs), "count": sum(h["count"] for h in hs)}


def hist_quantile(h, q):
    """Prometheus histogram_quantile: linear within the bucket that holds the
    q-th request (the buckets are powers of 2 microseconds, so the answer is
    good to within that bucket). Seconds; None without requests."""
    if not h or h["count"] <= 0:
        return None
    rank = q * h["count"]
    lower, prev = 0.0, 0.0
    for le, cum in h["buckets"]:
        if cum >= rank:
            if le == float("inf"):
                return lower
            if cum == prev:
                return le
            return lower + (le - lower) * (rank - prev) / (cum - prev)
        lower, prev = le, cum
    return lower


def hist_summary(h, total):
    if not h:
        return None
    out = {"requests": h["count"], "share": h["count"] / total if total else None,
           "mean_ms": h["sum"] / h["count"] * 1e3 if h["count"] else None}
    for q in QUANTILES:
        v = hist_quantile(h, q / 100)
        out[q_key(q)] = None if v is None else v * 1e3
    return out


def gauge(sample, name):
    return next((v for (n, ls), v in sample.items() if n == name and not ls), None)


def labelled(sample, name, **labels):
    return sum(v for (n, ls), v in sample.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def pjserve_tiers(before_text, after_text):
    """The measured interval's tier histogram (per tier and device + host),
    requests and their outcomes, and what the tier counts say of loads."""
    before, after = parse_metrics(before_text), parse_metrics(after_text)
    hb, ha = histograms(before, TIER, "tier"), histograms(after, TIER, "tier")
    if not ha:
        raise RuntimeError(f"pjserve's /metrics has no {TIER} (a binary without the host tier's "
                           "metrics?)")
    d = {tier: hist_delta(ha[tier], hb.get(tier)) for tier in TIERS if tier in ha}
    total = sum(h["count"] for h in d.values())
    out = {"executed": total,
           "tiers": {tier: hist_summary(h, total) for tier, h in d.items()},
           "device_or_host": hist_summary(hist_merge([d.get("device"), d.get("host")]), total),
           "histograms": {tier: h["buckets"] for tier, h in d.items()}}
    out["device_or_host"]["share"] = None
    for outcome in ("success", "failure"):
        out[f"server_{outcome}"] = (labelled(after, "pjserve_all_models_requests_total",
                                             outcome=outcome) -
                                    labelled(before, "pjserve_all_models_requests_total",
                                             outcome=outcome))
    # Loads, from the tier counts: a request queued while its model was in
    # host or file waited for an upload (coalesced requests share one), one in
    # file for a read of the file first (by its execution or by a copy ahead of
    # it); coalescing and prefetches shared between requests mean these are not
    # the loads themselves (the per-model series below are, with
    # --metrics-models all). The extra time they waited over a device hit,
    # from the histograms' sums.
    dev = d.get("device")
    dev_mean = dev["sum"] / dev["count"] if dev and dev["count"] else 0.0
    out["requests_needing_upload"] = sum(d[t]["count"] for t in ("host", "file") if t in d)
    out["requests_needing_file_read"] = d["file"]["count"] if "file" in d else 0.0
    out["extra_wait_s"] = {t: d[t]["sum"] - d[t]["count"] * dev_mean
                           for t in ("host", "file") if t in d}
    for g in ("pjserve_host_weight_used_bytes", "pjserve_host_weight_budget_bytes",
              "pjserve_weight_cache_used_bytes", "pjserve_weight_cache_budget_bytes"):
        out[g.replace("pjserve_", "") + "_end"] = gauge(after, g)
    out["prefetches"] = (gauge(after, "pjserve_weight_prefetches_total") or 0) - \
        (gauge(before, "pjserve_weight_prefetches_total") or 0)
    # per-model load counters: only the models with series of their own
    # (--metrics-models); complete with --metrics-models all
    for name, key in (("pjserve_weight_loads_total", "uploads_series"),
                      ("pjserve_weight_load_seconds_total", "upload_seconds_series"),
                      ("pjserve_host_weight_loads_total", "file_reads_series"),
                      ("pjserve_host_weight_load_seconds_total", "file_read_seconds_series")):
        out[key] = labelled(after, name) - labelled(before, name)
    out["models_with_series"] = gauge(after, "pjserve_models_with_series")
    return out


def summarise(run, t, warmup, seconds):
    """The measured interval [warmup, seconds) of a replay."""
    sent, lat, ok, origin = run["sent"], run["lat"], run["ok"], run["origin"]
    window = (t >= warmup) & (t < seconds)
    measured = seconds - warmup
    done_at = sent + lat
    in_window = window & ok
    completed = int((ok & (done_at >= warmup) & (done_at < seconds)).sum())
    lags = (sent - t)[window]
    lags = lags[~np.isnan(lags)]
    good = lat[in_window]
    tiers = np.array(run["tiers"], dtype=object)
    s0, s1 = run["snaps"][0], run["snaps"][-1]
    span = s1["t"] - s0["t"]
    out = {"offered": int(window.sum()), "offered_per_s": window.sum() / measured,
           "completed_per_s": completed / measured,
           "ok": int(in_window.sum()), "errors": int((window & ~ok).sum()),
           "errors_all": int((~ok).sum()),
           "error_kinds": dict(sorted(run["errors"].items(), key=lambda kv: -kv[1])[:5]),
           **quantiles_ms(good), "max_ms": float(good.max()) * 1e3 if good.size else None,
           "mean_ms": float(good.mean()) * 1e3 if good.size else None,
           "lag_p50_ms": float(np.percentile(lags, 50)) * 1e3 if lags.size else None,
           "lag_p99_ms": float(np.percentile(lags, 99)) * 1e3 if lags.size else None,
           "lag_max_ms": float(lags.max()) * 1e3 if lags.size else None,
           "loop_stall_p99_ms": float(np.percentile(run["loop_stalls"], 99)) * 1e3
           if run["loop_stalls"].size else None,
           "loop_stall_max_ms": float(run["loop_stalls"].max()) * 1e3
           if run["loop_stalls"].size else None,
           "server_cpu_pct": 100 * (s1["server_cpu"] - s0["server_cpu"]) / span,
           "client_cpu_pct": 100 * (s1["client_cpu"] - s0["client_cpu"]) / span,
           # how long the driver's threads waited for a CPU, per second of the interval
           "client_run_delay_ms_per_s": 1e3 * (s1["client_run_delay"] - s0["client_run_delay"])
           / span,
           # what else ran on the machine meanwhile (other users' work, the kernel)
           "other_cpu_pct": 100 * ((s1["machine_cpu"] - s0["machine_cpu"])
                                   - (s1["server_cpu"] - s0["server_cpu"])
                                   - (s1["client_cpu"] - s0["client_cpu"])) / span,
           "cdf_ms": [[q, float(np.percentile(good, q)) * 1e3] for q in CDF_POINTS]
           if good.size else []}
    labels = sorted(set(tiers[in_window].tolist()) - {""})
    if labels:
        out["client_tiers"] = {}
        for label in labels:
            sel = in_window & (tiers == label)
            out["client_tiers"][label] = {"requests": int(sel.sum()),
                                          "share": float(sel.sum() / max(1, in_window.sum())),
                                          **quantiles_ms(lat[sel])}
    if "metrics" in s0:
        out["pjserve"] = pjserve_tiers(s0["metrics"], s1["metrics"])
    return out


# ---- the runs -------------------------------------------------------------------

SYSTEMS = ("tiered", "host", "ray", "pytriton")
TITLES = {"tiered": "pjserve, host tier (--host-weight-budget)",
          "host": "pjserve, every floor in host memory",
          "ray": "Ray Serve, @serve.multiplexed",
          "pytriton": "Triton via PyTriton, client-side LRU of weight slots"}


def tree_rss_mib(root):
    from benchlib import process_tree
    total = 0
    for pid in process_tree(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def run_system(key, a, repo, t, m, work, capacity):
    check_models = sorted({int(m[0]), int(m[len(m) // 2]), int(m[-1])})
    if key in ("tiered", "host"):
        extra = ["--pjrt-plugin", str(a.plugin), "--model-control-mode", "static",
                 "--device-weight-budget",
                 str(a.device_budget), "--metrics-models", a.metrics_models, *a.server_arg]
        if key == "tiered":
            extra += ["--host-weight-budget", str(a.host_budget)]
        server = Pjserve(a.binary, repo, MODELS_DIR / "cache", work / f"{key}.log", extra)

        def sender():
            return GrpcSender(server.grpc, a.channels, a.request_timeout)
        what = " ".join(extra)
    elif key == "ray":
        per = capacity // a.ray_replicas
        server = RayServe(repo, work / "ray.log", per, a.ray_replicas, a.ray_max_ongoing)

        def sender():
            return RaySender(server.http, a.request_timeout, a.ray_connections)
        what = (f"{a.ray_replicas} replica(s), max_num_models_per_replica {per}, "
                f"max_ongoing_requests {a.ray_max_ongoing}")
    else:
        server = PyTriton(repo, work / "pytriton.log", capacity, a.pytriton_max_batch)

        def sender():
            return PyTritonSender(server.grpc, a.channels, a.request_timeout, capacity)
        what = f"{capacity} slots, max_batch_size {a.pytriton_max_batch}"
    log(f"{key}: starting ({what})")
    extra_out = {}
    try:
        server.start(a.start_timeout)
        log(f"{key}: ready in {server.start_s:.1f} s (RSS {tree_rss_mib(server.proc.pid):.0f} "
            f"MiB); replaying {len(t)} requests over {a.seconds:g} s")

        async def go():
            s = sender()
            try:
                run = await replay(s, server, t, m, a.warmup, check_models)
            finally:
                await s.close()
            return run, s
        run, s = asyncio.run(go())
        extra_out["server_rss_mib_end"] = tree_rss_mib(server.proc.pid)
        lo, hi = run["origin"] + a.warmup, run["origin"] + a.seconds
        if key == "ray":
            loads = [ms for at, ms in s.load_ms if lo <= at < hi]
            extra_out["loads"] = {"requests_with_load_header": len(loads),
                                  "load_ms_mean": float(np.mean(loads)) if loads else None}
        elif key == "pytriton":
            loads = [sec for at, sec in s.lru.load_log if lo <= at < hi]
            extra_out["loads"] = {"loads": len(loads), "load_seconds": float(sum(loads)),
                                  "load_ms_mean": float(np.mean(loads)) * 1e3 if loads else None}
    finally:
        server.stop()
    res = summarise(run, t, a.warmup, a.seconds)
    res["requests_csv"] = str(write_requests(a.requests_dir / f"requests-{key}.csv", t, m, run))
    res.update(extra_out)
    res.update({"system": key, "title": TITLES[key], "configuration": what,
                "start_s": server.start_s})
    log(f"{key}: {res['completed_per_s']:.0f}/s completed of {res['offered_per_s']:.0f}/s "
        f"offered, p50 {fmt(res['p50'], '.2f')} ms, p99 {fmt(res['p99'], '.2f')} ms, "
        f"p99.9 {fmt(res['p99_9'], '.2f')} ms, {res['errors']} errors, lag p99 "
        f"{fmt(res['lag_p99_ms'], '.2f')} ms")
    return res


def write_requests(path, t, m, run):
    """Every request of a replay: scheduled and sent (s after the origin), model,
    latency (ms; to the error for a failed one), ok, the sender's tier label."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheduled_s", "sent_s", "model", "latency_ms", "ok", "tier"])
        for i in range(len(t)):
            w.writerow([f"{t[i]:.6f}", f"{run['sent'][i]:.6f}", name_of(int(m[i])),
                        f"{run['lat'][i] * 1e3:.3f}", int(run["ok"][i]), run["tiers"][i]])
    return path


def goal(result):
    """p99 of device-or-host requests, tiered over all-in-host (server histograms)."""
    runs = result["runs"]
    if "tiered" not in runs or "host" not in runs:
        return None
    a = runs["tiered"]["pjserve"]["device_or_host"]["p99"]
    b = runs["host"]["pjserve"]["device_or_host"]["p99"]
    if a is None or not b:
        return None
    return {"tiered_p99_ms": a, "host_p99_ms": b, "ratio": a / b, "met": a / b <= 1.5}


def ratios(result):
    """pjserve (both runs) against each peer: throughput and p99."""
    runs, out = result["runs"], []
    for p in ("tiered", "host"):
        for peer in ("ray", "pytriton"):
            if p in runs and peer in runs:
                a, b = runs[p], runs[peer]
                out.append({"pjserve": p, "peer": peer,
                            "throughput": a["completed_per_s"] / b["completed_per_s"]
                            if b["completed_per_s"] else None,
                            "p99": a["p99"] / b["p99"] if a["p99"] and b["p99"] else None})
    return out


# ---- report ----------------------------------------------------------------------

def mib(nbytes):
    return None if nbytes is None else nbytes / MIB


def markdown(result):
    s, tr = result["settings"], result["trace"]
    m = result["machine"]
    lines = [f"# Catalogue: {s['models']:,} models under a multi-model trace ({result['date']})",
             "",
             f"{s['models']:,} models of one dense layer {K}x{K} f32 + bias "
             f"({WEIGHT_BYTES / MIB:.2f} MiB of weights each, "
             f"{s['models'] * WEIGHT_BYTES / GIB:.1f} GiB in all), each its own bundle and "
             f"weights file. Trace: seed {s['seed']}, "
             f"{s['seconds']:g} s at {s['rate']:g} requests/s (Zipf {s['zipf_s']} popularity, "
             f"on/off bursts; the first {s['warmup']:g} s warm the caches and are not measured): "
             f"{tr['requests']:,} requests, {tr['rate_mean']:.0f}/s on average, "
             f"{tr['rate_min_1s']}-{tr['rate_max_1s']} in a second, to "
             f"{tr['models_requested']:,} models; the top 1 % of models get "
             f"{100 * tr['share_top_1pct']:.0f} %, the top 10 % "
             f"{100 * tr['share_top_10pct']:.0f} %;"
             f" inter-arrival CV per model median {fmt(tr['iat_cv_median'], '.2f')} "
             f"(Poisson: 1). An LRU of {s['device_models']:,} models would hit "
             f"{100 * tr['lru_hit_rate_device']:.1f} %, of {s['capacity_models']:,} "
             f"{100 * tr['lru_hit_rate_host']:.1f} %.",
             "",
             f"pjserve: --device-weight-budget {s['device_budget']} "
             f"(~{s['device_models']:,} models), tiered --host-weight-budget {s['host_budget']} "
             f"(~{s['capacity_models']:,} models), --model-control-mode static, --metrics-models "
             f"{s['metrics_models']}; gRPC (tritonclient.grpc.aio, {s['channels']} channels). "
             f"Peers hold {s['capacity_models']:,} models (Ray: "
             f"{s['ray_replicas']} replica(s); PyTriton: slots), loaded from the same files. "
             f"{m['cores']} CPUs ({m['cpu']}), {m.get('memory_gib')} GiB, CPU PJRT plugin; the "
             f"client and the servers share the CPUs. Revision {result['revision']}.",
             "",
             "| system | offered/s | completed/s | p50 ms | p99 ms | p99.9 ms | max ms | errors |"
             " send lag p99 ms (loop stall max) | server CPU % | client CPU % | other CPU % |"
             " server RSS MiB |"
             " start s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in result["runs"].items():
        lines.append(
            f"| {r['title']} | {r['offered_per_s']:.0f} | {r['completed_per_s']:.0f} | "
            f"{fmt(r['p50'], '.2f')} | {fmt(r['p99'], '.2f')} | {fmt(r['p99_9'], '.2f')} | "
            f"{fmt(r['max_ms'], '.1f')} | {r['errors']} | {fmt(r['lag_p99_ms'], '.2f')} "
            f"({fmt(r.get('loop_stall_max_ms'), '.0f')}) | "
            f"{r['server_cpu_pct']:.0f} | {r['client_cpu_pct']:.0f} | "
            f"{r['other_cpu_pct']:.0f} | "
            f"{fmt(r.get('server_rss_mib_end'), ',.0f')} | {r['start_s']:.1f} |")
    for key in ("skipped", "failed"):
        for sysname, why in result.get(key, {}).items():
            lines.append(f"| {TITLES[sysname]} | {key}: {why} |" + " |" * 12)
    lines += ["", "Latency is the client's (send to answer, measured requests); send lag: "
              "when the client sent a request after its time in the trace; loop stall: "
              "the longest its event loop woke late from a 5 ms sleep. CPU: % of one "
              "CPU over the measured interval, of the server's process tree, of the driver "
              "(the client), and of everything else on the machine (other users' work: "
              "more than a few % means the numbers are disturbed)."]
    pj = [(k, r) for k, r in result["runs"].items() if "pjserve" in r]
    if pj:
        lines += ["", "pjserve by tier (pjserve_request_tier_seconds over the measured interval:"
                  " received to executed, server side, by the tier the model was in when the "
                  "request was queued; quantiles interpolated within the histogram's buckets, "
                  "four to an octave):", "",
                  "| run | tier | requests | share | mean ms | p50 ms | p99 ms | p99.9 ms |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for key, r in pj:
            p = r["pjserve"]
            rows = list(p["tiers"].items()) + [("device or host", p["device_or_host"])]
            for tier, h in rows:
                if h is None:
                    continue
                lines.append(f"| {key} | {tier} | {h['requests']:,.0f} | "
                             f"{fmt(None if h['share'] is None else 100 * h['share'], '.1f')}"
                             f"{'' if h['share'] is None else ' %'} | {fmt(h['mean_ms'], '.3f')} "
                             f"| {fmt(h['p50'], '.3f')} | {fmt(h['p99'], '.3f')} | "
                             f"{fmt(h['p99_9'], '.3f')} |")
        lines += ["", "| run | requests queued in host or file | in file | their extra wait "
                  "over a device hit, host + file s | uploads | upload s | file reads | "
                  "file read s | prefetches | host floors used MiB | device weights used MiB |"
                  " server failures |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                  "---:|"]
        for key, r in pj:
            p = r["pjserve"]
            ew = p["extra_wait_s"]
            # the per-model load counters are complete only when every model has series
            exact = (p.get("models_with_series") or 0) >= result["settings"]["models"]
            loads = [p[k] if exact else None for k in (
                "uploads_series", "upload_seconds_series", "file_reads_series",
                "file_read_seconds_series")]
            lines.append(
                f"| {key} | {p['requests_needing_upload']:,.0f} | "
                f"{p['requests_needing_file_read']:,.0f} | "
                f"{ew.get('host', 0):.2f} + {ew.get('file', 0):.2f} | {fmt(loads[0], ',.0f')} | "
                f"{fmt(loads[1], '.2f')} | {fmt(loads[2], ',.0f')} | {fmt(loads[3], '.2f')} | "
                f"{p['prefetches']:,.0f} | "
                f"{fmt(mib(p['host_weight_used_bytes_end']), ',.0f')} | "
                f"{fmt(mib(p['weight_cache_used_bytes_end']), ',.0f')} | "
                f"{p['server_failure']:.0f} |")
        lines += ["", "Uploads, file reads and their seconds are the per-model load counters "
                  "summed: only with --metrics-models all (else -). A request queued while its model "
                  "was in host or file waited for an upload, in file for a read first (its own "
                  "execution's, or a copy made ahead of its turn)."]
    peers = [(k, r) for k, r in result["runs"].items() if "client_tiers" in r]
    if peers:
        lines += ["", "Peers by tier (the client's latency; load: the request waited for its "
                  "model's weights to be read from its file):", "",
                  "| system | tier | requests | share | p50 ms | p99 ms | p99.9 ms |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for key, r in peers:
            for tier, h in r["client_tiers"].items():
                lines.append(f"| {key} | {tier} | {h['requests']:,} | {100 * h['share']:.1f} % | "
                             f"{fmt(h['p50'], '.2f')} | {fmt(h['p99'], '.2f')} | "
                             f"{fmt(h['p99_9'], '.2f')} |")
            if r.get("loads", {}).get("load_ms_mean") is not None:
                lines.append(f"| {key} | (mean load) | | | {r['loads']['load_ms_mean']:.2f} | | |")
    g = result.get("goal")
    lines += [""]
    if g:
        lines.append(f"Goal: device-or-host p99 of the tiered run within 1.5x of the all-in-host "
                     f"run: {g['tiered_p99_ms']:.3f} ms / {g['host_p99_ms']:.3f} ms = "
                     f"{g['ratio']:.2f}x, {'met' if g['met'] else 'NOT met'}.")
    for r in result.get("ratios", []):
        lines.append(f"pjserve ({r['pjserve']}) / {r['peer']}: throughput "
                     f"{fmt(r['throughput'], '.3g')}x, p99 {fmt(r['p99'], '.3g')}x.")
    for note in result.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------

KNOBS = {  # name -> (type, default, with --quick, help)
    "models": (int, 10000, 1000, "models in the catalogue"),
    "seconds": (float, 120.0, 30.0, "length of the trace, seconds"),
    "warmup": (float, 20.0, 5.0, "first seconds of the trace not measured (caches warm)"),
}


def pjrt_plugin():
    """$PJSERVE_PJRT_PLUGIN or the xla-cpu-pjrt wheel's plugin (as tests/common.py
    finds it, without importing that module, which imports jax)."""
    import importlib.util
    env = os.environ.get("PJSERVE_PJRT_PLUGIN")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "xla_cpu_pjrt.so"
    return path if path.is_file() else None


def parse_bytes(text):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10 ** 3, "M": 10 ** 6,
             "G": 10 ** 9}
    for u, f in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * f)
    return int(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"1,000 models, 30 s: results under {QUICK_OUT.relative_to(ROOT)}/")
    for name, (typ, full, quick, text) in KNOBS.items():
        ap.add_argument("--" + name, type=typ, default=None,
                        help=f"{text} (default {full}; --quick: {quick})")
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE,
                    help="mean requests/s of the trace (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="the trace's seed")
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--trace", type=Path, help="replay this CSV (time_s,model) instead, its "
                    "first --seconds")
    ap.add_argument("--host-budget", help="tiered run's --host-weight-budget (default 2Gi for "
                    "10,000 models: 20 %% of the catalogue's weights, scaled with --models)")
    ap.add_argument("--device-budget", help="--device-weight-budget of both pjserve runs "
                    "(default 200Mi for 10,000 models, scaled with --models)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)")
    ap.add_argument("--metrics-models", default="1", help="pjserve --metrics-models")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument of both pjserve runs (repeatable)")
    ap.add_argument("--channels", type=int, default=4, help="gRPC channels of the client")
    ap.add_argument("--request-timeout", type=float, default=30.0)
    ap.add_argument("--start-timeout", type=float, default=1200.0)
    ap.add_argument("--ray-replicas", type=int, default=1)
    ap.add_argument("--ray-max-ongoing", type=int, default=256,
                    help="max_ongoing_requests of the Ray deployment (default %(default)s)")
    ap.add_argument("--ray-connections", type=int, default=512,
                    help="HTTP connections the client opens to Ray at most (default "
                         "%(default)s; more requests wait in the client for one)")
    ap.add_argument("--pytriton-max-batch", type=int, default=8)
    ap.add_argument("--json", type=Path, help=f"results (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--plot", type=Path, help="the plot (default docs/img/catalogue.png)")
    ap.add_argument("--keep", action="store_true", help="keep the servers' logs")
    a = ap.parse_args(argv)
    for name, (_, full, quick, _) in KNOBS.items():
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)
    systems = [x.strip() for x in a.systems.split(",") if x.strip()]
    if not set(systems) <= set(SYSTEMS):
        ap.error(f"--systems: unknown {sorted(set(systems) - set(SYSTEMS))}")
    if not 0 <= a.warmup < a.seconds:
        ap.error("--warmup must be less than --seconds")
    scale = a.models / 10000
    a.host_budget = parse_bytes(a.host_budget) if a.host_budget else int(2 * GIB * scale)
    a.device_budget = parse_bytes(a.device_budget) if a.device_budget else int(200 * MIB * scale)
    capacity = a.host_budget // WEIGHT_BYTES
    out = QUICK_OUT if a.quick else None
    a.json = a.json or (out or RESULTS.parent) / "catalogue.json"
    a.plot = a.plot or (out or ROOT / "docs" / "img") / "catalogue.png"
    if not PJSERVE.exists():
        sys.exit(f"catalogue: {PJSERVE} is missing (cmake --build build)")
    a.plugin = pjrt_plugin()
    if a.plugin is None:
        sys.exit("catalogue: no PJRT plugin: the xla-cpu-pjrt wheel is not in this Python "
                 "(scripts/bootstrap), and PJSERVE_PJRT_PLUGIN is not set")
    missing = [(sysname, py) for sysname, py in (("ray", RAY_PYTHON),
                                                 ("pytriton", PYTRITON_PYTHON))
               if sysname in systems and not py.exists()]

    started = time.time()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, CLIENT_NICE)
    except OSError as e:
        log(f"the driver stays at nice {os.getpriority(os.PRIO_PROCESS, 0)}: {e}")
    client_nice = os.getpriority(os.PRIO_PROCESS, 0)
    log(f"{a.models:,} bundles in {BUNDLES.relative_to(ROOT)}")
    make_bundles(a.models)
    repo = make_repository(a.models, MODELS_DIR / f"repo-{a.models}")
    if a.trace:
        t, m = read_trace(a.trace)
        trace_path = a.trace
        if m.max() >= a.models:
            sys.exit(f"catalogue: {a.trace} names model {name_of(int(m.max()))}, beyond --models")
        keep = t < a.seconds        # --seconds is the length replayed
        t, m = t[keep], m[keep]
    else:
        t, m = make_trace(a.models, a.rate, a.seconds, a.seed, a.zipf_s)
        trace_path = (out or ROOT / "build" / "bench-catalogue") / \
            f"trace-{a.models}-{a.rate:g}rps-{a.seconds:g}s-seed{a.seed}.csv"
        write_trace(trace_path, t, m)
    a.requests_dir = trace_path.parent if not a.trace else (out or ROOT / "build" /
                                                            "bench-catalogue")
    device_models = a.device_budget // WEIGHT_BYTES
    tr = trace_stats(t, m, a.models, a.seconds, {"device": device_models, "host": capacity})
    log(f"trace {trace_path}: {tr['requests']:,} requests, {tr['rate_mean']:.0f}/s "
        f"({tr['rate_min_1s']}-{tr['rate_max_1s']} per second), {tr['models_requested']:,} "
        f"models; LRU hit rates {tr['lru_hit_rate_device']:.3f} ({device_models} models), "
        f"{tr['lru_hit_rate_host']:.3f} ({capacity})")
    result = {"machine": machine_info(), "revision": git_revision(),
              "loadavg_start": os.getloadavg(),
              "settings": {"models": a.models, "seconds": a.seconds, "warmup": a.warmup,
                           "rate": a.rate, "seed": a.seed, "zipf_s": a.zipf_s,
                           "quick": a.quick, "weight_bytes": WEIGHT_BYTES,
                           "host_budget": a.host_budget, "device_budget": a.device_budget,
                           "capacity_models": capacity, "device_models": device_models,
                           "metrics_models": a.metrics_models, "server_args": a.server_arg,
                           "channels": a.channels, "request_timeout_s": a.request_timeout,
                           "ray_replicas": a.ray_replicas, "ray_max_ongoing": a.ray_max_ongoing,
                           "ray_connections": a.ray_connections,
                           "pytriton_max_batch": a.pytriton_max_batch,
                           "file_limit": FILE_LIMIT, "systems": systems,
                           "client_nice": client_nice,
                           "trace_csv": str(trace_path)},
              "trace": tr, "runs": {}, "skipped": {}, "failed": {}, "notes": list(NOTES)}
    work = Path(tempfile.mkdtemp(prefix="pjs-bench-catalogue-"))
    try:
        # a copy of the binary: a rebuild of build/pjserve during the run changes nothing
        a.binary = work / "pjserve"
        shutil.copy2(PJSERVE, a.binary)
        result["binary"] = {"path": str(PJSERVE),
                            "sha256": hashlib.sha256(a.binary.read_bytes()).hexdigest(),
                            "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                                PJSERVE.stat().st_mtime))}
        for key in systems:
            if any(key == s for s, _ in missing):
                why = f"{dict(missing)[key].relative_to(ROOT)} is missing"
                log(f"{key}: skipped, {why}")
                result["skipped"][key] = why
                continue
            try:
                result["runs"][key] = run_system(key, a, repo, t, m, work, capacity)
            except Exception as e:  # noqa: BLE001 - one system's failure is reported
                log(f"{key}: failed: {e}")
                result["failed"][key] = " ".join(str(e).split())[:400]
                a.keep = True
    finally:
        remove_workdir(work, a.keep)
    for key, r in result["runs"].items():
        if r["completed_per_s"] < 0.95 * r["offered_per_s"]:
            result["notes"].append(
                f"{TITLES[key]} did not keep up: {r['completed_per_s']:.0f} answers/s of "
                f"{r['offered_per_s']:.0f} offered; its latency is that of a growing backlog "
                f"(requests failing at the client's {a.request_timeout:g} s timeout count as "
                "errors), and its send lag comes from the client's event loop handling that "
                "backlog.")
        if r["other_cpu_pct"] > 20:
            result["notes"].append(
                f"{TITLES[key]}: other work on the machine used {r['other_cpu_pct']:.0f} % of "
                "a CPU during the measured interval; its numbers are disturbed.")
    result["goal"] = goal(result)
    result["ratios"] = ratios(result)
    write_report(result, started, a.json, markdown)
    plotter = find_plotter()
    if plotter is None:
        log("no plot: no Python with matplotlib (scripts/bootstrap-bench plot)")
    elif result["runs"]:
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(plotter), str(PLOT), str(a.json), str(a.plot)], check=True)
        log(f"wrote {a.plot}")
    g = result["goal"]
    if g:
        log(f"goal: device-or-host p99, tiered {g['tiered_p99_ms']:.3f} ms vs all-in-host "
            f"{g['host_p99_ms']:.3f} ms = {g['ratio']:.2f}x (<= 1.5x: "
            f"{'met' if g['met'] else 'NOT met'})")
    for r in result["ratios"]:
        log(f"pjserve ({r['pjserve']}) / {r['peer']}: throughput {fmt(r['throughput'], '.3g')}x,"
            f" p99 {fmt(r['p99'], '.3g')}x")
    log(f"done in {result['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
