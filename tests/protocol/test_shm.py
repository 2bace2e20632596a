"""System shared memory (tritonclient.utils.shared_memory) over gRPC and HTTP on
a server started with --allow-client-shm; refusal on the default server. CUDA
shared memory on a machine without the NVIDIA driver: registering says so,
malformed handles are refused, status and unregister work per kind, and CUDA
names share one namespace with system ones (scripts/gpu-check runs the CUDA
path on a GPU)."""

import base64
import ctypes
import json
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from protocol_util import grpc_code, http_request, metric, parse_metrics, scrape

PROTOCOLS = ["grpc", "http"]
_counter = [0]


def _key(tag):
    _counter[0] += 1
    return f"/pjs_proto_{os.getpid()}_{tag}_{_counter[0]}"


@pytest.fixture
def regions():
    """create(name, byte_size) -> handle; every region is destroyed afterwards."""
    made = []

    def create(name, byte_size):
        key = _key(name)
        h = shm.create_shared_memory_region(name, key, byte_size)
        made.append(h)
        return h, key

    yield create
    for h in made:
        shm.destroy_shared_memory_region(h)


def _client(protocol, server):
    if protocol == "grpc":
        return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)
    return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=60)


def _status(client, protocol, name=""):
    st = client.get_system_shared_memory_status(name)
    if protocol == "grpc":
        return {n: {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for n, r in st.regions.items()}
    return {r["name"]: {k: r[k] for k in ("name", "key", "offset", "byte_size")} for r in st}


def _read(handle, dtype, shape, offset=0):
    """A copy of the region's contents (no view left to block closing it)."""
    view = shm.get_contents_as_numpy(handle, dtype, shape, offset=offset)
    out = view.copy()
    del view
    return out


def _assert_not_inline(result, protocol, name):
    """The output written to shared memory is listed but carries no data."""
    if protocol == "grpc":
        resp = result.get_response()
        names = [o.name for o in resp.outputs]
        assert name in names, f"output {name} not listed: {names}"
        idx = names.index(name)
        if idx < len(resp.raw_output_contents):
            assert len(resp.raw_output_contents[idx]) == 0, \
                f"{name}: {len(resp.raw_output_contents[idx])} bytes sent although in shm"
    else:
        outs = {o["name"]: o for o in result.get_response()["outputs"]}
        assert name in outs, f"output {name} not listed: {list(outs)}"
        assert "data" not in outs[name], outs[name]
        # Triton's C++ client (perf_analyzer) reads parameters.binary_data_size
        # of every output that has "parameters": a shm output may carry none,
        # or binary_data_size 0.
        params = outs[name].get("parameters")
        assert params is None or params.get("binary_data_size") == 0, \
            (f"shm output {name} has parameters {params} without binary_data_size: "
             "Triton's C++ HTTP client fails on it")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mlp_inputs_and_outputs_in_shm(shm_server, cases, regions, protocol):
    mod, client = _client(protocol, shm_server)
    case = cases.get("mlp", 3)
    x, want = case.inputs["x"], case.expected["y"]
    try:
        client.unregister_system_shared_memory()
        h_in, k_in = regions("in", x.nbytes)
        h_out, k_out = regions("out", want.nbytes)
        shm.set_shared_memory_region(h_in, [x])
        client.register_system_shared_memory("in", k_in, x.nbytes)
        client.register_system_shared_memory("out", k_out, want.nbytes)
        st = _status(client, protocol)
        assert st == {"in": {"name": "in", "key": k_in, "offset": 0, "byte_size": x.nbytes},
                      "out": {"name": "out", "key": k_out, "offset": 0,
                              "byte_size": want.nbytes}}, st
        assert list(_status(client, protocol, "in")) == ["in"]

        for rnd in range(2):  # the same regions serve several requests
            i = mod.InferInput("x", list(x.shape), "FP32")
            i.set_shared_memory("in", x.nbytes)
            o = mod.InferRequestedOutput("y")
            o.set_shared_memory("out", want.nbytes)
            r = client.infer("mlp", [i], outputs=[o])
            _assert_not_inline(r, protocol, "y")
            got = _read(h_out, np.float32, list(want.shape))
            case.check({"y": got}, f"shm round {rnd}")
            shm.set_shared_memory_region(h_out, [np.zeros_like(want)])

        # values in system shared memory go through the host: none counts as
        # CUDA shared memory used on the device
        samples, types = parse_metrics(scrape(shm_server.metrics_url))
        assert types["pjserve_cuda_shm_device_bytes_total"] == "counter"
        for direction in ("input", "output"):
            assert metric(samples, "pjserve_cuda_shm_device_bytes_total",
                          direction=direction) == 0

        client.unregister_system_shared_memory("in")
        assert list(_status(client, protocol)) == ["out"]
        client.unregister_system_shared_memory()
        assert _status(client, protocol) == {}
    finally:
        try:
            client.unregister_system_shared_memory()
        finally:
            client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_io_offsets_and_mixed_placement(shm_server, cases, regions, protocol):
    """Both inputs in one region at offsets, registered at a non-zero offset into
    the object; `sum` into shm at an offset, `argmax` returned in the reply."""
    mod, client = _client(protocol, shm_server)
    case = cases.get("two_io", 4)
    a, b = case.inputs["a"], case.inputs["b"]
    s_want = case.expected["sum"]
    base = 64  # the registered window starts 64 bytes into the object
    try:
        client.unregister_system_shared_memory()
        h, key = regions("io", base + 256 + a.nbytes + b.nbytes + 32 + s_want.nbytes)
        shm.set_shared_memory_region(h, [b], offset=base + 16)
        shm.set_shared_memory_region(h, [a], offset=base + 16 + b.nbytes)
        window = 256 + a.nbytes + b.nbytes + 32 + s_want.nbytes
        client.register_system_shared_memory("io", key, window, offset=base)
        ia = mod.InferInput("a", list(a.shape), "FP32")
        ia.set_shared_memory("io", a.nbytes, offset=16 + b.nbytes)
        ib = mod.InferInput("b", list(b.shape), "INT32")
        ib.set_shared_memory("io", b.nbytes, offset=16)
        out_off = 16 + a.nbytes + b.nbytes + 32
        os_ = mod.InferRequestedOutput("sum")
        os_.set_shared_memory("io", s_want.nbytes, offset=out_off)
        oa = mod.InferRequestedOutput("argmax")
        r = client.infer("two_io", [ia, ib], outputs=[os_, oa])
        got_sum = _read(h, np.float32, list(s_want.shape), offset=base + out_off)
        # tritonclient finds `argmax` by its index among the outputs, so the
        # reply must keep one (empty) raw entry per output (as Triton does).
        case.check({"sum": got_sum, "argmax": r.as_numpy("argmax")}, "shm offsets")
        _assert_not_inline(r, protocol, "sum")

        # one input inline, the other from shm
        ia2 = mod.InferInput("a", list(a.shape), "FP32")
        ia2.set_data_from_numpy(a)
        r = client.infer("two_io", [ia2, ib])
        case.check({n: r.as_numpy(n) for n in ("sum", "argmax")}, "mixed inline+shm")
    finally:
        try:
            client.unregister_system_shared_memory()
        finally:
            client.close()


def test_http_json_request_with_shm_input(shm_server, cases, regions):
    case = cases.get("mlp", 2)
    x = case.inputs["x"]
    h, key = regions("jin", x.nbytes)
    shm.set_shared_memory_region(h, [x])
    status, _, raw = http_request(shm_server.http_url, "POST",
                                  "/v2/systemsharedmemory/region/jin/register",
                                  json.dumps({"key": key, "offset": 0,
                                              "byte_size": x.nbytes}).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 200, raw
    try:
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                           "parameters": {"shared_memory_region": "jin",
                                          "shared_memory_byte_size": x.nbytes}}]}
        status, _, raw = http_request(shm_server.http_url, "POST", "/v2/models/mlp/infer",
                                      json.dumps(doc).encode(),
                                      {"Content-Type": "application/json"})
        assert status == 200, raw
        out = json.loads(raw)["outputs"][0]
        case.check({"y": np.array(out["data"], np.float32).reshape(out["shape"])}, "json+shm")
        status, _, raw = http_request(shm_server.http_url, "GET",
                                      "/v2/systemsharedmemory/region/jin/status")
        assert status == 200, raw
        st = json.loads(raw)
        assert st == [{"name": "jin", "key": key, "offset": 0, "byte_size": x.nbytes}], st
    finally:
        status, _, raw = http_request(shm_server.http_url, "POST",
                                      "/v2/systemsharedmemory/region/jin/unregister")
        assert status == 200, raw


# ---- errors on the shm server ---------------------------------------------------

def _expect_error(fn, grpc_codes, http_codes, protocol, words=()):
    with pytest.raises(InferenceServerException) as ei:
        fn()
    e = ei.value
    if protocol == "grpc":
        assert grpc_code(e) in grpc_codes, f"{e.status()}: {e.message()}"
    else:
        assert e.status() in {str(c) for c in http_codes}, f"{e.status()}: {e.message()}"
    if words:
        msg = (e.message() or "").lower()
        assert any(w.lower() in msg for w in words), f"message {e.message()!r} names none of {words}"
    return e


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shm_errors(shm_server, cases, regions, protocol):
    mod, client = _client(protocol, shm_server)
    case = cases.get("mlp", 3)
    x = case.inputs["x"]
    try:
        client.unregister_system_shared_memory()
        h, key = regions("err", 1024)
        shm.set_shared_memory_region(h, [x])
        # a key that does not exist
        _expect_error(lambda: client.register_system_shared_memory(
            "ghost", f"/pjs_proto_no_such_key_{os.getpid()}", 64),
            {"NOT_FOUND", "INVALID_ARGUMENT"}, {400, 404}, protocol, ["ghost", "no_such_key"])
        # a window past the end of the object
        _expect_error(lambda: client.register_system_shared_memory("big", key, 4096),
                      {"INVALID_ARGUMENT"}, {400}, protocol)
        _expect_error(lambda: client.register_system_shared_memory("big", key, 512, offset=768),
                      {"INVALID_ARGUMENT"}, {400}, protocol)
        client.register_system_shared_memory("err", key, 1024)
        # the same name twice
        _expect_error(lambda: client.register_system_shared_memory("err", key, 1024),
                      {"ALREADY_EXISTS", "INVALID_ARGUMENT"}, {400, 409}, protocol, ["err"])

        def infer(in_region="err", in_size=x.nbytes, in_off=0, out_size=None, out_off=0):
            i = mod.InferInput("x", list(x.shape), "FP32")
            i.set_shared_memory(in_region, in_size, offset=in_off)
            outs = None
            if out_size is not None:
                o = mod.InferRequestedOutput("y")
                o.set_shared_memory("err", out_size, offset=out_off)
                outs = [o]
            return client.infer("mlp", [i], outputs=outs)

        _expect_error(lambda: infer(in_region="unregistered"), {"INVALID_ARGUMENT", "NOT_FOUND"},
                      {400, 404}, protocol, ["unregistered"])
        _expect_error(lambda: infer(in_size=x.nbytes - 4), {"INVALID_ARGUMENT"}, {400}, protocol)
        _expect_error(lambda: infer(in_off=1024 - 16), {"INVALID_ARGUMENT"}, {400}, protocol)
        _expect_error(lambda: infer(out_size=16, out_off=512), {"INVALID_ARGUMENT"}, {400},
                      protocol, ["y"])
        _expect_error(lambda: infer(out_size=48, out_off=1000), {"INVALID_ARGUMENT"}, {400},
                      protocol)
        # still fine afterwards
        r = infer(out_size=48, out_off=512)
        got = _read(h, np.float32, [3, 4], offset=512)
        case.check({"y": got}, "after errors")
        _assert_not_inline(r, protocol, "y")
    finally:
        try:
            client.unregister_system_shared_memory()
        finally:
            client.close()


# ---- refused where not enabled ---------------------------------------------------------

def test_shm_refused_on_default_server(server, regions, cases):
    h, key = regions("refused", 256)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    hc = httpclient.InferenceServerClient(server.http_url)
    try:
        e = _expect_error(lambda: g.register_system_shared_memory("r", key, 256),
                          {"UNIMPLEMENTED", "INVALID_ARGUMENT"}, (), "grpc",
                          ["allow-client-shm", "shared memory", "shared-memory"])
        e = _expect_error(lambda: hc.register_system_shared_memory("r", key, 256),
                          (), {501}, "http", ["allow-client-shm", "shared memory", "shared-memory"])
        assert e is not None
        # nothing got registered
        assert len(g.get_system_shared_memory_status().regions) == 0
        assert hc.get_system_shared_memory_status() == []
        # and an infer naming a region fails cleanly
        x = cases.get("mlp", 1).inputs["x"]
        i = grpcclient.InferInput("x", [1, 16], "FP32")
        i.set_shared_memory("r", x.nbytes)
        _expect_error(lambda: g.infer("mlp", [i]), {"INVALID_ARGUMENT", "NOT_FOUND",
                                                    "UNIMPLEMENTED"}, (), "grpc")
    finally:
        g.close()
        hc.close()


def test_unregister_while_in_use(shm_server, cases, regions):
    """Unregistering and re-registering a region while requests read from it:
    every request succeeds with correct outputs or fails with a clean
    region-not-found error; the server keeps running."""
    import threading

    from protocol_util import run_threads
    case = cases.get("mlp", 8)
    x = case.inputs["x"]
    h, key = regions("race", x.nbytes)
    shm.set_shared_memory_region(h, [x])
    admin = grpcclient.InferenceServerClient(shm_server.grpc_url)
    admin.unregister_system_shared_memory()
    admin.register_system_shared_memory("race", key, x.nbytes)
    stop = threading.Event()
    lock = threading.Lock()
    bad, seen = [], {"ok": 0, "missing": 0}

    def worker(tid):
        c = grpcclient.InferenceServerClient(shm_server.grpc_url)
        try:
            while not stop.is_set():
                i = grpcclient.InferInput("x", list(x.shape), "FP32")
                i.set_shared_memory("race", x.nbytes)
                try:
                    r = c.infer("mlp", [i], client_timeout=60)
                    case.check({"y": r.as_numpy("y")}, "shm race")
                    k = "ok"
                except InferenceServerException as e:
                    if grpc_code(e) in ("INVALID_ARGUMENT", "NOT_FOUND") and \
                            "race" in e.message():
                        k = "missing"
                    else:
                        with lock:
                            bad.append(f"{e.status()}: {e.message()}")
                        continue
                except AssertionError as e:
                    with lock:
                        bad.append(str(e))
                    continue
                with lock:
                    seen[k] += 1
        finally:
            c.close()

    t = threading.Thread(target=lambda: run_threads(worker, 4, timeout=60), daemon=True)
    t.start()
    try:
        for _ in range(30):
            admin.unregister_system_shared_memory("race")
            admin.register_system_shared_memory("race", key, x.nbytes)
    finally:
        stop.set()
        t.join(90)
        admin.unregister_system_shared_memory()
        admin.close()
    assert not t.is_alive(), "client threads hang"
    assert not bad, bad[:3]
    assert seen["ok"] > 0, seen


# ---- CUDA shared memory without a GPU --------------------------------------------

# A handle's base64 text, as cudashm.get_raw_handle gives it (decoded: the
# gRPC client decodes it, the HTTP client puts it in JSON).
HANDLE = base64.b64encode(bytes(range(64))).decode()


def _has_cuda_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _cuda_status(client, protocol, name=""):
    st = client.get_cuda_shared_memory_status(name)
    if protocol == "grpc":
        return {n: {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}
                for n, r in st.regions.items()}
    return {r["name"]: r for r in st}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shm_register_says_the_driver_is_missing(shm_server, protocol):
    if _has_cuda_driver():
        pytest.skip("this machine has libcuda.so.1: scripts/gpu-check covers CUDA regions")
    _, client = _client(protocol, shm_server)
    try:
        e = _expect_error(lambda: client.register_cuda_shared_memory("c", HANDLE, 0, 64),
                          {"UNIMPLEMENTED"}, {501}, protocol, ["libcuda.so.1"])
        assert "system shared memory" in e.message(), e.message()
        assert _cuda_status(client, protocol) == {}
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shm_malformed_handle(shm_server, protocol):
    _, client = _client(protocol, shm_server)
    try:
        for raw in (b"", bytes(63), bytes(65)):
            _expect_error(lambda: client.register_cuda_shared_memory(
                "c", base64.b64encode(raw).decode(), 0, 64),
                {"INVALID_ARGUMENT"}, {400}, protocol, ["64"])
        _expect_error(lambda: client.register_cuda_shared_memory("c", HANDLE, -1, 64),
                      {"INVALID_ARGUMENT"}, {400}, protocol, ["device_id"])
        assert _cuda_status(client, protocol) == {}
    finally:
        client.close()


@pytest.mark.parametrize("body", [
    {"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64},
    {"raw_handle": {"b64": HANDLE[:-2]}, "device_id": 0, "byte_size": 64},
    {"raw_handle": HANDLE, "device_id": 0, "byte_size": 64},
    {"raw_handle": {"b64": HANDLE}, "device_id": "0", "byte_size": 64},
    {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": -1},
    [],
])
def test_cuda_shm_http_register_body_refused(shm_server, body):
    status, _, raw = http_request(shm_server.http_url, "POST",
                                  "/v2/cudasharedmemory/region/c/register",
                                  json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 400, raw
    assert "raw_handle" in json.loads(raw)["error"] or "byte_size" in raw.decode() \
        or "device_id" in raw.decode(), raw


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_and_system_names_are_one_namespace(shm_server, cases, regions, protocol):
    """A CUDA registration under a system region's name is refused and leaves
    it registered and usable; CUDA status and unregister do not see it."""
    mod, client = _client(protocol, shm_server)
    case = cases.get("mlp", 2)
    x = case.inputs["x"]
    try:
        client.unregister_system_shared_memory()
        h, key = regions("same", x.nbytes)
        shm.set_shared_memory_region(h, [x])
        client.register_system_shared_memory("same", key, x.nbytes)
        _expect_error(lambda: client.register_cuda_shared_memory("same", HANDLE, 0, x.nbytes),
                      {"INVALID_ARGUMENT"}, {400}, protocol, ["already registered"])
        assert _cuda_status(client, protocol) == {}
        _expect_error(lambda: client.get_cuda_shared_memory_status("same"),
                      {"NOT_FOUND"}, {404}, protocol, ["same"])
        _expect_error(lambda: client.unregister_cuda_shared_memory("same"),
                      {"NOT_FOUND"}, {404}, protocol, ["same"])
        client.unregister_cuda_shared_memory()
        assert list(_status(client, protocol)) == ["same"]
        i = mod.InferInput("x", list(x.shape), "FP32")
        i.set_shared_memory("same", x.nbytes)
        r = client.infer("mlp", [i])
        case.check({"y": r.as_numpy("y")}, "system region beside CUDA calls")
    finally:
        try:
            client.unregister_system_shared_memory()
        finally:
            client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shm_refused_when_client_shm_is_off(server, protocol):
    _, client = _client(protocol, server)
    try:
        _expect_error(lambda: client.register_cuda_shared_memory("c", HANDLE, 0, 64),
                      {"UNIMPLEMENTED"}, {501}, protocol, ["allow-client-shm"])
    finally:
        client.close()


@pytest.mark.parametrize("srv", ["server", "shm_server"])
def test_cuda_shm_status_and_unregister_all_are_empty(request, srv):
    """With no CUDA region registered, status lists none and unregistering all
    of them succeeds (as on Triton without GPUs). perf_analyzer calls both
    when it cleans up after --shared-memory runs."""
    s = request.getfixturevalue(srv)
    g = grpcclient.InferenceServerClient(s.grpc_url)
    hc = httpclient.InferenceServerClient(s.http_url)
    try:
        assert len(g.get_cuda_shared_memory_status().regions) == 0
        g.unregister_cuda_shared_memory()
        assert hc.get_cuda_shared_memory_status() == []
        hc.unregister_cuda_shared_memory()
    finally:
        g.close()
        hc.close()
