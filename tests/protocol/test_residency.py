"""The device weight cache through the real server (tritonclient, gRPC and
HTTP): every model's weights live in host RAM and are copied to the device
when the model runs; at most --device-weight-budget bytes of them stay there,
the least recently used evicted first (docs/serving.md).

The models are ten copies of one wide mlp (x f32 [batch,64] -> 768 -> 768 ->
32, about 2.5 MiB of f32 weights each), exported once per session with
pjserve_export and copied with weights drawn from a different PRNG seed per
copy, so every model answers differently and a request served with another
model's weights fails its check. Their modules are identical, so the
executable cache compiles them once.

What is checked, each against dedicated servers (statistics start at zero):

  - many models, budget for two and a half: several client threads over both
    protocols send requests to all ten in random order; every reply matches
    JAX for its own model, /metrics is scraped all along and the resident
    bytes (summed over models, and the cache's used bytes) never exceed the
    budget, and at the end the load and eviction counters add up;
  - the LRU order with room for two: A B A C loads each once and evicts B,
    not A (then B evicts A);
  - a model larger than the budget still serves, alone on the device, with
    a warning in the log.
"""

import json
import os
import random
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import pjserve_export as pe
from protocol_util import (BUDGET, EVICTIONS, LOAD_SECONDS, LOADS, PINNED, RESIDENT, USED, Case,
                           ServerFailure, ServerProcess, grpc_infer_case, http_infer_case,
                           http_json, metric, parse_metrics, run_threads, scrape, serve_only,
                           start_or_fail, stop_all_checked)

N_MODELS = 10
IN, HIDDEN, OUT = 64, 768, 32
BATCH_SIZES = (1, 4)
ROWS = (1, 3)                   # rows per request (3 runs at compiled size 4)
NAMES = [f"res_{i:02d}" for i in range(N_MODELS)]
ARGUMENT_ORDER_KEY = "argument_order"


# ---- the models ------------------------------------------------------------------------

def wide_mlp(p, x):
    h = jax.nn.relu(x @ p["dense1"]["w"] + p["dense1"]["b"])
    h = jax.nn.relu(h @ p["dense2"]["w"] + p["dense2"]["b"])
    return h @ p["dense3"]["w"] + p["dense3"]["b"]


def wide_mlp_params(seed: int):
    k = jax.random.split(jax.random.PRNGKey(1000 + seed), 6)

    def dense(kw, kb, fan_in, fan_out):
        return {"w": jax.random.normal(kw, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in),
                "b": 0.1 * jax.random.normal(kb, (fan_out,))}
    return {"dense1": dense(k[0], k[1], IN, HIDDEN), "dense2": dense(k[2], k[3], HIDDEN, HIDDEN),
            "dense3": dense(k[4], k[5], HIDDEN, OUT)}


@dataclass
class ResidencyModels:
    bundles: Path                 # one bundle directory per name
    weight_bytes: int             # of each model (all the same)
    cases: Dict[str, Dict[int, Case]]   # model -> rows -> inputs and JAX outputs

    def repository(self, dest: Path, names) -> Path:
        """A repository of symbolic links to some of the bundles."""
        dest.mkdir(parents=True)
        for n in names:
            (dest / n).symlink_to(self.bundles / n, target_is_directory=True)
        return dest


@pytest.fixture(scope="session")
def residency_models(tmp_path_factory) -> ResidencyModels:
    """The ten models: res_00 exported, res_01.. copies with other weights."""
    out = tmp_path_factory.mktemp("residency-bundles")
    first = pe.export_jax(wide_mlp, wide_mlp_params(0), [np.zeros((1, IN), np.float32)], out,
                          name=NAMES[0], batch_sizes=BATCH_SIZES, input_names=["x"],
                          output_names=["y"], description="residency test: wide mlp, seed 0")
    manifest_text = (first / pe.MANIFEST_FILE).read_text()
    assert f'name: "{NAMES[0]}"\n' in manifest_text
    jitted = jax.jit(wide_mlp)
    cases: Dict[str, Dict[int, Case]] = {}
    weight_bytes = None
    for i, name in enumerate(NAMES):
        params = wide_mlp_params(i)
        names, arrays = pe.weight_names_and_arrays(params)
        nbytes = sum(int(np.asarray(a).nbytes) for a in arrays)
        assert weight_bytes in (None, nbytes)
        weight_bytes = nbytes
        path = out / name
        if i > 0:
            shutil.copytree(first, path)
            pe.write_safetensors(path / pe.WEIGHTS_FILE, dict(zip(names, arrays)),
                                 {ARGUMENT_ORDER_KEY: json.dumps(names)})
            (path / pe.MANIFEST_FILE).write_text(
                manifest_text.replace(f'name: "{NAMES[0]}"\n', f'name: "{name}"\n'))
        manifest = pe.read_manifest(path)
        assert manifest.name == name
        cases[name] = {}
        for rows in ROWS:
            x = np.random.default_rng(100 * i + rows).standard_normal((rows, IN)).astype(
                np.float32)
            y = np.asarray(jitted(params, jnp.asarray(x)))
            cases[name][rows] = Case(name, rows, {"x": x}, {"y": y}, manifest)
    # The copies really differ: another model's weights would fail the check.
    y0, y1 = cases[NAMES[0]][1].expected["y"], cases[NAMES[1]][1].expected["y"]
    assert not np.allclose(y0, y1, atol=1e-2)
    return ResidencyModels(out, weight_bytes, cases)


# ---- servers ---------------------------------------------------------------------------

@pytest.fixture
def start_server(pjserve_bin, plugin_path, cache_dir, residency_models, tmp_path):
    """start(names, budget, extra=()) -> a started server over those models with
    --device-weight-budget budget. Stopped (and its exit and log checked) at
    the end of the test."""
    started: List[ServerProcess] = []

    def start(names, budget: int, extra=()):
        k = len(started)
        repo = residency_models.repository(tmp_path / f"repo{k}", names)
        s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / f"srv{k}",
                          ["--device-weight-budget", str(budget), *extra], f"residency{k}")
        started.append(s)
        return start_or_fail(s)

    yield start
    stop_all_checked(started)


# ---- metrics ---------------------------------------------------------------------------

@dataclass
class CacheView:
    """The weight cache as one scrape of /metrics shows it."""
    budget: float
    used: float
    pinned: float
    loads: Dict[str, float]
    evictions: Dict[str, float]
    resident: Dict[str, float]
    load_seconds: Dict[str, float]

    def resident_models(self):
        return sorted(m for m, b in self.resident.items() if b > 0)


def per_model(samples, name: str) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            model = dict(labels).get("model")
            if model is not None:
                out[model] = out.get(model, 0.0) + v
    return out


def server_gauge(samples, name: str):
    for (n, labels), v in samples.items():
        if n == name and not labels:
            return v
    return None


def cache_view(server: ServerProcess) -> CacheView:
    samples, _ = parse_metrics(scrape(server.metrics_url))
    view = CacheView(server_gauge(samples, BUDGET), server_gauge(samples, USED),
                     server_gauge(samples, PINNED), per_model(samples, LOADS),
                     per_model(samples, EVICTIONS), per_model(samples, RESIDENT),
                     per_model(samples, LOAD_SECONDS))
    missing = [n for n, v in ((BUDGET, view.budget), (USED, view.used), (PINNED, view.pinned))
               if v is None]
    missing += [n for n, d in ((LOADS, view.loads), (EVICTIONS, view.evictions),
                               (RESIDENT, view.resident)) if not d]
    assert not missing, f"/metrics lacks {', '.join(missing)}"
    return view


# ---- requests --------------------------------------------------------------------------

def infer_checked(client, proto: str, case: Case, what: str = ""):
    if proto == "grpc":
        got, _ = grpc_infer_case(client, case)
    else:
        got, _ = http_infer_case(client, case)
    case.check(got, f"over {proto} {what}")


def clients(server):
    return (grpcclient.InferenceServerClient(server.grpc_url),
            httpclient.InferenceServerClient(server.http_url, network_timeout=120,
                                             connection_timeout=60))


def run_watched(view, check, client_thread, threads):
    """Runs client_thread on `threads` threads while another thread takes
    view() every 10 ms; check(view) names a bound it breaks, or is None.
    Returns (the client threads' results, every view taken, the breaches)."""
    views, breaches = [], []
    stop = threading.Event()

    def scraper():
        while not stop.is_set():
            try:
                v = view()
            except Exception as e:  # noqa: BLE001 - reported as a breach
                breaches.append(f"scrape failed: {e!r}")
                return
            views.append(v)
            problem = check(v)
            if problem:
                breaches.append(problem)
            time.sleep(0.01)

    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        results, errors = run_threads(client_thread, threads, timeout=600)
    finally:
        stop.set()
        t.join(30)
    assert not errors, f"{len(errors)} client threads failed; first: {errors[0][1]!r}"
    assert len(views) >= 10, f"only {len(views)} scrapes during the run"
    return results, views, breaches


# ---- many models under a budget for two and a half --------------------------------------

CLIENT_THREADS = 6              # half gRPC, half HTTP
REQUESTS_PER_THREAD = 100


@serve_only("the weight budget and its LRU are per worker")
@pytest.mark.parametrize("prefetch", ["true", "false"])
def test_many_models_under_budget(start_server, residency_models, prefetch):
    """Six clients over ten models in room for two and a half: every answer
    right, the budget kept at every scrape (copies in flight included), the
    books consistent at the end; with prefetch on (the default) some loads
    were copies made while another model executed."""
    mb = residency_models.weight_bytes
    budget = int(2.5 * mb)
    server = start_server(NAMES, budget, ["--weight-prefetch", prefetch])
    first = cache_view(server)
    assert first.budget == budget
    assert first.pinned == 0

    def over_budget(v):
        total = sum(v.resident.values())
        if v.used > budget or total > budget:
            return (f"used {v.used:.0f}, resident {total:.0f} ({v.resident_models()}) > "
                    f"budget {budget}")
        return None

    def client_thread(i):
        proto = "grpc" if i % 2 == 0 else "http"
        rng = random.Random(1234 + i)
        g, h = clients(server)
        c = g if proto == "grpc" else h
        used = set()
        try:
            for k in range(REQUESTS_PER_THREAD):
                name = rng.choice(NAMES)
                case = residency_models.cases[name][rng.choice(ROWS)]
                infer_checked(c, proto, case, f"(thread {i}, request {k})")
                used.add(name)
        finally:
            g.close()
            h.close()
        return used

    results, views, breaches = run_watched(lambda: cache_view(server), over_budget,
                                           client_thread, CLIENT_THREADS)
    assert not breaches, (f"the weight cache exceeded its budget at {len(breaches)} of "
                          f"{len(views)} scrapes:\n" + "\n".join(breaches[:20]))
    assert any(len(v.resident_models()) >= 2 for v in views), "never two models resident at once"

    used_models = set().union(*results)
    end = cache_view(server)
    resident = end.resident_models()
    for m in used_models:
        assert end.loads.get(m, 0) >= 1, f"{m} served requests with no weight load counted"
    for m in NAMES:
        loads, ev = end.loads.get(m, 0), end.evictions.get(m, 0)
        in_cache = 1 if m in resident else 0
        assert loads - ev == in_cache, (f"{m}: {loads:.0f} loads, {ev:.0f} evictions, "
                                        f"resident {bool(in_cache)}")
        if in_cache:
            assert end.resident[m] == mb, f"{m}: {end.resident[m]:.0f} resident bytes, not {mb}"
    assert sum(end.evictions.values()) == sum(end.loads.values()) - len(resident)
    assert 1 <= len(resident) <= 2
    assert end.used == len(resident) * mb
    # ten models through room for two: most requests missed
    assert sum(end.evictions.values()) >= len(used_models) - 2
    assert all(end.load_seconds.get(m, 0) > 0 for m in used_models)
    samples, _ = parse_metrics(scrape(server.metrics_url))
    # without a host tier every model is found on the device or in host memory
    tiers = {t: metric(samples, "pjserve_request_tier_seconds_count", tier=t)
             for t in ("device", "host", "file")}
    assert tiers["file"] == 0 and tiers["host"] > 0 and tiers["device"] > 0, tiers
    prefetches = server_gauge(samples, "pjserve_weight_prefetches_total")
    if prefetch == "true":
        assert prefetches > 0, "no weight copy was made beside an execution"
        assert prefetches < sum(end.loads.values())
    else:
        assert prefetches == 0


# ---- eviction order --------------------------------------------------------------------

def delta(after: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    """Per-model increase of a counter (models whose counter moved)."""
    return {m: v - before.get(m, 0) for m, v in after.items() if v != before.get(m, 0)}


@serve_only("the weight budget and its LRU are per worker")
def test_lru_sequence_abac(start_server, residency_models):
    """Room for two: A B A C loads each once and evicts B (least recently
    used), not A; then B comes back and evicts A.

    Loading a model (start-up) puts its weights on the device once, so two
    other models, D and E, are requested first: they leave A, B and C off
    the device and are the two oldest entries when the sequence starts."""
    mb = residency_models.weight_bytes
    a, b, c, d, e = NAMES[:5]
    server = start_server([a, b, c, d, e], int(2.5 * mb),
                          ["--warmup-runs", "0", "--eviction-policy", "lru"])
    g, h = clients(server)
    try:
        for model in (d, e):
            infer_checked(g, "grpc", residency_models.cases[model][1], "(flush)")
        start = cache_view(server)
        assert start.resident_models() == [d, e], start.resident_models()
        steps = [  # model, protocol, loads, evictions (since the flush), resident after
            (a, "grpc", {a: 1}, {d: 1}, [a, e]),
            (b, "http", {a: 1, b: 1}, {d: 1, e: 1}, [a, b]),
            (a, "http", {a: 1, b: 1}, {d: 1, e: 1}, [a, b]),
            (c, "grpc", {a: 1, b: 1, c: 1}, {b: 1, d: 1, e: 1}, [a, c]),
            (b, "grpc", {a: 1, b: 2, c: 1}, {a: 1, b: 1, d: 1, e: 1}, [b, c]),
        ]
        for k, (model, proto, loads, evictions, resident) in enumerate(steps):
            infer_checked(g if proto == "grpc" else h, proto,
                          residency_models.cases[model][1 + 2 * (k % 2)], f"(step {k + 1})")
            v = cache_view(server)
            seq = " ".join(s[0] for s in steps[:k + 1])
            got_loads = delta(v.loads, start.loads)
            got_ev = delta(v.evictions, start.evictions)
            assert (got_loads, got_ev, v.resident_models()) == (loads, evictions, resident), \
                f"after {seq}: loads {got_loads}, evictions {got_ev}, resident " \
                f"{v.resident_models()}; expected {loads}, {evictions}, {resident}"
            assert v.used == len(resident) * mb
    finally:
        g.close()
        h.close()


@serve_only("the weight budget and its eviction policy are per worker")
def test_lfu_keeps_the_often_used(start_server, residency_models):
    """Room for two, the default policy (lfu): A asked for six times, then B
    and C taking turns. LRU would evict A for C; lfu keeps A resident (one
    load in all) and lets B and C evict each other, answers correct
    throughout."""
    mb = residency_models.weight_bytes
    a, b, c = NAMES[:3]
    server = start_server([a, b, c], int(2.5 * mb), ["--warmup-runs", "0"])
    g, h = clients(server)
    try:
        start = cache_view(server)
        sequence = [a] * 6 + [b, c, b, c]
        for k, model in enumerate(sequence):
            proto = "grpc" if k % 2 == 0 else "http"
            infer_checked(g if proto == "grpc" else h, proto,
                          residency_models.cases[model][1 + 2 * (k % 2)], f"(step {k + 1})")
            v = cache_view(server)
            loads = delta(v.loads, start.loads)
            assert loads.get(a) == 1, f"after {' '.join(sequence[:k + 1])}: loads {loads}"
            assert a in v.resident_models(), v.resident_models()
            assert v.used <= 2 * mb
        # every B and C request missed: one place for the two of them
        assert (loads.get(b), loads.get(c)) == (2, 2), loads
        assert delta(v.evictions, start.evictions).get(a) is None
    finally:
        g.close()
        h.close()


# ---- a model larger than the budget ------------------------------------------------------

@serve_only("the weight budget and its LRU are per worker")
def test_model_larger_than_budget(start_server, residency_models):
    mb = residency_models.weight_bytes
    a, b = NAMES[:2]
    budget = mb // 2
    server = start_server([a, b], budget, ["--warmup-runs", "0"])
    start = cache_view(server)
    assert start.budget == budget
    g, h = clients(server)
    try:
        for k, (model, proto) in enumerate([(a, "grpc"), (b, "http"), (a, "http"),
                                            (b, "grpc"), (b, "http")]):
            infer_checked(g if proto == "grpc" else h, proto,
                          residency_models.cases[model][ROWS[k % 2]], f"(request {k + 1})")
            v = cache_view(server)
            # alone on the device, over the budget
            assert v.resident_models() == [model], v.resident_models()
            assert v.used == mb
    finally:
        g.close()
        h.close()
    v = cache_view(server)
    # a b a b b: b loaded twice, a twice (once when start-up left it on the
    # device); every load but the last evicted the model before it
    loads = delta(v.loads, start.loads)
    assert loads.get(b) == 2 and loads.get(a) in (1, 2), loads
    evictions = delta(v.evictions, start.evictions)
    assert sum(evictions.values()) == \
        sum(loads.values()) + len(start.resident_models()) - len(v.resident_models())
    log = server.stderr_text()
    for model in (a, b):
        assert re.search(rf"WARN.*{model}.*budget", log), \
            f"no warning that {model}'s weights exceed the budget in the log:\n{log[-3000:]}"


READY_REUSED = "(measured on an earlier model with the same modules; none run)"


@serve_only("the warm-up costs and the weight loads are per worker")
def test_models_with_the_same_modules_warm_up_once(start_server, residency_models):
    """Ten models of one architecture (identical modules, weights of their
    own), room for all: the first model loads its weights and executes each
    batch size at start-up; the other nine take its costs and run nothing,
    so start-up loads one model's weights, not ten. Each then answers with
    its own weights."""
    mb = residency_models.weight_bytes
    server = start_server(NAMES, 20 * mb)
    log = server.stderr_text()
    ready = {m.group(1): m.group(2) for m in re.finditer(r"model (\S+) ready: (.*)$", log, re.M)}
    assert set(ready) == set(NAMES), log[-3000:]
    first = NAMES[0]  # loaded first: the repository is read in name order
    assert "warm-up b1" in ready[first] and READY_REUSED not in ready[first], ready[first]
    for name in NAMES[1:]:
        assert re.search(r"warm-up b1 [\d.]+ ms", ready[name]), ready[name]
        assert READY_REUSED in ready[name], ready[name]
    start = cache_view(server)
    assert sum(start.loads.values()) == 1 and start.loads.get(first) == 1, start.loads
    g, h = clients(server)
    try:
        for k, name in enumerate(NAMES):
            proto = ("grpc", "http")[k % 2]
            infer_checked(g if proto == "grpc" else h, proto, residency_models.cases[name][1],
                          f"({name})")
    finally:
        g.close()
        h.close()
    loads = delta(cache_view(server).loads, start.loads)
    assert loads == {name: 1 for name in NAMES[1:]}, loads


OVER_BUDGET_REQUESTS = 300
OVER_BUDGET_LINE = re.compile(r"WARN  model (\S+): its weights .* exceed the device weight budget"
                              r".*?(?: \((\d+) more like this in the last [\d.]+ s\))?$", re.M)


ONE_BLOCK_LINE = re.compile(r"model (res_\d+): (\d+) weights copied to the device as one "
                            r"block of (\d+) bytes")


@serve_only("each worker loads its own copies")
def test_weights_are_copied_as_one_block(start_server, residency_models):
    """--weight-upload block: a model's host floor goes to the device as one
    copy, its weights views of it (on a GPU the calls cost more than the
    bytes), each load again after an eviction, with right answers. auto, the
    default, copies weight by weight on the CPU plugin, where a fresh block's
    page faults cost more."""
    mb = residency_models.weight_bytes
    a, b = NAMES[:2]
    for mode, want_blocks in (("block", True), ("auto", False)):
        server = start_server([a, b], mb + mb // 2,
                              ["--log-level", "debug", "--warmup-runs", "0",
                               "--weight-upload", mode])
        log_start = len(server.stderr_text())
        g, _ = clients(server)
        try:
            for k, model in enumerate((a, b, a)):
                infer_checked(g, "grpc", residency_models.cases[model][1], f"({mode}, {k})")
        finally:
            g.close()
        log = server.stderr_text()[log_start:]
        lines = ONE_BLOCK_LINE.findall(log)
        if not want_blocks:
            assert not lines, lines
            continue
        assert [m for m, _, _ in lines] == [a, b, a], lines
        for _, n, size in lines:
            # the wide mlp's six weights, each rounded up to 256 bytes
            assert int(n) == 6 and mb <= int(size) < mb + 6 * 256, (n, size, mb)


@serve_only("the weight budget and its LRU are per worker")
def test_over_budget_warning_is_rate_limited(start_server, residency_models):
    """Two models each over the budget, requested in turn: every request
    loads its model (evicting the other), and the warning that goes with
    each load is written at most once a second per model, the loads in
    between counted on the next line written, never one line per request."""
    mb = residency_models.weight_bytes
    a, b = NAMES[:2]
    server = start_server([a, b], mb // 2, ["--warmup-runs", "0"])
    start = cache_view(server)
    log_start = len(server.stderr_text())
    g, _ = clients(server)
    t0 = time.monotonic()
    try:
        for k in range(OVER_BUDGET_REQUESTS):
            infer_checked(g, "grpc", residency_models.cases[(a, b)[k % 2]][1], f"(request {k})")
        # A second later, one more each: those lines carry the counts of
        # every load since the last line written.
        time.sleep(1.1)
        for model in (a, b):
            infer_checked(g, "grpc", residency_models.cases[model][1], "(after the pause)")
    finally:
        g.close()
    elapsed = time.monotonic() - t0
    loads = delta(cache_view(server).loads, start.loads)
    assert sum(loads.values()) >= OVER_BUDGET_REQUESTS, loads

    lines = OVER_BUDGET_LINE.findall(server.stderr_text()[log_start:])
    for model in (a, b):
        mine = [int(n or 0) for m, n in lines if m == model]
        # one line a second at most, plus the one the first load may write
        assert 1 <= len(mine) <= elapsed + 2, (model, len(mine), elapsed)
        assert mine[-1] > 0, f"the last line for {model} carries no count: {mine}"
        # every load is either a line or counted in one (start-up's lines
        # may be counted too)
        assert loads[model] <= len(mine) + sum(mine) <= loads[model] + 2, (model, mine, loads)


# ---- the host tier (--host-weight-budget) ------------------------------------------------

HOST_BUDGET = "pjserve_host_weight_budget_bytes"
HOST_USED = "pjserve_host_weight_used_bytes"
HOST_PINNED = "pjserve_host_weight_pinned_bytes"
HOST_BYTES = "pjserve_host_weight_bytes"
HOST_LOADS = "pjserve_host_weight_loads_total"
HOST_EVICTIONS = "pjserve_host_weight_evictions_total"


@dataclass
class HostView:
    """The host tier as one scrape of /metrics shows it."""
    budget: float
    used: float
    pinned: float
    in_host: Dict[str, float]
    loads: Dict[str, float]
    evictions: Dict[str, float]

    def floors(self):
        return sorted(m for m, b in self.in_host.items() if b > 0)


def host_view(server: ServerProcess) -> HostView:
    samples, _ = parse_metrics(scrape(server.metrics_url))
    return HostView(server_gauge(samples, HOST_BUDGET), server_gauge(samples, HOST_USED),
                    server_gauge(samples, HOST_PINNED), per_model(samples, HOST_BYTES),
                    per_model(samples, HOST_LOADS), per_model(samples, HOST_EVICTIONS))


def control_json(server, method: str, path: str, doc=None):
    status, got, raw = http_json(server.http_url, method, path, doc)
    return status, got if got is not None else raw


@serve_only("the host budget is per worker")
def test_host_tier_many_models(start_server, residency_models):
    """Ten models, host memory for four of their floors, device room for two:
    every answer right over both protocols while floors are read from their
    files and evicted again; the host budget held at every scrape; the books
    add up at the end."""
    mb = residency_models.weight_bytes
    host_budget = 4 * mb + mb // 2
    server = start_server(NAMES, int(2.5 * mb), ["--host-weight-budget", str(host_budget)])
    first = host_view(server)
    assert first.budget == host_budget
    assert first.pinned == 0
    assert len(first.floors()) <= 4  # the warm-ups read them, within the budget

    def over_budget(v):
        total = sum(v.in_host.values())
        if v.used > host_budget or total > host_budget:
            return f"used {v.used:.0f}, floors {total:.0f} ({v.floors()}) > budget {host_budget}"
        return None

    def client_thread(i):
        proto = "grpc" if i % 2 == 0 else "http"
        rng = random.Random(4321 + i)
        g, h = clients(server)
        c = g if proto == "grpc" else h
        try:
            for k in range(60):
                name = rng.choice(NAMES)
                case = residency_models.cases[name][rng.choice(ROWS)]
                infer_checked(c, proto, case, f"(thread {i}, request {k})")
        finally:
            g.close()
            h.close()
        return k + 1

    _, views, breaches = run_watched(lambda: host_view(server), over_budget, client_thread, 4)
    assert not breaches, (f"the host tier exceeded its budget at {len(breaches)} of "
                          f"{len(views)} scrapes:\n" + "\n".join(breaches[:20]))
    end = host_view(server)
    floors = end.floors()
    assert 1 <= len(floors) <= 4
    for m in NAMES:
        loads, ev = end.loads.get(m, 0), end.evictions.get(m, 0)
        assert loads - ev == (1 if m in floors else 0), f"{m}: {loads} reads, {ev} evictions"
    assert sum(end.evictions.values()) > 0, "no floor was ever evicted"
    assert end.used == sum(end.in_host.values())
    # every request counted once, by the tier its model was found in
    samples, _ = parse_metrics(scrape(server.metrics_url))
    tiers = {t: metric(samples, "pjserve_request_tier_seconds_count", tier=t)
             for t in ("device", "host", "file")}
    served = sum(per_model(samples, "nv_inference_request_success").values())
    assert sum(tiers.values()) == served, (tiers, served)
    assert tiers["device"] > 0 and tiers["file"] > 0, tiers


@serve_only("the host budget is per worker")
def test_host_tier_follows_residency(start_server, residency_models):
    """A device-pinned model's floor is kept outside the host budget, an
    unpinned one's dropped (it is read from the file on each upload), and
    a host one's back under the budget; the answers stay right."""
    mb = residency_models.weight_bytes
    names = NAMES[:3]
    server = start_server(names, 10 * mb, ["--host-weight-budget", str(2 * mb + mb // 2)])
    g, h = clients(server)
    try:
        a = names[0]
        assert control_json(server, "POST", f"/v2/pjserve/models/{a}/residency",
                            {"residency": "device"})[0] == 200
        v = host_view(server)
        assert v.in_host[a] > 0 and v.pinned == v.in_host[a], v
        for name in names:  # the other two fill the budget; a's floor stays
            infer_checked(g, "grpc", residency_models.cases[name][1], f"({name})")
        status, doc = control_json(server, "GET", "/v2/pjserve/control")
        assert status == 200, doc
        state = {m["name"]: m for m in doc["models"]}
        assert state[a]["in_host"] and state[a]["residency"] == "device"
        assert doc["cache"]["host_pinned_bytes"] == v.pinned
        assert doc["cache"]["host_budget_bytes"] == 2 * mb + mb // 2
        assert not doc["cache"]["host_unlimited"]

        assert control_json(server, "POST", f"/v2/pjserve/models/{a}/residency",
                            {"residency": "unpinned"})[0] == 200
        v = host_view(server)
        assert v.in_host.get(a, 0) == 0 and v.pinned == 0, v
        infer_checked(h, "http", residency_models.cases[a][3], "(unpinned)")
        assert host_view(server).in_host.get(a, 0) == 0, "an unpinned model got a floor"

        assert control_json(server, "POST", f"/v2/pjserve/models/{a}/residency",
                            {"residency": "host"})[0] == 200
        for name in names:
            infer_checked(h, "http", residency_models.cases[name][1], f"({name}, host)")
        v = host_view(server)
        assert v.used <= 2 * mb + mb // 2 and v.pinned == 0, v
    finally:
        g.close()
        h.close()


@serve_only("the host budget is per worker")
def test_host_tier_refuses_a_changed_file(pjserve_bin, plugin_path, cache_dir, residency_models,
                                          tmp_path):
    """A floor read again after its file changed is refused with
    FAILED_PRECONDITION (the checksums taken when the model loaded), never
    served; the other models keep answering."""
    mb = residency_models.weight_bytes
    changed = NAMES[1]
    repo = residency_models.repository(tmp_path / "repo", NAMES[:3])
    (repo / changed).unlink()  # a copy of its own, to change
    shutil.copytree(residency_models.bundles / changed, repo / changed)
    server = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "srv",
                           ["--device-weight-budget", str(mb + mb // 2), "--host-weight-budget",
                            str(mb + mb // 2), "--model-control-mode", "static"], "host-changed")
    try:
        server.start()
    except ServerFailure as e:
        pytest.fail(str(e), pytrace=False)
    g, h = clients(server)
    try:
        for name in NAMES[:3]:  # room for one model: each request reads its model's file
            infer_checked(g, "grpc", residency_models.cases[name][1], f"({name})")
        weights = repo / changed / pe.WEIGHTS_FILE
        with open(weights, "r+b") as f:  # in place: the file the server has open
            f.seek(-8, 2)
            tail = f.read(8)
            f.seek(-8, 2)
            f.write(bytes(8) if tail != bytes(8) else b"\x01" * 8)
        infer_checked(g, "grpc", residency_models.cases[NAMES[0]][1], "(evicting the floor)")
        with pytest.raises(Exception) as e:
            grpc_infer_case(g, residency_models.cases[changed][1])
        assert "weights refused" in str(e.value), str(e.value)
        assert "FAILED_PRECONDITION" in str(e.value), str(e.value)
        for name in (NAMES[0], NAMES[2]):
            infer_checked(h, "http", residency_models.cases[name][3], f"({name}, after)")
    finally:
        g.close()
        h.close()
        problems = server.stop_and_check()
        server.kill()
    assert problems == [], problems


@serve_only("counts one server process's descriptors")
def test_weights_files_are_not_kept_open(start_server, residency_models):
    """A model's weights file is closed once its host copy is made, so ten
    models hold no more descriptors than one (10,000 models once held 10,000
    and left none for connections)."""
    mb = residency_models.weight_bytes
    one = start_server(NAMES[:1], 10 * mb)
    ten = start_server(NAMES, 10 * mb)

    def weights_open(s):
        count = 0
        for fd in Path(f"/proc/{s.proc.pid}/fd").iterdir():
            try:
                count += os.readlink(fd).endswith("weights.safetensors")
            except FileNotFoundError:  # closed since the listing (a connection, a pipe)
                pass
        return count

    assert weights_open(one) == 0 and weights_open(ten) == 0
    g, h = clients(ten)
    try:
        for name in NAMES:  # and after every model ran
            infer_checked(g, "grpc", residency_models.cases[name][1], f"({name})")
    finally:
        g.close()
        h.close()
    assert weights_open(ten) == 0
