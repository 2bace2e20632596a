"""Bundles with C code for the composition tests: a hooked copy of a demo
model or a meta bundle, written into a repository and built with
`pjserve build-hooks` (the real compiler, the real header); and a server
over such a repository, stopped with its log checked.

C sources are dedented, so tests may write them indented. TIMING_C is a
prelude for sources that read the clock or spin: CLOCK_MONOTONIC nanoseconds
(the clock Python's time.monotonic reads on Linux) and a busy wait.
"""

import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Iterable, Optional, Sequence

import pytest

from protocol_util import ServerProcess, finish_checked, start_or_fail

TIMING_C = """\
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <pjserve/model.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins (a request thread kept busy, as real glue code would) for ms. */
static void busy_wait_ms(int64_t ms)
{
    int64_t end = now_ns() + ms * 1000000;
    while (now_ns() < end)
        ;
}
"""


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


def write_source(bundle: Path, source: str, pjserve_bin: Optional[Path] = None) -> Path:
    """Writes bundle/model.c; builds model.so when pjserve_bin is given."""
    (bundle / "model.c").write_text(textwrap.dedent(source))
    if pjserve_bin is not None:
        build_hooks(pjserve_bin, bundle)
    return bundle


def mark_source_newer(bundle: Path):
    """Makes model.c newer than model.so, as an edit after the last build does."""
    so = (bundle / "model.so").stat()
    os.utime(bundle / "model.c", ns=(so.st_atime_ns, so.st_mtime_ns + 2_000_000_000))


def copy_bundle(repo: Path, base: Path, name: str) -> Path:
    """A copy of the exported bundle `base` as repo/name, renamed in its manifest."""
    d = repo / name
    shutil.copytree(base, d)
    man = d / "manifest.yaml"
    text = man.read_text()
    assert f'name: "{base.name}"\n' in text, f"{man}: no name line to rename"
    man.write_text(text.replace(f'name: "{base.name}"\n', f"name: {name}\n"))
    return d


def write_meta(repo: Path, name: str, calls: Iterable[str], client_inputs: str,
               client_outputs: str, source: str, pjserve_bin: Optional[Path] = None) -> Path:
    """A kind: meta bundle; client_* are YAML list bodies (tensor_yaml lines)."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    call_list = ", ".join(calls)
    (d / "manifest.yaml").write_text(
        f'format_version: "2.0"\nname: {name}\nkind: meta\nmeta: {{calls: [{call_list}]}}\n'
        f"client_inputs:\n{client_inputs}client_outputs:\n{client_outputs}")
    return write_source(d, source, pjserve_bin)


def write_hooked(repo: Path, base: Path, name: str, client_inputs: Optional[str],
                 client_outputs: Optional[str], source: str,
                 pjserve_bin: Optional[Path] = None) -> Path:
    """A copy of the exported bundle `base` under `name` with hooks."""
    d = copy_bundle(repo, base, name)
    manifest = (d / "manifest.yaml").read_text()
    if client_inputs is not None:
        manifest += f"client_inputs:\n{client_inputs}"
    if client_outputs is not None:
        manifest += f"client_outputs:\n{client_outputs}"
    (d / "manifest.yaml").write_text(manifest)
    return write_source(d, source, pjserve_bin)


# ---- a server over such a repository -----------------------------------------

class LiveServerProcess(ServerProcess):
    """A server whose repository holds bundles it refuses: /v2/health/ready
    stays 400 while a model is UNAVAILABLE, so start() waits for
    /v2/health/live (static mode answers it once every bundle was tried)."""

    health_route = "live"


def start_server(pjserve_bin, plugin_path, repo: Path, cache_dir: Path, workdir: Path,
                 extra_args: Sequence[str], name: str, refuses_some: bool = False
                 ) -> ServerProcess:
    """A started server; refuses_some: the repository holds bundles it
    refuses (start in static mode: then live means every bundle was tried)."""
    cls = LiveServerProcess if refuses_some else ServerProcess
    return start_or_fail(cls(pjserve_bin, plugin_path, repo, cache_dir, workdir,
                             list(extra_args), name))


def stop_server(s: ServerProcess, expected_errors: Sequence[str] = ()):
    """SIGTERM; fails unless the server was still running, exits 0 and its log
    has no error or sanitizer line besides those matching an
    `expected_errors` pattern (the ERROR lines a test provoked on purpose)."""
    if not s.alive():
        pytest.fail(f"the server had exited before SIGTERM\n{s.describe()}", pytrace=False)
    finish_checked(s, expected_errors)
