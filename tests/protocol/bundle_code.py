"""Bundles with C code for the composition tests: a hooked copy of a demo
model or a meta bundle, written into a repository and built with
`pjserve build-hooks` (the real compiler, the real header)."""

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Iterable, Optional


def tensor_yaml(name: str, dtype: str, shape) -> str:
    dims = ", ".join(str(d) for d in shape)
    return f"  - {{name: {name}, dtype: {dtype}, shape: [{dims}]}}\n"


def build_hooks(pjserve_bin: Path, bundle: Path, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(pjserve_bin), "build-hooks", str(bundle)], capture_output=True,
                       text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"pjserve build-hooks {bundle} failed ({r.returncode}):\n"
                             f"{r.stdout}\n{r.stderr}")
    return r


def write_meta(repo: Path, name: str, calls: Iterable[str], client_inputs: str,
               client_outputs: str, source: str, pjserve_bin: Optional[Path] = None) -> Path:
    """A kind: meta bundle; client_* are YAML list bodies (tensor_yaml lines)."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    call_list = ", ".join(calls)
    (d / "manifest.yaml").write_text(
        f'format_version: "2.0"\nname: {name}\nkind: meta\nmeta: {{calls: [{call_list}]}}\n'
        f"client_inputs:\n{client_inputs}client_outputs:\n{client_outputs}")
    (d / "model.c").write_text(textwrap.dedent(source))
    if pjserve_bin is not None:
        build_hooks(pjserve_bin, d)
    return d


def write_hooked(repo: Path, base: Path, name: str, client_inputs: Optional[str],
                 client_outputs: Optional[str], source: str,
                 pjserve_bin: Optional[Path] = None) -> Path:
    """A copy of the exported bundle `base` under `name` with hooks."""
    d = repo / name
    shutil.copytree(base, d)
    manifest = (d / "manifest.yaml").read_text().replace(f'name: "{base.name}"', f"name: {name}")
    if client_inputs is not None:
        manifest += f"client_inputs:\n{client_inputs}"
    if client_outputs is not None:
        manifest += f"client_outputs:\n{client_outputs}"
    (d / "manifest.yaml").write_text(manifest)
    (d / "model.c").write_text(textwrap.dedent(source))
    if pjserve_bin is not None:
        build_hooks(pjserve_bin, d)
    return d
