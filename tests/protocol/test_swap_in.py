"""Pipelined swap-in through the real server (tritonclient, gRPC and HTTP).

A bundle exported with `swap_in_stages` carries, besides its whole-model
modules, one module per stage; a cold model's first execution after its
weights were copied runs the stages, each queued as soon as its own block of
weights is on the device (docs/residency.md, "Pipelined swap-in"). The
models here are two four-layer MLPs (different weights), exported with three
stages, under a device budget that holds one of them, so that every switch
between them is a cold load.

What is checked:

  - with --weight-upload block every cold load is staged (its debug line),
    answers at every batch size and row count match JAX on both protocols,
    warm requests and warm-up runs answer right too, and the load counters
    count each staged load once;
  - with --weight-upload each (no blocks to pipeline) nothing is staged and
    the answers are the same;
  - `pjserve check` lists the stages, and refuses, naming what is wrong, a
    bundle whose stage module is missing, whose stage takes a weight the
    file lacks, whose weights are not ordered by first use, or whose stage
    module has another signature than its manifest entry.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import pjserve_export as pe
from protocol_util import (LOAD_SECONDS, LOADS, Case, ServerProcess, grpc_infer_case,
                           http_infer_case, parse_metrics, scrape, serve_only, start_or_fail,
                           stop_all_checked)

IN, HIDDEN, OUT = 32, 256, 8
BATCH_SIZES = (1, 4)
STAGES = 3
NAMES = ("swap_a", "swap_b")
STAGED_LINE = re.compile(r"model (swap_[ab]): weights copied to the device as (\d+) stage "
                         r"blocks")


def deep_mlp(p, x):
    h = x
    for k in range(4):
        h = h @ p[f"l{k}"]["w"] + p[f"l{k}"]["b"]
        if k < 3:
            h = jnp.tanh(h)
    return h


def deep_mlp_params(seed: int):
    rng = np.random.default_rng(seed)
    dims = (IN, HIDDEN, HIDDEN, HIDDEN, OUT)
    return {f"l{k}": {"w": (rng.standard_normal((dims[k], dims[k + 1])) /
                            np.sqrt(dims[k])).astype(np.float32),
                      "b": rng.standard_normal(dims[k + 1]).astype(np.float32) * 0.1}
            for k in range(4)}


class SwapModels:
    def __init__(self, out: Path):
        self.out = out
        self.cases: Dict[str, Dict[int, Case]] = {}
        self.weight_bytes = 0

    def repository(self, where: Path) -> Path:
        where.mkdir(parents=True)
        for name in NAMES:
            shutil.copytree(self.out / name, where / name)
        return where


@pytest.fixture(scope="module")
def swap_models(tmp_path_factory) -> SwapModels:
    models = SwapModels(tmp_path_factory.mktemp("swap-in-bundles"))
    rng = np.random.default_rng(7)
    for seed, name in enumerate(NAMES):
        params = deep_mlp_params(seed)
        path = pe.export_jax(deep_mlp, params, [np.zeros((1, IN), np.float32)], models.out,
                             name=name, batch_sizes=BATCH_SIZES, input_names=["x"],
                             output_names=["y"], swap_in_stages=STAGES)
        manifest = pe.read_manifest(path)
        _, arrays = pe.weight_names_and_arrays(params)
        models.weight_bytes = sum(int(np.asarray(a).nbytes) for a in arrays)
        models.cases[name] = {}
        for n in (1, 3, 4):
            x = rng.standard_normal((n, IN)).astype(np.float32)
            y = np.asarray(jax.jit(deep_mlp)(params, x))
            models.cases[name][n] = Case(name, n, {"x": x}, {"y": y}, manifest)
    return models


@pytest.fixture
def start_server(pjserve_bin, plugin_path, cache_dir, swap_models, tmp_path):
    started = []

    def start(extra=()):
        k = len(started)
        repo = swap_models.repository(tmp_path / f"repo{k}")
        # room for one model's floor (each weight rounded up to 256 bytes)
        budget = swap_models.weight_bytes + 16 * 256
        s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / f"srv{k}",
                          ["--device-weight-budget", str(budget), "--log-level", "debug",
                           *extra], f"swap{k}")
        started.append(s)
        return start_or_fail(s)

    yield start
    stop_all_checked(started)


def infer_both(server, case: Case, what: str):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        got, _ = grpc_infer_case(g, case)
        case.check(got, f"over grpc {what}")
        got, _ = http_infer_case(h, case)
        case.check(got, f"over http {what}")
    finally:
        g.close()
        h.close()


def per_model(server, name: str) -> Dict[str, float]:
    """{model: the sum of its samples of `name`}."""
    out: Dict[str, float] = {}
    for (n, labels), v in parse_metrics(scrape(server.metrics_url))[0].items():
        model = dict(labels).get("model")
        if n == name and model is not None:
            out[model] = out.get(model, 0.0) + v
    return out


@serve_only("the weight budget and the debug log are per worker")
@pytest.mark.parametrize("warmup", ["0", "1"])
def test_cold_loads_run_the_stages(start_server, swap_models, warmup):
    server = start_server(["--weight-upload", "block", "--warmup-runs", warmup])
    a, b = NAMES
    infer_both(server, swap_models.cases[b][1], "(b made resident first)")
    log_start = len(server.stderr_text())
    loads_before = per_model(server, LOADS)
    seconds_before = per_model(server, LOAD_SECONDS)
    order = [a, b, a, b, b, a]
    for k, name in enumerate(order):
        for n in (1, 3, 4):
            # the first request of each switch is the cold one, at every size in turn
            infer_both(server, swap_models.cases[name][n], f"(request {k}, {n} rows)")
    staged = STAGED_LINE.findall(server.stderr_text()[log_start:])
    # one staged load per switch: a, b, a, b, a (b twice in a row stays warm)
    assert [m for m, _ in staged] == [a, b, a, b, a], staged
    assert all(int(k) == STAGES for _, k in staged), staged
    # each staged load counted once, and charged its time
    loads_after, seconds_after = per_model(server, LOADS), per_model(server, LOAD_SECONDS)
    for name, want in ((a, 3), (b, 2)):
        assert loads_after[name] - loads_before.get(name, 0.0) == want, (loads_before,
                                                                          loads_after)
        assert seconds_after[name] > seconds_before.get(name, 0.0)


@serve_only("the debug log is per worker")
def test_nothing_is_staged_without_blocks(start_server, swap_models):
    server = start_server(["--weight-upload", "each", "--warmup-runs", "0"])
    log_start = len(server.stderr_text())
    for k, name in enumerate(NAMES * 2):
        infer_both(server, swap_models.cases[name][3], f"(request {k})")
    assert not STAGED_LINE.findall(server.stderr_text()[log_start:])


# ---- pjserve check ---------------------------------------------------------------------

def check(pjserve_bin, plugin_path, bundle: Path):
    return subprocess.run([str(pjserve_bin), "check", "--pjrt-plugin", str(plugin_path),
                           str(bundle)], capture_output=True, text=True, timeout=300)


def test_check_lists_the_stages(pjserve_bin, plugin_path, swap_models):
    r = check(pjserve_bin, plugin_path, swap_models.out / NAMES[0])
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "swap-in stage" in ln]
    assert len(lines) == STAGES, r.stdout
    assert "returns the outputs" in lines[-1]
    assert f"modules: {len(BATCH_SIZES) * (STAGES + 1)} " in r.stdout


def broken_copy(swap_models, tmp_path) -> Path:
    bundle = tmp_path / NAMES[0]
    shutil.copytree(swap_models.out / NAMES[0], bundle)
    return bundle


def manifest_stages(bundle: Path):
    import yaml
    return yaml.safe_load((bundle / pe.MANIFEST_FILE).read_text())["swap_in_stages"]


def rewrite_stages(bundle: Path, stages):
    import yaml
    doc = yaml.safe_load((bundle / pe.MANIFEST_FILE).read_text())
    doc["swap_in_stages"] = stages
    (bundle / pe.MANIFEST_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))


def test_check_refuses_a_missing_stage_module(pjserve_bin, plugin_path, swap_models, tmp_path):
    bundle = broken_copy(swap_models, tmp_path)
    (bundle / "swap_in.s1.b4.mlir").unlink()
    r = check(pjserve_bin, plugin_path, bundle)
    assert r.returncode == 1
    assert "swap_in.s1.b4.mlir: missing (manifest.yaml swap_in_stages[1] needs one module " \
           "per batch size" in r.stderr, r.stderr


def test_check_refuses_an_unknown_stage_weight(pjserve_bin, plugin_path, swap_models,
                                               tmp_path):
    bundle = broken_copy(swap_models, tmp_path)
    stages = manifest_stages(bundle)
    stages[1]["weights"][0] = "no.such.weight"
    rewrite_stages(bundle, stages)
    r = check(pjserve_bin, plugin_path, bundle)
    assert r.returncode == 1
    assert 'swap_in_stages[1].weights[0]: no weight "no.such.weight" in weights.safetensors' \
        in r.stderr, r.stderr


def test_check_refuses_weights_out_of_stage_order(pjserve_bin, plugin_path, swap_models,
                                                  tmp_path):
    """The first stage's first weight named by the last stage instead: the
    file's order then puts a later stage's weight before an earlier one's."""
    bundle = broken_copy(swap_models, tmp_path)
    stages = manifest_stages(bundle)
    moved = stages[0]["weights"].pop(0)
    stages[-1]["weights"].append(moved)
    rewrite_stages(bundle, stages)
    r = check(pjserve_bin, plugin_path, bundle)
    assert r.returncode == 1
    assert re.search(r'argument_order: weight "[^"]+", first used by swap_in_stages\[[0-1]\], '
                     rf"comes after weights of swap_in_stages\[{STAGES - 1}\]; order the "
                     r"weights by the stage that first uses them", r.stderr), r.stderr


def test_check_refuses_a_stage_module_of_another_signature(pjserve_bin, plugin_path,
                                                           swap_models, tmp_path):
    bundle = broken_copy(swap_models, tmp_path)
    shutil.copy(bundle / "swap_in.s0.b1.mlir", bundle / "swap_in.s1.b1.mlir")
    r = check(pjserve_bin, plugin_path, bundle)
    assert r.returncode == 1
    assert "swap_in.s1.b1.mlir" in r.stderr and "swap_in_stages[1]" in r.stderr, r.stderr
