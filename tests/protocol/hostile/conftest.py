"""Helpers of the hostile-client suite: each test plays an attacker against a
real `pjserve serve` and asserts the status it gets, that normal traffic kept
flowing, and how much memory the server reached.

These tests are heavy (bombs, floods, thousands of connections): they run once,
in the plain build (`make test`); the sanitizer builds skip this directory.
The fixtures of tests/protocol/conftest.py (server_factory, exported, ...) are
inherited.
"""

import resource
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient


def vm_hwm_mib(server) -> float:
    """Peak resident memory (VmHWM) of a running server process, in MiB."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError("VmHWM missing from /proc status")


def vm_rss_mib(server) -> float:
    """Current resident memory (VmRSS) of a running server process, in MiB."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError("VmRSS missing from /proc status")


def open_fds(server) -> int:
    """Descriptors the server process holds open now."""
    return len(list(Path(f"/proc/{server.proc.pid}/fd").iterdir()))


def wait_until_read(port: int, timeout: float = 30.0):
    """Waits until the server has read every byte sent to it on `port`: on
    both ends of each established connection to or from `port`, the send queue
    and the receive queue (tx_queue, rx_queue in /proc/net/tcp) are empty, on
    two looks in a row. sendall returns once the kernel holds the bytes, not
    once the server has read them; tests that count what the server did with
    them wait here first."""
    deadline = time.monotonic() + timeout
    empty_before = False
    while True:
        queued = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                ends = (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16))
                if port in ends and f[3] == "01":  # ESTABLISHED
                    tx, rx = f[4].split(":")
                    queued += int(tx, 16) + int(rx, 16)
        if queued == 0 and empty_before:
            return
        empty_before = queued == 0
        assert time.monotonic() < deadline, f"{queued} bytes still unread on port {port}"
        time.sleep(0.02)


def timed(fn, *args, **kw):
    """(result, seconds) of one call."""
    t0 = time.monotonic()
    r = fn(*args, **kw)
    return r, time.monotonic() - t0


def http_mlp_infer(url: str) -> float:
    """One normal tritonclient HTTP inference on mlp; the seconds it took."""
    client = httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=10)
    try:
        x = httpclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        r, dt = timed(client.infer, "mlp", [x])
        assert r.as_numpy("y") is not None
        return dt
    finally:
        client.close()


def raise_fd_limit(need: int):
    """Raises this test process's soft file limit to `need` descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need, \
        f"this test needs {need} descriptors (ulimit -n)"
