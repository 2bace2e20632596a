"""Shared fixtures for the end-to-end tests: the pjserve binary, the PJRT
plugin, and the demo bundles exported once per session (helpers the tests
import are in e2e_util.py).

Environment:
    PJSERVE_BIN          the binary under test (default: build/pjserve in the repo)
    PJSERVE_PJRT_PLUGIN  the PJRT plugin passed with --pjrt-plugin (default: the
                         xla-cpu-pjrt wheel's plugin in this Python environment)

A missing binary fails the tests that need it, with a message saying how to
build it; it never skips them.
"""

import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402
from common import REPO, ExportedModel  # noqa: E402

# Generous: a cold run compiles up to three modules.
PJSERVE_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def pjserve_bin() -> Path:
    p = common.pjserve_bin_path()
    message = common.missing_binary_message(p)
    if message:
        pytest.fail(message, pytrace=False)
    return p


@pytest.fixture(scope="session")
def plugin_path() -> Path:
    p, message = common.plugin_path_or_message()
    if message:
        pytest.fail(message, pytrace=False)
    return p


@pytest.fixture(scope="session")
def is_cpu_plugin(plugin_path) -> bool:
    cpu = common.cpu_plugin_path()
    return cpu is not None and plugin_path.resolve() == cpu.resolve()


class Pjserve:
    """Runs the binary; `plugin_args` are added to run/check/info."""

    def __init__(self, binary: Path, plugin: Path):
        self.binary = binary
        self.plugin_args = ["--pjrt-plugin", str(plugin)]

    def __call__(self, *args, plugin: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.binary)] + [str(a) for a in args]
        if plugin and args and args[0] in ("run", "check", "info"):
            argv += self.plugin_args
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                              timeout=PJSERVE_TIMEOUT_S)


@pytest.fixture(scope="session")
def pjserve(pjserve_bin, plugin_path) -> Pjserve:
    return Pjserve(pjserve_bin, plugin_path)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Dict[str, ExportedModel]:
    """Every demo model exported once into a session directory (batch sizes 1, 4, 8)."""
    return common.export_demo_models(tmp_path_factory.mktemp("models"))
