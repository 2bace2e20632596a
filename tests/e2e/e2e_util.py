"""Helpers of the end-to-end tests (their fixtures are in conftest.py): a
private copy of a bundle, inputs saved as .npy, a failed command's
error and description, and a server over a few bundles. A module of its own so that test files import it by
a name no other test directory shares.
"""

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pjserve_export as pe  # noqa: E402
from common import REPO, ExportedModel  # noqa: E402, F401 (REPO: for the tests)
from protocol_util import ServerProcess, finish_checked, start_or_fail  # noqa: E402

ERROR_PREFIX = "pjserve: error:"


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


@contextlib.contextmanager
def serving(pjserve_bin: Path, plugin_path: Path, bundles: Sequence[Path], workdir: Path,
            name: str = "server") -> Iterator[ServerProcess]:
    """`pjserve serve` over a repository of links to `bundles`, ready; on exit
    stopped, and the test fails unless it shut down cleanly."""
    repo = workdir / "repo"
    repo.mkdir(parents=True)
    for b in bundles:
        (repo / Path(b).name).symlink_to(Path(b).resolve())
    s = start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, workdir / "cache",
                                    workdir / "srv", [], name))
    try:
        yield s
    finally:
        finish_checked(s)
