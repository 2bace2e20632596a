"""The on-disk executable cache, seen through `pjserve check` and `pjserve run`.

`pjserve check BUNDLE... --cache-dir D` compiles (or loads from D) every module
and ends its report with the line `modules: K (compiled C, from cache H)`.
Entries are keyed by the module bytes (plus compile options, platform and
plugin version), so an identical module hits whatever bundle it comes from,
and a corrupt entry is never trusted: it is rebuilt, with a warning.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from e2e_util import bundle_copy, describe, save_inputs
from pjserve_export import demo

SUMMARY_RE = re.compile(r"modules: (\d+) \(compiled (\d+), from cache (\d+)\)")


def summary(result):
    """(modules, compiled, from_cache) from the report's last line."""
    assert result.returncode == 0, describe(result)
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert lines, describe(result)
    m = SUMMARY_RE.fullmatch(lines[-1].strip())
    assert m, f"last line is not a `modules: K (compiled C, from cache H)` summary\n{describe(result)}"
    return tuple(int(g) for g in m.groups())


def cache_files(d: Path):
    return sorted(p for p in d.rglob("*") if p.is_file())


def test_second_check_loads_everything_from_cache(pjserve, models, tmp_path):
    d = tmp_path / "cache"
    first = pjserve("check", models["mlp"].path, "--cache-dir", d)
    assert summary(first) == (3, 3, 0)
    assert "compiled 3, from cache 0" in first.stdout
    assert len(cache_files(d)) >= 3, f"expected an entry per module in {d}: {cache_files(d)}"

    second = pjserve("check", models["mlp"].path, "--cache-dir", d)
    assert summary(second) == (3, 0, 3)
    assert "compiled 0, from cache 3" in second.stdout


def test_check_counts_modules_of_several_bundles(pjserve, models, tmp_path):
    d = tmp_path / "cache"
    r = pjserve("check", models["mlp"].path, models["two_io"].path, "--cache-dir", d)
    assert summary(r) == (6, 6, 0)
    r = pjserve("check", models["two_io"].path, models["convnet"].path, "--cache-dir", d)
    assert summary(r) == (6, 3, 3)


def test_cache_is_keyed_by_module_bytes(pjserve, models, tmp_path):
    """The same model exported with batch sizes [1, 2, 8] shares modules 1 and 8
    (the exporter is deterministic) with the [1, 4, 8] export: only module 2 compiles."""
    d = tmp_path / "cache"
    assert summary(pjserve("check", models["mlp"].path, "--cache-dir", d)) == (3, 3, 0)
    other = demo.demo_models(["mlp"])[0].export(tmp_path / "other", batch_sizes=[1, 2, 8])
    for n in (1, 8):
        assert (other / f"model.b{n}.mlir").read_bytes() == \
            (models["mlp"].path / f"model.b{n}.mlir").read_bytes()
    assert summary(pjserve("check", other, "--cache-dir", d)) == (3, 1, 2)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip(data: bytes) -> bytes:
    # Flip single bytes at the start, the middle and the end: a header check
    # alone does not catch the middle one, only a checksum of the payload does.
    b = bytearray(data)
    for i in {0, len(b) // 2, len(b) - 1}:
        if 0 <= i < len(b):
            b[i] ^= 0xFF
    return bytes(b)


def _empty(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize("corrupt", [_truncate, _flip, _empty], ids=["truncate", "flip", "empty"])
def test_corrupt_entries_are_rebuilt(pjserve, models, tmp_path, corrupt):
    d = tmp_path / "cache"
    assert summary(pjserve("check", models["mlp"].path, "--cache-dir", d)) == (3, 3, 0)
    files = cache_files(d)
    assert files
    for f in files:
        f.write_bytes(corrupt(f.read_bytes()))

    rebuilt = pjserve("check", models["mlp"].path, "--cache-dir", d)
    assert summary(rebuilt) == (3, 3, 0)
    assert "compiled 3" in rebuilt.stdout
    assert re.search(r"warn", rebuilt.stderr, re.I) and "cache" in rebuilt.stderr.lower(), \
        f"expected a warning about the corrupt cache entries\n{describe(rebuilt)}"

    # The rebuilt entries replaced the corrupt ones.
    assert summary(pjserve("check", models["mlp"].path, "--cache-dir", d)) == (3, 0, 3)


def test_run_uses_cache_and_no_cache_writes_nothing(pjserve, models, tmp_path):
    exported = models["mlp"]
    inputs = {"x": np.ones((2, 16), np.float32)}
    in_args = save_inputs(inputs, tmp_path / "in")

    for sub in ("out1", "out2"):
        (tmp_path / sub).mkdir()
    d = tmp_path / "cache"
    r = pjserve("run", exported.path, *in_args, "--output-dir", tmp_path / "out1",
                "--cache-dir", d)
    assert r.returncode == 0, describe(r)
    assert cache_files(d), "run with --cache-dir stored nothing"
    # what run stored is what check finds (run compiles at least the module it used)
    hits = summary(pjserve("check", exported.path, "--cache-dir", d))[2]
    assert hits >= 1

    d2 = tmp_path / "cache2"
    r = pjserve("run", exported.path, *in_args, "--output-dir", tmp_path / "out2",
                "--cache-dir", d2, "--no-cache")
    assert r.returncode == 0, describe(r)
    assert not (d2.exists() and cache_files(d2)), "--no-cache wrote cache entries"
    np.testing.assert_array_equal(np.load(tmp_path / "out1" / "y.npy"),
                                  np.load(tmp_path / "out2" / "y.npy"))


def test_check_rejects_a_module_that_does_not_compile(pjserve, models, tmp_path):
    """check validates: a broken bundle makes it fail (exit 1) naming the bundle."""
    broken = bundle_copy(models, "mlp", tmp_path / "repo", new_name="mlp_broken")
    (broken / "model.b4.mlir").write_bytes(b"this is not a StableHLO module")
    r = pjserve("check", broken, "--cache-dir", tmp_path / "cache")
    assert r.returncode == 1, describe(r)
    assert "mlp_broken" in r.stderr and "model.b4.mlir" in r.stderr, describe(r)
