"""Keras 3 models to pjserve bundles, through Keras's JAX backend.

    export_keras(model, out_dir, *, name, batch_sizes, example_inputs=None,
                 input_names=None, output_names=None, **export_jax_options) -> Path

With the JAX backend a Keras model is a JAX function of its variables
(Model.stateless_call), so export_jax exports it as any JAX function: one
trace and one StableHLO module per compiled batch size, the variables as
module arguments written once. So:

- the weights are the model's variables, trainable first, then the others
  (batch normalization's moving statistics, ...), named by their Keras paths
  with "/" as "." under "trainable." and "non_trainable." ("trainable.dense.
  kernel");
- the model runs in inference mode (training=False, where its call takes
  that argument: batch normalization from its moving statistics, no
  dropout);
- a functional model (or a Sequential one given an Input) knows its inputs:
  their names and per-example shapes and dtypes are taken from model.inputs,
  and its outputs' names from model.output_names (a Sequential model's one
  output: its last layer's name). A subclassed model, or one
  with an extent other than the batch left open, needs example_inputs (one
  array per input, with a leading batch axis of any size) and names.

The JAX backend must be chosen before Keras is first imported
(KERAS_BACKEND=jax in the environment, or ~/.keras/keras.json); another one
is refused with that advice. Keras is in .venv (scripts/requirements.txt).
"""

import inspect
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .jax_export import export_jax


def _keras():
    import keras
    backend = keras.config.backend()
    if backend != "jax":
        raise ValueError(
            f"export_keras needs Keras's JAX backend, and Keras runs on {backend!r}: set "
            f"KERAS_BACKEND=jax in the environment before keras is first imported")
    return keras


def _example_inputs(model, example_inputs):
    if example_inputs is not None:
        return [np.asarray(x) for x in example_inputs]
    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError):
        inputs = []
    if not inputs:
        raise ValueError(
            f"model {model.name!r} does not say what its inputs are (a subclassed model, or a "
            f"Sequential one without an Input): give example_inputs, one array per input "
            f"with a leading batch axis, and input_names")
    examples = []
    for t in inputs:
        shape = tuple(t.shape)
        open_axes = [k for k, d in enumerate(shape[1:], 1) if d is None]
        if open_axes:
            raise ValueError(
                f"model {model.name!r}: input {t.name!r} has shape {shape}, open at axis "
                f"{open_axes[0]}: give example_inputs at the shape to compile (and variants= "
                f"for other shapes)")
        examples.append(np.zeros((1,) + shape[1:], np.dtype(t.dtype)))
    return examples


def _variable_names(variables):
    """Keras paths with "." for "/" (export_jax prefixes the dict's key)."""
    names, seen = [], set()
    for i, v in enumerate(variables):
        name = v.path.replace("/", ".")
        if name in seen:  # two variables with one path: keep both, apart
            name = f"{name}.{i}"
        seen.add(name)
        names.append(name)
    return names


def export_keras(model, out_dir, *, name: str, batch_sizes: Sequence[int],
                 example_inputs: Optional[Sequence[Any]] = None,
                 input_names: Optional[Sequence[str]] = None,
                 output_names: Optional[Sequence[str]] = None, **export_jax_options) -> Path:
    """Exports a Keras 3 model (JAX backend) as the bundle out_dir/name/; returns
    its path. See the module's documentation; other options go to export_jax."""
    keras = _keras()
    examples = _example_inputs(model, example_inputs)
    if input_names is None:
        if example_inputs is not None:
            raise ValueError("give input_names with example_inputs")
        input_names = [t.name for t in model.inputs]
    if len(input_names) != len(examples):
        raise ValueError(f"{len(input_names)} input names for {len(examples)} inputs")
    if output_names is None:
        output_names = list(getattr(model, "output_names", None) or [])
        if not output_names and isinstance(model, keras.Sequential) and model.layers:
            output_names = [model.layers[-1].name]  # its one output is its last layer's
        if not output_names:
            raise ValueError(f"model {model.name!r} does not name its outputs: give "
                             f"output_names")
    trainable = _variable_names(model.trainable_variables)
    others = _variable_names(model.non_trainable_variables)
    params = {"trainable": {n: np.asarray(v.value) for n, v in
                            zip(trainable, model.trainable_variables)},
              "non_trainable": {n: np.asarray(v.value) for n, v in
                                zip(others, model.non_trainable_variables)}}
    single_input = len(examples) == 1
    # inference mode, told to a call() that takes it (Keras's own call does)
    parameters = inspect.signature(model.call).parameters
    mode = {"training": False} if "training" in parameters or any(
        p.kind == p.VAR_KEYWORD for p in parameters.values()) else {}

    def forward(p, *inputs):
        tv = [p["trainable"][n] for n in trainable]
        ntv = [p["non_trainable"][n] for n in others]
        out, _ = model.stateless_call(tv, ntv, inputs[0] if single_input else list(inputs),
                                      **mode)
        if isinstance(out, dict):
            missing = [k for k in output_names if k not in out]
            if missing:
                raise ValueError(f"model {model.name!r} returns {sorted(out)}, not "
                                 f"{missing}: give output_names from those")
            return tuple(out[k] for k in output_names)
        outs = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        if len(outs) != len(output_names):
            raise ValueError(f"model {model.name!r} returns {len(outs)} outputs, and "
                             f"{len(output_names)} names were given")
        return outs if len(outs) > 1 else outs[0]

    return export_jax(forward, params, examples, out_dir, name=name, batch_sizes=batch_sizes,
                      input_names=list(input_names), output_names=list(output_names),
                      **export_jax_options)
