"""Fixtures for the gateway tests: `pjserve gateway` in front of two
`pjserve serve` workers over the demo bundles, on free local ports.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/gateway

The bundles, the executable cache and the reference cases are the protocol
suite's (tests/protocol/conftest.py), shared through its fixtures.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "protocol"))
sys.path.insert(0, str(HERE.parent))

from gateway_util import Cluster, GatewayProcess  # noqa: E402
from protocol_util import ServerProcess, start_or_fail  # noqa: E402

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


@pytest.fixture
def cluster_factory(pjserve_bin, plugin_path, exported, cache_dir, tmp_path):
    """start(n_workers=2, names=("mlp", "two_io"), gateway_args=(), worker_args=(),
    prepare=None) -> a Cluster; prepare(repo) may add bundles before the
    workers start. Each test stops what it started (leftovers are killed)."""
    started = []

    def start(n_workers=2, names=("mlp", "two_io"), gateway_args=(), worker_args=(),
              prepare=None):
        repo = small_repository(exported, tmp_path / f"repo{len(started)}", names)
        if prepare is not None:
            prepare(repo)
        workers = []
        for i in range(n_workers):
            w = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                              tmp_path / f"c{len(started)}w{i}", list(worker_args), f"worker{i}")
            started.append(w)
            workers.append(start_or_fail(w))
        g = GatewayProcess(pjserve_bin, workers, tmp_path / f"c{len(started)}gw",
                           list(gateway_args))
        started.append(g)
        start_or_fail(g)
        return Cluster(workers, g)

    yield start
    for p in started:
        p.kill()
