"""The model control surface: the pjserve.control.v1.ModelControl gRPC service
and the REST endpoints under /v2/pjserve/ (docs/serving.md, "Model control"),
and the weight-cache metrics they move.

The gRPC client needs no generated stubs: the message classes are built at
run time from the descriptors the server itself returns over server
reflection (grpcio and protobuf only, no tritonclient), which also checks that
reflection describes the service. REST is driven with http.client.

What is checked:

  - reflection lists the service and its five methods;
  - ModelControlStatus lists every model of the repository index with
    sensible fields, agrees with GET /v2/pjserve/control, and takes names
    (NOT_FOUND for an unknown one);
  - SetModelPolicy (gRPC) and POST .../policy (REST) change weight, queue
    depth and default timeout, each field on its own, and the status and
    /metrics show it; out-of-range values, a change of nothing, unknown
    fields, wrong JSON types and unknown models are refused;
  - SetModelResidency with an unknown model or residency value is refused;
    a model that is not loaded is UNAVAILABLE;
  - in --model-control-mode explicit, a request for a model whose weights
    are not on the device fails FAILED_PRECONDITION (gRPC) / 400 (HTTP,
    status_map.h's mapping of FAILED_PRECONDITION) naming the model; after
    SetModelResidency(DEVICE) it is answered correctly; after HOST it fails
    again; Compact loads the models it is given and frees them again; the
    load, eviction and resident-byte metrics and the cache's used and
    pinned bytes follow each step, and the budget gauge shows the budget.
"""

import json
import math
import threading

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from control_client import SERVICE, ControlClient, ControlError, reflected_services
from protocol_util import (BUDGET, EVICTIONS, LOAD_SECONDS, LOADS, PINNED, RESIDENT, USED,
                           grpc_code, grpc_infer_case, http_json, http_request, metric,
                           parse_metrics, scrape, serve_only)

METHODS = {"ModelControlStatus", "SetModelResidency", "SetModelPolicy", "Compact", "NodeStatus"}

RESIDENCY_NAMES = {"DEVICE": "device", "HOST": "host", "UNPINNED": "unpinned"}


@pytest.fixture
def control(server):
    c = ControlClient(server.grpc_url)
    yield c
    c.close()


def expect_error(code: grpc.StatusCode, fn, *args, **kw) -> str:
    with pytest.raises(ControlError) as info:
        fn(*args, **kw)
    assert info.value.code == code, f"expected {code.name}, got {info.value}"
    return info.value.details


def http_expect(srv, method: str, path: str, status: int, doc=None, body: bytes = None):
    """Sends doc as JSON (or body as it is); checks the status; returns the
    parsed reply, or the message of an error reply."""
    if body is None:
        body = b"" if doc is None else json.dumps(doc).encode()
    got, _, raw = http_request(srv.http_url, method, path, body,
                               {"Content-Type": "application/json"})
    assert got == status, f"{method} {path} {body!r}: HTTP {got} {raw!r}, expected {status}"
    parsed = json.loads(raw) if raw else None
    if status != 200:
        assert isinstance(parsed, dict) and isinstance(parsed.get("error"), str), raw
        return parsed["error"]
    return parsed


def rest_status(srv):
    status, doc, raw = http_json(srv.http_url, "GET", "/v2/pjserve/control")
    assert status == 200, raw
    return doc


# ---- reflection and status -------------------------------------------------------------

def test_reflection_describes_the_service(server, control):
    assert SERVICE in reflected_services(control.channel)
    assert {m.name for m in control.service.methods} == METHODS
    assert control.service.methods_by_name["SetModelResidency"].output_type.name == "ModelStatus"


def check_loaded(m, where: str):
    assert m.residency != 0, f"{where}: no residency"
    assert m.weight_bytes > 0, where
    assert m.weight > 0 and math.isfinite(m.weight), where
    assert 1 <= m.max_queue_depth <= 1 << 24, where
    assert m.loads >= m.evictions, where
    assert m.load_seconds >= 0, where
    if m.resident:
        assert m.loads >= 1, f"{where}: resident without a load"
    if m.loads > 0:
        assert m.load_seconds > 0, f"{where}: {m.loads} loads in no time"


def test_status_lists_every_model(server, control):
    index = {m["name"]: m for m in http_json(server.http_url, "POST",
                                             "/v2/repository/index", {})[1]}
    st = control.status()
    assert st.control_mode == "dynamic"
    assert st.cache.unlimited == (st.cache.budget_bytes == 0)
    names = [m.name for m in st.models]
    assert names == sorted(index), (names, sorted(index))
    for m in st.models:
        assert m.state == index[m.name]["state"], m
        if m.state == "READY":
            check_loaded(m, m.name)
    resident = sum(m.weight_bytes for m in st.models if m.resident and
                   control.residency_name(m) != "DEVICE")
    assert st.cache.used_bytes <= resident, (st.cache, resident)

    doc = rest_status(server)
    assert doc["control_mode"] == "dynamic"
    assert set(doc["cache"]) == {"budget_bytes", "unlimited", "used_bytes", "pinned_bytes",
                                 "host_budget_bytes", "host_unlimited", "host_used_bytes",
                                 "host_pinned_bytes"}
    # no host tier: every floor kept, none counted under a budget
    assert doc["cache"]["host_unlimited"] and doc["cache"]["host_used_bytes"] == 0
    assert st.cache.host_unlimited and st.cache.host_budget_bytes == 0
    assert [m["name"] for m in doc["models"]] == names
    for g, r in zip(st.models, doc["models"]):
        assert r["state"] == g.state and r["reason"] == g.reason
        if g.state == "READY":
            assert r["residency"] == RESIDENCY_NAMES[control.residency_name(g)]
            assert r["weight_bytes"] == g.weight_bytes
            assert r["weight"] == g.weight and r["max_queue_depth"] == g.max_queue_depth
            assert r["default_timeout_us"] == g.default_timeout_us
            assert r["in_host"] == g.in_host == (r["residency"] != "unpinned")


def test_status_of_named_models(server, control):
    st = control.status(["two_io", "mlp"])
    assert [m.name for m in st.models] == ["two_io", "mlp"]
    details = expect_error(grpc.StatusCode.NOT_FOUND, control.status, ["mlp", "no_such_model"])
    assert "no_such_model" in details


def test_rest_routes(server):
    http_expect(server, "POST", "/v2/pjserve/control", 405, {})
    http_expect(server, "GET", "/v2/pjserve/compact", 405)
    http_expect(server, "GET", "/v2/pjserve/models/mlp/policy", 405)
    http_expect(server, "GET", "/v2/pjserve/models/mlp/residency", 405)
    http_expect(server, "GET", "/v2/pjserve/nothing", 404)
    http_expect(server, "POST", "/v2/pjserve/models/mlp/pin", 404, {})


# ---- policy ------------------------------------------------------------------------

@serve_only("the policy gauges are each worker's")
def test_set_policy(server_factory):
    srv = server_factory(["--model-weight", "two_io=3"])
    c = ControlClient(srv.grpc_url)
    try:
        before = c.model("mlp")
        assert (before.weight, before.max_queue_depth, before.default_timeout_us) == (1, 1024, 0)
        assert c.model("two_io").weight == 3

        got = c.set_policy("mlp", weight=2.5, max_queue_depth=64)
        assert (got.name, got.weight, got.max_queue_depth, got.default_timeout_us) == \
            ("mlp", 2.5, 64, 0)
        assert c.model("mlp").weight == 2.5

        doc = http_expect(srv, "POST", "/v2/pjserve/models/mlp/policy", 200,
                          {"default_timeout_us": 50000})
        assert (doc["name"], doc["weight"], doc["max_queue_depth"],
                doc["default_timeout_us"]) == ("mlp", 2.5, 64, 50000)
        got = c.set_policy("mlp", default_timeout_us=0)
        assert (got.weight, got.max_queue_depth, got.default_timeout_us) == (2.5, 64, 0)
        doc = http_expect(srv, "POST", "/v2/pjserve/models/mlp/policy", 200, {"weight": 4})
        assert doc["weight"] == 4 and doc["max_queue_depth"] == 64

        samples, _ = parse_metrics(scrape(srv.metrics_url))
        assert metric(samples, "pjserve_model_weight", model="mlp", version="1") == 4
        assert metric(samples, "pjserve_model_weight", model="two_io", version="1") == 3
        assert c.model("two_io").weight == 3, "another model's policy changed"

        # With a queue bound of 1 the model still answers.
        c.set_policy("mlp", max_queue_depth=1)
        assert http_json(srv.http_url, "POST", "/v2/models/mlp/infer", {"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})[0] == 200
    finally:
        c.close()
    assert not srv.stop_and_check()


@pytest.mark.parametrize("policy, words", [
    ({"weight": 0}, "weight"),
    ({"weight": -1.5}, "weight"),
    ({"weight": float("inf")}, "weight"),
    ({"weight": float("nan")}, "weight"),
    ({"max_queue_depth": 0}, "max_queue_depth"),
    ({"max_queue_depth": (1 << 24) + 1}, "max_queue_depth"),
    ({"max_queue_depth": (1 << 64) - 1}, "max_queue_depth"),
    ({"default_timeout_us": 86400000001}, "default_timeout_us"),
    ({}, "sets nothing"),
])
def test_grpc_policy_refusals(server, control, policy, words):
    before = control.model("mlp")
    details = expect_error(grpc.StatusCode.INVALID_ARGUMENT, control.set_policy, "mlp", **policy)
    assert "mlp" in details and words in details, details
    after = control.model("mlp")
    assert (after.weight, after.max_queue_depth, after.default_timeout_us) == \
        (before.weight, before.max_queue_depth, before.default_timeout_us)


@pytest.mark.parametrize("body, words", [
    (b'{"weight": 0}', "weight"),
    (b'{"weight": "2"}', "\"weight\" must be a number"),
    (b'{"weight": true}', "\"weight\" must be a number"),
    (b'{"max_queue_depth": 2.5}', "\"max_queue_depth\" must be an integer"),
    (b'{"max_queue_depth": -1}', "max_queue_depth must be in 1..16777216"),
    (b'{"default_timeout_us": -5}', "default_timeout_us must be in 0.."),
    (b'{"default_timeout_us": null}', "\"default_timeout_us\" must be an integer"),
    (b'{"weigth": 2}', "unknown field \"weigth\""),
    (b'{"weight": 2, "weight": 3}', "duplicate"),
    (b'{}', "sets nothing"),
    (b'', "needs a JSON body"),
    (b'[1]', "must be an object"),
    (b'{"weight": 2', "malformed JSON"),
])
def test_rest_policy_refusals(server, body, words):
    err = http_expect(server, "POST", "/v2/pjserve/models/mlp/policy", 400, body=body)
    assert words in err, err
    assert err.startswith("model mlp: "), err


def test_unknown_model(server, control):
    for fn, kw in ((control.set_policy, {"weight": 2}), (control.set_residency,
                                                         {"residency": "DEVICE"})):
        details = expect_error(grpc.StatusCode.NOT_FOUND, fn, "no_such_model", **kw)
        assert "no_such_model" in details
    for what, doc in (("policy", {"weight": 2}), ("residency", {"residency": "host"})):
        err = http_expect(server, "POST", f"/v2/pjserve/models/no_such_model/{what}", 404, doc)
        assert "no_such_model" in err
    expect_error(grpc.StatusCode.NOT_FOUND, control.compact, ["no_such_model"])
    http_expect(server, "POST", "/v2/pjserve/compact", 404, {"reload": ["no_such_model"]})


# ---- residency -----------------------------------------------------------------------

def test_residency_refusals(server, control):
    details = expect_error(grpc.StatusCode.INVALID_ARGUMENT, control.set_residency, "mlp", 0)
    assert "mlp" in details and "no residency" in details
    details = expect_error(grpc.StatusCode.INVALID_ARGUMENT, control.set_residency, "mlp", 7)
    assert "unknown residency 7" in details
    for doc, words in (({"residency": "gpu"}, "unknown residency \"gpu\""),
                       ({"residency": "DEVICE"}, "unknown residency \"DEVICE\""),
                       ({"residency": 1}, "must be a string"),
                       ({}, "no \"residency\" given"),
                       ({"residency": "host", "pin": True}, "unknown field \"pin\"")):
        err = http_expect(server, "POST", "/v2/pjserve/models/mlp/residency", 400, doc)
        assert err.startswith("model mlp: ") and words in err, err
    for body in (b'{"reload": "mlp"}', b'{"reload": [1]}', b'{"reload": [""]}',
                 b'{"reloads": []}', b'"mlp"'):
        http_expect(server, "POST", "/v2/pjserve/compact", 400, body=body)


def test_model_not_loaded(server_factory):
    srv = server_factory()
    c = ControlClient(srv.grpc_url)
    try:
        assert http_request(srv.http_url, "POST", "/v2/repository/models/two_io/unload")[0] == 200
        m = c.model("two_io")
        assert m.state == "UNAVAILABLE" and m.reason, m
        assert (m.residency, m.weight_bytes, m.weight, m.resident) == (0, 0, 0, False)
        doc = next(d for d in rest_status(srv)["models"] if d["name"] == "two_io")
        assert set(doc) == {"name", "state", "reason"}, doc
        expect_error(grpc.StatusCode.UNAVAILABLE, c.set_residency, "two_io", "DEVICE")
        expect_error(grpc.StatusCode.UNAVAILABLE, c.set_policy, "two_io", weight=2)
        http_expect(srv, "POST", "/v2/pjserve/models/two_io/residency", 503,
                    {"residency": "device"})
        http_expect(srv, "POST", "/v2/pjserve/models/two_io/policy", 503, {"weight": 2})
        assert c.model("mlp").state == "READY"
    finally:
        c.close()
    assert not srv.stop_and_check()


# ---- explicit mode -----------------------------------------------------------------------

BUDGET_BYTES = 1 << 20


def weight_samples(srv, model: str):
    samples, types = parse_metrics(scrape(srv.metrics_url))
    for name, kind in ((LOADS, "counter"), (EVICTIONS, "counter"), (RESIDENT, "gauge"),
                       (LOAD_SECONDS, "counter"), (BUDGET, "gauge"), (USED, "gauge"),
                       (PINNED, "gauge")):
        assert types.get(name) == kind, f"{name}: type {types.get(name)}"
    per_model = {n: metric(samples, n, model=model, version="1")
                 for n in (LOADS, EVICTIONS, RESIDENT, LOAD_SECONDS)}
    cache = {n: metric(samples, n) for n in (BUDGET, USED, PINNED)}
    return per_model, cache


def expect_precondition(srv, case):
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            grpc_infer_case(g, case)
    finally:
        g.close()
    assert grpc_code(info.value) == "FAILED_PRECONDITION", info.value
    assert "mlp" in info.value.message(), info.value
    body = {"inputs": [{"name": s.name, "datatype": "FP32", "shape": list(case.inputs[s.name].shape),
                        "data": case.inputs[s.name].ravel().tolist()}
                       for s in case.manifest.inputs]}
    err = http_expect(srv, "POST", "/v2/models/mlp/infer", 400, body)
    assert "mlp" in err, err


def infer_ok(srv, case):
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        got, _ = grpc_infer_case(g, case)
    finally:
        g.close()
    case.check(got, "explicit mode, pinned")


@serve_only("the weight cache gauges are each worker's")
def test_explicit_mode(server_factory, cases):
    srv = server_factory(["--model-control-mode", "explicit",
                          "--device-weight-budget", str(BUDGET_BYTES)])
    c = ControlClient(srv.grpc_url)
    case = cases.get("mlp", 3)
    try:
        st = c.status()
        assert st.control_mode == "explicit"
        assert (st.cache.budget_bytes, st.cache.unlimited) == (BUDGET_BYTES, False)
        assert (st.cache.used_bytes, st.cache.pinned_bytes) == (0, 0)
        mlp = c.model("mlp")
        assert not mlp.resident and mlp.loads == 0, mlp
        size = mlp.weight_bytes
        assert size > 0
        per_model, cache = weight_samples(srv, "mlp")
        assert per_model == {LOADS: 0, EVICTIONS: 0, RESIDENT: 0, LOAD_SECONDS: 0}
        assert cache == {BUDGET: BUDGET_BYTES, USED: 0, PINNED: 0}

        expect_precondition(srv, case)

        got = c.set_residency("mlp", "DEVICE")
        assert (c.residency_name(got), got.resident, got.loads, got.evictions) == \
            ("DEVICE", True, 1, 0), got
        assert got.load_seconds > 0
        infer_ok(srv, case)
        per_model, cache = weight_samples(srv, "mlp")
        assert (per_model[LOADS], per_model[EVICTIONS], per_model[RESIDENT]) == (1, 0, size)
        assert per_model[LOAD_SECONDS] > 0
        assert (cache[USED], cache[PINNED]) == (0, size)
        assert c.status().cache.pinned_bytes == size

        got = c.set_residency("mlp", "HOST")
        assert (c.residency_name(got), got.resident, got.loads, got.evictions) == \
            ("HOST", False, 1, 1), got
        expect_precondition(srv, case)
        per_model, cache = weight_samples(srv, "mlp")
        assert (per_model[LOADS], per_model[EVICTIONS], per_model[RESIDENT]) == (1, 1, 0)
        assert (cache[USED], cache[PINNED]) == (0, 0)

        # The same over REST.
        doc = http_expect(srv, "POST", "/v2/pjserve/models/mlp/residency", 200,
                          {"residency": "device"})
        assert (doc["residency"], doc["resident"], doc["loads"]) == ("device", True, 2), doc
        infer_ok(srv, case)

        # Compact loads what it is told to (an evictable model) and frees it
        # again next time; the pinned model stays.
        two_io = c.model("two_io")
        assert not two_io.resident
        assert c.compact(["two_io"]) == 1
        two_io = c.model("two_io")
        assert two_io.resident and two_io.loads == 1, two_io
        st = c.status()
        assert (st.cache.used_bytes, st.cache.pinned_bytes) == (two_io.weight_bytes, size)
        per_model, cache = weight_samples(srv, "two_io")
        assert (per_model[LOADS], per_model[RESIDENT]) == (1, two_io.weight_bytes)
        assert cache[USED] == two_io.weight_bytes

        doc = http_expect(srv, "POST", "/v2/pjserve/compact", 200)
        assert doc == {"reloaded": 0}
        two_io = c.model("two_io")
        assert not two_io.resident and two_io.evictions == 1, two_io
        assert c.model("mlp").resident, "compact freed a pinned model"
        per_model, cache = weight_samples(srv, "two_io")
        assert (per_model[EVICTIONS], per_model[RESIDENT]) == (1, 0)
        assert (cache[USED], cache[PINNED]) == (0, size)
        infer_ok(srv, case)
    finally:
        c.close()
    assert not srv.stop_and_check()


def test_unlimited_budget_is_inf(server):
    _, cache = weight_samples(server, "mlp")
    st = rest_status(server)["cache"]
    if st["unlimited"]:
        assert cache[BUDGET] == math.inf and st["budget_bytes"] == 0
    else:
        assert cache[BUDGET] == st["budget_bytes"] > 0


def test_concurrent_control_calls_with_one_queue_thread(server_factory):
    """SetModelResidency and Compact are answered from the control job threads
    (deferred calls): with one completion-queue thread, 24 of them from four
    clients at once all succeed while liveness checks on the same server keep
    being answered, and the server stops cleanly afterwards."""
    srv = server_factory(["--model-control-mode", "explicit", "--grpc-threads", "1"])
    clients = [ControlClient(srv.grpc_url) for _ in range(4)]
    live = grpcclient.InferenceServerClient(srv.grpc_url)
    errors, done = [], []

    def churn(c: ControlClient, k: int):
        try:
            for i in range(6):
                if (i + k) % 3 == 2:
                    c.compact(["mlp"])
                else:
                    c.set_residency("mlp" if i % 2 else "two_io",
                                    "DEVICE" if (i + k) % 2 else "HOST")
        except ControlError as e:
            errors.append(str(e))
        done.append(k)

    threads = [threading.Thread(target=churn, args=(c, k)) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    checks = 0
    while len(done) < len(threads):
        assert live.is_server_live(client_timeout=30)
        checks += 1
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    live.close()
    assert errors == []
    assert checks >= 1
    assert srv.stop_and_check() == []
