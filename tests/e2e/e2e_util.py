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


def check_served(server, cases, tolerance: float):
    """Each case served as its framework computes it, over gRPC (3 rows, padded
    by the server) and HTTP (1 row), within `tolerance` relative to the
    output's scale. A case has name (the model), input_names, output_names,
    make_inputs(n, seed) -> arrays and reference(arrays) -> outputs."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    kserve = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        for k, c in enumerate(cases):
            for mod, client, n in ((grpcclient, g, 3), (httpclient, h, 1)):
                xs = c.make_inputs(n, k)
                inputs = []
                for name, x in zip(c.input_names, xs):
                    i = mod.InferInput(name, list(x.shape), kserve[x.dtype])
                    i.set_data_from_numpy(x)
                    inputs.append(i)
                result = client.infer(c.name, inputs)
                for name, want in zip(c.output_names, c.reference(xs)):
                    got = result.as_numpy(name)
                    assert got.shape == want.shape, (c.name, name)
                    err = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
                    print(f"{c.name} {name} {mod.__name__.split('.')[-1]} {n} rows: relative "
                          f"error {err:.2e}")
                    assert err <= tolerance, (c.name, name, err)
    finally:
        g.close()
        h.close()
