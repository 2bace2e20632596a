"""HTTPS on the REST and metrics ports (--http-tls-cert/--http-tls-key) and
mutual TLS (--http-tls-ca): tritonclient.http with ssl=True is served; with a
CA given, a client without a certificate, or with one another CA signed, is
refused in the handshake, and one the CA signed is served. Bad files stop the
start with a message naming the flag.

Certificates are made at test time with the openssl command line (Debian's
openssl package, installed by scripts/bootstrap).
"""

import http.client
import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from protocol_util import ServerFailure, ServerProcess, free_ports, make_ca, make_cert

from ..conftest import small_repository
from .conftest import timed


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    assert shutil.which("openssl"), "openssl is missing (scripts/bootstrap installs it)"
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_ca(d, "rogue")
    make_cert(d, "server", "ca", server=True)
    make_cert(d, "client", "ca", server=False)
    make_cert(d, "intruder", "rogue", server=False)
    return d


class HttpsServer(ServerProcess):
    """A server whose REST port speaks HTTPS: ready when the health probe
    answers over TLS (with the client certificate when one is needed)."""

    def __init__(self, *args, certs: Path, mutual: bool, **kw):
        super().__init__(*args, **kw)
        self.certs = certs
        self.mutual = mutual

    def context(self, client: str = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.pem"))
        if client:
            ctx.load_cert_chain(str(self.certs / f"{client}.pem"),
                                str(self.certs / f"{client}.key"))
        return ctx

    def wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        url = f"https://{self.http_url}/v2/health/ready"
        ctx = self.context("client" if self.mutual else None)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailure(f"pjserve exited before it was ready\n{self.describe()}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise ServerFailure(f"not ready over HTTPS within {timeout:.0f} s\n{self.describe()}")


@pytest.fixture
def https_server(pjserve_bin, plugin_path, cache_dir, exported, certs, tmp_path):
    started = []

    def start(mutual: bool):
        repo = small_repository(exported, tmp_path / f"repo{len(started)}", ("mlp",))
        args = ["--http-tls-cert", str(certs / "server.pem"),
                "--http-tls-key", str(certs / "server.key")]
        if mutual:
            args += ["--http-tls-ca", str(certs / "ca.pem")]
        s = HttpsServer(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / f"srv{len(started)}",
                        args, f"https{len(started)}", certs=certs, mutual=mutual)
        started.append(s)
        try:
            s.start()
        except ServerFailure as e:
            pytest.fail(str(e), pytrace=False)
        return s

    yield start
    for s in started:
        s.kill()


def triton_infer(s: HttpsServer, client: str = None):
    opts = {"ca_certs": str(s.certs / "ca.pem")}
    if client:
        opts.update(certfile=str(s.certs / f"{client}.pem"), keyfile=str(s.certs / f"{client}.key"))
    c = httpclient.InferenceServerClient(s.http_url, ssl=True, ssl_options=opts,
                                         connection_timeout=10, network_timeout=10)
    try:
        x = httpclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        return c.infer("mlp", [x]).as_numpy("y")
    finally:
        c.close()


def https_get(s: HttpsServer, port: int, path: str, client: str = None) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                       context=s.context(client))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def finish(s):
    problems = s.stop_and_check()
    assert not problems, "\n".join(problems)


def test_https_with_tritonclient(https_server):
    s = https_server(mutual=False)
    y, dt = timed(triton_infer, s)
    assert y.shape == (1, 8) or y.size > 0
    assert https_get(s, s.metrics_port, "/metrics") == 200
    # Plain HTTP on the HTTPS port gets no answer.
    with pytest.raises((http.client.HTTPException, OSError)):
        conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=3)
        conn.request("GET", "/v2/health/ready")
        conn.getresponse()
    assert "with HTTPS" in s.stderr_text()
    finish(s)


def test_mutual_tls_requires_a_certificate_the_ca_signed(https_server):
    s = https_server(mutual=True)
    assert triton_infer(s, "client").size > 0
    assert https_get(s, s.metrics_port, "/metrics", "client") == 200
    for who in (None, "intruder"):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            https_get(s, s.http_port, "/v2/health/ready", who)
        with pytest.raises(Exception):
            triton_infer(s, who)
    # A refused handshake costs the server nothing: it still serves.
    assert triton_infer(s, "client").size > 0
    assert "with HTTPS and client certificates" in s.stderr_text()
    finish(s)


@pytest.mark.parametrize("flag,content,want", [
    ("--http-tls-cert", None, "--http-tls-cert"),
    ("--http-tls-key", "not a key\n", "--http-tls-key"),
    ("--http-tls-ca", "", "--http-tls-ca"),
])
def test_unreadable_tls_files_stop_the_start(pjserve_bin, plugin_path, cache_dir, exported, certs,
                                             tmp_path, flag, content, want):
    repo = small_repository(exported, tmp_path / "repo", ("mlp",))
    bad = tmp_path / "bad.pem"
    if content is not None:
        bad.write_text(content)
    files = {"--http-tls-cert": str(certs / "server.pem"),
             "--http-tls-key": str(certs / "server.key"),
             "--http-tls-ca": str(certs / "ca.pem")}
    files[flag] = str(bad)
    argv = [str(pjserve_bin), "serve", "--model-repository", str(repo), "--host", "127.0.0.1",
            "--http-port", str(free_ports(1)[0]), "--grpc-port", "0", "--metrics-port", "0",
            "--pjrt-plugin", str(plugin_path), "--cache-dir", str(cache_dir)]
    for k, v in files.items():
        argv += [k, v]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert want in r.stderr and str(bad) in r.stderr, r.stderr[-2000:]
