"""Fixtures for the KServe V2 protocol tests: the demo bundles exported once
into a model repository, `pjserve serve` on free ports, clients, and the JAX
reference outputs.

Run:  PJSERVE_BIN=$PWD/build/pjserve .venv/bin/python -m pytest -q tests/protocol

Environment:
    PJSERVE_BIN            the binary under test (default: build/pjserve)
    PJSERVE_PJRT_PLUGIN    the PJRT plugin (default: the xla-cpu-pjrt wheel's)
    PJSERVE_READY_TIMEOUT  seconds a server may take to become ready (240)

A missing binary or plugin fails every test that needs a server (never skips).
Each server's stderr is kept in a file under the session's temporary
directory; when a server fails to start, dies, exits non-zero on SIGTERM or
logs an ERROR or sanitizer line, the failure message includes its stderr.
"""

import shutil
import sys
from pathlib import Path
from typing import Dict

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402
import pjserve_export as pe  # noqa: E402
from pjserve_export import demo  # noqa: E402
from protocol_util import (BF16_MODEL, RELOAD_MODEL, Case, ServerProcess,  # noqa: E402
                           bf16_io_model, finish_checked, guard_alive, start_or_fail)

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

# ---- binary, plugin, bundles -----------------------------------------------

@pytest.fixture(scope="session")
def pjserve_bin() -> Path:
    p = common.pjserve_bin_path()
    why = common.missing_binary_message(p)
    if why:
        pytest.fail(why, pytrace=False)
    return p


@pytest.fixture(scope="session")
def plugin_path() -> Path:
    p, why = common.plugin_path_or_message()
    if why:
        pytest.fail(why, pytrace=False)
    return p


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> Dict[str, common.ExportedModel]:
    """Every model of the main repository, exported once (batch sizes 1, 4, 8)."""
    repo = tmp_path_factory.mktemp("repository")
    models = common.export_demo_models(repo)
    m = bf16_io_model()
    path = m.export(repo, batch_sizes=demo.BATCH_SIZES)
    models[BF16_MODEL] = common.ExportedModel(m, path, pe.read_manifest(path))
    # A renamed copy of mlp that the repository tests unload and load.
    dst = repo / RELOAD_MODEL
    shutil.copytree(models["mlp"].path, dst)
    man = dst / pe.MANIFEST_FILE
    text = man.read_text()
    assert 'name: "mlp"\n' in text
    man.write_text(text.replace('name: "mlp"\n', f'name: "{RELOAD_MODEL}"\n'))
    models[RELOAD_MODEL] = common.ExportedModel(models["mlp"].model, dst, pe.read_manifest(dst))
    return models


@pytest.fixture(scope="session")
def repository(exported) -> Path:
    return exported["mlp"].path.parent


def small_repository(exported, dest: Path, names=("mlp", "two_io")) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copytree(exported[n].path, dest / n)
    return dest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The executable cache shared by every server of the session."""
    return tmp_path_factory.mktemp("exec-cache")


class Cases:
    """Deterministic inputs and JAX reference outputs, computed once each (at
    the shapes of the model's `variant`)."""

    def __init__(self, exported):
        self.exported = exported
        self._cache = {}

    def get(self, model: str, n: int, seed: int = None, variant: str = "default") -> Case:
        seed = 1000 * n + 7 if seed is None else seed
        key = (model, n, seed, variant)
        if key not in self._cache:
            e = self.exported[model]
            inputs = pe.random_inputs(e.manifest, n, seed=seed, variant=variant)
            want = e.model.reference(*[inputs[s.name] for s in e.manifest.inputs])
            expected = {spec.name: w for spec, w in zip(e.manifest.outputs, want)}
            self._cache[key] = Case(model, n, inputs, expected, e.manifest, variant)
        return self._cache[key]


@pytest.fixture(scope="session")
def cases(exported) -> Cases:
    return Cases(exported)


# ---- servers ----------------------------------------------------------------

def _start(pjserve_bin, plugin_path, repository, cache_dir, workdir, extra, name):
    return start_or_fail(ServerProcess(pjserve_bin, plugin_path, repository, cache_dir, workdir,
                                       extra, name))


@pytest.fixture(scope="session")
def _main_server(pjserve_bin, plugin_path, repository, cache_dir, tmp_path_factory):
    s = _start(pjserve_bin, plugin_path, repository, cache_dir,
               tmp_path_factory.mktemp("server-main"), [], "main")
    yield s
    finish_checked(s)


@pytest.fixture(scope="session")
def _shm_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path_factory):
    repo = small_repository(exported, tmp_path_factory.mktemp("repository-shm"))
    s = _start(pjserve_bin, plugin_path, repo, cache_dir,
               tmp_path_factory.mktemp("server-shm"), ["--allow-client-shm"], "shm")
    yield s
    finish_checked(s)


@pytest.fixture
def server(_main_server):
    """The shared server over the full repository (client shared memory off)."""
    yield from guard_alive(_main_server)


@pytest.fixture
def shm_server(_shm_server):
    """A server started with --allow-client-shm over mlp and two_io."""
    yield from guard_alive(_shm_server)


@pytest.fixture
def server_factory(pjserve_bin, plugin_path, cache_dir, exported, tmp_path):
    """start(extra_args=(), names=("mlp", "two_io"), bundles=()) -> a dedicated
    started server over exported models `names` and the bundle folders `bundles`.

    The test stops it itself (and checks the exit); leftovers are killed."""
    started = []

    def start(extra_args=(), names=("mlp", "two_io"), bundles=()):
        repo = small_repository(exported, tmp_path / f"repo{len(started)}", names)
        for b in bundles:
            shutil.copytree(b, repo / b.name)
        s = _start(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / f"srv{len(started)}",
                   list(extra_args), f"dedicated{len(started)}")
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


# ---- clients ------------------------------------------------------------------

@pytest.fixture
def gclient(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def hclient(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=60,
                                         connection_timeout=60)
    yield c
    c.close()
