"""libpjserve-client against a real server, over gRPC and REST, through
tests/client/client_check.c (every call of include/pjserve/client.h) and
examples/client/simple.c:

- every call: health, metadata, configuration, statistics, the repository
  index, model control status, shared memory status, unload and load;
- inference by every path (sync, async callback, polled handle, gRPC
  stream), with and without shared memory staging, answers equal to the JAX
  reference (max abs error printed);
- errors: unknown model, bad shape, unknown output, the server's deadline,
  mistakes the library catches itself, a deadline with a server that never
  answers, a stream's per-request error;
- many asynchronous calls in flight from several threads, and a stream;
- BYTES through the string models;
- mutual TLS with an admin token, and refusals without them;
- the header compiled as C++, and the installed library found with
  pkg-config and linked both ways.
"""

import json
import os
import socket
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from client_util import url_of

PROTOCOLS = ("grpc", "http")


def run_check(tools, scenario, url, *args, expect_ok=True, timeout=300):
    r = tools.run(tools.check, scenario, url, *args, timeout=timeout)
    if expect_ok:
        assert r.returncode == 0 and "FAIL" not in r.stdout, \
            f"pjs_client_check {scenario} {url} failed:\n{r.stdout}\n{r.stderr}"
    return r


def docs(stdout: str) -> dict:
    """The "NAME VALUE" lines: JSON values decoded, others as text;
    model_ready lines collected in order."""
    out = {"model_ready": []}
    for line in stdout.splitlines():
        name, _, value = line.partition(" ")
        if name == "model_ready":
            out[name].append(value)
            continue
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


def errors(stdout: str) -> dict:
    """{CASE: (CODE, HTTP, FROM_SERVER, MESSAGE)} of the "error" lines."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("error "):
            _, case, code, http, from_server, msg = line.split(" ", 5)
            out[case] = (code, int(http), int(from_server), msg)
    return out


# ---- every call ---------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_call(tools, server, protocol):
    r = run_check(tools, "calls", url_of(server, protocol))
    d = docs(r.stdout)
    assert d["live"] == 1 and d["ready"] == 1
    assert d["model_ready"] == ["mlp 1", "nope 0", "two_io 0", "two_io 1"]
    assert d["server_metadata"]["name"] == "pjserve"
    assert "system_shared_memory" in d["server_metadata"]["extensions"]
    meta = d["model_metadata"]
    assert meta == d["model_metadata_v1"]
    assert meta["name"] == "mlp"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    config = d["model_config"]["config"] if protocol == "grpc" else d["model_config"]
    assert config["name"] == "mlp" and config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [16]
    names = {s["name"] for s in d["statistics_all"]["model_stats"]}
    assert {"mlp", "two_io"} <= names
    (mlp_stats,) = d["statistics_mlp"]["model_stats"]
    assert mlp_stats["name"] == "mlp" and "success" in mlp_stats["inference_stats"]
    index = d["index"]["models"] if protocol == "grpc" else d["index"]
    assert {m["name"]: m["state"] for m in index}["mlp"] == "READY"
    ready_index = d["index_ready"]["models"] if protocol == "grpc" else d["index_ready"]
    assert "two_io" not in {m["name"] for m in ready_index}
    assert "mlp" in {m["name"] for m in ready_index}
    control = d["control"]
    assert control["control_mode"] and "cache" in control
    mlp = [m for m in control["models"] if m["name"] == "mlp"][0]
    assert mlp["residency"].lower() in ("host", "device", "unpinned")
    assert mlp["weight_bytes"] > 0
    assert d["shm_status"] in ({"regions": {}}, [])
    assert d["unload"] == "two_io ok" and d["load"] == "two_io ok"
    assert d["protocol"] == protocol


# ---- inference against the JAX reference -------------------------------------------------

NUMPY_OF = {"FP32": np.float32, "INT32": np.int32, "FP16": np.float16,
            "BF16": ml_dtypes.bfloat16}
# How far an answer may be from the JAX reference, by datatype.
TOLERANCE = {"FP32": 1e-5, "INT32": 0, "FP16": 1e-2, "BF16": 1e-2}


def write_inputs(case, d: Path):
    specs = []
    dtypes = {np.dtype(t): name for name, t in NUMPY_OF.items()}
    for name, arr in case.inputs.items():
        arr = np.ascontiguousarray(arr)
        path = d / f"{name}.in"
        path.write_bytes(arr.tobytes())
        specs += ["--input", f"{name}:{dtypes[arr.dtype]}:{'x'.join(map(str, arr.shape))}:{path}"]
    return specs


def read_outputs(stdout: str):
    out = {}
    for line in stdout.splitlines():
        if line.startswith("output "):
            parts = line.split(" ")
            name, datatype, dims, path = parts[1:5]
            shape = tuple(int(x) for x in dims.split(",")) if dims != "-" else ()
            data = np.frombuffer(Path(path).read_bytes(), NUMPY_OF[datatype]).reshape(shape)
            out[name] = (datatype, data)
    return out


# Every path of every protocol, inline and staged in shared memory (but
# streams: their answers are not matched to their requests' regions).
INFER_PATHS = [(p, m, shm) for p in ("grpc", "http")
               for m in ("sync", "async", "poll", "stream") for shm in (0, 1)
               if not (m == "stream" and (p == "http" or shm))]


@pytest.mark.parametrize("protocol,mode,shm", INFER_PATHS)
@pytest.mark.parametrize("model,n", [("mlp", 3), ("two_io", 5), ("mlp_f16", 2), ("bf16_io", 4)])
def test_infer_matches_jax(tools, server, cases, tmp_path, protocol, mode, shm, model, n):
    case = cases.get(model, n)
    args = write_inputs(case, tmp_path)
    r = run_check(tools, "infer", url_of(server, protocol), "--model", model, "--mode", mode,
                  "--shm", shm, "--outdir", tmp_path, *args)
    got = read_outputs(r.stdout)
    assert set(got) == set(case.expected)
    for name, want in case.expected.items():
        datatype, data = got[name]
        assert data.shape == want.shape and data.dtype == want.dtype, datatype
        d = np.abs(data.astype(np.float64) - want.astype(np.float64))
        print(f"{model} {protocol} {mode} shm={shm} {name} {datatype}: "
              f"max abs error {float(d.max()) if d.size else 0.0:.3g}")
        tol = TOLERANCE[datatype]
        np.testing.assert_allclose(data.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)
    if shm:
        assert all(line.endswith(" shm") for line in r.stdout.splitlines()
                   if line.startswith("output "))
    assert f"id check-1 model {model} version 1" in r.stdout


# ---- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_errors_carry_the_servers_status(tools, server, protocol):
    r = run_check(tools, "errors", url_of(server, protocol))
    e = errors(r.stdout)
    assert e["unknown_model"][:3] == ("NOT_FOUND", 404, 1)
    assert "no_such_model" in e["unknown_model"][3]
    assert e["bad_shape"][:3] == ("INVALID_ARGUMENT", 400, 1)
    assert "[1, 15]" in e["bad_shape"][3]
    assert e["unknown_output"][:3] == ("INVALID_ARGUMENT", 400, 1)
    assert e["server_deadline"][:3] == ("DEADLINE_EXCEEDED", 504, 1)
    for local in ("short_input", "bad_datatype", "bad_bytes", "bad_url"):
        assert e[local][0] == "INVALID_ARGUMENT" and e[local][2] == 0, e[local]
    assert e["load_unknown"][0] == "NOT_FOUND" and e["load_unknown"][2] == 1
    assert e["metadata_unknown"][:3] == ("NOT_FOUND", 404, 1)
    if protocol == "http":
        assert e["http_stream"][:3] == ("UNIMPLEMENTED", 501, 0)
    else:
        assert "no_such_model" in e["stream_unknown_model"][3]


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_deadline_with_a_server_that_never_answers(tools, silent_port, protocol):
    url = f"{protocol}://127.0.0.1:{silent_port}"
    r = run_check(tools, "deadline", url, "--timeout-ms", 300)
    e = errors(r.stdout)
    assert e["deadline"][:3] == ("DEADLINE_EXCEEDED", 504, 0), r.stdout
    assert e["live_deadline"][:3] == ("DEADLINE_EXCEEDED", 504, 0), r.stdout
    assert "answered" not in r.stdout


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unreachable_server(tools, protocol):
    r = run_check(tools, "deadline", f"{protocol}://127.0.0.1:{_free_port()}",
                  "--timeout-ms", 2000)
    e = errors(r.stdout)
    assert e["deadline"][0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and e["deadline"][2] == 0
    assert e["live_deadline"][0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- concurrency, shared memory, BYTES -------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_calls_under_concurrency(tools, server, protocol):
    r = run_check(tools, "concurrent", url_of(server, protocol), "--threads", 8,
                  "--requests", 24)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("concurrent ")][0]
    assert line == ("concurrent answered 192 mismatches 0 streamed "
                    + ("24" if protocol == "grpc" else "0"))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shared_memory_staging(tools, server, protocol):
    r = run_check(tools, "shm", url_of(server, protocol))
    d = docs(r.stdout)
    regions = d["shm_status"]
    region = regions["regions"]["in_out"] if protocol == "grpc" else regions[0]
    assert region["name"] == "in_out" and region["byte_size"] == 4096
    assert region["key"].startswith("/pjs-check-shm-")
    assert d["shm_status_after"] in ({"regions": {}}, [])
    assert "shm y 48 bytes equal" in r.stdout
    e = errors(r.stdout)
    assert e["shm_outside"][:3] == ("INVALID_ARGUMENT", 400, 1)
    assert e["shm_unregistered"][0] in ("NOT_FOUND", "INVALID_ARGUMENT")
    assert e["shm_unregistered"][2] == 1 and "not registered" in e["shm_unregistered"][3]
    assert not list(Path("/dev/shm").glob("pjs-check-shm-*")), "a region was left behind"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_tensors(tools, server, protocol):
    r = run_check(tools, "bytes", url_of(server, protocol))
    assert "identity sync 4 elements" in r.stdout
    assert "identity async 4 elements" in r.stdout
    assert ("identity stream 4 elements" in r.stdout) == (protocol == "grpc")
    assert "simple_string 16 elements" in r.stdout


# ---- TLS and tokens ------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mutual_tls_with_an_admin_token(tools, tls_server, certs, protocol):
    url = (f"grpcs://{tls_server.grpc_url}" if protocol == "grpc"
           else f"https://{tls_server.http_url}")
    tls = ["--ca", certs / "ca.pem", "--cert", certs / "client.pem", "--key",
           certs / "client.key"]
    r = run_check(tools, "calls", url, *tls, "--token-file", tls_server.token_file)
    d = docs(r.stdout)
    assert d["live"] == 1 and d["unload"] == "two_io ok" and d["load"] == "two_io ok"
    # The same calls without the token: the admin ones are refused.
    r = run_check(tools, "calls", url, *tls, expect_ok=False)
    assert r.returncode == 1
    assert "FAIL: unload two_io" in r.stdout and "live 1" in r.stdout
    assert ("UNAUTHENTICATED" in r.stdout) or ("PERMISSION_DENIED" in r.stdout)
    # Without a client certificate, or without TLS, nothing gets through.
    r = run_check(tools, "deadline", url, "--ca", certs / "ca.pem", "--timeout-ms", 3000)
    assert errors(r.stdout)["deadline"][0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    plain = url.replace("grpcs://", "grpc://").replace("https://", "http://")
    r = run_check(tools, "deadline", plain, "--timeout-ms", 3000)
    assert errors(r.stdout)["deadline"][0] in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL")


# ---- the example, the header, the installed library -------------------------------------------

def sanitizer_flags(build_dir: Path) -> list:
    """What a program linking this build's library needs besides it: the
    sanitizer runtime the build was made with (make asan / make tsan)."""
    cache = (build_dir / "CMakeCache.txt").read_text()
    if "PJSERVE_SANITIZE:STRING=address" in cache:
        return ["-fsanitize=address,undefined"]
    if "PJSERVE_SANITIZE:STRING=thread" in cache:
        return ["-fsanitize=thread"]
    return []


def mlp_reference(exported, x):
    e = exported["mlp"]
    (y,) = e.model.reference(x)
    return np.asarray(y)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_example_program(tools, server, exported, protocol):
    r = tools.run(tools.example, url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    assert f"mlp at {url_of(server, protocol)} is ready" in r.stdout
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("y: FP32 [2, 4] =")][0]
    got = np.array([float(v) for v in line.split("=")[1].split()], np.float32).reshape(2, 4)
    x = (np.arange(32, dtype=np.float32) / np.float32(10)).reshape(2, 16)
    want = mlp_reference(exported, x)
    print(f"example: max abs error {np.max(np.abs(got - want)):.3g}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    r = tools.run(tools.example, url_of(server, protocol), "no_such_model")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "is not ready" in r.stdout


def test_header_compiles_as_cxx(tools, tmp_path):
    src = tmp_path / "use.cc"
    src.write_text(
        '#include <pjserve/client.h>\n#include <cstdio>\n'
        'int main() {\n'
        '  pjs_client_options o = {};\n  pjs_client *c = nullptr;\n  pjs_client_error e;\n'
        '  int rc = pjs_client_connect("ftp://x", &o, &c, &e);\n'
        '  std::printf("%s %s %d\\n", pjs_client_version(), pjs_client_code_name(e.code), rc);\n'
        '  return rc == PJS_CLIENT_INVALID_ARGUMENT ? 0 : 1;\n}\n')
    repo = Path(__file__).resolve().parents[2]
    exe = tmp_path / "use"
    r = subprocess.run(["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                        *sanitizer_flags(tools.build_dir),
                        f"-I{repo / 'include'}", str(src), "-o", str(exe),
                        f"-L{tools.build_dir}", "-lpjserve-client",
                        f"-Wl,-rpath,{tools.build_dir}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0 and "INVALID_ARGUMENT 3" in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(tools, tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("prefix")
    r = subprocess.run(["cmake", "--install", str(tools.build_dir), "--prefix", str(prefix)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return prefix


def pkg_config(prefix: Path, *args) -> list:
    pc = list(prefix.glob("lib*/pkgconfig/pjserve-client.pc")) + \
        list(prefix.glob("lib/*/pkgconfig/pjserve-client.pc"))
    assert pc, f"no pjserve-client.pc under {prefix}"
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc[0].parent))
    r = subprocess.run(["pkg-config", *args, "pjserve-client"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("link", ["shared", "static"])
def test_installed_library_with_pkg_config(tools, installed, server, tmp_path, link):
    """The example built outside the tree the way its comment says, against
    what `make install` put in the prefix."""
    example = Path(__file__).resolve().parents[2] / "examples" / "client" / "simple.c"
    cflags = pkg_config(installed, "--cflags")
    if link == "static":
        # The archive, with its dependencies' shared libraries (Debian
        # ships no static libcurl dependencies): as docs/client.md says.
        (libdir,) = pkg_config(installed, "--variable=libdir")
        libs = [f"{libdir}/libpjserve-client.a"] + subprocess.run(
            ["pkg-config", "--libs", "grpc", "libcurl", "jansson", "libprotobuf-c"],
            capture_output=True, text=True, check=True).stdout.split() + ["-lpthread"]
    else:
        libs = pkg_config(installed, "--libs")
    exe = tmp_path / f"simple-{link}"
    sanitize = sanitizer_flags(tools.build_dir)
    r = subprocess.run(["cc", str(example), *cflags, "-o", str(exe), *libs, *sanitize],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # As a user runs it: no LD_LIBRARY_PATH, no ldconfig (the .pc's rpath).
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([str(exe), url_of(server, "grpc")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "y: FP32 [2, 4] =" in r.stdout


def test_installed_pjserve_uses_its_own_plugin(installed, tmp_path):
    """An installed pjserve, run from elsewhere with no environment variable,
    loads the CPU plugin `make install` put beside it, not the source
    tree's .venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJSERVE_")}
    r = subprocess.run([str(installed / "bin" / "pjserve"), "info"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (plugin,) = [ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines()
                 if ln.startswith("plugin:")]
    assert Path(plugin).resolve().is_relative_to(installed.resolve()), plugin
    assert Path(plugin).name == "xla_cpu_pjrt.so"
