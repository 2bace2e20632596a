"""Committed requests (pjs_server_submit_committed, the class meta models'
sub-calls use) through a real server: tests/e2e/committed_caller.c creates a
pjs_server on the exported mlp and two_io bundles with the fifo discipline
and checks that a committed request overtakes a flood of queued requests,
that a caller has at most one committed request in flight, that the model's
queue depth does not refuse it and that a passed deadline does (see the
program's header for the details). It prints one line per check and exits
non-zero when one failed.

The program is built next to the pjserve binary under test (PJSERVE_BIN,
default build/pjserve), so `make tsan` runs its ThreadSanitizer build.
"""

import os
import shutil
import subprocess

import pytest

from e2e_util import REPO, describe

RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def committed_caller(pjserve_bin):
    p = pjserve_bin.parent / "committed_caller"
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.skip(f"{p} was not built (CMake target committed_caller, built with the "
                    f"other test programs by `cmake --build {pjserve_bin.parent}`)")
    return p


def test_committed_requests(committed_caller, plugin_path, models, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("mlp", "two_io"):
        shutil.copytree(models[name].path, repo / name)
    argv = [str(committed_caller), str(repo), str(plugin_path), str(tmp_path / "cache")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJSERVE_SCHEDULER_")}
    env.setdefault("PJSERVE_LOG_LEVEL", "info")
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env,
                       timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, describe(r)
    lines = r.stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith("FAIL")], describe(r)
    # Every check reported a result (a, b, c and d each at least once).
    for check in ("a:", "b:", "c:", "d:"):
        assert any(ln.startswith("ok  : " + check) for ln in lines), \
            f"check {check} reported nothing\n{describe(r)}"
    assert "all checks passed" in r.stdout, describe(r)
    for bad in ("ThreadSanitizer", "AddressSanitizer", "runtime error:", " ERROR "):
        assert bad not in r.stderr, describe(r)
