"""The model repository extension: index, unload, load (gRPC and HTTP).

Only mlp_reload (a renamed copy of mlp) is unloaded, and every test loads it
back, so the other tests see a full repository."""

import pytest
from tritonclient.utils import InferenceServerException

from protocol_util import (ALL_MODELS, RELOAD_MODEL, grpc_code, grpc_infer_case,
                           http_infer_case, http_json, http_request)


@pytest.fixture
def reload_model(gclient):
    yield RELOAD_MODEL
    try:  # whatever happened, leave it loaded
        if not gclient.is_model_ready(RELOAD_MODEL):
            gclient.load_model(RELOAD_MODEL)
    except InferenceServerException:
        gclient.load_model(RELOAD_MODEL)


def _grpc_index(gclient):
    return {m.name: m for m in gclient.get_model_repository_index().models}


def _http_index(server, body=None):
    status, doc, raw = http_json(server.http_url, "POST", "/v2/repository/index",
                                 body if body is not None else {})
    assert status == 200, raw
    assert isinstance(doc, list), doc
    return {m["name"]: m for m in doc}


def test_index_lists_every_model_ready(gclient, server):
    idx = _grpc_index(gclient)
    assert sorted(idx) == sorted(ALL_MODELS)
    for name, m in idx.items():
        assert m.state == "READY", m
        assert m.version in ("1", ""), m
    hidx = _http_index(server)
    assert sorted(hidx) == sorted(ALL_MODELS)
    assert all(m["state"] == "READY" for m in hidx.values()), hidx
    ready_only = _http_index(server, {"ready": True})
    assert sorted(ready_only) == sorted(ALL_MODELS)
    # An empty POST body means no options.
    status, _, raw = http_request(server.http_url, "POST", "/v2/repository/index")
    assert status == 200, raw


def _assert_unavailable(gclient, hclient, case):
    assert not gclient.is_model_ready(case.model)
    assert not hclient.is_model_ready(case.model)
    with pytest.raises(InferenceServerException) as ei:
        grpc_infer_case(gclient, case)
    assert grpc_code(ei.value) == "UNAVAILABLE", f"gRPC infer on an unloaded model: {ei.value}"
    assert case.model in ei.value.message()
    with pytest.raises(InferenceServerException) as ei:
        http_infer_case(hclient, case)
    assert ei.value.status() == "503", f"HTTP infer on an unloaded model: {ei.value}"


def _assert_serving(gclient, hclient, case):
    assert gclient.is_model_ready(case.model)
    got, _ = grpc_infer_case(gclient, case)
    case.check(got, "grpc after load")
    got, _ = http_infer_case(hclient, case)
    case.check(got, "http after load")


def test_grpc_unload_load_round_trip(gclient, hclient, server, cases, reload_model):
    case = cases.get(reload_model, 3)
    _assert_serving(gclient, hclient, case)
    gclient.unload_model(reload_model)
    _assert_unavailable(gclient, hclient, case)
    idx = _grpc_index(gclient)
    assert idx[reload_model].state == "UNAVAILABLE", idx[reload_model]
    assert idx["mlp"].state == "READY"
    hidx = _http_index(server)
    assert hidx[reload_model]["state"] == "UNAVAILABLE", hidx[reload_model]
    assert reload_model not in _http_index(server, {"ready": True})
    # Other models are untouched; the server stays ready (Triton: a model
    # unloaded on request does not make the server unready).
    got, _ = grpc_infer_case(gclient, cases.get("mlp", 3))
    cases.get("mlp", 3).check(got)
    status, _, _ = http_request(server.http_url, "GET", "/v2/health/ready")
    assert status == 200, "server not ready while one model is unloaded on request"
    gclient.load_model(reload_model)
    _assert_serving(gclient, hclient, case)
    assert _grpc_index(gclient)[reload_model].state == "READY"


def test_http_unload_load_round_trip(gclient, hclient, server, cases, reload_model):
    case = cases.get(reload_model, 8)
    status, _, raw = http_request(server.http_url, "POST",
                                  f"/v2/repository/models/{reload_model}/unload", b"{}",
                                  {"Content-Type": "application/json"})
    assert status == 200, raw
    _assert_unavailable(gclient, hclient, case)
    status, _, _ = http_request(server.http_url, "GET", f"/v2/models/{reload_model}/ready")
    assert status != 200
    status, _, raw = http_request(server.http_url, "POST",
                                  f"/v2/repository/models/{reload_model}/load")
    assert status == 200, raw
    _assert_serving(gclient, hclient, case)


def test_tritonclient_http_repository_calls(hclient, gclient, cases, reload_model):
    case = cases.get(reload_model, 1)
    idx = {m["name"]: m for m in hclient.get_model_repository_index()}
    assert idx[reload_model]["state"] == "READY"
    hclient.unload_model(reload_model)
    _assert_unavailable(gclient, hclient, case)
    hclient.load_model(reload_model)
    _assert_serving(gclient, hclient, case)


def test_load_of_a_loaded_model_reloads(gclient, hclient, cases, reload_model):
    gclient.load_model(reload_model)
    _assert_serving(gclient, hclient, cases.get(reload_model, 4))


def test_unload_twice(gclient, hclient, cases, reload_model):
    gclient.unload_model(reload_model)
    try:
        gclient.unload_model(reload_model)
    except InferenceServerException as e:  # accepted or refused cleanly, never INTERNAL
        assert grpc_code(e) in ("NOT_FOUND", "UNAVAILABLE", "INVALID_ARGUMENT",
                                "FAILED_PRECONDITION"), e
    _assert_unavailable(gclient, hclient, cases.get(reload_model, 1))
    gclient.load_model(reload_model)
    _assert_serving(gclient, hclient, cases.get(reload_model, 1))


def test_load_unknown_model(gclient, server):
    with pytest.raises(InferenceServerException) as ei:
        gclient.load_model("no_such_model")
    assert grpc_code(ei.value) in ("NOT_FOUND", "INVALID_ARGUMENT"), ei.value
    # Triton's wording first: its model control examples look for "failed to load"
    assert ei.value.message().startswith("failed to load 'no_such_model': "), ei.value
    status, doc, raw = http_json(server.http_url, "POST",
                                 "/v2/repository/models/no_such_model/load", {})
    assert status in (400, 404), raw
    assert doc["error"].startswith("failed to load 'no_such_model': "), raw


def test_refused_config_override_says_failed_to_load(gclient, hclient, reload_model):
    for client in (gclient, hclient):
        with pytest.raises(InferenceServerException) as ei:
            client.load_model(reload_model, config='"parameters": {"config": {}}')
        assert ei.value.message().startswith(f"failed to load '{reload_model}': "), ei.value



def test_unload_load_under_load(server, cases, reload_model):
    """Requests racing with unload/load either succeed with correct outputs or
    fail UNAVAILABLE / 503; nothing hangs, nothing is wrong."""
    import threading
    import time

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from protocol_util import run_threads
    stop = threading.Event()
    lock = threading.Lock()
    seen = {"ok": 0, "unavailable": 0}
    bad = []
    case = cases.get(reload_model, 4)

    def worker(tid):
        if tid % 2:
            c = grpcclient.InferenceServerClient(server.grpc_url)
        else:
            c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            while not stop.is_set():
                try:
                    if tid % 2:
                        got, _ = grpc_infer_case(c, case, client_timeout=60)
                    else:
                        got, _ = http_infer_case(c, case)
                    case.check(got, "during unload/load")
                    k = "ok"
                except InferenceServerException as e:
                    if grpc_code(e) in ("UNAVAILABLE", "503"):
                        k = "unavailable"
                    else:
                        with lock:
                            bad.append(f"{e.status()}: {e.message()}")
                        continue
                except AssertionError as e:
                    with lock:
                        bad.append(f"wrong output: {e}")
                    continue
                with lock:
                    seen[k] += 1
        finally:
            c.close()

    admin = grpcclient.InferenceServerClient(server.grpc_url)
    t = threading.Thread(target=lambda: run_threads(worker, 6, timeout=120), daemon=True)
    t.start()
    try:
        for _ in range(5):
            time.sleep(0.15)
            admin.unload_model(reload_model)
            time.sleep(0.15)
            admin.load_model(reload_model)
        time.sleep(0.15)
    finally:
        stop.set()
        t.join(150)
        admin.close()
    assert not t.is_alive(), "client threads hang"
    assert not bad, bad[:3]
    assert seen["ok"] > 0, seen
