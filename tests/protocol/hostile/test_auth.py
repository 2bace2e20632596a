"""Credentials and exposure: an attacker who reaches the ports calls the admin
surface (repository load/unload, model control, shared memory, logging and
trace settings) and inference, with no token, a wrong one, or from another
host; an operator with the right token is served.

Cases (docs/serving.md, "Credentials"):

  - with --admin-token-file, every admin call on REST and gRPC (tritonclient,
    and the pjserve.control.v1.ModelControl service over a raw channel):
    no token -> 401 with `WWW-Authenticate: Bearer` / UNAUTHENTICATED, a
    wrong one -> 403 / PERMISSION_DENIED, the admin token -> 200 / OK; the
    messages never echo what was sent; inference stays open; a flood of
    wrong-token guesses leaves inference answered within a stated latency;
  - with --infer-token-file too, inference, metadata, statistics and
    /metrics need the inference (or admin) token on both protocols,
    ModelStreamInfer included, while the health probes stay open; the
    inference token does not open admin calls;
  - without a token file, on a server bound to 0.0.0.0: admin calls through
    the machine's non-loopback address -> 403 / PERMISSION_DENIED naming
    --admin-token-file, through 127.0.0.1 -> 200 / OK; inference through
    the non-loopback address is served;
  - the serve log says which rule holds; a token file that is readable by
    others, empty, missing, or equal to the other one stops the start.
"""

import json
import os
import queue
import re
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from protocol_util import grpc_code, grpc_infer_case, grpc_inputs, http_infer_case, http_request

from .conftest import timed, vm_hwm_mib

ADMIN = "adm-7f3c9e1b52d04a86b1e0c4d2a9f85e37"
INFER = "inf-2b8d4f6a1c3e5079d8f2a4c6e1b3d5f7"
WRONG = "not-the-token-0123456789abcdef0123"

CONTROL = "/pjserve.control.v1.ModelControl/"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# A normal request must be answered within this many seconds while attacked.
NORMAL_LATENCY_S = 2.0


def token_file(directory: Path, name: str, token: str, mode: int = 0o600) -> Path:
    p = directory / name
    p.write_text(token + "\n")
    p.chmod(mode)
    return p


def bearer(token):
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def gbearer(token):
    """tritonclient gRPC headers: metadata keys must be lower case (HTTP/2)."""
    return {"authorization": f"Bearer {token}"} if token is not None else {}


def gmeta(token):
    return tuple(gbearer(token).items())


def server_log(server) -> str:
    return server.stderr_text()


def raw_grpc(url: str, method: str, token=None, request: bytes = b""):
    """(status code name, details) of one unary call with raw bytes."""
    with grpc.insecure_channel(url) as ch:
        call = ch.unary_unary(method)
        try:
            call(request, metadata=gmeta(token), timeout=30)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""


# ---- admin calls ------------------------------------------------------------------

def http_admin_calls(region_key: str):
    """(method, path, body) of every REST admin call, in an order that leaves the
    server as it was when each succeeds."""
    reg = json.dumps({"key": region_key, "offset": 0, "byte_size": 64}).encode()
    return [
        ("GET", "/v2/logging", b""),
        ("POST", "/v2/logging", b'{"log_info": true}'),
        ("POST", "/v2/systemsharedmemory/region/auth_r/register", reg),
        ("GET", "/v2/systemsharedmemory/status", b""),
        ("POST", "/v2/systemsharedmemory/region/auth_r/unregister", b""),
        ("GET", "/v2/cudasharedmemory/status", b""),
        ("POST", "/v2/repository/models/two_io/unload", b""),
        ("POST", "/v2/repository/models/two_io/load", b""),
        ("POST", "/v2/pjserve/models/mlp/policy", b'{"weight": 1}'),
        ("POST", "/v2/pjserve/compact", b"{}"),
    ]


def grpc_admin_calls(client, region_key: str):
    """(name, fn(headers)) of every tritonclient gRPC admin call, same order."""
    return [
        ("LogSettings read", lambda h: client.get_log_settings(headers=h)),
        ("LogSettings write", lambda h: client.update_log_settings({"log_info": True},
                                                                   headers=h)),
        ("TraceSetting", lambda h: client.get_trace_settings(headers=h)),
        ("SystemSharedMemoryRegister",
         lambda h: client.register_system_shared_memory("auth_g", region_key, 64, headers=h)),
        ("SystemSharedMemoryStatus",
         lambda h: client.get_system_shared_memory_status(headers=h)),
        ("SystemSharedMemoryUnregister",
         lambda h: client.unregister_system_shared_memory("auth_g", headers=h)),
        ("CudaSharedMemoryStatus", lambda h: client.get_cuda_shared_memory_status(headers=h)),
        ("RepositoryModelUnload", lambda h: client.unload_model("two_io", headers=h)),
        ("RepositoryModelLoad", lambda h: client.load_model("two_io", headers=h)),
    ]


def grpc_outcome(fn, headers):
    try:
        fn(headers)
        return "OK", ""
    except InferenceServerException as e:
        return grpc_code(e), e.message() or ""


@pytest.fixture
def region():
    key = f"/pjs_auth_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    h = shm.create_shared_memory_region("auth", key, 64)
    yield key
    shm.destroy_shared_memory_region(h)


def check_admin_surface(server, region_key, allowed, denied, how_denied, host="127.0.0.1",
                        deny_word=None, served=True):
    """Every admin call once per token in `denied` (expecting how_denied[token]:
    (HTTP status, gRPC code)) and then, when `served`, with `allowed` (expecting
    200 / OK)."""
    http_url = f"{host}:{server.http_port}"
    grpc_url = f"{host}:{server.grpc_port}"
    g = grpcclient.InferenceServerClient(grpc_url)
    try:
        for token in denied:
            want_http, want_grpc = how_denied[token]
            for method, path, body in http_admin_calls(region_key):
                status, headers, data = http_request(http_url, method, path, body, bearer(token))
                assert status == want_http, f"{method} {path} with {token!r}: {status} {data!r}"
                msg = json.loads(data)["error"]
                assert WRONG not in msg and ADMIN not in msg and INFER not in msg
                if deny_word:
                    assert deny_word in msg, msg
                if want_http == 401:
                    assert headers.get("www-authenticate") == "Bearer", headers
            for name, fn in grpc_admin_calls(g, region_key):
                code, msg = grpc_outcome(fn, gbearer(token))
                assert code == want_grpc, f"{name} with {token!r}: {code} {msg}"
                assert WRONG not in msg and ADMIN not in msg
            for m in ("SetModelPolicy", "SetModelResidency", "Compact"):
                code, msg = raw_grpc(grpc_url, CONTROL + m, token)
                assert code == want_grpc, f"{m} with {token!r}: {code} {msg}"
        if not served:
            return
        for method, path, body in http_admin_calls(region_key):
            status, _, data = http_request(http_url, method, path, body, bearer(allowed))
            assert status == 200, f"{method} {path} with the right credentials: {status} {data!r}"
        for name, fn in grpc_admin_calls(g, region_key):
            code, msg = grpc_outcome(fn, gbearer(allowed))
            assert code == "OK", f"{name} with the right credentials: {code} {msg}"
        code, msg = raw_grpc(grpc_url, CONTROL + "Compact", allowed)
        assert code == "OK", msg
    finally:
        g.close()


def test_admin_token_on_both_protocols(server_factory, tmp_path, region, cases):
    admin = token_file(tmp_path, "admin.token", ADMIN)
    s = server_factory(["--admin-token-file", str(admin), "--allow-client-shm"])
    assert re.search(r"admin calls .* need the bearer token of .*admin\.token", server_log(s))
    assert "inference and read calls are open to any peer" in server_log(s)
    check_admin_surface(s, region, ADMIN, [None, WRONG],
                        {None: (401, "UNAUTHENTICATED"), WRONG: (403, "PERMISSION_DENIED")})
    # Malformed credentials count as none.
    status, headers, _ = http_request(s.http_url, "GET", "/v2/logging", b"",
                                      {"Authorization": f"Basic {ADMIN}"})
    assert status == 401 and headers.get("www-authenticate") == "Bearer"
    # Inference needs no token without --infer-token-file, on either protocol.
    case = cases.get("mlp", 2)
    g = grpcclient.InferenceServerClient(s.grpc_url)
    h = httpclient.InferenceServerClient(s.http_url)
    try:
        case.check(grpc_infer_case(g, case)[0], "grpc, no token")
        case.check(http_infer_case(h, case)[0], "http, no token")
    finally:
        g.close()
        h.close()
    assert s.stop_and_check() == []


def test_token_guessing_keeps_inference_flowing(server_factory, tmp_path, cases):
    """Four threads guess admin tokens as fast as they can (HTTP and gRPC) while
    a client runs inferences: every guess is refused and every inference is
    answered within NORMAL_LATENCY_S, with the server's peak memory bounded."""
    admin = token_file(tmp_path, "admin.token", ADMIN)
    s = server_factory(["--admin-token-file", str(admin)])
    hwm_before = vm_hwm_mib(s)
    stop = threading.Event()
    refused, other = [0], []

    def guess(i):
        g = grpcclient.InferenceServerClient(s.grpc_url)
        n = 0
        try:
            while not stop.is_set():
                n += 1
                token = f"{WRONG}{i}{n}"
                if i % 2:
                    status, _, _ = http_request(s.http_url, "POST",
                                                "/v2/repository/models/mlp/unload", b"",
                                                bearer(token))
                    ok = status == 403
                else:
                    ok = grpc_outcome(lambda h: g.unload_model("mlp", headers=h),
                                      gbearer(token))[0] == "PERMISSION_DENIED"
                if ok:
                    refused[0] += 1
                else:
                    other.append(token)
        finally:
            g.close()

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    case = cases.get("mlp", 1)
    g = grpcclient.InferenceServerClient(s.grpc_url)
    worst = 0.0
    try:
        for _ in range(40):
            (got, _), dt = timed(grpc_infer_case, g, case)
            case.check(got, "during guessing")
            worst = max(worst, dt)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    try:
        assert not other, f"guesses not refused with 403 / PERMISSION_DENIED: {other[:3]}"
        assert refused[0] >= 100, f"only {refused[0]} guesses were made"
        assert worst < NORMAL_LATENCY_S, f"an inference took {worst:.2f} s during guessing"
        assert vm_hwm_mib(s) - hwm_before < 64, "guessing grew the server's peak memory"
        # The model the guessers tried to unload still serves.
        case.check(grpc_infer_case(g, case)[0], "after guessing")
    finally:
        g.close()
    assert s.stop_and_check() == []


def test_infer_token_on_both_protocols(server_factory, tmp_path, cases):
    admin = token_file(tmp_path, "admin.token", ADMIN)
    infer = token_file(tmp_path, "infer.token", INFER)
    s = server_factory(["--admin-token-file", str(admin), "--infer-token-file", str(infer)])
    assert re.search(r"inference and read calls need the bearer token of .*infer\.token",
                     server_log(s))
    case = cases.get("mlp", 2)
    g = grpcclient.InferenceServerClient(s.grpc_url)
    h = httpclient.InferenceServerClient(s.http_url)
    try:
        # Health probes stay open on both protocols.
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert http_request(s.http_url, "GET", path)[0] == 200
        assert g.is_server_live() and g.is_server_ready()
        assert raw_grpc(s.grpc_url, HEALTH_CHECK)[0] == "OK"

        expect = {None: (401, "UNAUTHENTICATED"), WRONG: (403, "PERMISSION_DENIED")}
        for token, (want_http, want_grpc) in expect.items():
            for path in ("/v2", "/v2/models/mlp", "/v2/models/mlp/ready", "/v2/models/stats",
                         "/v2/pjserve/control"):
                status, headers, data = http_request(s.http_url, "GET", path, b"",
                                                     bearer(token))
                assert status == want_http, f"GET {path} with {token!r}: {status} {data!r}"
                assert WRONG not in data.decode()
            status, headers, _ = http_request(f"127.0.0.1:{s.metrics_port}", "GET", "/metrics",
                                              b"", bearer(token))
            assert status == want_http, f"/metrics with {token!r}: {status}"
            if want_http == 401:
                assert headers.get("www-authenticate") == "Bearer"
            with pytest.raises(InferenceServerException) as e:
                http_infer_case(h, case, headers=bearer(token))
            assert e.value.status() == str(want_http), e.value
            for call in (lambda: grpc_infer_case(g, case, headers=gbearer(token)),
                         lambda: g.get_model_metadata("mlp", headers=gbearer(token)),
                         lambda: g.get_server_metadata(headers=gbearer(token))):
                with pytest.raises(InferenceServerException) as e:
                    call()
                assert grpc_code(e.value) == want_grpc, e.value
            assert raw_grpc(s.grpc_url, CONTROL + "ModelControlStatus", token)[0] == want_grpc

            # ModelStreamInfer: the refusal is the stream's status, sent before
            # anything is read (so sending may already find the stream over).
            results = queue.Queue()
            g.start_stream(callback=lambda result, error: results.put((result, error)),
                           headers=gbearer(token))
            try:
                g.async_stream_infer("mlp", grpc_inputs(case))
            except InferenceServerException:
                pass
            result, error = results.get(timeout=30)
            g.stop_stream()
            assert result is None and grpc_code(error) == want_grpc, error

        # Either token serves inference, on both protocols and the stream.
        for token in (INFER, ADMIN):
            (got, _), dt = timed(grpc_infer_case, g, case, headers=gbearer(token))
            case.check(got, f"grpc with {token[:3]}")
            assert dt < NORMAL_LATENCY_S
            case.check(http_infer_case(h, case, headers=bearer(token))[0], "http")
            assert http_request(s.http_url, "GET", "/v2/models/mlp", b"", bearer(token))[0] == 200
            assert http_request(f"127.0.0.1:{s.metrics_port}", "GET", "/metrics", b"",
                                bearer(token))[0] == 200
            assert raw_grpc(s.grpc_url, CONTROL + "ModelControlStatus", token)[0] == "OK"
            results = queue.Queue()
            g.start_stream(callback=lambda result, error: results.put((result, error)),
                           headers=gbearer(token))
            g.async_stream_infer("mlp", grpc_inputs(case))
            result, error = results.get(timeout=30)
            g.stop_stream()
            assert error is None, error
        # The inference token does not open admin calls (even from loopback).
        status, _, _ = http_request(s.http_url, "POST", "/v2/repository/models/mlp/unload", b"",
                                    bearer(INFER))
        assert status == 403
        code, _ = grpc_outcome(lambda hd: g.unload_model("mlp", headers=hd), gbearer(INFER))
        assert code == "PERMISSION_DENIED"
    finally:
        g.close()
        h.close()
    assert s.stop_and_check() == []


# ---- the loopback rule ----------------------------------------------------------------

def non_loopback_ipv4():
    """An IPv4 address of this machine other than 127.x, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                             text=True, timeout=10).stdout
        for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
            if not m.group(1).startswith("127."):
                return m.group(1)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addr = info[4][0]
            if not addr.startswith("127."):
                return addr
    except OSError:
        pass
    return None


def test_loopback_rule_without_a_token_file(server_factory, region, cases):
    addr = non_loopback_ipv4()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call the server through")
    s = server_factory(["--host", "0.0.0.0", "--allow-client-shm"])
    assert "accepted from loopback peers only (no --admin-token-file)" in server_log(s)
    # Through the non-loopback address: refused, whatever token is sent; the
    # message says what to do. Through 127.0.0.1: served.
    denied = (403, "PERMISSION_DENIED")
    check_admin_surface(s, region, None, [None, ADMIN], {None: denied, ADMIN: denied},
                        host=addr, deny_word="--admin-token-file", served=False)
    check_admin_surface(s, region, None, [], {}, host="127.0.0.1")
    # Inference through the non-loopback address is served.
    case = cases.get("mlp", 2)
    g = grpcclient.InferenceServerClient(f"{addr}:{s.grpc_port}")
    h = httpclient.InferenceServerClient(f"{addr}:{s.http_port}")
    try:
        (got, _), dt = timed(grpc_infer_case, g, case)
        case.check(got, "grpc via the non-loopback address")
        assert dt < NORMAL_LATENCY_S
        case.check(http_infer_case(h, case)[0], "http via the non-loopback address")
        assert http_request(f"{addr}:{s.http_port}", "GET", "/v2/health/ready")[0] == 200
    finally:
        g.close()
        h.close()
    assert s.stop_and_check() == []


# ---- token files -----------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["group-readable", "world-readable", "empty", "missing",
                                   "same-token", "two-lines"])
def test_bad_token_file_stops_the_start(pjserve_bin, plugin_path, repository, tmp_path, fault):
    good = token_file(tmp_path, "good.token", INFER)
    flag = "--admin-token-file"
    if fault == "group-readable":
        f, want = token_file(tmp_path, "t", ADMIN, 0o640), "chmod 600"
    elif fault == "world-readable":
        f, want = token_file(tmp_path, "t", ADMIN, 0o604), "chmod 600"
    elif fault == "empty":
        f, want = token_file(tmp_path, "t", ""), "empty"
    elif fault == "missing":
        f, want = tmp_path / "absent.token", "cannot open"
    elif fault == "two-lines":
        f, want = token_file(tmp_path, "t", ADMIN + "\n" + ADMIN), "visible ASCII"
    else:
        f, want = token_file(tmp_path, "t", INFER), "same token"
    t0 = time.monotonic()
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(repository),
                        "--pjrt-plugin", str(plugin_path), "--http-port", "0", "--grpc-port",
                        "0", "--metrics-port", "0", flag, str(f), "--infer-token-file",
                        str(good)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    assert flag in r.stderr and want in r.stderr, r.stderr
    assert ADMIN not in r.stderr and INFER not in r.stderr
    assert time.monotonic() - t0 < 10, "the start should stop before loading models"
