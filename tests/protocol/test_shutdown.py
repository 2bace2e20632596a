"""SIGTERM under load: a dedicated server is hammered from threads over gRPC
and HTTP, then sent SIGTERM. Every request either succeeds with correct
outputs or fails cleanly once shutdown began (UNAVAILABLE / 503 / connection
refused or closed, or CANCELLED for a gRPC call sent after SIGTERM that the
gRPC core had not yet handed to pjserve: it cancels such calls when the
server shuts down); none hangs; the server exits 0 without error lines."""

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from protocol_util import grpc_code, grpc_inputs, run_threads

THREADS = 12
LOAD_BEFORE_SIGTERM_S = 1.5
REQUEST_TIMEOUT_S = 30


def _http_infer(url, case):
    doc = {"inputs": [{"name": s.name, "datatype": "FP32" if s.dtype == "f32" else "INT32",
                       "shape": list(case.inputs[s.name].shape),
                       "data": case.inputs[s.name].ravel().tolist()}
                      for s in case.manifest.inputs]}
    req = urllib.request.Request(f"http://{url}/v2/models/{case.model}/infer",
                                 data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        out = json.loads(r.read())
    return {o["name"]: np.array(o["data"], dtype=np.float32 if o["datatype"] == "FP32"
                                else np.int32).reshape(o["shape"]) for o in out["outputs"]}


def _clean_http_error(e) -> bool:
    if isinstance(e, urllib.error.HTTPError):
        return e.code == 503
    if isinstance(e, urllib.error.URLError):
        e = e.reason
    return isinstance(e, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                          http.client.RemoteDisconnected))


def test_sigterm_under_load(server_factory, cases):
    srv = server_factory(names=("mlp", "two_io"))
    plan = [cases.get(m, n, seed=90 + n) for m in ("mlp", "two_io") for n in (1, 3, 8)]
    stop = threading.Event()
    records = []  # (thread, protocol, start, end, outcome, detail)
    lock = threading.Lock()

    def worker(tid):
        proto = "http" if tid % 3 == 0 else "grpc"
        client = grpcclient.InferenceServerClient(srv.grpc_url) if proto == "grpc" else None
        i = 0
        try:
            while not stop.is_set():
                case = plan[(tid + i) % len(plan)]
                i += 1
                t0 = time.monotonic()
                outcome, detail = "ok", ""
                try:
                    if proto == "grpc":
                        r = client.infer(case.model, grpc_inputs(case),
                                         client_timeout=REQUEST_TIMEOUT_S)
                        got = {n: r.as_numpy(n) for n in case.output_names()}
                    else:
                        got = _http_infer(srv.http_url, case)
                    case.check(got, f"{proto} during shutdown test")
                except AssertionError as e:
                    outcome, detail = "wrong", str(e)
                except InferenceServerException as e:
                    code = grpc_code(e)
                    never_accepted = (code == "CANCELLED" and srv.sigterm_time is not None
                                      and t0 >= srv.sigterm_time)
                    outcome = "clean" if code == "UNAVAILABLE" or never_accepted else "unclean"
                    detail = f"{code}: {e.message()}"
                except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                    outcome = "clean" if _clean_http_error(e) else "unclean"
                    detail = repr(e)
                    if isinstance(e, urllib.error.HTTPError):
                        detail += " " + e.read().decode(errors="replace")[:200]
                t1 = time.monotonic()
                with lock:
                    records.append((tid, proto, t0, t1, outcome, detail))
                if outcome != "ok":
                    if srv.sigterm_time is None or outcome in ("wrong", "unclean"):
                        break
                    # after SIGTERM keep trying briefly: later requests must fail
                    # just as cleanly (refused), not hang
                    if t1 - srv.sigterm_time > 3:
                        break
                    time.sleep(0.05)
        finally:
            if client is not None:
                client.close()

    threads_done = []

    def run():
        threads_done.append(run_threads(worker, THREADS, timeout=120))

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    time.sleep(LOAD_BEFORE_SIGTERM_S)
    ok_before = sum(1 for r in records if r[4] == "ok")
    srv.terminate()
    t_term = srv.sigterm_time
    rc = srv.wait_exit(60)
    stop.set()
    runner.join(180)
    assert not runner.is_alive() and threads_done, "client threads hang after SIGTERM"
    _, errors = threads_done[0]
    assert not errors, f"client thread crashed: {errors[0][1]!r}"

    assert rc is not None, f"server did not exit within 60 s of SIGTERM\n{srv.describe()}"
    assert rc == 0, f"exit code {rc} after SIGTERM\n{srv.describe()}"
    problems = srv.stop_and_check()  # already exited: only the stderr check remains
    problems = [p for p in problems if "already exited (code 0)" not in p]
    assert not problems, "\n".join(problems) + "\n" + srv.describe()

    assert ok_before >= THREADS, f"only {ok_before} requests succeeded before SIGTERM"
    wrong = [r for r in records if r[4] == "wrong"]
    assert not wrong, f"{len(wrong)} wrong outputs, first: {wrong[0]}"
    unclean = [r for r in records if r[4] == "unclean"]
    assert not unclean, (
        f"{len(unclean)} unclean errors; first: thread {unclean[0][0]} {unclean[0][1]}: "
        f"{unclean[0][5]} (request sent {unclean[0][2] - t_term:+.3f} s, answered "
        f"{unclean[0][3] - t_term:+.3f} s relative to SIGTERM)\n{srv.describe()}")
    early = [r for r in records if r[4] == "clean" and r[3] < t_term]
    assert not early, f"requests failed before SIGTERM was sent: {early[:3]}"
    # every request that was answered after SIGTERM either succeeded or was refused
    after = [r for r in records if r[3] >= t_term]
    summary = {k: sum(1 for r in after if r[4] == k) for k in ("ok", "clean")}
    print(f"before SIGTERM: {ok_before} ok; after: {summary}")
    # and the ports are closed now
    for port in (srv.grpc_port, srv.http_port):
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still accepts"


def test_sigterm_idle_server_exits_zero(server_factory):
    srv = server_factory(names=("mlp",))
    ch = grpc.insecure_channel(srv.grpc_url)
    grpc.channel_ready_future(ch).result(timeout=10)  # an idle open connection
    srv.terminate()
    rc = srv.wait_exit(30)
    ch.close()
    assert rc == 0, f"exit code {rc}\n{srv.describe()}"
    problems = [p for p in srv.stop_and_check() if "already exited (code 0)" not in p]
    assert not problems, "\n".join(problems)


def test_sigint_exits_zero(server_factory, cases):
    import signal
    srv = server_factory(names=("mlp",))
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    case = cases.get("mlp", 1)
    r = c.infer("mlp", grpc_inputs(case))
    case.check({"y": r.as_numpy("y")})
    c.close()
    srv.proc.send_signal(signal.SIGINT)
    rc = srv.wait_exit(30)
    assert rc == 0, f"exit code {rc} after SIGINT\n{srv.describe()}"


def test_sigterm_with_open_streams(server_factory, cases):
    """SIGTERM while ModelStreamInfer streams have requests in flight (plus unary
    calls): the server exits 0 (no crash), every reply that arrives is correct,
    no client hangs. Five rounds, since the window is narrow."""
    import queue

    case = cases.get("mlp", 4)
    for rnd in range(5):
        srv = server_factory(names=("mlp",))
        stop = threading.Event()
        lock = threading.Lock()
        wrong, seen = [], {"ok": 0, "err": 0}

        def streamer(tid):
            c = grpcclient.InferenceServerClient(srv.grpc_url)
            q = queue.Queue()
            received = sent = 0

            def drain():
                nonlocal received
                while True:
                    try:
                        result, error = q.get_nowait()
                    except queue.Empty:
                        return
                    received += 1
                    if error is not None:
                        with lock:
                            seen["err"] += 1
                        continue
                    try:
                        case.check({"y": result.as_numpy("y")}, "stream during shutdown")
                        with lock:
                            seen["ok"] += 1
                    except AssertionError as e:
                        with lock:
                            wrong.append(str(e))
            try:
                c.start_stream(callback=lambda result, error: q.put((result, error)))
                while not stop.is_set():
                    drain()
                    if sent - received >= 256:
                        time.sleep(0.001)
                        continue
                    try:
                        c.async_stream_infer("mlp", grpc_inputs(case), request_id=str(sent))
                    except InferenceServerException:
                        break  # the stream is gone
                    sent += 1
            finally:
                try:
                    c.stop_stream(cancel_requests=True)
                except InferenceServerException:
                    pass
                drain()
                c.close()

        def unary(tid):
            c = grpcclient.InferenceServerClient(srv.grpc_url)
            try:
                while not stop.is_set():
                    try:
                        r = c.infer("mlp", grpc_inputs(case), client_timeout=REQUEST_TIMEOUT_S)
                        case.check({"y": r.as_numpy("y")}, "unary during shutdown")
                    except InferenceServerException:
                        time.sleep(0.01)
            finally:
                c.close()

        def worker(tid):
            return streamer(tid) if tid < 3 else unary(tid)

        done = []
        runner = threading.Thread(target=lambda: done.append(run_threads(worker, 5, 120)),
                                  daemon=True)
        runner.start()
        # Streams flowing before the signal: the first answers, then a
        # little more (a fixed 0.8 s saw none yet on two loaded CPUs).
        flowing = time.monotonic() + 60
        while seen["ok"] == 0 and time.monotonic() < flowing and not done:
            time.sleep(0.05)
        time.sleep(0.3)
        srv.terminate()
        rc = srv.wait_exit(60)
        stop.set()
        runner.join(150)
        assert not runner.is_alive() and done, f"round {rnd}: client threads hang"
        assert not done[0][1], f"round {rnd}: client thread failed: {done[0][1][0][1]!r}"
        assert rc is not None, f"round {rnd}: no exit within 60 s of SIGTERM\n{srv.describe()}"
        assert rc == 0, (f"round {rnd}: exit code {rc} after SIGTERM with open streams "
                         f"({seen})\n{srv.describe()}")
        assert not wrong, wrong[:3]
        assert seen["ok"] > 0, seen
        problems = [p for p in srv.stop_and_check() if "already exited (code 0)" not in p]
        assert not problems, "\n".join(problems) + "\n" + srv.describe()
