"""Fixtures for the libpjserve-client tests: the client programs the build
makes (tests/client/client_check.c, examples/client/simple.c) and
`pjserve serve` over mlp, two_io, mlp_f16, bf16_io and the two string
models, with client shared memory allowed.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/client

The programs are taken from the directory of PJSERVE_BIN (the build
directory). The bundles, the executable cache and the JAX references are
the protocol suite's (tests/protocol/conftest.py), shared through its
fixtures.
"""

import importlib.util
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "protocol"))
sys.path.insert(0, str(HERE.parent))

from protocol_util import (ServerProcess, finish_checked,  # noqa: E402
                           guard_alive, start_or_fail, make_ca, make_cert, wait_https_ready)

sys.path.insert(0, str(HERE.parent / "gateway"))
from gateway_util import gateway_over_two_workers  # noqa: E402

from pjserve_export import hooks as H  # noqa: E402
from pjserve_export.triton_examples import export_triton_example  # noqa: E402

_spec = importlib.util.spec_from_file_location("protocol_conftest",
                                               HERE.parent / "protocol" / "conftest.py")
_protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_protocol)

# The protocol suite's session fixtures, shared.
pjserve_bin = _protocol.pjserve_bin
plugin_path = _protocol.plugin_path
exported = _protocol.exported
cache_dir = _protocol.cache_dir
cases = _protocol.cases
small_repository = _protocol.small_repository

# FP32 and INT32 (mlp, two_io), FP16 (mlp_f16) and BF16 (bf16_io) tensors.
MODELS = ("mlp", "two_io", "mlp_f16", "bf16_io")
STRING_MODELS = ("simple_string", "simple_identity")
# A stateful model (a running sum per sequence) and a decoupled one.
STREAM_MODELS = ("simple_string_dyna_sequence", "repeat_int32")


class Tools:
    """The build's client programs."""

    def __init__(self, build_dir: Path):
        self.build_dir = build_dir
        self.check = build_dir / "pjs_client_check"
        self.example = build_dir / "pjs_client_example"
        self.pjserve = build_dir / "pjserve"

    def run(self, program: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(program), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="session")
def tools(pjserve_bin) -> Tools:
    t = Tools(Path(pjserve_bin).resolve().parent)
    for p in (t.check, t.example):
        if not p.is_file():
            pytest.fail(f"{p} is missing: build the project (cmake --build {t.build_dir})",
                        pytrace=False)
    return t


def client_repository(exported, pjserve_bin, dest: Path) -> Path:
    small_repository(exported, dest, MODELS)
    build = H.hooks_builder(pjserve_bin)
    for name in STRING_MODELS + STREAM_MODELS:
        export_triton_example(name, dest, build=build)
    return dest


@pytest.fixture(scope="session")
def _client_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path_factory):
    repo = client_repository(exported, pjserve_bin, tmp_path_factory.mktemp("repository-client"))
    s = start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                                    tmp_path_factory.mktemp("server-client"),
                                    ["--allow-client-shm"], "client"))
    yield s
    finish_checked(s)


@pytest.fixture
def server(_client_server):
    """The shared server (MODELS and STRING_MODELS; client shared memory
    allowed)."""
    yield from guard_alive(_client_server)


# ---- TLS ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1 and localhost, and a
    client certificate, all signed by it."""
    assert shutil.which("openssl"), "openssl is missing (scripts/bootstrap installs it)"
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_cert(d, "server", "ca", server=True)
    make_cert(d, "client", "ca", server=False)
    return d


class MutualTlsServer(ServerProcess):
    """gRPC and REST over mutual TLS, admin calls behind a token: ready when
    the health probe answers over HTTPS with the client certificate."""

    def __init__(self, *args, certs: Path, token_file: Path, **kw):
        c = certs
        extra = ["--grpc-tls-cert", c / "server.pem", "--grpc-tls-key", c / "server.key",
                 "--grpc-tls-ca", c / "ca.pem",
                 "--http-tls-cert", c / "server.pem", "--http-tls-key", c / "server.key",
                 "--http-tls-ca", c / "ca.pem", "--admin-token-file", token_file]
        super().__init__(*args, extra_args=[str(x) for x in extra], **kw)
        self.certs = certs

    def wait_ready(self, timeout: float):
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.pem"))
        ctx.load_cert_chain(str(self.certs / "client.pem"), str(self.certs / "client.key"))
        wait_https_ready(self, ctx, "TLS", timeout)


@pytest.fixture(scope="session")
def tls_server(pjserve_bin, plugin_path, exported, cache_dir, certs, tmp_path_factory):
    work = tmp_path_factory.mktemp("server-tls")
    token = work / "admin.token"
    token.write_text("s3cret-admin-token\n")
    token.chmod(0o600)
    repo = small_repository(exported, tmp_path_factory.mktemp("repository-tls"), MODELS)
    s = start_or_fail(MutualTlsServer(pjserve_bin, plugin_path, repo, cache_dir, work,
                                      name="tls", certs=certs, token_file=token))
    s.token_file = token
    yield s
    finish_checked(s)


@pytest.fixture
def gateway(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """`pjserve gateway` over two workers serving mlp and two_io."""
    repo = small_repository(exported, tmp_path / "repo-gateway", ("mlp", "two_io"))
    with gateway_over_two_workers(pjserve_bin, plugin_path, repo, cache_dir, tmp_path) as g:
        yield g
