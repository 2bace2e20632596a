"""HTTP/REST and metrics ports against hostile clients: compression bombs,
bodies declared huge, crowds of large bodies, idle and slow connections.

Cases (docs/serving.md, "Limits"):

  - gzip bombs (1 GiB of zeros in 4.5 MB) on inference, on another POST
    route, on an unknown route, on GET and on the metrics port: 413
    (inflating stops at the model's bound, or at 1 MiB for other POST
    routes), 404 or 415 (nothing inflated), each within a second or two,
    VmHWM growing by less than 64 MiB, and a normal tritonclient request
    served meanwhile;
  - a gzipped JSON bomb (100 KB inflating to 100 MB of JSON numbers) on
    inference: 413 before any JSON is parsed;
  - 50 connections that declare a huge Content-Length and send nothing:
    413 at once above the cap, no memory reserved below it;
  - many large bodies at once under a small --max-inflight-request-bytes:
    429 for those past the budget, and the budget given back afterwards;
  - bodies refused on their headers (413, 415) and written whole without
    Expect: 100-continue: read and dropped, then the status is read (not a
    reset) and the connection stays usable; past the linger bounds, refused
    at once or cut off;
  - 1,100 idle connections, from one address (the per-IP cap) and spread
    over five (the connection table fills: the longest waiting are closed to
    admit new ones, never one with a request begun), with a normal request
    served within a second, the descriptors bounded and the log quiet;
  - slowloris on the headers and on the body: cut off at the deadlines.
"""

import functools
import gzip
import json
import select
import socket
import threading
import time
import urllib.request
import zlib

import pytest

from .conftest import (http_mlp_infer, open_fds, raise_fd_limit, timed, vm_hwm_mib, vm_rss_mib,
                       wait_until_read)

# A normal request must be answered within this many seconds while attacked.
NORMAL_LATENCY_S = 1.5
# A refused bomb is answered within this many seconds.
REFUSE_S = 2.0


@functools.lru_cache(maxsize=None)
def gzip_bomb(inflated_mib: int) -> bytes:
    """inflated_mib MiB of zeros, gzip-compressed (about 4.5 KB per MiB)."""
    c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    return b"".join([c.compress(zeros) for _ in range(inflated_mib)] + [c.flush()])


def json_bomb(mib: int) -> bytes:
    """A KServe request for mlp whose data list inflates to `mib` MiB."""
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,16],"data":['
    return gzip.compress(head + b"0," * (mib << 19) + b'0]}]}', compresslevel=9)



def read_reply(sock: socket.socket):
    """(status, headers text, body bytes) of one HTTP/1.1 reply."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    text = head.decode(errors="replace")
    length = 0
    for line in text.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(text.split()[1]), text, rest[:length]


def post(url, path, body, headers, method="POST", timeout=30):
    """(status, the error message of the reply or its text), as a client that
    asks before sending a body (Expect: 100-continue, as curl does) and so
    reads a refusal sent before the body."""
    host, port = url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {url}", f"Content-Length: {len(body)}",
                 "Expect: 100-continue"] + [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status, _, data = read_reply(sock)
        if status == 100:
            sock.sendall(body)
            status, _, data = read_reply(sock)
    finally:
        sock.close()
    try:
        return status, json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return status, data.decode(errors="replace")


def finish(server):
    problems = server.stop_and_check()
    assert not problems, "\n".join(problems) + "\n" + server.describe()



def connect_from(addr: str, port: int, source: str, timeout: float = 5) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    # Closed by this side, the socket lingers in TIME_WAIT on source:port;
    # without SO_REUSEADDR that keeps a later server from binding 0.0.0.0 on
    # the same port (test_bind_address_per_port met it).
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((source, 0))
    s.connect((addr, port))
    return s


def closed_by_peer(s: socket.socket, within: float) -> bool:
    """Whether the server closes s (EOF or reset) within `within` seconds."""
    s.settimeout(within)
    try:
        while True:
            if s.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def closed_now(s: socket.socket) -> bool:
    """Whether the server has closed s (EOF or reset waiting), without waiting."""
    p = select.poll()
    p.register(s, select.POLLIN)
    if not p.poll(0):
        return False
    try:
        return s.recv(65536, socket.MSG_DONTWAIT) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except BlockingIOError:
        return False


def vm_size_mib(server) -> float:
    """Virtual memory (VmSize) of a running server process, in MiB."""
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("VmSize missing from /proc status")


def http_warn_lines(server) -> int:
    return sum(1 for ln in server.stderr_text().splitlines() if "http " in ln and "WARN" in ln)


# ---- bodies ------------------------------------------------------------------

def test_gzip_bombs_refused_without_inflating_past_a_bound(server_factory):
    s = server_factory()
    bomb = gzip_bomb(1024)
    small_bomb = gzip_bomb(8)  # under mlp's bound compressed: inflating must stop there
    gz = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    http_mlp_infer(s.http_url)
    hwm0, rss0 = vm_hwm_mib(s), vm_rss_mib(s)

    cases = [
        # (url, method, path, body, expected status, text in the error)
        (s.http_url, "POST", "/v2/models/mlp/infer", bomb, 413, "model \"mlp\""),
        (s.http_url, "POST", "/v2/models/mlp/infer", small_bomb, 413, "inflated request body"),
        (s.http_url, "POST", "/v2/no/such/route", bomb, 413, "other than inference"),
        (s.http_url, "GET", "/v2/health/ready", bomb, 415, "Content-Encoding"),
        (f"127.0.0.1:{s.metrics_port}", "GET", "/metrics", bomb, 415, "Content-Encoding"),
        (f"127.0.0.1:{s.metrics_port}", "POST", "/metrics", bomb, 415, "Content-Encoding"),
    ]
    results = {}

    def attack(i):
        url, method, path, body, _, _ = cases[i]
        results[i] = timed(post, url, path, body, gz, method)

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    normal = http_mlp_infer(s.http_url)
    for t in threads:
        t.join(60)
    for i, (url, method, path, _, want, text) in enumerate(cases):
        (status, msg), dt = results[i]
        assert status == want and text in msg, (method, path, status, msg)
        assert dt < REFUSE_S, f"{method} {path}: answered in {dt:.1f} s"
    assert normal < NORMAL_LATENCY_S, f"a normal request took {normal:.2f} s"
    assert vm_hwm_mib(s) - hwm0 < 64, f"VmHWM grew from {hwm0:.0f} to {vm_hwm_mib(s):.0f} MiB"

    # Other POST routes take small JSON objects: inflating stops at 1 MiB.
    (status, msg), dt = timed(post, s.http_url, "/v2/repository/index", bomb, gz)
    assert status == 413 and "other than inference" in msg, (status, msg)
    assert dt < REFUSE_S, f"refused in {dt:.1f} s"
    assert vm_hwm_mib(s) - hwm0 < 64, f"VmHWM grew from {hwm0:.0f} to {vm_hwm_mib(s):.0f} MiB"
    time.sleep(0.2)
    assert vm_rss_mib(s) - rss0 < 64, \
        f"the bombs' memory stayed resident: VmRSS {rss0:.0f} -> {vm_rss_mib(s):.0f} MiB"
    assert http_mlp_infer(s.http_url) < NORMAL_LATENCY_S
    finish(s)


def test_gzipped_json_bomb_refused_before_parsing(server_factory):
    s = server_factory()
    hwm0 = vm_hwm_mib(s)
    gz = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    # 100 KB that inflate to 100 MiB: more than mlp's bound as sent.
    (status, msg), dt = timed(post, s.http_url, "/v2/models/mlp/infer", json_bomb(100), gz)
    assert status == 413 and "model \"mlp\"" in msg, (status, msg)
    assert dt < REFUSE_S, f"refused in {dt:.1f} s (was 16.8 s)"
    # 20 KB that inflate to 20 MiB: inflating stops at the bound.
    (status, msg), dt = timed(post, s.http_url, "/v2/models/mlp/infer", json_bomb(20), gz)
    assert status == 413 and "inflated request body" in msg and "model \"mlp\"" in msg, msg
    assert dt < REFUSE_S, f"refused in {dt:.1f} s"
    assert vm_hwm_mib(s) - hwm0 < 32
    # The same JSON uncompressed and declared: refused on its Content-Length.
    c = connect_from("127.0.0.1", s.http_port, "127.0.0.1")
    c.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
              b"Content-Length: 104857610\r\n\r\n")
    status, _, data = read_reply(c)
    c.close()
    assert status == 413 and 'model "mlp"' in json.loads(data)["error"], (status, data)
    assert http_mlp_infer(s.http_url) < NORMAL_LATENCY_S
    finish(s)


def test_declared_content_length_reserves_nothing(server_factory):
    s = server_factory()
    port = s.http_port
    hwm0, size0 = vm_hwm_mib(s), vm_size_mib(s)

    def headers(path, length):
        return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()

    # 50 connections declare bodies and send none: above --max-request-bytes,
    # or above what the endpoint takes, each is refused with 413 before a
    # byte of body is sent, and nothing is reserved for them.
    cases = [("/v2/repository/index", 2_000_000_000, "--max-request-bytes"),
             ("/v2/models/mlp/infer", 2_000_000_000, "--max-request-bytes"),
             ("/v2/repository/index", 200_000_000, "other than inference"),
             ("/v2/models/mlp/infer", 200_000_000, 'model \\"mlp\\"')] * 13
    conns = []
    for path, length, _ in cases[:50]:
        c = connect_from("127.0.0.1", port, "127.0.0.1")
        c.sendall(headers(path, length))
        conns.append(c)
    for c, (path, length, text) in zip(conns, cases):
        status, _, data = read_reply(c)
        assert status == 413 and text in data.decode(), (path, length, status, data[:300])
        c.close()
    assert vm_hwm_mib(s) - hwm0 < 32, f"VmHWM {hwm0:.0f} -> {vm_hwm_mib(s):.0f} MiB"
    assert vm_size_mib(s) - size0 < 256, f"VmSize {size0:.0f} -> {vm_size_mib(s):.0f} MiB"
    assert http_mlp_infer(s.http_url) < NORMAL_LATENCY_S
    finish(s)


def test_inflight_budget_refuses_a_crowd_of_large_bodies(server_factory):
    s = server_factory(["--max-inflight-request-bytes", "2Mi", "--max-request-bytes", "1Mi"])
    size = 700 << 10
    body = b"{" + b" " * (size - 2) + b"}"
    conns = []
    for _ in range(6):  # six 700 KiB bodies against a 2 MiB budget
        c = connect_from("127.0.0.1", s.http_port, "127.0.0.1", timeout=30)
        c.sendall((f"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode())
        conns.append(c)
    for c in conns:  # most of each body, so that they are all held at once
        c.sendall(body[: size - 1024])
    # Only bytes the server has read count against the budget: a server slow to
    # read would find budget given back by the first replies below.
    wait_until_read(s.http_port)
    normal = http_mlp_infer(s.http_url)
    statuses = []
    for c in conns:
        try:
            c.sendall(body[size - 1024:])
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = c.recv(4096).decode(errors="replace")
        statuses.append(int(reply.split()[1]))
        if statuses[-1] == 429:
            assert "--max-inflight-request-bytes" in reply, reply[:400]
        c.close()
    assert statuses.count(429) >= 3 and statuses.count(200) >= 1, statuses
    assert normal < NORMAL_LATENCY_S
    # Every byte was given back: the budget holds two such bodies again.
    status, _ = post(s.http_url, "/v2/repository/index", body, {})
    assert status == 200
    finish(s)


# ---- connections -------------------------------------------------------------

def test_idle_connections_from_one_address_hit_the_per_ip_cap(server_factory):
    raise_fd_limit(1400)
    s = server_factory()
    socks = []
    try:
        for _ in range(1100):
            socks.append(connect_from("127.0.0.1", s.http_port, "127.0.0.2"))
        time.sleep(0.5)
        normal = http_mlp_infer(s.http_url)
        assert normal < NORMAL_LATENCY_S, f"a normal request took {normal:.2f} s"
        # Past 256 per address the server closed them at once.
        assert closed_by_peer(socks[-1], 2)
        assert open_fds(s) < 256 + 200, f"the server holds {open_fds(s)} descriptors"
    finally:
        for c in socks:
            c.close()
    assert http_warn_lines(s) < 20, "the connection refusals flooded the log"
    finish(s)


def test_idle_flood_from_many_addresses_evicts_the_oldest(server_factory):
    raise_fd_limit(1400)
    s = server_factory()  # default flags: a table of 1000 connections
    # A request begun before the flood (its body half sent): never evicted.
    busy = connect_from("127.0.0.1", s.http_port, "127.0.0.1", timeout=10)
    busy.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 4\r\n\r\n{ ")
    socks = []
    try:
        for i in range(1100):  # 220 from each of five addresses: under the per-IP cap
            socks.append(connect_from("127.0.0.1", s.http_port, f"127.0.0.{2 + i % 5}"))
        time.sleep(0.5)
        assert open_fds(s) < 1000 + 200, f"the server holds {open_fds(s)} descriptors"
        # The table is full of connections that sent nothing: the oldest of
        # them make room for new ones, so normal clients are served at once.
        reply, health = timed(urllib.request.urlopen, f"http://{s.http_url}/v2/health/ready",
                              timeout=10)
        assert reply.status == 200 and health < 1.0, f"health answered in {health:.2f} s"
        reply.close()
        normal = http_mlp_infer(s.http_url)
        assert normal < 1.0, f"a normal request took {normal:.2f} s"
        closed = [i for i, c in enumerate(socks) if closed_now(c)]
        assert socks and 0 in closed and len(socks) - 1 not in closed, closed[:20]
        assert 90 <= len(closed) <= 200 and max(closed) < 400, \
            f"{len(closed)} closed, not the oldest: {closed[:10]} ... {closed[-10:]}"
        busy.sendall(b" }")
        assert read_reply(busy)[0] == 200
    finally:
        for c in socks + [busy]:
            c.close()
    assert "to admit new ones (--http-max-connections 1000)" in s.stderr_text()
    assert http_warn_lines(s) < 30, "the evictions flooded the log"
    finish(s)


def test_bodies_refused_early_are_read_before_the_reply(server_factory):
    s = server_factory()
    big = b"{" + b" " * ((8 << 20) - 2) + b"}"
    cases = [  # (method, path, extra headers, status, text in the error)
        ("POST", "/v2/models/mlp/infer", "", 413, 'model "mlp"'),
        ("POST", "/v2/repository/index", "", 413, "other than inference"),
        ("GET", "/v2/health/ready", "Content-Encoding: gzip\r\n", 415, "Content-Encoding"),
    ]
    for method, path, extra, want, text in cases:
        c = connect_from("127.0.0.1", s.http_port, "127.0.0.1", timeout=10)
        try:
            # A client that writes its whole body before it reads (no
            # Expect: 100-continue) sees the status, not a reset.
            c.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}"
                      f"Content-Length: {len(big)}\r\n\r\n".encode() + big)
            status, _, data = read_reply(c)
            assert status == want and text in json.loads(data)["error"], (path, status, data)
            # Every byte was read: the connection is still in step.
            c.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(c)[0] == 200
        finally:
            c.close()
    # A body past what is read and dropped (64 MiB) is refused before it is sent.
    c = connect_from("127.0.0.1", s.http_port, "127.0.0.1")
    c.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
              b"Content-Length: 100000000\r\n\r\n")
    assert read_reply(c)[0] == 413
    c.close()
    # A refused body that stops coming is cut off within seconds.
    c = connect_from("127.0.0.1", s.http_port, "127.0.0.1")
    c.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
              b"Content-Length: 2000000\r\n\r\n" + big[:4096])
    t0 = time.monotonic()
    assert closed_by_peer(c, 5) and time.monotonic() - t0 < 2 + 1.5
    c.close()
    assert http_mlp_infer(s.http_url) < NORMAL_LATENCY_S
    finish(s)


def test_slowloris_cut_off_at_the_header_and_body_deadlines(server_factory):
    s = server_factory(["--http-header-timeout-s", "2", "--http-body-timeout-s", "2"])
    drip_head = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    drip_body = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    cut = {}

    def slowloris(name, first, drip):
        c = connect_from("127.0.0.1", s.http_port, "127.0.0.1")
        t0 = time.monotonic()
        c.sendall(first)
        try:
            for _ in range(40):  # one byte every 0.25 s: never idle
                time.sleep(0.25)
                c.sendall(drip)
        except (BrokenPipeError, ConnectionResetError):
            pass
        closed = closed_by_peer(c, 0.1)
        cut[name] = (closed, time.monotonic() - t0)
        c.close()

    threads = [threading.Thread(target=slowloris, args=("headers", drip_head[:40], b"a")),
               threading.Thread(target=slowloris, args=("body", drip_body, b" "))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    normal = http_mlp_infer(s.http_url)
    for t in threads:
        t.join(30)
    for name, (closed, dt) in cut.items():
        assert closed and dt < 2 + 1.5, f"{name} slowloris lived {dt:.1f} s"
    assert normal < NORMAL_LATENCY_S
    assert "did not send headers within --http-header-timeout-s" in s.stderr_text()
    finish(s)


def test_per_ip_cap(server_factory):
    s = server_factory(["--http-max-connections-per-ip", "4"])
    held = [connect_from("127.0.0.1", s.http_port, "127.0.0.3") for _ in range(4)]
    extra = connect_from("127.0.0.1", s.http_port, "127.0.0.3")
    assert closed_by_peer(extra, 2), "a fifth connection from one address was kept"
    assert not closed_by_peer(held[0], 0.3)
    assert http_mlp_infer(s.http_url) < NORMAL_LATENCY_S  # another address
    for c in held + [extra]:
        c.close()
    finish(s)


def test_bind_address_per_port(server_factory):
    s = server_factory(["--host", "0.0.0.0", "--http-host", "127.0.0.1",
                        "--metrics-host", "127.0.0.1"])
    assert f"HTTP/REST listening on 127.0.0.1:{s.http_port}" in s.stderr_text()
    assert f"metrics listening on 127.0.0.1:{s.metrics_port}" in s.stderr_text()
    finish(s)
