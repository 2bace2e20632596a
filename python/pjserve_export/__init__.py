"""pjserve_export: turn JAX models into pjserve bundles.

A bundle is a directory ``<out_dir>/<name>/`` with ``manifest.yaml``, one
StableHLO module ``model.b{N}.mlir`` per compiled batch size N (written as a
StableHLO portable artifact; ``model.<variant>.b{N}.mlir`` for each
input-shape variant), and ``weights.safetensors`` holding every weight once,
shared by all modules (docs/bundle-format.md, docs/exporter.md).

Main entry point::

    export_jax(fn, params, example_inputs, out_dir, *, name, batch_sizes,
               input_names, output_names, description=None, residency="host",
               weight=1.0, variants=None, target_stablehlo_version=None)
        -> pathlib.Path

``fn(params, *inputs)`` returns one array or a tuple of arrays. ``params`` is
any pytree of arrays; its leaves become the weights, named by their tree paths
joined with dots (``dense1.w``, ``layers.0.b``) and passed to every module as
its first arguments, in jax's flattening order (dict keys sorted), followed by
the inputs in ``input_names`` order. ``example_inputs`` give each input's
per-example shape and dtype (their leading batch axis may have any size).
``variants`` maps variant names to example inputs at other shapes, e.g.
``{"wide": [np.zeros((1, 16, 32, 3), np.float32)]}``.

Example::

    import jax, jax.numpy as jnp
    from pjserve_export import export_jax

    params = {"w": jnp.ones((16, 4)), "b": jnp.zeros(4)}
    def fn(p, x):
        return x @ p["w"] + p["b"]

    export_jax(fn, params, [jnp.zeros((1, 16), jnp.float32)], "models",
               name="linear", batch_sizes=[1, 4, 8],
               input_names=["x"], output_names=["y"])

PyTorch modules (torch and torchax live in .venv-torch)::

    export_torch(module, example_inputs, out_dir, *, name, batch_sizes,
                 input_names, output_names, **export_jax_options) -> pathlib.Path

traces module.forward through torchax into JAX and exports it as above; the
weights are the module's state_dict, by name.

Keras 3 models (the JAX backend: KERAS_BACKEND=jax before keras is imported)::

    export_keras(model, out_dir, *, name, batch_sizes, example_inputs=None,
                 input_names=None, output_names=None, **export_jax_options) -> pathlib.Path

exports model.stateless_call in inference mode; a functional model's inputs
and output names are its own.

ONNX files (onnx lives in .venv-torch)::

    export_onnx(model, out_dir, *, name, batch_sizes, input_names=None,
                output_names=None, example_inputs=None, **export_jax_options) -> pathlib.Path

runs the graph's nodes as JAX operations (onnx_export.OPS) and exports that;
the weights are the graph's float initializers, by name.

torchvision's Faster R-CNN (docs/detection.md)::

    export_faster_rcnn(model, out_dir, *, name, image_size, build=None) -> pathlib.Path

writes two StableHLO stages and the meta model clients call, whose C does
the data-dependent parts (proposal selection, NMS) as torchvision does.

Hooked and meta bundles (C code in model.c, docs/hooks.md,
docs/meta-models.md): `export_jax(..., client_inputs=, client_outputs=,
hooks_source=, extra_files=, build_hooks=)` and `export_meta(out_dir, name=,
calls=, client_inputs=, client_outputs=, source=)`; `hooks_builder` builds
model.so (``pjserve build-hooks``).

Swap-in stages (docs/exporter.md § Swap-in stages): ``export_jax(...,
swap_in_stages=K or "auto")`` also splits the model into stages the server
runs on a cold model's first execution while later stages' weights are still
being copied; `swap_in` has the splitting and `swap_in.plan_stages`, the
chooser of "auto".

Also here: the safetensors reader/writer (`read_safetensors`,
`write_safetensors`), manifest helpers (`read_manifest`, `random_inputs`) and
StableHLO helpers (`default_target_version`, `main_signature`,
`deserialize_portable_artifact`).
"""

from .bundle import (DEFAULT_VARIANT, FORMAT_VERSION, MANIFEST_FILE, WEIGHTS_FILE, Manifest,
                     SwapInStage, TensorSpec, Variant, module_file, random_inputs, read_manifest,
                     swap_in_file, tensor_spec)
from .hooks import HOOKS_LIBRARY, HOOKS_SOURCE, export_meta, hooks_builder
from .jax_export import (PLUGIN_STABLEHLO_VERSION, artifact_version, custom_call_targets,
                         default_target_version, deserialize_portable_artifact, export_jax,
                         main_signature, serialize_portable_artifact, stablehlo_versions,
                         weight_names_and_arrays)
from .safetensors_io import read_safetensors, rewrite_metadata, write_safetensors
from .keras_export import export_keras
from .onnx_export import export_onnx
from .torch_export import export_torch, torch_reference
from .detection import export_faster_rcnn, random_faster_rcnn

__all__ = [
    "export_jax", "export_keras", "export_onnx", "export_torch", "torch_reference",
    "export_faster_rcnn", "random_faster_rcnn", "export_meta", "hooks_builder", "tensor_spec", "HOOKS_SOURCE", "HOOKS_LIBRARY",
    "DEFAULT_VARIANT", "FORMAT_VERSION", "MANIFEST_FILE", "WEIGHTS_FILE", "Manifest",
    "TensorSpec", "Variant", "module_file", "random_inputs", "read_manifest",
    "SwapInStage", "swap_in_file",
    "PLUGIN_STABLEHLO_VERSION", "artifact_version", "custom_call_targets",
    "default_target_version", "deserialize_portable_artifact", "main_signature",
    "serialize_portable_artifact", "stablehlo_versions", "weight_names_and_arrays",
    "read_safetensors", "rewrite_metadata", "write_safetensors",
]
