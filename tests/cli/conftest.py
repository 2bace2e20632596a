"""Fixtures for the tests of `pjserve top`: a `pjserve serve` over three demo
bundles (mlp, a renamed copy of it, two_io) with a device weight budget that
holds one mlp at a time, so traffic that alternates the two loads and
evicts their weights; a thread of tritonclient traffic; and a `pjserve node`
with two workers.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/cli

The bundles, the executable cache and the binary are the protocol suite's
(tests/protocol/conftest.py), shared through its fixtures.
"""

import importlib.util
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "protocol"))
sys.path.insert(0, str(HERE.parent / "node"))
sys.path.insert(0, str(HERE.parent))

from protocol_util import (RELOAD_MODEL, ServerProcess, finish_checked,  # noqa: E402
                           guard_alive, start_or_fail)
from top_util import BUDGET, MODELS  # noqa: E402

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

import tritonclient.http as httpclient  # noqa: E402


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


class Traffic:
    """One thread of REST inference requests, mlp and its copy in turn,
    until stopped; counts what was answered and keeps the first error."""

    def __init__(self, server, models=("mlp", RELOAD_MODEL)):
        self.client = httpclient.InferenceServerClient(server.http_url)
        self.models = models
        self.done = 0
        self.error = None
        self.first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        x = np.ones((2, 16), np.float32)
        i = 0
        while not self._stop.is_set():
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                self.client.infer(self.models[i % len(self.models)], [inp])
            except Exception as e:  # kept for the test to report
                self.error = e
                self.first.set()
                return
            self.done += 1
            i += 1
            if self.done >= len(self.models):
                self.first.set()

    def __enter__(self):
        self._thread.start()
        if not self.first.wait(120) or self.error is not None:
            self._stop.set()
            pytest.fail(f"the traffic thread did not get answers: {self.error}")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)
        self.client.close()
        assert self.error is None, f"an inference failed under top: {self.error}"


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
