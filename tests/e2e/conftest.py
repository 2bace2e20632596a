"""Shared fixtures for the end-to-end tests: the pjserve binary, the PJRT
plugin, and the demo bundles exported once per session.

Environment:
    PJSERVE_BIN          the binary under test (default: build/pjserve in the repo)
    PJSERVE_PJRT_PLUGIN  the PJRT plugin passed with --pjrt-plugin (default: the
                         xla-cpu-pjrt wheel's plugin in this Python environment)

A missing binary fails the tests that need it, with a message saying how to
build it; it never skips them.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import pjserve_export as pe  # noqa: E402
from pjserve_export import demo  # noqa: E402

# Generous: a cold run compiles up to three modules.
PJSERVE_TIMEOUT_S = 300

ERROR_PREFIX = "pjserve: error:"


def cpu_plugin_path() -> Optional[Path]:
    """The xla-cpu-pjrt wheel's plugin, or None when the wheel is absent."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "xla_cpu_pjrt.so"
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def pjserve_bin() -> Path:
    p = Path(os.environ.get("PJSERVE_BIN", "build/pjserve"))
    if not p.is_absolute():
        p = REPO / p
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"pjserve binary not found at {p}: build it with `make` or point "
                    "PJSERVE_BIN at it", pytrace=False)
    return p


@pytest.fixture(scope="session")
def plugin_path() -> Path:
    env = os.environ.get("PJSERVE_PJRT_PLUGIN")
    p = Path(env) if env else cpu_plugin_path()
    if p is None or not p.is_file():
        pytest.fail(f"PJRT plugin not found ({env or 'xla-cpu-pjrt wheel not installed'}); "
                    "run scripts/bootstrap or set PJSERVE_PJRT_PLUGIN", pytrace=False)
    return p


@pytest.fixture(scope="session")
def is_cpu_plugin(plugin_path) -> bool:
    cpu = cpu_plugin_path()
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


@dataclass
class ExportedModel:
    model: demo.DemoModel
    path: Path
    manifest: pe.Manifest


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Dict[str, ExportedModel]:
    """Every demo model exported once into a session directory (batch sizes 1, 4, 8)."""
    out = tmp_path_factory.mktemp("models")
    result = {}
    for m in demo.demo_models():
        path = m.export(out, batch_sizes=demo.BATCH_SIZES)
        result[m.name] = ExportedModel(m, path, pe.read_manifest(path))
    return result


def bundle_copy(models: Dict[str, ExportedModel], name: str, dest_root: Path,
                new_name: Optional[str] = None) -> Path:
    """A private copy of an exported bundle (to break it) under dest_root.

    With new_name, the directory and the manifest's name are both changed."""
    src = models[name].path
    dst = Path(dest_root) / (new_name or name)
    shutil.copytree(src, dst)
    if new_name:
        man = dst / pe.MANIFEST_FILE
        text = man.read_text()
        old = f'name: "{name}"\n'
        assert old in text
        man.write_text(text.replace(old, f'name: "{new_name}"\n'))
    return dst


def save_inputs(inputs: Dict[str, np.ndarray], directory: Path) -> List[str]:
    """Writes each input as directory/<name>.npy; returns the --input arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    args = []
    for name, array in inputs.items():
        f = directory / f"{name}.npy"
        np.save(f, array)
        args += ["--input", f"{name}={f}"]
    return args


def error_text(result: subprocess.CompletedProcess) -> str:
    """stderr from the first `pjserve: error:` line on; fails if there is none."""
    lines = result.stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(ERROR_PREFIX):
            return "\n".join(lines[i:])
    pytest.fail(f"no line starting with {ERROR_PREFIX!r} on stderr:\n{result.stderr}")


def describe(result: subprocess.CompletedProcess) -> str:
    return (f"command: {' '.join(result.args)}\nexit code: {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")
