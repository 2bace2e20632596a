"""Fixtures for the tests of `pjserve top`: a `pjserve serve` over three demo
bundles (mlp, a renamed copy of it, two_io) with a device weight budget that
holds one mlp at a time, so traffic that alternates the two loads and
evicts their weights; a thread of tritonclient traffic; a `pjserve node`
with two workers, and a `pjserve gateway` over two serve processes.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/cli

The bundles, the executable cache and the binary are the protocol suite's
(tests/protocol/conftest.py), shared through its fixtures.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "protocol"))
sys.path.insert(0, str(HERE.parent / "node"))
sys.path.insert(0, str(HERE.parent / "gateway"))
sys.path.insert(0, str(HERE.parent))

from protocol_util import (ServerProcess, finish_checked, guard_alive,  # noqa: E402
                           start_or_fail)
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
    from gateway_util import GatewayProcess
    repo = small_repository(exported, tmp_path / "repo-gateway", ("mlp", "two_io"))
    started = []
    try:
        for i in range(2):
            started.append(start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                                                       tmp_path / f"w{i}", [], f"worker{i}")))
        g = start_or_fail(GatewayProcess(pjserve_bin, list(started), tmp_path / "gw"))
        started.insert(0, g)
        yield g
        for p in started:
            finish_checked(p)
    finally:
        for p in started:
            p.kill()
