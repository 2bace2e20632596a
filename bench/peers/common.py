"""The function every peer serves, shared by the peer servers and the driver.

The model is the demo `mlp` of pjserve_export (python/pjserve_export/demo.py):
two dense layers with relu, x f32 [batch, 16] -> y f32 [batch, 4], weights from
a fixed PRNG key. Every peer venv has the same jax (0.8.1, CPU) as .venv, so
the weights and the computation are identical to what pjserve was given as a
bundle. pjserve_export itself only needs jax, numpy and ml_dtypes, so the peers
import it straight from python/ (it is not installed into their venvs).

The peers call jax.jit(fn)(params, x) with the weights as device-resident
arguments, as pjserve passes the bundle's weights to the compiled module.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))

MODEL_NAME = "mlp"
INPUT_NAME = "x"
OUTPUT_NAME = "y"
INPUT_SHAPE = (16,)     # per example
OUTPUT_SHAPE = (4,)


def load_model(max_batch_size):
    """Returns infer(x: np.ndarray [n,16] f32) -> np.ndarray [n,4] f32, warmed
    up (compiled) for every batch size 1..max_batch_size."""
    import jax
    import numpy as np
    from pjserve_export.demo import demo_models

    model = demo_models([MODEL_NAME])[0]
    fn = jax.jit(model.fn)
    params = jax.device_put(model.params)

    def infer(x):
        return np.asarray(fn(params, x))

    for n in range(1, max_batch_size + 1):
        infer(np.zeros((n,) + INPUT_SHAPE, np.float32))
    return infer
