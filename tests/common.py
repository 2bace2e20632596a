"""Helpers shared by the test suites under tests/ (protocol tests today; the
end-to-end suite keeps its own conftest).

- where the repository, the pjserve binary and the PJRT plugin are;
- exporting the demo bundles (python/pjserve_export/demo.py);
- the output tolerances used everywhere a server output is compared with the
  JAX reference (the same numbers as tests/e2e/test_run_matches_jax.py).

Importing this module puts python/ on sys.path, so `pjserve_export` imports.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import pjserve_export as pe  # noqa: E402
from pjserve_export import demo  # noqa: E402

BUILD_HINT = ("build it with `make` (or `cmake -S . -B build && cmake --build build -j2`) "
              "or point PJSERVE_BIN at it")

# Tolerances (atol, rtol), as in numpy.allclose: |got - want| <= ATOL + RTOL * |want|.
# f32 models: the server and jax compile the same StableHLO with XLA CPU; only
# the fusion / accumulation order may differ (seen: ~3e-6 absolute on the
# convnet's 1568-long dot at batch 4, exact elsewhere).
F32_TOL = (1e-5, 1e-5)
# bf16 compute (mlp_bf16): bf16 carries 8 significant bits, so one rounding
# difference in an intermediate moves an output of magnitude ~2-4 by ~0.016;
# allow about two such ulps.
BF16_TOL = (2e-2, 2e-2)
# f16 compute (mlp_f16): 11 significant bits, a few ulps (~5e-4 relative each).
F16_TOL = (5e-3, 5e-3)
# Integer outputs (two_io.argmax) must match exactly.

MODEL_TOLERANCE = {
    "mlp": F32_TOL,
    "convnet": F32_TOL,
    "two_io": F32_TOL,
    "mlp_bf16": BF16_TOL,
    "mlp_f16": F16_TOL,
    "gapnet": F32_TOL,
    "image_convnet": F32_TOL,
}


def tolerance(model: str, dtype: np.dtype):
    """(atol, rtol) for a float output of `model`; None for exact comparison."""
    dt = np.dtype(dtype)
    if np.issubdtype(dt, np.integer) or dt == np.bool_:
        return None
    if model in MODEL_TOLERANCE:
        return MODEL_TOLERANCE[model]
    if dt == np.float16:
        return F16_TOL
    if dt.itemsize == 2:  # bfloat16
        return BF16_TOL
    return F32_TOL


def assert_matches(model: str, output: str, got: np.ndarray, want: np.ndarray, what: str = ""):
    """got (from the server) equals want (from jax) within the model's tolerance."""
    where = f"{model}.{output}{(' ' + what) if what else ''}"
    assert got is not None, f"{where}: no output returned"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, expected {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), \
        f"{where}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    tol = tolerance(model, want.dtype)
    if tol is None:
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.all(np.isfinite(g)), f"{where}: non-finite values {g}"
    np.testing.assert_allclose(g, w, atol=tol[0], rtol=tol[1], err_msg=where)


def cpu_plugin_path() -> Optional[Path]:
    """The xla-cpu-pjrt wheel's plugin, or None when the wheel is absent."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "xla_cpu_pjrt.so"
    return path if path.is_file() else None


def pjserve_bin_path() -> Path:
    """PJSERVE_BIN (relative to the repository) or build/pjserve; may not exist."""
    p = Path(os.environ.get("PJSERVE_BIN", "build/pjserve"))
    return p if p.is_absolute() else REPO / p


def missing_binary_message(p: Path) -> Optional[str]:
    if p.is_file() and os.access(p, os.X_OK):
        return None
    return f"pjserve binary not found at {p}: {BUILD_HINT}"


def plugin_path_or_message():
    """(path, None) or (None, why not)."""
    env = os.environ.get("PJSERVE_PJRT_PLUGIN")
    p = Path(env) if env else cpu_plugin_path()
    if p is None or not p.is_file():
        return None, (f"PJRT plugin not found ({env or 'xla-cpu-pjrt wheel not installed'}); "
                      "run scripts/bootstrap or set PJSERVE_PJRT_PLUGIN")
    return p, None


@dataclass
class ExportedModel:
    model: demo.DemoModel
    path: Path
    manifest: pe.Manifest


def nvidia_gpu_here() -> bool:
    """Whether nvidia-smi lists a GPU: a GPU package's "no GPU here" path
    cannot be seen on such a machine."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return r.stdout.startswith("GPU ")


def export_demo_models(out: Path, names: Optional[Sequence[str]] = None,
                       batch_sizes=demo.BATCH_SIZES) -> Dict[str, ExportedModel]:
    """Exports the demo models (all, or those named) into out/<name>/."""
    result = {}
    for m in demo.demo_models(names):
        path = m.export(out, batch_sizes=batch_sizes)
        result[m.name] = ExportedModel(m, path, pe.read_manifest(path))
    return result
