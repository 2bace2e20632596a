"""Fixtures for the tests of `pjserve top`: a `pjserve serve` over three demo
bundles (mlp, a renamed copy of it, two_io) with a device weight budget that
holds one mlp at a time, so traffic that alternates the two loads and
evicts their weights; a thread of tritonclient traffic; a `pjserve node`
with two workers; a `pjserve gateway` over two serve processes; and a server
whose REST and metrics ports take HTTPS and an inference token.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/cli

The bundles, the executable cache and the binary are the protocol suite's
(tests/protocol/conftest.py), shared through its fixtures.
"""

import importlib.util
import ssl
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "protocol"))
sys.path.insert(0, str(HERE.parent / "node"))
sys.path.insert(0, str(HERE.parent / "gateway"))
sys.path.insert(0, str(HERE.parent))

from protocol_util import (ServerProcess, finish_checked,  # noqa: E402
                           guard_alive, make_ca, make_cert, start_or_fail, wait_https_ready)
from gateway_util import gateway_over_two_workers  # noqa: E402
from top_util import BUDGET, MODELS, Traffic  # noqa: E402

_spec = importlib.util.spec_from_file_location("protocol_conftest",
                                               HERE.parent / "protocol" / "conftest.py")
_protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_protocol)

# The protocol suite's session fixtures, shared.
pjserve_bin = _protocol.pjserve_bin
plugin_path = _protocol.plugin_path
exported = _protocol.exported
cache_dir = _protocol.cache_dir
small_repository = _protocol.small_repository


@pytest.fixture(scope="session")
def _top_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path_factory):
    repo = small_repository(exported, tmp_path_factory.mktemp("repository-top"), MODELS)
    s = start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                                    tmp_path_factory.mktemp("server-top"),
                                    ["--device-weight-budget", BUDGET], "top"))
    yield s
    finish_checked(s)


@pytest.fixture
def server(_top_server):
    """The shared server (MODELS under a budget that holds one mlp)."""
    yield from guard_alive(_top_server)


@pytest.fixture
def traffic(server):
    with Traffic(server) as t:
        yield t


@pytest.fixture
def node(pjserve_bin, plugin_path, cache_dir, exported, tmp_path):
    """`pjserve node --workers 2` over mlp and two_io."""
    from node_util import NodeProcess
    repo = small_repository(exported, tmp_path / "repo-node", ("mlp", "two_io"))
    n = NodeProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "node",
                    ["--workers", "2"], "node")
    try:
        start_or_fail(n)
        yield n
        finish_checked(n)
    finally:
        n.kill_all()


@pytest.fixture
def gateway(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """`pjserve gateway` over two `pjserve serve` workers with mlp and two_io."""
    repo = small_repository(exported, tmp_path / "repo-gateway", ("mlp", "two_io"))
    with gateway_over_two_workers(pjserve_bin, plugin_path, repo, cache_dir, tmp_path) as g:
        yield g


@pytest.fixture
def gateway_without_worker_metrics(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """The same, each --worker given with grpc= and http= alone (no metrics=)."""
    repo = small_repository(exported, tmp_path / "repo-gateway", ("mlp", "two_io"))
    with gateway_over_two_workers(pjserve_bin, plugin_path, repo, cache_dir, tmp_path,
                                  worker_metrics=False) as g:
        yield g


class SecureServer(ServerProcess):
    """REST and metrics over HTTPS (a throwaway CA), every inference call
    (metrics and control status included) behind a token: ready when the
    health probe answers over HTTPS."""

    def __init__(self, *args, certs: Path, **kw):
        self.infer_token = certs / "infer.token"
        admin = certs / "admin.token"
        for f, text in ((self.infer_token, "infer-token-0123\n"), (admin, "admin-token-4567\n")):
            f.write_text(text)
            f.chmod(0o600)
        extra = ["--http-tls-cert", certs / "server.pem", "--http-tls-key", certs / "server.key",
                 "--admin-token-file", admin, "--infer-token-file", self.infer_token]
        super().__init__(*args, extra_args=[str(x) for x in extra], **kw)
        self.ca = certs / "ca.pem"

    def wait_ready(self, timeout: float):
        ctx = ssl.create_default_context(cafile=str(self.ca))
        wait_https_ready(self, ctx, "HTTPS", timeout)


@pytest.fixture
def secure_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    make_ca(certs, "ca")
    make_cert(certs, "server", "ca", server=True)
    repo = small_repository(exported, tmp_path / "repo-secure", ("mlp",))
    s = start_or_fail(SecureServer(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "secure",
                                   name="secure", certs=certs))
    yield s
    finish_checked(s)


@pytest.fixture
def own_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """A server of the test's own over mlp, which the test may stop."""
    repo = small_repository(exported, tmp_path / "repo-own", ("mlp",))
    s = start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "own",
                                    [], "own"))
    try:
        yield s
    finally:
        s.kill()
