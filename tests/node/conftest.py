"""Fixtures for the `pjserve node` tests: the protocol suite's binary, plugin,
exported demo bundles, executable cache and reference cases (imported from
tests/protocol/conftest.py, not copied), and NodeProcess, a `pjserve node` on
free ports with its run directory in the test's temporary directory.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/node
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import importlib.util  # noqa: E402

import pytest  # noqa: E402


def _protocol_conftest():
    """tests/protocol/conftest.py under a name of its own (both files are
    'conftest' to pytest)."""
    path = Path(__file__).resolve().parents[1] / "protocol" / "conftest.py"
    spec = importlib.util.spec_from_file_location("protocol_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_pc = _protocol_conftest()
# The protocol suite's session fixtures, shared rather than copied.
pjserve_bin = _pc.pjserve_bin
plugin_path = _pc.plugin_path
exported = _pc.exported
cache_dir = _pc.cache_dir
cases = _pc.cases
small_repository = _pc.small_repository

from node_util import DEFAULT_RUN_DIR, NodeProcess  # noqa: E402
from protocol_util import start_or_fail  # noqa: E402


@pytest.fixture
def node_factory(pjserve_bin, plugin_path, cache_dir, exported, tmp_path):
    """start(extra_args=(), names=("mlp", "two_io"), ready=True,
    run_dir=DEFAULT_RUN_DIR) -> a started node (run_dir as NodeProcess takes it).

    The test stops it itself (and checks how it ended); leftovers are killed,
    workers included."""
    started = []

    def start(extra_args=(), names=("mlp", "two_io"), ready=True, run_dir=DEFAULT_RUN_DIR):
        i = len(started)
        repo = small_repository(exported, tmp_path / f"repo{i}", names)
        n = NodeProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / f"node{i}",
                        list(extra_args), f"node{i}", run_dir=run_dir)
        started.append(n)
        if ready:
            return start_or_fail(n)
        n.launch()
        return n

    yield start
    for n in started:
        n.kill_all()
