"""The client commands of `pjserve` against a real server, over gRPC and
REST: `infer` (outputs as .npy equal to the JAX reference, the table, and
--json with every value), `models` (table and
--json, with residency), `load` / `unload` (and the token an admin call
needs), `status`; --help that answers, usage errors (exit 2) and failures
(exit 1) that say what to do; and the library and the commands behind
`pjserve gateway` over two workers.
"""

import json
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest

from client_util import url_of

PROTOCOLS = ("grpc", "http")


def pjserve(tools, *args, timeout=120):
    return subprocess.run([str(tools.pjserve), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def table(stdout: str):
    """Rows of a table as lists of cells (split on runs of 2+ spaces)."""
    return [re.split(r"\s{2,}", ln.strip()) for ln in stdout.splitlines() if ln.strip()]


def save_inputs(case, d):
    args = []
    for name, arr in case.inputs.items():
        path = d / f"{name}.npy"
        np.save(path, arr)
        args += ["--input", f"{name}={path}"]
    return args


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model,n", [("mlp", 4), ("two_io", 2), ("mlp_f16", 3), ("bf16_io", 2)])
def test_infer_writes_npy_equal_to_jax(tools, server, cases, tmp_path, protocol, model, n):
    case = cases.get(model, n)
    out = tmp_path / "out"
    r = pjserve(tools, "infer", model, *save_inputs(case, tmp_path), "--output-dir", out,
                "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)
    assert rows[0] == ["OUTPUT", "DATATYPE", "SHAPE", "FILE"]
    assert {row[0] for row in rows[1:]} == set(case.expected)
    for name, want in case.expected.items():
        got = np.load(out / f"{name}.npy")
        if got.dtype == np.dtype("V2"):  # bf16, written as ml_dtypes writes it
            got = got.view(ml_dtypes.bfloat16)
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        print(f"pjserve infer {model} {protocol} {name}: max abs error {err.max():.3g}")
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = 1e-2 if want.dtype.itemsize == 2 else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_json_and_table(tools, server, cases, tmp_path, protocol):
    case = cases.get("mlp", 2)
    args = save_inputs(case, tmp_path)
    r = pjserve(tools, "infer", "mlp", *args, "--json", "--id", "req-7", "--priority", 1,
                "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model_name"] == "mlp" and doc["id"] == "req-7"
    (y,) = doc["outputs"]
    assert y["name"] == "y" and y["datatype"] == "FP32" and y["shape"] == [2, 4]
    np.testing.assert_allclose(np.array(y["data"], np.float32).reshape(2, 4),
                               case.expected["y"], rtol=1e-5, atol=1e-5)
    r = pjserve(tools, "infer", "mlp", *args, "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    head, row = table(r.stdout)
    assert head == ["OUTPUT", "DATATYPE", "SHAPE", "VALUES"]
    assert row[:3] == ["y", "FP32", "[2, 4]"] and row[3].endswith(", ...]")


def test_infer_protocol_flag_and_environment(tools, server, cases, tmp_path, monkeypatch):
    case = cases.get("mlp", 1)
    args = save_inputs(case, tmp_path)
    r = pjserve(tools, "infer", "mlp", *args, "--protocol", "http", "--url", server.http_url)
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("PJSERVE_URL", f"grpc://{server.grpc_url}")
    r = pjserve(tools, "infer", "mlp", *args, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"][0]["shape"] == [1, 4]
    r = pjserve(tools, "infer", "mlp", *args, "--protocol", "http", "--url",
                f"grpc://{server.grpc_url}")
    assert r.returncode == 2 and "does not match" in r.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_strings_in_and_out(tools, server, tmp_path, protocol):
    """numpy string arrays are BYTES inputs (unicode as UTF-8, byte strings as
    they are) and BYTES outputs are saved as byte strings: simple_string adds
    and subtracts numerals, simple_identity returns binary strings (a NUL
    inside) unchanged."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.array([[str(i) for i in range(16)]]))                 # <U2
    np.save(b, np.array([[str(3 * i).encode() for i in range(16)]]))    # |S2
    out = tmp_path / "out"
    r = pjserve(tools, "infer", "simple_string", "--input", f"INPUT0={a}", "--input",
                f"INPUT1={b}", "--output-dir", out, "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    sums, diffs = np.load(out / "OUTPUT0.npy"), np.load(out / "OUTPUT1.npy")
    assert sums.dtype.kind == "S" and sums.shape == (1, 16)
    assert [int(x) for x in sums[0]] == [4 * i for i in range(16)]
    assert [int(x) for x in diffs[0]] == [-2 * i for i in range(16)]

    blobs = np.array([[b"\x00\x01binary\xff", b"text", b"a\x00b"]])
    np.save(a, blobs)
    r = pjserve(tools, "infer", "simple_identity", "--input", f"INPUT0={a}", "--output-dir",
                out, "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    back = np.load(out / "OUTPUT0.npy")
    assert back.shape == blobs.shape and (back == blobs).all(), back


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_numbers_for_a_bytes_input_are_refused(tools, server, tmp_path, protocol):
    """A numeric .npy for a BYTES input is refused by the server, which names
    the input and its datatype."""
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.arange(16, dtype=np.int32)[None, :])
    np.save(b, np.ones((1, 16), np.int32))
    r = pjserve(tools, "infer", "simple_string", "--input", f"INPUT0={a}", "--input",
                f"INPUT1={b}", "--url", url_of(server, protocol))
    assert r.returncode == 1
    assert "INPUT0" in r.stderr and "BYTES" in r.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_errors_say_what_to_do(tools, server, cases, tmp_path, protocol):
    case = cases.get("mlp", 1)
    args = save_inputs(case, tmp_path)
    r = pjserve(tools, "infer", "no_such_model", *args, "--url", url_of(server, protocol))
    assert r.returncode == 1
    assert "pjserve: error: infer:" in r.stderr and "no_such_model" in r.stderr
    assert "pjserve models" in r.stderr
    bad = tmp_path / "bad.npy"
    np.save(bad, np.ones((1, 15), np.float32))
    r = pjserve(tools, "infer", "mlp", "--input", f"x={bad}", "--url", url_of(server, protocol))
    assert r.returncode == 1 and "[1, 15]" in r.stderr
    r = pjserve(tools, "infer", "mlp", "--input", f"x={tmp_path / 'missing.npy'}")
    assert r.returncode == 1 and "missing.npy" in r.stderr
    r = pjserve(tools, "infer", "mlp", *args, "--url", "127.0.0.1:1")
    assert r.returncode == 1 and "cannot reach the server" in r.stderr


def test_usage_and_help(tools):
    r = pjserve(tools, "infer", "--help")
    assert r.returncode == 0 and "--input NAME=FILE.npy" in r.stdout and "--json" in r.stdout
    assert "--url" in r.stdout and "example:" in r.stdout
    for cmd in ("models", "load", "unload", "status"):
        r = pjserve(tools, cmd, "--help")
        assert r.returncode == 0 and "--url" in r.stdout, cmd
    r = pjserve(tools, "infer", "mlp")
    assert r.returncode == 2 and "--input NAME=FILE.npy" in r.stderr
    r = pjserve(tools, "infer", "mlp", "--input", "x.npy")
    assert r.returncode == 2 and "NAME=FILE.npy" in r.stderr
    r = pjserve(tools, "load")
    assert r.returncode == 2 and "name one model" in r.stderr
    r = pjserve(tools, "models", "--protocol", "smtp")
    assert r.returncode == 2 and "grpc or http" in r.stderr
    r = pjserve(tools, "status", "--timeout-ms", "soon")
    assert r.returncode == 2
    r = pjserve(tools, "--help")
    assert r.returncode == 0 and "infer MODEL" in r.stdout and "status" in r.stdout


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_models_table_and_json(tools, server, protocol):
    r = pjserve(tools, "models", "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)
    assert rows[0] == ["MODEL", "STATE", "RESIDENCY", "ON DEVICE", "WEIGHTS", "REASON"]
    by_name = {row[0]: row for row in rows[1:]}
    assert {"mlp", "two_io", "simple_string", "simple_identity"} <= set(by_name)
    assert by_name["mlp"][1] == "READY" and by_name["mlp"][2] in ("host", "device", "unpinned")
    assert by_name["mlp"][4].endswith("KiB")
    r = pjserve(tools, "models", "--json", "--url", url_of(server, protocol))
    doc = json.loads(r.stdout)
    assert doc["control"] is True
    mlp = [m for m in doc["models"] if m["name"] == "mlp"][0]
    assert mlp["state"] == "READY" and mlp["weight_bytes"] > 0
    assert mlp["residency"] in ("host", "device", "unpinned")
    assert isinstance(mlp["resident"], bool)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_unload(tools, server, protocol):
    url = url_of(server, protocol)
    r = pjserve(tools, "unload", "two_io", "--url", url)
    assert r.returncode == 0 and r.stdout.strip() == "unloaded two_io", r.stderr
    r = pjserve(tools, "models", "--ready", "--json", "--url", url)
    assert "two_io" not in {m["name"] for m in json.loads(r.stdout)["models"]}
    r = pjserve(tools, "models", "--url", url)
    two_io = [row for row in table(r.stdout) if row[0] == "two_io"][0]
    assert two_io[1] == "UNAVAILABLE" and two_io[2] == "-"
    r = pjserve(tools, "load", "two_io", "--url", url, "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"model": "two_io", "state": "READY"}
    r = pjserve(tools, "load", "no_such_model", "--url", url)
    assert r.returncode == 1 and "no_such_model" in r.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_status(tools, server, protocol):
    r = pjserve(tools, "status", "--url", url_of(server, protocol))
    assert r.returncode == 0, r.stderr
    rows = {row[0]: row[1] for row in table(r.stdout)}
    assert rows["server"].startswith("pjserve ") and rows["live"] == "yes"
    assert rows["ready"] == "yes" and "READY" in rows["models"]
    assert "on the device" in rows["weights"] and "system_shared_memory" in rows["extensions"]
    r = pjserve(tools, "status", "--json", "--url", url_of(server, protocol))
    doc = json.loads(r.stdout)
    assert doc["name"] == "pjserve" and doc["live"] is True and doc["ready"] is True
    assert doc["models"]["READY"] >= 4 and doc["url"] == url_of(server, protocol)
    assert "cache" in doc["control"]


def test_admin_calls_need_the_token_over_mutual_tls(tools, tls_server, certs):
    tls = ["--tls-ca", certs / "ca.pem", "--tls-cert", certs / "client.pem", "--tls-key",
           certs / "client.key"]
    for url in (f"grpcs://{tls_server.grpc_url}", f"https://{tls_server.http_url}"):
        r = pjserve(tools, "status", "--url", url, *tls)
        assert r.returncode == 0 and "live        yes" in r.stdout, r.stderr
        r = pjserve(tools, "unload", "mlp", "--url", url, *tls)
        assert r.returncode == 1 and "hint: admin calls need --token-file" in r.stderr
        r = pjserve(tools, "unload", "mlp", "--url", url, *tls, "--token-file",
                    tls_server.token_file)
        assert r.returncode == 0, r.stderr
        r = pjserve(tools, "load", "mlp", "--url", url, *tls, "--token-file",
                    tls_server.token_file)
        assert r.returncode == 0, r.stderr
    # A URL without a scheme gets TLS from the TLS options.
    r = pjserve(tools, "models", "--url", tls_server.grpc_url, *tls)
    assert r.returncode == 0 and "mlp" in r.stdout, r.stderr


def test_through_a_gateway(tools, gateway, cases, tmp_path):
    """The library and the commands behind `pjserve gateway` over two
    workers: every call, asynchronous calls and a stream spread over the
    workers, and the tables."""
    for url in (f"grpc://{gateway.grpc_url}", f"http://{gateway.http_url}"):
        r = tools.run(tools.check, "calls", url)
        assert r.returncode == 0, r.stdout + r.stderr
        r = tools.run(tools.check, "concurrent", url, "--threads", 4, "--requests", 8)
        assert r.returncode == 0 and "mismatches 0" in r.stdout, r.stdout + r.stderr
        r = pjserve(tools, "models", "--url", url)
        assert r.returncode == 0 and "mlp" in r.stdout, r.stderr
        case = cases.get("mlp", 2)
        out = tmp_path / "out"
        r = pjserve(tools, "infer", "mlp", *save_inputs(case, tmp_path), "--url", url,
                    "--output-dir", out)
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(out / "y.npy"), case.expected["y"], rtol=1e-5,
                                   atol=1e-5)


# ---- a server's strings reach the terminal escaped -----------------------------------

HOSTILE = "y\x1b[2J\n2026-11-23T18:00:00Z forged line\r"
ESCAPED = "y\\x1b[2J\\n2026-11-23T18:00:00Z forged line\\r"


class HostileServer:
    """A KServe V2 REST server that answers every inference with an output
    named HOSTILE, or (for a model named `refuse`) an error whose text is
    HOSTILE: what a hostile or broken server could send."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if "/models/refuse/" in self.path:
                    status, doc = 400, {"error": HOSTILE}
                else:
                    status, doc = 200, {"model_name": "m", "outputs": [
                        {"name": HOSTILE, "datatype": "INT32", "shape": [1], "data": [7]}]}
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile_server():
    s = HostileServer()
    yield s
    s.close()


def test_infer_shows_a_servers_strings_escaped(tools, hostile_server, tmp_path):
    """An output name and an error text holding ESC, CR and newlines are
    shown escaped, each on the one line it belongs to."""
    np.save(tmp_path / "x.npy", np.ones((1,), np.int32))
    r = pjserve(tools, "infer", "m", "--input", f"x={tmp_path / 'x.npy'}",
                "--url", hostile_server.url)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\r" not in r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[1].startswith(ESCAPED) and lines[1].rstrip().endswith("[7]"), r.stdout

    r = pjserve(tools, "infer", "refuse", "--input", f"x={tmp_path / 'x.npy'}",
                "--url", hostile_server.url)
    assert r.returncode == 1
    assert "\x1b" not in r.stderr and "\r" not in r.stderr
    error = [ln for ln in r.stderr.splitlines() if ln.startswith("pjserve: error:")]
    assert len(error) == 1 and ESCAPED in error[0], r.stderr
    assert "forged line" not in r.stderr.replace(error[0], ""), r.stderr


# ---- stateful and decoupled models ---------------------------------------------------

def test_infer_steps_of_a_sequence(tools, server, tmp_path):
    """Three steps of one sequence through `pjserve infer --sequence-id`:
    the running sum, plus the id on the step flagged --sequence-end."""
    outputs = []
    for k, value in enumerate((1, 2, 3)):
        np.save(tmp_path / "in.npy", np.array([[value]], np.int32))
        flags = ["--sequence-start"] if k == 0 else ["--sequence-end"] if k == 2 else []
        r = pjserve(tools, "infer", "simple_string_dyna_sequence",
                    "--input", f"INPUT={tmp_path / 'in.npy'}", "--output", "OUTPUT",
                    "--sequence-id", "1000", *flags, "--url", url_of(server, "grpc"), "--json")
        assert r.returncode == 0, r.stderr
        outputs.append(json.loads(r.stdout)["outputs"][0]["data"])
    assert outputs == [[1], [3], [6 + 1000]]


def test_infer_parameters_are_typed(tools, server, tmp_path):
    """--parameter sends int, bool and string parameters; a bad one is a
    usage error."""
    np.save(tmp_path / "x.npy", np.ones((1, 16), np.float32))
    x = ["--input", f"x={tmp_path / 'x.npy'}", "--url", url_of(server, "http")]
    r = pjserve(tools, "infer", "mlp", *x, "--parameter", "timeout=int:60000000",
                "--parameter", "note=hello", "--parameter", "flag=true")
    assert r.returncode == 0, r.stderr
    r = pjserve(tools, "infer", "mlp", *x, "--parameter", "timeout=int:soon")
    assert r.returncode == 2 and "not an integer" in r.stderr, r.stderr
    r = pjserve(tools, "infer", "mlp", *x, "--sequence-start")
    assert r.returncode == 2 and "--sequence-id" in r.stderr, r.stderr


def repeat_inputs(tmp_path, values, delays, wait_ms):
    args = []
    for name, arr in (("IN", np.array(values, np.int32)), ("DELAY", np.array(delays, np.uint32)),
                      ("WAIT", np.array([wait_ms], np.uint32))):
        np.save(tmp_path / f"{name}.npy", arr)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    return args


def test_infer_stream_shows_every_response(tools, server, tmp_path):
    """repeat_int32 answers one response per value, then the final flag
    alone: --stream shows each, in order."""
    values = [7, 8, 9, 10]
    r = pjserve(tools, "infer", "repeat_int32", *repeat_inputs(tmp_path, values, [5] * 4, 5),
                "--output", "OUT", "--output", "IDX", "--stream", "--json",
                "--url", url_of(server, "grpc"))
    assert r.returncode == 0, r.stderr
    docs = [json.loads(d) for d in re.split(r"\n(?=\{)", r.stdout.strip())]
    got = [{o["name"]: o["data"] for o in d["outputs"]} for d in docs if d["outputs"]]
    assert got == [{"OUT": [v], "IDX": [i]} for i, v in enumerate(values)], r.stdout


def test_infer_a_decoupled_model_without_stream_says_to_stream(tools, server, tmp_path):
    r = pjserve(tools, "infer", "repeat_int32", *repeat_inputs(tmp_path, [1], [0], 0),
                "--url", url_of(server, "grpc"))
    assert r.returncode == 1
    assert "hint: model repeat_int32 is decoupled: use --stream" in r.stderr, r.stderr
    r = pjserve(tools, "infer", "repeat_int32", *repeat_inputs(tmp_path, [1], [0], 0),
                "--stream", "--url", url_of(server, "http"))
    assert r.returncode == 1 and "--stream needs gRPC" in r.stderr, r.stderr
