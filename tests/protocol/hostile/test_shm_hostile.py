"""Hostile clients of system shared memory (--allow-client-shm).

Truncation: a client registers a region, then truncates the object under it
and names the region in a request, as an input or as an output, on gRPC and
on HTTP. The request is refused with INVALID_ARGUMENT / 400 naming the region
("shrank"); the server stays up and serves the next normal request. (Before,
the server mapped the object and died of SIGBUS.)

Floods: registrations beyond --max-shm-regions (default 1024) are refused
with RESOURCE_EXHAUSTED / 429 naming the flag, without the server gaining a
mapping or more than one descriptor for the object, and a repository load
works afterwards (before, 65 k registrations took the kernel's map count and
every later load failed); regions beyond --max-shm-bytes are refused the same
way.
"""

import os
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from protocol_util import grpc_code

from .conftest import open_fds, timed, vm_hwm_mib

# A normal request on an otherwise idle server answers well within this.
NORMAL_LATENCY_S = 2.0
FLOOD = 2000
DEFAULT_MAX_REGIONS = 1024
# What the registration flood may add to the server's peak memory.
FLOOD_HWM_MIB = 64


class PosixShm:
    """A POSIX shared-memory object the test writes and truncates by path
    (never mapped here, so truncating it cannot hurt the test either)."""

    def __init__(self, tag, size):
        self.key = f"/pjs_hostile_{os.getpid()}_{tag}"
        self.path = "/dev/shm" + self.key
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, size)

    def write(self, data: bytes, offset=0):
        assert os.pwrite(self.fd, data, offset) == len(data)

    def read(self, n, offset=0) -> bytes:
        return os.pread(self.fd, n, offset)

    def truncate(self, size):
        os.ftruncate(self.fd, size)

    def close(self):
        os.close(self.fd)
        os.unlink(self.path)


@pytest.fixture
def objects():
    made = []

    def create(tag, size):
        made.append(PosixShm(tag, size))
        return made[-1]

    yield create
    for o in made:
        o.close()


def _clients(server):
    return {"grpc": (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
            "http": (httpclient, httpclient.InferenceServerClient(server.http_url,
                                                                  network_timeout=60))}


def _inputs(mod, case):
    out = []
    for name, a in case.inputs.items():
        i = mod.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def _normal_request(server, mod, client, case, what):
    """A plain request, answered correctly within NORMAL_LATENCY_S."""
    assert server.alive(), f"the server died after {what}\n{server.describe()}"
    r, took = timed(client.infer, case.model, _inputs(mod, case))
    case.check({n: r.as_numpy(n) for n in case.output_names()}, f"after {what}")
    assert took < NORMAL_LATENCY_S, f"a normal request after {what} took {took:.2f} s"
    return took


def _refused(fn, protocol, grpc_status, http_status, words):
    with pytest.raises(InferenceServerException) as ei:
        fn()
    e = ei.value
    got = grpc_code(e) if protocol == "grpc" else e.status()
    want = grpc_status if protocol == "grpc" else str(http_status)
    assert got == want, f"{protocol}: {e.status()}: {e.message()}"
    msg = e.message() or ""
    for w in words:
        assert w in msg, f"{protocol}: message {msg!r} lacks {w!r}"
    return msg


def _map_count(server) -> int:
    with open(f"/proc/{server.proc.pid}/maps") as f:
        return sum(1 for _ in f)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_truncated_region_is_an_error_not_a_crash(server_factory, cases, objects, protocol):
    srv = server_factory(["--allow-client-shm"], names=("mlp",))
    mod, client = _clients(srv)[protocol]
    case = cases.get("mlp", 3)
    x, y = case.inputs["x"], case.expected["y"]
    obj = objects(protocol, x.nbytes + y.nbytes)
    obj.write(x.tobytes())
    client.register_system_shared_memory("in", obj.key, x.nbytes)
    client.register_system_shared_memory("out", obj.key, y.nbytes, offset=x.nbytes)

    def shm_input():
        i = mod.InferInput("x", list(x.shape), "FP32")
        i.set_shared_memory("in", x.nbytes)
        return client.infer("mlp", [i])

    def shm_output():
        o = mod.InferRequestedOutput("y")
        o.set_shared_memory("out", y.nbytes)
        return client.infer("mlp", _inputs(mod, case), outputs=[o])

    shm_input()
    shm_output()  # both serve while the object is whole
    got = np.frombuffer(obj.read(y.nbytes, x.nbytes), dtype=y.dtype).reshape(y.shape)
    case.check({"y": got}, "output through shared memory")

    # Part of the input region left, then none of either.
    for size, what in [(x.nbytes // 2, "half"), (0, "all")]:
        obj.truncate(size)
        msg = _refused(shm_input, protocol, "INVALID_ARGUMENT", 400,
                       ['"in"', "shrank", '"x"'])
        assert f"now holds {size} bytes" in msg, msg
        _normal_request(srv, mod, client, case, f"an input region truncated ({what})")
    _refused(shm_output, protocol, "INVALID_ARGUMENT", 400, ['"out"', "shrank", '"y"'])
    assert os.fstat(obj.fd).st_size == 0, "the server grew the client's truncated object"
    _normal_request(srv, mod, client, case, "an output region truncated")

    # Restored by the client, the same registrations serve again.
    obj.truncate(x.nbytes + y.nbytes)
    obj.write(x.tobytes())
    shm_input()
    shm_output()
    client.unregister_system_shared_memory()
    client.close()
    problems = srv.stop_and_check()
    assert not problems, problems


def test_registration_flood_is_bounded(server_factory, cases, objects):
    srv = server_factory(["--allow-client-shm", "--max-shm-bytes", "64Mi"])
    clients = _clients(srv)
    gmod, g = clients["grpc"]
    hmod, h = clients["http"]
    case = cases.get("mlp", 2)
    _normal_request(srv, gmod, g, case, "start")
    maps_before, fds_before, hwm_before = _map_count(srv), open_fds(srv), vm_hwm_mib(srv)

    obj = objects("flood", 4096)
    refused = []
    for n in range(FLOOD):
        try:
            g.register_system_shared_memory(f"f{n}", obj.key, 64, offset=(n % 64) * 64)
        except InferenceServerException as e:
            refused.append((n, grpc_code(e), e.message()))
    assert len(refused) == FLOOD - DEFAULT_MAX_REGIONS, refused[:3]
    assert refused[0][0] == DEFAULT_MAX_REGIONS, refused[:3]
    assert {code for _, code, _ in refused} == {"RESOURCE_EXHAUSTED"}, refused[:3]
    assert "--max-shm-regions" in refused[0][2], refused[0]
    _refused(lambda: h.register_system_shared_memory("h", obj.key, 64), "http",
             None, 429, ["--max-shm-regions"])
    assert len(g.get_system_shared_memory_status().regions) == DEFAULT_MAX_REGIONS

    # No mapping per region (the allocator may add a few), one descriptor
    # for the object.
    maps_after, fds_after = _map_count(srv), open_fds(srv)
    assert maps_after < maps_before + 64, (maps_before, maps_after)
    assert fds_after <= fds_before + 3, (fds_before, fds_after)  # object + HTTP connection
    assert vm_hwm_mib(srv) < hwm_before + FLOOD_HWM_MIB, (hwm_before, vm_hwm_mib(srv))
    _normal_request(srv, hmod, h, case, "a registration flood")

    # A repository load still works with the registrations in place.
    two = cases.get("two_io", 2)
    g.unload_model("two_io")
    _, took = timed(g.load_model, "two_io")
    assert g.is_model_ready("two_io")
    _normal_request(srv, gmod, g, two, f"a load after the flood ({took:.1f} s)")

    # Registered bytes: 4 x 16 MiB fill 64Mi; one byte more is refused.
    g.unregister_system_shared_memory()
    big = objects("big", 16 << 20)  # sparse: nothing is written
    for n in range(4):
        h.register_system_shared_memory(f"b{n}", big.key, 16 << 20)
    for protocol, c in (("grpc", g), ("http", h)):
        _refused(lambda: c.register_system_shared_memory("b4", big.key, 1), protocol,
                 "RESOURCE_EXHAUSTED", 429, ["--max-shm-bytes"])
    h.unregister_system_shared_memory("b0")
    g.register_system_shared_memory("b4", big.key, 16 << 20)
    g.unregister_system_shared_memory()
    assert open_fds(srv) <= fds_before + 2
    g.close()
    h.close()
    problems = srv.stop_and_check()
    assert not problems, problems


@pytest.mark.parametrize("args, words", [
    (["--max-shm-regions", "0"], "--max-shm-regions 0: expected at least 1"),
    (["--max-shm-regions", "65537"], "expected an integer in 0..65536"),
    (["--max-shm-bytes", "0"], "--max-shm-bytes 0: expected at least 1"),
    (["--max-shm-bytes", "1X"], "--max-shm-bytes 1X: expected a number of bytes"),
])
def test_limit_flags_are_checked(pjserve_bin, tmp_path, args, words):
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert words in r.stderr, r.stderr
