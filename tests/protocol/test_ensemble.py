"""Ensembles (manifest `kind: ensemble`), against the real server with
tritonclient, on gRPC and HTTP (and, with PJSERVE_PROTOCOL_NODE_WORKERS,
through a node's gateway).

The repository holds the demo mlp (x f32 [batch,16] -> y f32 [batch,4]) and
two_io (a f32 [batch,8], b i32 [batch,3] -> sum f32 [batch,8], argmax i32
[batch]), public, and these ensembles:

    chain      two_io(a, b) -> s1, am1; two_io(s1, b) -> s2; mlp(x) -> y,
               declared out of order (the step reading s1 first); answers
               s2, am1 and y, which the tests compare with calling the three
               steps one by one
    loose      mlp(x) with x declared f32 [-1, -1]: any shape reaches the
               step, whose refusal becomes the request's error
    ens_*      refused at load (a missing model, an input not mapped, a
               dtype or an extent that differs, an output or a version the
               model lacks, C code in the bundle, a cycle)

The last tests load chain again (a reload) and unload mlp and load it
again: chain is not ready meanwhile.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle_code import copy_bundle, start_server, stop_server, tensor_yaml
from protocol_util import grpc_code, http_json

PROTOS = ("grpc", "http-binary", "http-json")

CHAIN_STEPS = """\
ensemble:
  steps:
    - model: two_io
      input_map: {a: s1, b: b}
      output_map: {sum: s2}
    - model: two_io
      version: 1
      input_map: {a: a, b: b}
      output_map: {sum: s1, argmax: am1}
    - model: mlp
      input_map: {x: x}
      output_map: {y: y}
"""
CHAIN_IN = (tensor_yaml("a", "f32", ["batch", 8]) + tensor_yaml("b", "i32", ["batch", 3])
            + tensor_yaml("x", "f32", ["batch", 16]))
CHAIN_OUT = (tensor_yaml("s2", "f32", ["batch", 8]) + tensor_yaml("am1", "i32", ["batch"])
             + tensor_yaml("y", "f32", ["batch", 4]))
MLP_STEP = "ensemble:\n  steps:\n    - {model: mlp, input_map: {x: x}, output_map: {y: y}}\n"
X_IN = tensor_yaml("x", "f32", ["batch", 16])
Y_OUT = tensor_yaml("y", "f32", ["batch", 4])

# name -> (client inputs, client outputs, ensemble section, what the index's reason says)
REFUSED = {
    "ens_missing": (X_IN, Y_OUT, MLP_STEP.replace("model: mlp", "model: nosuch"),
                    ['ensemble.steps[0].model: no model "nosuch" in the repository']),
    "ens_unmapped": (tensor_yaml("a", "f32", ["batch", 8]),
                     tensor_yaml("s", "f32", ["batch", 8]),
                     "ensemble:\n  steps:\n"
                     "    - {model: two_io, input_map: {a: a}, output_map: {sum: s}}\n",
                     ["ensemble.steps[0].input_map", "model two_io's input \"b\" is not mapped"]),
    "ens_dtype": (tensor_yaml("a", "f32", ["batch", 8]) + tensor_yaml("b", "f32", ["batch", 3]),
                  tensor_yaml("s", "f32", ["batch", 8]),
                  "ensemble:\n  steps:\n"
                  "    - {model: two_io, input_map: {a: a, b: b}, output_map: {sum: s}}\n",
                  ["ensemble.steps[0].input_map.b", 'ensemble tensor "b" is f32',
                   "written by client_inputs[1]", "model two_io's input \"b\" is i32"]),
    "ens_no_output": (X_IN, Y_OUT, MLP_STEP.replace("output_map: {y: y}",
                                                    "output_map: {logits: y}"),
                      ['ensemble.steps[0].output_map.logits: model mlp has no output "logits" '
                       "(its outputs: y)"]),
    "ens_cycle": (X_IN, Y_OUT,
                  "ensemble:\n  steps:\n"
                  "    - {model: mlp, input_map: {x: x}, output_map: {y: y}}\n"
                  "    - {model: two_io, input_map: {a: p, b: q}, output_map: {sum: r}}\n"
                  "    - {model: two_io, input_map: {a: r, b: q}, output_map: {sum: p, "
                  "argmax: q}}\n",
                  ["ensemble.steps[1].input_map.a", "the steps form a cycle"]),
    "ens_extent": (X_IN, tensor_yaml("y", "f32", ["batch", 5]), MLP_STEP,
                   ['client_outputs[0]: ensemble tensor "y" is f32 [-1, 4] (written by '
                    "ensemble.steps[0].output_map.y (model mlp)) but client output \"y\" is "
                    "f32 [-1, 5]"]),
    "ens_version": (X_IN, Y_OUT, MLP_STEP.replace("{model: mlp,", "{model: mlp, version: 2,"),
                    ["ensemble.steps[0].version: model mlp has no version 2"]),
    "ens_with_code": (X_IN, Y_OUT, MLP_STEP,
                      ["a kind: ensemble bundle runs no C code", "remove model.c"]),
}


def write_ensemble(repo, name, client_inputs, client_outputs, section):
    d = repo / name
    d.mkdir()
    (d / "manifest.yaml").write_text(
        f'format_version: "2.0"\nname: {name}\nkind: ensemble\n'
        f"client_inputs:\n{client_inputs}client_outputs:\n{client_outputs}{section}")
    return d


@pytest.fixture(scope="module")
def ensemble_server(pjserve_bin, plugin_path, cache_dir, exported, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensemble-repository")
    for name in ("mlp", "two_io"):
        copy_bundle(repo, exported[name].path, name)
    write_ensemble(repo, "chain", CHAIN_IN, CHAIN_OUT, CHAIN_STEPS)
    write_ensemble(repo, "loose", tensor_yaml("x", "f32", [-1, -1]), Y_OUT, MLP_STEP)
    for name, (ins, outs, section, _) in REFUSED.items():
        write_ensemble(repo, name, ins, outs, section)
    (repo / "ens_with_code" / "model.c").write_text("int unused;\n")
    s = start_server(pjserve_bin, plugin_path, repo, cache_dir,
                     tmp_path_factory.mktemp("ensemble-server"),
                     ["--model-control-mode", "static"], "ensemble", refuses_some=True)
    yield s
    stop_server(s)


@pytest.fixture
def srv(ensemble_server):
    assert ensemble_server.alive(), ensemble_server.describe()
    yield ensemble_server
    assert ensemble_server.alive(), f"the server died during this test\n{ensemble_server.describe()}"


def url_of(s, proto):
    return s.grpc_url if proto == "grpc" else s.http_url


def infer(url, model, arrays, outputs, proto="grpc"):
    """{output: array} over gRPC, HTTP binary ("http-binary") or HTTP JSON."""
    dtypes = {np.float32: "FP32", np.int32: "INT32"}
    if proto == "grpc":
        with grpcclient.InferenceServerClient(url) as c:
            ins = []
            for name, a in arrays.items():
                t = grpcclient.InferInput(name, list(a.shape), dtypes[a.dtype.type])
                t.set_data_from_numpy(a)
                ins.append(t)
            r = c.infer(model, ins)
            return {o: r.as_numpy(o) for o in outputs}
    binary = proto == "http-binary"
    with httpclient.InferenceServerClient(url) as c:
        ins = []
        for name, a in arrays.items():
            t = httpclient.InferInput(name, list(a.shape), dtypes[a.dtype.type])
            t.set_data_from_numpy(a, binary_data=binary)
            ins.append(t)
        req = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
        r = c.infer(model, ins, outputs=req)
        return {o: r.as_numpy(o) for o in outputs}


MAX_ROWS = 8  # the demo models' largest compiled batch size


def infer_direct(url, model, arrays, outputs, proto):
    """A model called directly, in requests of at most MAX_ROWS rows (an
    ensemble's sub-call splits a larger batch the same way)."""
    rows = len(next(iter(arrays.values())))
    parts = [infer(url, model, {k: a[i:i + MAX_ROWS] for k, a in arrays.items()}, outputs, proto)
             for i in range(0, rows, MAX_ROWS)]
    return {o: np.concatenate([p[o] for p in parts]) for o in outputs}


def chain_inputs(rows, seed):
    g = np.random.default_rng(seed)
    return {"a": g.standard_normal((rows, 8)).astype(np.float32),
            "b": g.integers(-3, 4, (rows, 3)).astype(np.int32),
            "x": g.standard_normal((rows, 16)).astype(np.float32)}


# ---- answers ------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("rows", (1, 3, 8, 11))  # 11: split into sub-calls of 8 and 3
def test_chain_matches_the_steps_called_one_by_one(srv, proto, rows):
    url = url_of(srv, proto)
    v = chain_inputs(rows, seed=rows)
    got = infer(url, "chain", v, ["s2", "am1", "y"], proto)
    first = infer_direct(url, "two_io", {"a": v["a"], "b": v["b"]}, ["sum", "argmax"], proto)
    second = infer_direct(url, "two_io", {"a": first["sum"], "b": v["b"]}, ["sum"], proto)
    y = infer_direct(url, "mlp", {"x": v["x"]}, ["y"], proto)["y"]
    assert got["s2"].shape == (rows, 8) and got["am1"].shape == (rows,), got
    np.testing.assert_allclose(got["s2"], second["sum"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["am1"], first["argmax"])
    np.testing.assert_allclose(got["y"], y, rtol=1e-6, atol=1e-6)


def test_concurrent_requests_each_get_their_own_answer(srv):
    """Requests of several clients at once (more than the meta gate's two
    permits), of different sizes: each answer is its own inputs' chain (to
    float rounding: a sub-call may be coalesced with other requests into
    another compiled batch size than the direct call)."""
    def one(seed):
        proto = PROTOS[seed % len(PROTOS)]
        v = chain_inputs(1 + seed % 9, seed=1000 + seed)
        return v, infer(url_of(srv, proto), "chain", v, ["s2", "am1", "y"], proto)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(24)))
    for v, got in answers:
        first = infer_direct(srv.grpc_url, "two_io", {"a": v["a"], "b": v["b"]},
                             ["sum", "argmax"], "grpc")
        second = infer_direct(srv.grpc_url, "two_io", {"a": first["sum"], "b": v["b"]}, ["sum"],
                              "grpc")
        y = infer_direct(srv.grpc_url, "mlp", {"x": v["x"]}, ["y"], "grpc")["y"]
        np.testing.assert_allclose(got["s2"], second["sum"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["am1"], first["argmax"])
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)


def test_chain_matches_jax(srv, exported):
    v = chain_inputs(4, seed=99)
    got = infer(srv.grpc_url, "chain", v, ["s2", "am1", "y"])
    two_io, mlp = exported["two_io"].model, exported["mlp"].model
    s1, am1 = (np.asarray(t) for t in two_io.reference(v["a"], v["b"]))
    s2 = np.asarray(two_io.reference(s1, v["b"])[0])
    np.testing.assert_allclose(got["s2"], s2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["am1"], am1)
    np.testing.assert_allclose(got["y"], np.asarray(mlp.reference(v["x"])[0]), rtol=1e-5,
                               atol=1e-5)


def test_requested_output_only(srv):
    v = chain_inputs(2, seed=5)
    with httpclient.InferenceServerClient(srv.http_url) as c:
        ins = []
        for name, a in v.items():
            t = httpclient.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32
                                      else "INT32")
            t.set_data_from_numpy(a)
            ins.append(t)
        r = c.infer("chain", ins, outputs=[httpclient.InferRequestedOutput("y")])
        outs = [o["name"] for o in r.get_response()["outputs"]]
    assert outs == ["y"], outs


# ---- errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("proto", ("grpc", "http-json"))
def test_step_error_names_the_step(srv, proto):
    x = np.zeros((2, 15), np.float32)  # loose takes any shape; mlp takes [batch, 16]
    with pytest.raises(InferenceServerException) as e:
        infer(url_of(srv, proto), "loose", {"x": x}, ["y"], proto)
    msg = e.value.message()
    if proto == "grpc":
        assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
    else:
        assert e.value.status() == "400", e.value
    assert "model loose: ensemble: ensemble.steps[0] (model mlp)" in msg, msg
    assert "x" in msg and "16" in msg, msg


@pytest.mark.parametrize("proto", ("grpc", "http-json"))
def test_client_inputs_checked_before_any_step(srv, proto):
    v = chain_inputs(2, seed=1)
    del v["b"]
    with pytest.raises(InferenceServerException) as e:
        infer(url_of(srv, proto), "chain", v, ["y"], proto)
    assert "b" in e.value.message(), e.value.message()
    if proto == "grpc":
        assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value


def index_entries(s):
    with grpcclient.InferenceServerClient(s.grpc_url) as c:
        g = {m.name: (m.state, m.reason)
             for m in c.get_model_repository_index(as_json=False).models}
    status, doc, raw = http_json(s.http_url, "POST", "/v2/repository/index", {})
    assert status == 200, raw
    return g, {m["name"]: (m.get("state"), m.get("reason", "")) for m in doc}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_load(srv, name):
    for what, entries in zip(("gRPC", "REST"), index_entries(srv)):
        state, reason = entries[name]
        assert state == "UNAVAILABLE", f"{what} index: {name} is {state}"
        for part in REFUSED[name][3]:
            assert part in reason, f"{what} index: {name}: {reason!r} lacks {part!r}"


def test_steps_stay_addressable(srv):
    for what, entries in zip(("gRPC", "REST"), index_entries(srv)):
        for name in ("chain", "loose", "mlp", "two_io"):
            assert entries[name][0] == "READY", f"{what} index: {name}: {entries}"


# ---- metadata and configuration -------------------------------------------------------

def test_metadata_shows_the_client_tensors(srv):
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        g = c.get_model_metadata("chain", as_json=False)
    assert g.platform == "ensemble"
    assert [(t.name, t.datatype, list(t.shape)) for t in g.inputs] == [
        ("a", "FP32", [-1, 8]), ("b", "INT32", [-1, 3]), ("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in g.outputs] == [
        ("s2", "FP32", [-1, 8]), ("am1", "INT32", [-1]), ("y", "FP32", [-1, 4])]
    with httpclient.InferenceServerClient(srv.http_url) as c:
        h = c.get_model_metadata("chain")
    assert h["platform"] == "ensemble"
    assert [(t["name"], t["datatype"], t["shape"]) for t in h["inputs"]] == [
        ("a", "FP32", [-1, 8]), ("b", "INT32", [-1, 3]), ("x", "FP32", [-1, 16])]
    assert [t["name"] for t in h["outputs"]] == ["s2", "am1", "y"]


EXPECTED_STEPS = [
    ("two_io", -1, {"a": "s1", "b": "b"}, {"sum": "s2"}),
    ("two_io", 1, {"a": "a", "b": "b"}, {"sum": "s1", "argmax": "am1"}),
    ("mlp", -1, {"x": "x"}, {"y": "y"}),
]


def test_config_reports_ensemble_scheduling(srv):
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        g = c.get_model_config("chain", as_json=False).config
    assert g.platform == "ensemble"
    assert g.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    assert [(s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
            for s in g.ensemble_scheduling.step] == EXPECTED_STEPS
    assert [i.name for i in g.input] == ["a", "b", "x"]
    assert [o.name for o in g.output] == ["s2", "am1", "y"]
    with httpclient.InferenceServerClient(srv.http_url) as c:
        h = c.get_model_config("chain")
    assert h["platform"] == "ensemble"
    assert "dynamic_batching" not in h, h
    assert [(s["model_name"], s["model_version"], s["input_map"], s["output_map"])
            for s in h["ensemble_scheduling"]["step"]] == EXPECTED_STEPS
    assert [i["name"] for i in h["input"]] == ["a", "b", "x"]


def test_step_models_keep_their_own_config(srv):
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        g = c.get_model_config("mlp", as_json=False).config
    assert g.platform.startswith("pjrt_"), g.platform
    assert g.WhichOneof("scheduling_choice") != "ensemble_scheduling"


# ---- reloads and a step model unloaded ------------------------------------------------

def test_reload_and_config_override_keep_serving(srv):
    v = chain_inputs(2, seed=8)
    before = infer(srv.grpc_url, "chain", v, ["s2", "am1", "y"])
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        c.load_model("chain")
        assert c.is_model_ready("chain")
        # A config override may restate the platform ModelConfig reports.
        c.load_model("chain", config=json.dumps({"name": "chain", "platform": "ensemble"}))
        assert c.is_model_ready("chain")
        with pytest.raises(InferenceServerException) as e:
            c.load_model("chain", config=json.dumps({"name": "chain", "platform": "pjrt_cpu"}))
        assert grpc_code(e.value) == "INVALID_ARGUMENT", e.value
        assert 'platform "pjrt_cpu"' in e.value.message() and '"ensemble"' in e.value.message()
        assert c.is_model_ready("chain")
    after = infer(srv.grpc_url, "chain", v, ["s2", "am1", "y"])
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_unloaded_step_makes_the_ensemble_not_ready(srv):
    v = chain_inputs(1, seed=3)
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        c.unload_model("mlp")
        try:
            assert not c.is_model_ready("chain")
            with pytest.raises(InferenceServerException) as e:
                infer(srv.grpc_url, "chain", v, ["y"])
            assert grpc_code(e.value) == "UNAVAILABLE", e.value
            assert 'the model it calls, "mlp", is not loaded' in e.value.message(), e.value
            status, doc, raw = http_json(srv.http_url, "GET", "/v2/models/chain/ready")
            assert status == 400, raw
        finally:
            c.load_model("mlp")
        assert c.is_model_ready("chain")
    got = infer(srv.grpc_url, "chain", v, ["y"])
    np.testing.assert_allclose(got["y"], infer(srv.grpc_url, "mlp", {"x": v["x"]}, ["y"])["y"],
                               rtol=1e-6, atol=1e-6)
