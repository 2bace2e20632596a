"""Helpers for the KServe V2 protocol tests: running `pjserve serve`, building
requests with tritonclient and by hand, and checking replies.

Nothing here is a fixture; tests/protocol/conftest.py wires them up.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import REPO, assert_matches  # noqa: E402,F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from pjserve_export import demo  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

import grpc  # noqa: E402

# Seconds a server may take from exec to /v2/health/ready (compiles every
# bundle; the executable cache makes later starts fast).
READY_TIMEOUT_S = float(os.environ.get("PJSERVE_READY_TIMEOUT", "240"))
# Seconds a server may take to exit after SIGTERM.
EXIT_TIMEOUT_S = 60
# With PJSERVE_PROTOCOL_NODE_WORKERS=N every server of the suite is
# `pjserve node --workers N` (the gateway in front of N serve workers)
# instead of `pjserve serve`: the suite then checks the gateway.
NODE_WORKERS = os.environ.get("PJSERVE_PROTOCOL_NODE_WORKERS")


def serve_only(why: str):
    """Marks a test of one serve process's own behaviour (its log lines,
    gauges, thread pools, gates, budgets), which a node of several workers
    does not have as one: skipped when the suite runs against a node."""
    return pytest.mark.skipif(bool(NODE_WORKERS), reason=f"one serve process: {why}")

# manifest dtype -> KServe datatype
KSERVE_DTYPE = {
    "bool": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64",
    "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "f16": "FP16", "bf16": "BF16", "f32": "FP32", "f64": "FP64",
}
# KServe datatype -> model config DataType enum name
CONFIG_DTYPE = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16", "BF16": "TYPE_BF16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
}

# Lines in the server's stderr that fail a test run.
BAD_STDERR = re.compile(r"\bERROR\b|Sanitizer|runtime error:|Segmentation fault|"
                        r"core dumped|stack-buffer|heap-use-after-free|double free|"
                        r"assertion .* failed|Assertion .* failed|\bpanic\b")


# ---- ports and the server process ------------------------------------------

def free_ports(n: int) -> List[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(text: str, n: int = 200) -> str:
    lines = text.splitlines()
    if len(lines) > n:
        lines = [f"... ({len(lines) - n} earlier lines)"] + lines[-n:]
    return "\n".join(lines)


class ServerProcess:
    """One `pjserve serve` process on free local ports, its stderr kept in a file.

    start() waits for GET /v2/health/<health_route> to answer 200: "ready"
    (every model loaded), or "live" for a repository holding bundles the
    server refuses (readiness then stays false)."""

    health_route = "ready"

    def __init__(self, binary: Path, plugin: Path, repository: Path, cache_dir: Path,
                 workdir: Path, extra_args: Sequence[str] = (), name: str = "server"):
        self.binary = Path(binary)
        self.plugin = Path(plugin)
        self.repository = Path(repository)
        self.cache_dir = Path(cache_dir)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra_args = list(extra_args)
        self.name = name
        self.proc: Optional[subprocess.Popen] = None
        self.stderr_path = self.workdir / f"{name}.stderr.log"
        self.stdout_path = self.workdir / f"{name}.stdout.log"
        self.http_port = self.grpc_port = self.metrics_port = None
        self.argv: List[str] = []
        self.sigterm_time: Optional[float] = None

    # addresses
    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command_name(self) -> str:
        """"serve" or "node": the subcommand this process runs."""
        return self.argv[1] if len(self.argv) > 1 else "serve"

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def describe(self) -> str:
        rc = None if self.proc is None else self.proc.poll()
        return (f"server {self.name!r}: {' '.join(self.argv)}\n"
                f"exit code: {rc if rc is not None else 'still running'}\n"
                f"--- stderr ({self.stderr_path}) ---\n{tail(self.stderr_text())}")

    def start(self, ready_timeout: float = READY_TIMEOUT_S):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        command = ["node", "--workers", NODE_WORKERS] if NODE_WORKERS else ["serve"]
        self.argv = [str(self.binary), *command,
                     "--model-repository", str(self.repository),
                     "--host", "127.0.0.1",
                     "--http-port", str(self.http_port),
                     "--grpc-port", str(self.grpc_port),
                     "--metrics-port", str(self.metrics_port),
                     "--pjrt-plugin", str(self.plugin),
                     "--cache-dir", str(self.cache_dir)] + self.extra_args
        env = dict(os.environ)
        env.setdefault("PJSERVE_LOG_LEVEL", "info")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL)
        self.wait_ready(ready_timeout)
        return self

    def _node_workers_ready(self) -> bool:
        """Behind a node, the gateway answers health itself: wait until it
        answers health_route and the node reports every worker ready (which
        the node does only once its gateway routes to it)."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/{self.health_route}",
                                        timeout=2) as r:
                if r.status != 200:
                    return False
            with urllib.request.urlopen(f"http://{self.http_url}/v2/pjserve/node",
                                        timeout=2) as r:
                workers = json.loads(r.read())["workers"]
            return len(workers) == int(NODE_WORKERS) and all(w["state"] == "ready"
                                                             for w in workers)
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        url = f"http://{self.http_url}/v2/health/{self.health_route}"
        last = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerFailure(f"pjserve serve exited with code {rc} before it was "
                                    f"{self.health_route}\n{self.describe()}")
            if NODE_WORKERS and self.command_name() == "node":
                if self._node_workers_ready():
                    return
                last = "the node's workers are not all ready"
                time.sleep(0.1)
                continue
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = repr(e)
            time.sleep(0.1)
        self.kill()
        raise ServerFailure(f"pjserve serve was not {self.health_route} within {timeout:.0f} s "
                            f"(GET {url}: {last})\n{self.describe()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self):
        self.sigterm_time = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = EXIT_TIMEOUT_S) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop_and_check(self, expected_errors: Sequence[str] = ()) -> List[str]:
        """SIGTERM, wait, and return a list of problems (empty when clean).
        Error lines matching an `expected_errors` pattern (ones a test
        provoked on purpose) are not problems."""
        problems = []
        if self.proc is None:
            return problems
        rc = self.proc.poll()
        if rc is not None:
            problems.append(f"the server had already exited (code {rc}) before SIGTERM")
        else:
            self.terminate()
            rc = self.wait_exit()
            if rc is None:
                self.kill()
                problems.append(f"the server did not exit within {EXIT_TIMEOUT_S} s of "
                                "SIGTERM (killed)")
            elif rc != 0:
                problems.append(f"exit code {rc} after SIGTERM (expected 0)")
        allowed = [re.compile(p) for p in expected_errors]
        bad = [ln for ln in self.stderr_text().splitlines()
               if BAD_STDERR.search(ln) and not any(a.search(ln) for a in allowed)]
        if bad:
            problems.append("stderr has error/sanitizer lines:\n  " + "\n  ".join(bad[:40]))
        return problems


class ServerFailure(Exception):
    pass


# ---- TLS -------------------------------------------------------------------------

def openssl(*args, cwd: Path):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str):
    """A throwaway CA: d/name.key and d/name.pem."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}", cwd=d)


def make_cert(d: Path, name: str, ca: str, server: bool):
    """d/name.{key,pem} signed by CA `ca`, for 127.0.0.1 and localhost, a
    server's or a client's."""
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   + ("extendedKeyUsage=serverAuth\n" if server
                      else "extendedKeyUsage=clientAuth\n"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", ext.name, cwd=d)


# ---- reference outputs ------------------------------------------------------

class Case:
    """One batch for one model at the shapes of one of its variants: inputs
    (numpy) and the JAX reference outputs."""

    def __init__(self, model: str, n: int, inputs: Dict[str, np.ndarray],
                 expected: Dict[str, np.ndarray], manifest, variant: str = "default"):
        self.model = model
        self.n = n
        self.inputs = inputs
        self.expected = expected
        self.manifest = manifest
        self.variant = variant

    def input_specs(self):
        return self.manifest.variant_inputs(self.variant)

    def output_specs(self):
        return self.manifest.variant_outputs(self.variant)

    def output_names(self) -> List[str]:
        return [o.name for o in self.manifest.outputs]

    def check(self, got: Dict[str, Optional[np.ndarray]], what: str = "",
              outputs: Optional[Sequence[str]] = None):
        names = list(outputs) if outputs is not None else self.output_names()
        for name in names:
            assert name in got, f"{self.model} {what}: output {name!r} missing"
            assert_matches(self.model, name, got[name], self.expected[name],
                           f"n={self.n} {what}")


def kserve_dtype(spec) -> str:
    return KSERVE_DTYPE[spec.dtype]


def client_dims(manifest, spec, output: bool = False) -> List[int]:
    """The per-example dims of a tensor as metadata and config show them:
    the manifest's, with -1 where the model's input-shape variants differ."""
    shapes = [next(t.shape for t in (manifest.variant_outputs(v) if output
                                     else manifest.variant_inputs(v)) if t.name == spec.name)
              for v in manifest.variant_names()]
    return [d if all(sh[i] == d for sh in shapes) else -1 for i, d in enumerate(spec.shape)]


# ---- tritonclient requests --------------------------------------------------

def grpc_inputs(case: Case) -> list:
    res = []
    for spec in case.input_specs():
        arr = case.inputs[spec.name]
        i = grpcclient.InferInput(spec.name, list(arr.shape), kserve_dtype(spec))
        i.set_data_from_numpy(arr)
        res.append(i)
    return res


def http_inputs(case: Case, binary=True) -> list:
    """binary: a bool, or {input name: bool}."""
    res = []
    for spec in case.input_specs():
        arr = case.inputs[spec.name]
        b = binary[spec.name] if isinstance(binary, dict) else binary
        i = httpclient.InferInput(spec.name, list(arr.shape), kserve_dtype(spec))
        i.set_data_from_numpy(arr, binary_data=b)
        res.append(i)
    return res


def result_dict(result, names: Sequence[str]) -> Dict[str, Optional[np.ndarray]]:
    return {n: result.as_numpy(n) for n in names}


def grpc_infer_case(client, case: Case, outputs: Optional[Sequence[str]] = None, **kw):
    req_out = None
    if outputs is not None:
        req_out = [grpcclient.InferRequestedOutput(n) for n in outputs]
    r = client.infer(case.model, grpc_inputs(case), outputs=req_out, **kw)
    return result_dict(r, outputs if outputs is not None else case.output_names()), r


def http_infer_case(client, case: Case, binary_in=True, binary_out=True,
                    outputs: Optional[Sequence[str]] = None, **kw):
    """binary_out: a bool or {output name: bool}; outputs: names to request (None:
    request every output explicitly when binary_out is a dict, else none)."""
    names = list(outputs) if outputs is not None else case.output_names()
    if outputs is None and not isinstance(binary_out, dict):
        req_out = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in names]
    else:
        req_out = [httpclient.InferRequestedOutput(
            n, binary_data=binary_out[n] if isinstance(binary_out, dict) else binary_out)
            for n in names]
    r = client.infer(case.model, http_inputs(case, binary_in), outputs=req_out, **kw)
    return result_dict(r, names), r


def grpc_code(e: InferenceServerException) -> str:
    """'INVALID_ARGUMENT' from a tritonclient gRPC exception."""
    s = e.status() or ""
    return s.replace("StatusCode.", "")


# ---- raw HTTP ---------------------------------------------------------------

class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix-domain socket (a node's worker)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def http_request(host_port: str, method: str, path: str, body: bytes = b"",
                 headers: Optional[Dict[str, str]] = None, timeout: float = 30):
    """(status, headers dict (lower-case keys), body bytes) with http.client;
    host_port may be "unix:/path" (a Unix-domain socket)."""
    if host_port.startswith("unix:"):
        conn = UnixHTTPConnection(host_port[len("unix:"):], timeout)
    else:
        host, port = host_port.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def http_json(host_port: str, method: str, path: str, doc=None, timeout: float = 30):
    body = b"" if doc is None else json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"} if doc is not None else {}
    status, hdrs, data = http_request(host_port, method, path, body, headers, timeout)
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = None
    return status, parsed, data


def binary_infer_body(header: dict, blobs: Sequence[bytes]) -> Tuple[bytes, Dict[str, str]]:
    h = json.dumps(header).encode()
    return h + b"".join(blobs), {"Inference-Header-Content-Length": str(len(h)),
                                 "Content-Type": "application/octet-stream"}


def parse_binary_infer_response(headers: Dict[str, str], body: bytes):
    """(json header, {output name: raw bytes or None}) of a /infer reply."""
    hlen = headers.get("inference-header-content-length")
    if hlen is None:
        return json.loads(body), {}
    hlen = int(hlen)
    doc = json.loads(body[:hlen])
    pos = hlen
    raw = {}
    for o in doc.get("outputs", []):
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw[o["name"]] = body[pos:pos + size]
            pos += size
    assert pos == len(body), f"binary reply: {len(body) - pos} trailing bytes"
    return doc, raw


# ---- raw gRPC ---------------------------------------------------------------

def grpc_channel(url: str):
    return grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1),
                                               ("grpc.max_receive_message_length", -1)])


def grpc_stub(channel):
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


# Minimal protobuf wire-format codec, for services whose stubs are not installed.

def pb_varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field_bytes(field: int, value: bytes) -> bytes:
    return pb_varint((field << 3) | 2) + pb_varint(len(value)) + value


def pb_field_varint(field: int, value: int) -> bytes:
    return pb_varint(field << 3) + pb_varint(value)


def pb_decode(data: bytes) -> List[Tuple[int, int, object]]:
    """[(field number, wire type, value)]: varints as int, length-delimited as bytes."""
    out = []
    pos = 0

    def varint():
        nonlocal pos
        shift = result = 0
        while True:
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while pos < len(data):
        key = varint()
        field, wt = key >> 3, key & 7
        if wt == 0:
            out.append((field, wt, varint()))
        elif wt == 2:
            n = varint()
            out.append((field, wt, data[pos:pos + n]))
            pos += n
        elif wt == 1:
            out.append((field, wt, data[pos:pos + 8]))
            pos += 8
        elif wt == 5:
            out.append((field, wt, data[pos:pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
    return out


def pb_get(fields, number):
    return [v for f, _, v in fields if f == number]


# ---- metrics ----------------------------------------------------------------

METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)(\s+\d+)?$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str):
    """{(name, frozenset(labels.items())): value} and {name: type}."""
    samples, types = {}, {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = METRIC_LINE.match(line)
        assert m, f"malformed metrics line: {line!r}"
        labels = dict(LABEL.findall(m.group(3) or ""))
        samples[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return samples, types


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers.get("Content-Type", "")
        assert ctype.startswith("text/plain"), f"metrics Content-Type {ctype!r}"
        return r.read().decode()


def metric(samples, name: str, **labels) -> Optional[float]:
    """The sample of `name` with exactly `labels`; behind a node (whose
    gateway adds a `worker` label to each worker's samples) the sum over
    the workers."""
    exact = samples.get((name, frozenset(labels.items())))
    if exact is not None or not NODE_WORKERS:
        return exact
    found = [v for (n, ls), v in samples.items()
             if n == name and "worker" in dict(ls)
             and {k: x for k, x in ls if k != "worker"} == labels]
    return sum(found) if found else None


# Metric families of the device weight cache (docs/serving.md, Metrics).
LOADS = "pjserve_weight_loads_total"
EVICTIONS = "pjserve_weight_evictions_total"
RESIDENT = "pjserve_weight_resident_bytes"
LOAD_SECONDS = "pjserve_weight_load_seconds_total"
BUDGET = "pjserve_weight_cache_budget_bytes"
USED = "pjserve_weight_cache_used_bytes"
PINNED = "pjserve_weight_cache_pinned_bytes"


# ---- threads ----------------------------------------------------------------

def run_threads(fn, n: int, timeout: float):
    """Runs fn(i) on n threads; returns (results, exceptions); fails on a hang."""
    results = [None] * n
    errors: List[Tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(i):
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append((i, e))

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"threads {hung} still running after {timeout} s (requests hang)"
    return results, errors


BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- the models ---------------------------------------------------------------

# Every model the main server's repository holds (the demo models, a renamed
# copy of mlp for the unload/load tests, and a model with a BF16 interface:
# the demo models only use bf16 inside mlp_bf16).
RELOAD_MODEL = "mlp_reload"
BF16_MODEL = "bf16_io"

# A public model slow enough to keep the device busy: two_io and convnet
# execute in well under a millisecond here, too little for a flood of them to
# build a queue of seconds, or for requests arriving one by one from Python
# threads to find the device busy. This loop of SLOW_ITERATIONS 64x64
# matrix-vector products executes in ~10 ms at batch 1 (measured: 0.22 us per
# iteration), in the PJRT plugin, which no sanitizer instruments.
SLOW = "slow"
SLOW_ITERATIONS = 40000


def slow_fn(p, x):
    return jax.lax.fori_loop(0, SLOW_ITERATIONS, lambda i, v: jnp.tanh(v @ p["w"] + p["b"]), x)


def slow_model() -> demo.DemoModel:
    params = {"w": jnp.eye(64, dtype=jnp.float32) * 0.999, "b": jnp.float32(0.001)}
    return demo.DemoModel(SLOW, slow_fn, params, [np.zeros((1, 64), np.float32)], ["x"], ["y"],
                          "a loop of matrix-vector products, slow on purpose")
DEMO_MODELS = tuple(demo.DEMO_MODEL_NAMES)
ALL_MODELS = DEMO_MODELS + (BF16_MODEL, RELOAD_MODEL)


def _bf16_io_fn(p, x):
    return x * p["scale"] + p["bias"]


def bf16_io_model() -> demo.DemoModel:
    bf16 = jnp.bfloat16
    params = {"scale": jnp.array([1.5, -2.0, 0.25, 3.0], bf16),
              "bias": jnp.array([0.5, 0.125, -1.0, 2.0], bf16)}
    return demo.DemoModel(BF16_MODEL, _bf16_io_fn, params,
                          [np.zeros((1, 4), ml_dtypes.bfloat16)], ["x"], ["y"],
                          "bf16 in, bf16 out: y = x*scale + bias")


# ---- servers in fixtures ----------------------------------------------------

def start_or_fail(s: ServerProcess) -> ServerProcess:
    """Starts s; a server that does not come up fails the test with its log."""
    try:
        s.start()
    except ServerFailure as e:
        s.kill()
        pytest.fail(str(e), pytrace=False)
    return s


def finish_checked(s: ServerProcess, expected_errors: Sequence[str] = ()):
    """Stops s; fails unless it exited 0 with no error or sanitizer line
    (besides those matching an `expected_errors` pattern)."""
    problems = s.stop_and_check(expected_errors)
    if problems:
        pytest.fail(f"server {s.name!r} did not shut down cleanly:\n- " + "\n- ".join(problems)
                    + "\n" + s.describe(), pytrace=False)


def guard_alive(s: ServerProcess):
    """For a fixture handing a shared server to one test: it must be running
    before and after."""
    if not s.alive():
        pytest.fail(f"the server is not running\n{s.describe()}", pytrace=False)
    yield s
    if not s.alive():
        pytest.fail(f"the server died during this test\n{s.describe()}", pytrace=False)


def wait_https_ready(server: "ServerProcess", ctx, what: str, timeout: float):
    """Waits until `server` answers GET /v2/health/ready over HTTPS with the
    SSL context ctx (a server whose plain-HTTP probe cannot reach it)."""
    url = f"https://{server.http_url}/v2/health/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise ServerFailure(f"the {what} server exited\n{server.describe()}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    server.kill()
    raise ServerFailure(f"the {what} server was not ready within {timeout:.0f} s\n"
                        f"{server.describe()}")


class SourceRelay:
    """A local TCP port whose connections reach 127.0.0.1:target_port from
    another loopback address (`source`, e.g. 127.0.0.2): the server sees a
    different client, while the client library (tritonclient, which cannot
    pick its source address) connects to `url` as usual. Bytes are copied
    both ways by a thread per direction; close() stops accepting and shuts
    the connections down."""

    def __init__(self, target_port: int, source: str):
        self.target_port, self.source = target_port, source
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: List[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            outbound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            outbound.bind((self.source, 0))
            try:
                outbound.connect(("127.0.0.1", self.target_port))
            except OSError:
                inbound.close()
                outbound.close()
                continue
            for s in (inbound, outbound):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sockets += [inbound, outbound]
            for a, b in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        self.closed = True
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def start_or_fail(server: ServerProcess) -> ServerProcess:
    """server.start(); a server that does not come up fails the test with why."""
    try:
        server.start()
    except ServerFailure as e:
        pytest.fail(str(e), pytrace=False)
    return server


def stop_all_checked(servers: Sequence[ServerProcess]):
    """Stops every server still running (SIGTERM, exit and log checked), kills
    what is left, and fails the test when any did not shut down cleanly."""
    problems = []
    for s in servers:
        if s.alive():
            problems += [f"{s.name}: {p}" for p in s.stop_and_check()]
    for s in servers:
        s.kill()
    if problems:
        pytest.fail("server did not shut down cleanly:\n- " + "\n- ".join(problems)
                    + "\n" + "\n".join(s.describe() for s in servers), pytrace=False)
