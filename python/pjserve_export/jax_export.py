"""Export a JAX function and its parameters to a pjserve bundle.

How a bundle's module is made (one per compiled batch size N, and per
input-shape variant: the same function traced at the variant's input shapes):

1. ``jax.export.export(jax.jit(fn, keep_unused=True), platforms=["cpu"])`` is
   traced with abstract values: the parameter pytree first, then each input
   with leading dimension N. ``keep_unused=True`` keeps every weight as an
   argument of ``@main`` even when ``fn`` ignores it, so every module takes the
   same weights in the same order and one weights file serves them all.
2. With one platform, no effects and no shape polymorphism, jax's ``@main``
   takes exactly the flattened arguments, in ``jax.tree_util`` flattening
   order (dict keys sorted), with no platform-index or token arguments, and
   returns the flattened outputs. This module checks all of that (and checks
   the argument types in the module text itself) rather than trusting it.
3. Debug locations (file paths of the exporting script) are stripped, so the
   same model exports to the same bytes wherever it is exported from; the
   server's executable cache is keyed by those bytes.
4. The module is written as a StableHLO portable artifact (versioned VHLO
   bytecode) targeting `target_stablehlo_version`; any consumer whose accepted
   window [minimum, current] contains that version can read it.
"""

import collections.abc
import json
import re
import warnings
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from . import bundle as B
from . import dtypes
from . import hooks as H
from . import swap_in as S
from .safetensors_io import write_safetensors

# The newest StableHLO version the plugins pjserve is tested with accept:
# xla-cpu-pjrt 0.0.1 reports stablehlo_current_version 1.13.3 (minimum 0.9.0);
# jax-cuda13-pjrt reports 1.22.0 (minimum 0.9.0). A portable artifact is
# readable by a consumer when its target lies in the consumer's window, so the
# default target is the smaller of this and the installed jaxlib's current
# version: new enough for everything jax emits, old enough for every plugin.
PLUGIN_STABLEHLO_VERSION = "1.13.3"

ARGUMENT_ORDER_KEY = "argument_order"


# ---- StableHLO versions ----------------------------------------------------

def _stablehlo():
    # jaxlib's StableHLO bindings, under the name jax itself uses for them.
    from jax._src.lib.mlir.dialects import hlo
    return hlo


def _vtuple(v: str) -> Tuple[int, ...]:
    if not isinstance(v, str) or not re.fullmatch(r"\d+\.\d+\.\d+", v):
        raise ValueError(f"a StableHLO version looks like '1.13.3', got {v!r}")
    return tuple(int(p) for p in v.split("."))


def stablehlo_versions() -> Tuple[str, str]:
    """(minimum, current) StableHLO versions the installed jaxlib can write."""
    s = _stablehlo()
    return s.get_minimum_version(), s.get_current_version()


def default_target_version() -> str:
    """min(jaxlib's current StableHLO version, PLUGIN_STABLEHLO_VERSION)."""
    _, current = stablehlo_versions()
    return min(current, PLUGIN_STABLEHLO_VERSION, key=_vtuple)


def resolve_target_version(target: Optional[str]) -> str:
    if target is None:
        return default_target_version()
    lo, hi = stablehlo_versions()
    if not (_vtuple(lo) <= _vtuple(target) <= _vtuple(hi)):
        raise ValueError(f"target_stablehlo_version {target} is outside what this jaxlib "
                         f"can write ({lo} .. {hi})")
    return target


# ---- module text helpers ---------------------------------------------------

def _ir_context():
    from jax._src.interpreters import mlir as jax_mlir
    return jax_mlir.make_ir_context()


def serialize_portable_artifact(module_text, target_version: str,
                                strip_debug_info: bool = True) -> bytes:
    """StableHLO text (or bytecode) -> portable artifact for `target_version`.

    Uses XLA's serializer (the one jax.export uses) without mixed
    serialization: everything, including the Shardy (sdy) attributes jax puts
    on some ops, is written as versioned VHLO (sdy attributes become
    ``xla.sdy.*`` frontend-attribute strings), so the consumer needs no dialect
    beyond StableHLO's. (jaxlib's plain StableHLO binding refuses modules that
    carry sdy attributes at all.)

    With strip_debug_info, source locations are dropped first; the module is
    handed over as bytecode so that no new locations are made up by a parse."""
    import io
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir, passmanager
    with _ir_context():
        module = ir.Module.parse(module_text)
        if strip_debug_info:
            passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(
                module.operation)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    return xla_client._xla.mlir.serialize_portable_artifact(buf.getvalue(), target_version, False)


def deserialize_portable_artifact(artifact: bytes) -> str:
    """Portable artifact -> StableHLO module text (for checks and debugging)."""
    from jax._src.lib import xla_client
    # jaxlib 0.8 returns the text; newer ones return a module in the caller's context
    with _ir_context():
        module = xla_client._xla.mlir.deserialize_portable_artifact(artifact)
        return module if isinstance(module, str) else str(module)


def artifact_version(artifact: bytes) -> str:
    """The StableHLO version a portable artifact was written for."""
    m = re.search(rb"StableHLO_v(\d+\.\d+\.\d+)", artifact[:64])
    if m is None:
        raise ValueError("not a StableHLO portable artifact")
    return m.group(1).decode()


_ELEM = {
    "i1": "bool", "ui8": "u8", "ui16": "u16", "ui32": "u32", "ui64": "u64",
    "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64",
    "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64",
}


def _tensor_type(t) -> Tuple[Tuple[int, ...], str]:
    from jax._src.lib.mlir import ir
    rt = ir.RankedTensorType(t)
    elem = str(rt.element_type)
    if elem not in _ELEM:
        raise ValueError(f"module uses element type {elem}, which bundles do not support")
    return tuple(rt.shape), _ELEM[elem]


def main_signature(module_text: str):
    """([(shape, dtype), ...] of @main's arguments, [...] of its results), with
    manifest dtype names, read from the module text itself."""
    from jax._src.lib.mlir import ir
    with _ir_context():
        module = ir.Module.parse(module_text)
        for op in module.body.operations:
            if op.operation.name == "func.func" and \
                    ir.StringAttr(op.attributes["sym_name"]).value == "main":
                ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                return ([_tensor_type(t) for t in ftype.inputs],
                        [_tensor_type(t) for t in ftype.results])
    raise ValueError("module has no @main")


def custom_call_targets(module_text: str) -> List[str]:
    """Names of the custom calls a module makes (a bare PJRT plugin may lack them)."""
    found = re.findall(r"stablehlo\.custom_call\s+@([\w.$-]+)", module_text)
    found += re.findall(r"call_target_name\s*=\s*\"([^\"]+)\"", module_text)
    return sorted(set(found))


# ---- parameters and inputs -------------------------------------------------

def _key_str(k) -> str:
    tu = jax.tree_util
    if isinstance(k, tu.DictKey):
        return str(k.key)
    if isinstance(k, tu.SequenceKey):
        return str(k.idx)
    if isinstance(k, tu.GetAttrKey):
        return str(k.name)
    if isinstance(k, tu.FlattenedIndexKey):
        return str(k.key)
    return str(k)


def weight_names_and_arrays(params) -> Tuple[List[str], List[np.ndarray]]:
    """Flattens `params` in jax order; names are tree paths joined with dots
    (``{"dense1": {"w": ...}}`` -> ``dense1.w``, ``[a, b]`` -> ``0``, ``1``).
    Arrays are converted to the dtype jax will use for them (without x64,
    64-bit types become 32-bit), which is the dtype of the module argument."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    names, arrays = [], []
    for path, leaf in leaves:
        name = ".".join(_key_str(k) for k in path) or "params"
        arr = np.asarray(leaf)
        if arr.dtype == object:
            raise ValueError(f"parameter {name!r} is not an array (got {type(leaf).__name__})")
        canon = np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
        if canon != arr.dtype:
            if not isinstance(leaf, (int, float, bool)):
                warnings.warn(f"parameter {name!r}: {arr.dtype} is stored as {canon}, the type "
                              "jax computes with (enable jax_enable_x64 to keep 64-bit types)",
                              stacklevel=3)
            arr = arr.astype(canon)
        dtypes.manifest_name(arr.dtype)  # raises for unsupported dtypes
        names.append(name)
        arrays.append(arr)
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"parameter names collide after joining paths with dots: {dups}")
    for n in names:
        if n == "__metadata__":
            raise ValueError("a parameter may not be named '__metadata__'")
    return names, arrays


def _input_specs(example_inputs, input_names,
                 batched: bool = True) -> List[Tuple[Tuple[int, ...], np.dtype]]:
    """Per-example (shape, dtype) of each example input; the whole shape
    when the model has no batch axis."""
    specs = []
    for name, x in zip(input_names, example_inputs):
        shape = tuple(int(d) for d in np.shape(x))
        if batched and len(shape) < 1:
            raise ValueError(f"example input {name!r} is a scalar; every input needs a leading "
                             "batch axis")
        dt = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        dt = np.dtype(jax.dtypes.canonicalize_dtype(dt))
        dtypes.manifest_name(dt)
        specs.append((shape[1:] if batched else shape, dt))
    return specs


def _batch_axis(n: Optional[int]) -> Tuple[int, ...]:
    """The leading extent of batch size n; none for a model without a batch
    axis (n None)."""
    return () if n is None else (n,)


# ---- the exporter ----------------------------------------------------------

def _export_one(fn, param_structs, input_specs, n: Optional[int]):
    inputs = [jax.ShapeDtypeStruct(_batch_axis(n) + shape, dt) for shape, dt in input_specs]
    return jax.export.export(jax.jit(fn, keep_unused=True), platforms=["cpu"])(
        param_structs, *inputs)


def _check_plain(exp, n_args: int, where: str):
    """What every exported module must be: all arguments kept, no effects,
    one device, no shape polymorphism."""
    problems = []
    if tuple(exp.module_kept_var_idx) != tuple(range(n_args)):
        problems.append(f"jax dropped arguments (kept {exp.module_kept_var_idx} of {n_args})")
    if exp.ordered_effects or exp.unordered_effects:
        problems.append("the function has side effects (effects become token arguments)")
    if exp.nr_devices != 1:
        problems.append(f"the function is sharded over {exp.nr_devices} devices")
    if exp.uses_global_constants:
        problems.append("the module uses shape polymorphism (dimension arguments)")
    if problems:
        raise ValueError(f"{where}: cannot export: " + "; ".join(problems))


def _check_exported(exp, n: Optional[int], n_weights: int, n_inputs: int,
                    output_names: Sequence[str]):
    _check_plain(exp, n_weights + n_inputs, f"batch size {n}")
    n_out = len(exp.out_avals)
    leaf = jax.tree_util.tree_structure(0)
    flat_tuple = jax.tree_util.tree_structure(tuple(range(n_out)))
    flat_list = jax.tree_util.tree_structure(list(range(n_out)))
    if exp.out_tree not in (flat_tuple, flat_list) and not (n_out == 1 and exp.out_tree == leaf):
        raise ValueError(f"fn must return an array or a tuple of arrays, got the structure "
                         f"{exp.out_tree}")
    if n_out != len(output_names):
        raise ValueError(f"fn returns {n_out} output(s) but output_names has "
                         f"{len(output_names)}: {list(output_names)}")
    for name, aval in zip(output_names, exp.out_avals):
        if n is not None and (len(aval.shape) < 1 or aval.shape[0] != n):
            raise ValueError(f"output {name!r} has shape {tuple(aval.shape)} at batch size {n}; "
                             f"every output needs a leading batch axis of size {n}")
        dtypes.manifest_name(aval.dtype)


def _check_variants(variants, input_names, input_specs):
    """{name: per-example (shape, dtype) of each input} for each variant, in
    order; every variant's shapes differ from the default's and each other's,
    with the default's dtypes and ranks."""
    if variants is None:
        return {}
    if not isinstance(variants, collections.abc.Mapping):
        raise ValueError(f"variants must be a mapping of variant names to example inputs, got "
                         f"{type(variants).__name__}")
    if len(variants) > B.VARIANTS_MAX:
        raise ValueError(f"at most {B.VARIANTS_MAX} variants besides the default, got "
                         f"{len(variants)}")
    result = {}
    seen = {tuple(shape for shape, _ in input_specs): B.DEFAULT_VARIANT}
    for vname, examples in variants.items():
        B.check_name("each variant name", vname)
        if vname == B.DEFAULT_VARIANT:
            raise ValueError(f"variant name {B.DEFAULT_VARIANT!r} is taken by the top-level "
                             "shapes (example_inputs)")
        examples = list(examples)
        if len(examples) != len(input_names):
            raise ValueError(f"variant {vname!r} has {len(examples)} example input(s) but the "
                             f"model has {len(input_names)}: {list(input_names)}")
        specs = _input_specs(examples, input_names)
        for nm, (shape, dt), (top_shape, top_dt) in zip(input_names, specs, input_specs):
            if dt != top_dt:
                raise ValueError(f"variant {vname!r}: input {nm!r} has dtype {dt}, but "
                                 f"example_inputs have {top_dt} (variants change shapes only)")
            if len(shape) != len(top_shape):
                raise ValueError(f"variant {vname!r}: input {nm!r} has per-example shape "
                                 f"{shape}, of another rank than {top_shape} (variants change "
                                 "extents, not ranks)")
        key = tuple(shape for shape, _ in specs)
        if key in seen:
            raise ValueError(f"variant {vname!r} has the same input shapes as {seen[key]!r}; "
                             "requests could not tell them apart")
        seen[key] = vname
        result[vname] = specs
    return result


def _export_modules(fn, name, param_structs, weight_arrays, weight_names, input_names,
                    output_names, input_specs, sizes, target, strip_debug_info, what):
    """One portable artifact per batch size for inputs of `input_specs`; returns
    ({batch size: artifact}, [(per-example shape, dtype) of each output]).
    sizes None: the model has no batch axis, one artifact (batch size 1)."""
    modules = {}
    out_specs = None
    for n in sizes or [None]:
        exp = _export_one(fn, param_structs, input_specs, n)
        _check_exported(exp, n, len(weight_names), len(input_names), output_names)
        lead = len(_batch_axis(n))
        specs = [(tuple(a.shape[lead:]), dtypes.manifest_name(a.dtype)) for a in exp.out_avals]
        if out_specs is None:
            out_specs = specs
        elif specs != out_specs:
            raise ValueError(f"{what}outputs at batch size {n} ({specs}) differ from those at "
                             f"batch size {sizes[0]} ({out_specs}) beyond the batch axis")

        text = exp.mlir_module()
        want_args = [(tuple(a.shape), dtypes.manifest_name(a.dtype)) for a in weight_arrays]
        want_args += [(_batch_axis(n) + shape, dtypes.manifest_name(dt))
                      for shape, dt in input_specs]
        want_res = [(_batch_axis(n) + shape, dt) for shape, dt in specs]
        _verify_signature(text, want_args, want_res, weight_names + input_names, n)
        targets = custom_call_targets(text)
        if targets:
            warnings.warn(f"model {name!r} ({what}batch size {n}) makes custom calls {targets}; "
                          "the PJRT plugin that serves it must register handlers for them (the "
                          "bare xla-cpu-pjrt plugin has none for jax's LAPACK calls, e.g. "
                          "lapack_sgetrf_ffi from jnp.linalg)", stacklevel=4)

        artifact = serialize_portable_artifact(text, target, strip_debug_info)
        # Round trip: what we wrote reads back with the same signature.
        _verify_signature(deserialize_portable_artifact(artifact), want_args, want_res,
                          weight_names + input_names, n)
        modules[n or 1] = artifact
    return modules, out_specs


def export_jax(fn: Callable, params: Any, example_inputs: Sequence[Any], out_dir, *,
               name: str, batch_sizes: Sequence[int], input_names: Sequence[str],
               output_names: Sequence[str], description: Optional[str] = None,
               residency: str = "host", weight: float = 1.0,
               variants: Optional[Mapping[str, Sequence[Any]]] = None,
               input_formats: Optional[Mapping[str, str]] = None,
               output_labels: Optional[Mapping[str, str]] = None,
               client_inputs: Optional[Sequence[Any]] = None,
               client_outputs: Optional[Sequence[Any]] = None,
               hooks_source: Optional[H.FileSource] = None,
               extra_files: Optional[Mapping[str, H.FileSource]] = None,
               build_hooks: Optional[H.Builder] = None,
               hooks_libraries: Optional[Sequence[str]] = None,
               target_stablehlo_version: Optional[str] = None,
               strip_debug_info: bool = True,
               sequence_state: Optional[Sequence[Tuple[str, str]]] = None,
               sequence_controls: Optional[Mapping[str, str]] = None,
               idle_timeout_ms: Optional[int] = None,
               max_sequences: Optional[int] = None,
               max_sequences_per_client: Optional[int] = None,
               evict_after_idle_ms: Optional[int] = None,
               swap_in_stages: Optional[Any] = None) -> Path:
    """Exports ``fn(params, *inputs)`` as the bundle ``out_dir/name/``; returns its path.

    fn: a jax-traceable function returning one array or a tuple of arrays, each
        with a leading batch axis.
    params: any pytree of arrays; each leaf becomes a weight named by its tree
        path joined with dots. Weights are module arguments, never constants.
    example_inputs: one array (or ShapeDtypeStruct) per input, with a leading
        batch axis of any size; only the per-example shape and dtype are used.
    batch_sizes: strictly ascending positive ints; one module per entry. None:
        the model has no batch axis (Triton's max_batch_size 0): example_inputs
        give the whole shapes, fn's outputs are taken as they are, one module
        is compiled, and each request carries exactly those shapes (no
        coalescing; no variants or sequences).
    input_names, output_names: names for the manifest ([A-Za-z0-9_.-]+, unique).
    description, residency ("host" | "device" | "unpinned"), weight (> 0):
        copied into the manifest.
    variants: optional input-shape variants, {variant name: example inputs}
        with example inputs as for example_inputs (same dtypes and ranks, other
        per-example shapes). Each variant gets one module per batch size,
        ``model.<variant>.b{N}.mlir``, over the same weights; the server runs a
        request on the variant whose input shapes it has.
    input_formats: optional {input name: "NHWC" | "NCHW"} for image inputs
        (three extents per example); the model configuration reports it to
        clients that read the layout. Nothing about execution changes.
    output_labels: optional {output name: labels file name}: the classes of
        the output, one per line, for clients asking for classification
        (docs/serving.md); each file must be among extra_files.
    client_inputs, client_outputs: a hooked model's client side, what
        metadata reports and requests are checked against: TensorSpecs or
        (name, dtype, shape) tuples (`bundle.tensor_spec`), dtype "bytes" and
        extents of -1 allowed. Either defaults to the executable's own.
    hooks_source: the hooks' model.c (a path, or its bytes), copied into the
        bundle; needed when client_inputs or client_outputs are given.
    extra_files: {file name in the bundle: path or bytes}, files the hooks
        read (e.g. labels.txt).
    build_hooks: run on the staged bundle before it is published, e.g.
        ``hooks.hooks_builder("build/pjserve")``; None leaves model.so to
        ``pjserve build-hooks``.
    hooks_libraries: libraries model.c links with, named as they follow -l
        (["turbojpeg"] for -lturbojpeg); the manifest lists them and
        ``pjserve build-hooks`` (and `hooks.hooks_builder`) link them.
    target_stablehlo_version: StableHLO version of the portable artifacts;
        default `default_target_version()`.
    strip_debug_info: drop source locations so exports are reproducible.
    sequence_state: a stateful model's [(state input, state output)] pairs:
        fn takes each sequence's state as the input and returns the next as
        the output (same dtype and shape). The server keeps the state per
        sequence (requests with sequence_id, sequence_start, sequence_end);
        clients never send or see these tensors. Not with variants or hooks.
    sequence_controls: {"start" | "end" | "ready" | "corrid": input name},
        inputs the server fills in each step's row as Triton's control
        inputs: 1 on a sequence's first (start) or last (end) request, else
        0; 1 in every request's row (ready; rows that only pad a batch hold
        0); the sequence id (corrid: an integer input). Each input has one
        element per row, bool, i32 or f32 for a flag. Makes the model
        stateful with or without sequence_state.
    idle_timeout_ms, max_sequences, max_sequences_per_client,
        evict_after_idle_ms: a stateful model's limits (a sequence idle this
        long is freed; live sequences at once; live sequences one client
        started; in a full table, or for a client at its cap, a new sequence
        evicts the least recently used one idle longer than this); None: the
        server's defaults (60000 ms, 1024, a quarter of max_sequences, 1000
        ms or the idle timeout when shorter).
    swap_in_stages: None or 1: the model is exported whole. An int K from 2
        to 16: it is also split into at most K stages of about equal weight
        bytes, ``swap_in.s{k}.b{N}.mlir``, which the server runs on a cold
        model's first execution, copying stage k+1's weights while stage k
        executes; weights are written sorted by the stage that first uses
        them. "auto": K and the cuts minimize the cold latency modelled from
        the bandwidth and execution times measured on jax's default device
        (the whole model when one stage is best). Not with variants. See
        `swap_in`.

    An existing bundle of the same name is replaced atomically.
    """
    B.check_name("name", name)
    batched = batch_sizes is not None
    sizes = B.check_batch_sizes(batch_sizes) if batched else None
    example_inputs = list(example_inputs)
    input_names = B.check_names("input_names", input_names, len(example_inputs),
                                "example_inputs")
    output_names = B.check_names("output_names", output_names)
    if not output_names:
        raise ValueError("output_names must not be empty")
    clash = sorted(set(input_names) & set(output_names))
    if clash:
        raise ValueError(f"names used for both an input and an output: {clash}")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"description must be a string, got {description!r}")
    residency = B.check_residency(residency)
    weight = B.check_weight(weight)
    target = resolve_target_version(target_stablehlo_version)
    if not callable(fn):
        raise ValueError("fn must be callable")
    client_ins = [] if client_inputs is None else B.check_client_tensors("client_inputs",
                                                                         client_inputs)
    client_outs = [] if client_outputs is None else B.check_client_tensors("client_outputs",
                                                                           client_outputs)
    if (client_ins or client_outs) and hooks_source is None:
        raise ValueError("client_inputs / client_outputs need the hooks that produce them "
                         "(hooks_source=, a model.c)")
    if build_hooks is not None and hooks_source is None:
        raise ValueError("build_hooks needs hooks_source (a model.c)")
    libraries = B.check_hooks_libraries(hooks_libraries)
    if libraries and hooks_source is None:
        raise ValueError("hooks_libraries needs hooks_source (a model.c)")
    H.check_bundle_files(hooks_source, extra_files)
    state_pairs = B.check_sequence_state(sequence_state or [], input_names, output_names)
    controls = B.check_sequence_controls(sequence_controls, input_names, state_pairs)
    stateful = bool(state_pairs or controls)
    limits = (idle_timeout_ms, max_sequences, max_sequences_per_client, evict_after_idle_ms)
    if any(v is not None for v in limits) and not stateful:
        raise ValueError("idle_timeout_ms / max_sequences / max_sequences_per_client / "
                         "evict_after_idle_ms need sequence_state or sequence_controls")
    if stateful and (variants or client_ins or client_outs):
        raise ValueError("a stateful model (sequence_state, sequence_controls) has no variants, "
                         "client_inputs or client_outputs")
    if not batched and (stateful or variants):
        raise ValueError("a model without a batch axis (batch_sizes None) has no variants and "
                         "no sequence state or controls")
    stages = _check_swap_in_stages(swap_in_stages, variants)

    weight_names, weight_arrays = weight_names_and_arrays(params)
    treedef = jax.tree_util.tree_structure(params)
    param_structs = jax.tree_util.tree_unflatten(
        treedef, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in weight_arrays])
    input_specs = _input_specs(example_inputs, input_names, batched)
    variant_specs = _check_variants(variants, input_names, input_specs)
    formats = B.check_input_formats(
        input_formats, input_names, {nm: shape for nm, (shape, _) in zip(input_names, input_specs)})
    labels = dict(output_labels or {})
    unknown = sorted(set(labels) - set(output_names))
    if unknown:
        raise ValueError(f"output_labels names outputs the model does not have: {unknown}")
    missing = sorted(set(labels.values()) - set(extra_files or {}))
    if missing:
        raise ValueError(f"labels files not among extra_files: {missing}")

    split = None
    if stages is not None:
        def input_structs(n):
            return [jax.ShapeDtypeStruct(_batch_axis(n) + shape, dt) for shape, dt in input_specs]
        split = S.split_model(fn, params, weight_arrays, input_structs, sizes, stages,
                              output_names)
        if split is None:
            warnings.warn(f"model {name!r}: swap_in_stages={stages!r}: "
                          + ("one stage has the least modelled cold latency"
                             if stages == "auto" else "fn has no place to cut between the first "
                             "uses of its weights") + "; exported without stages", stacklevel=2)
    model_fn, model_names, model_arrays, model_structs = fn, weight_names, weight_arrays, \
        param_structs
    if split is not None:
        model_fn = _reordered(fn, treedef, split.order)
        model_names = [weight_names[w] for w in split.order]
        model_arrays = [weight_arrays[w] for w in split.order]
        model_structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in model_arrays]

    def export_variant(specs, what):
        return _export_modules(model_fn, name, model_structs, model_arrays, model_names,
                               input_names, output_names, specs, sizes, target,
                               strip_debug_info, what)

    modules, out_specs = export_variant(input_specs, "")
    files = {B.module_file(n): artifact for n, artifact in modules.items()}
    manifest_stages = []
    if split is not None:
        manifest_stages, stage_files = _export_stages(
            split, weight_names, weight_arrays, input_names, input_specs, output_names,
            out_specs, sizes, target, strip_debug_info)
        files.update(stage_files)
    manifest_variants = []
    for vname, specs in variant_specs.items():
        v_modules, v_out = export_variant(specs, f"variant {vname!r}: ")
        files.update({B.module_file(n, vname): a for n, a in v_modules.items()})
        manifest_variants.append(_manifest_variant(vname, input_names, input_specs, specs,
                                                   output_names, out_specs, v_out))

    outputs = [B.TensorSpec(nm, dt, shape, batched=batched, labels=labels.get(nm))
               for nm, (shape, dt) in zip(output_names, out_specs)]
    for spec in outputs:
        if spec.labels is not None:
            B.check_labels(spec)
    manifest = B.Manifest(
        name=name, description=description, batch_sizes=sizes or [1],
        inputs=[B.TensorSpec(nm, dtypes.manifest_name(dt), shape, batched=batched,
                             format=formats.get(nm))
                for nm, (shape, dt) in zip(input_names, input_specs)],
        outputs=outputs,
        variants=manifest_variants, residency=residency, weight=weight,
        client_inputs=client_ins, client_outputs=client_outs,
        sequence_state=state_pairs, sequence_controls=controls, idle_timeout_ms=idle_timeout_ms,
        max_sequences=max_sequences, max_sequences_per_client=max_sequences_per_client,
        evict_after_idle_ms=evict_after_idle_ms,
        hooks_libraries=libraries, swap_in_stages=manifest_stages)
    by_name = {t.name: t for t in manifest.inputs + manifest.outputs}
    for i, o in state_pairs:
        a, b = by_name[i], by_name[o]
        if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
            raise ValueError(f"sequence_state: input {i!r} is {a.dtype} {a.shape} but output "
                             f"{o!r} is {b.dtype} {b.shape}; the output is the next step's "
                             "input, so they must match")

    with B.StagedBundle(out_dir, name) as staging:
        write_safetensors(staging / B.WEIGHTS_FILE, dict(zip(model_names, model_arrays)),
                          {ARGUMENT_ORDER_KEY: json.dumps(model_names)})
        for file, artifact in files.items():
            (staging / file).write_bytes(artifact)
        (staging / B.MANIFEST_FILE).write_text(B.manifest_yaml(manifest))
        H.add_bundle_files(staging, hooks_source, extra_files, build_hooks)
    return Path(out_dir) / name


def _check_swap_in_stages(value, variants):
    """None (export whole), an int in 2..16, or "auto"."""
    lo, hi = B.SWAP_IN_STAGES_MIN, B.SWAP_IN_STAGES_MAX
    if value is None:
        return None
    if isinstance(value, str) and value == "auto":
        stages = "auto"
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not (value == 1 or lo <= value <= hi):
        raise ValueError(f"swap_in_stages must be None, 1 (no stages), an int from {lo} to {hi} "
                         f"or 'auto', got {value!r}")
    else:
        stages = int(value)
        if stages == 1:
            return None
    if variants:
        raise ValueError("swap_in_stages and variants cannot be combined: a model split into "
                         "swap-in stages has one set of input shapes")
    return stages


def _reordered(fn, treedef, order):
    """fn taking its weights as one list in `order` (of params' leaves)."""
    position = {w: i for i, w in enumerate(order)}

    def model(weights, *inputs):
        leaves = [weights[position[w]] for w in range(len(order))]
        return fn(jax.tree_util.tree_unflatten(treedef, leaves), *inputs)
    return model


def _export_stages(split, weight_names, weight_arrays, input_names, input_specs, output_names,
                   out_specs, sizes, target, strip_debug_info):
    """The manifest's swap_in_stages entries and {file name: portable
    artifact} of every stage at every batch size, each checked against what
    the entries declare."""
    last = len(split.stages) - 1
    entries = []
    # per stage: (name, per-example or whole shape, dtype, batched) of what it takes and returns
    takes = [[(nm, shape, dtypes.manifest_name(dt), sizes is not None)
              for nm, (shape, dt) in zip(input_names, input_specs)]]
    returns = []
    for k, st in enumerate(split.stages):
        if k == last:
            returns.append([(nm, shape, dt, sizes is not None)
                            for nm, (shape, dt) in zip(output_names, out_specs)])
            entries.append(B.SwapInStage([weight_names[w] for w in st.weights]))
            continue
        outs = [B.TensorSpec(f"s{k}.{i}", split.kinds[v].dtype, split.kinds[v].shape,
                             batched=split.kinds[v].batched) for i, v in enumerate(st.outs)]
        entries.append(B.SwapInStage([weight_names[w] for w in st.weights], outs))
        returns.append([(t.name, t.shape, t.dtype, t.batched) for t in outs])
        takes.append(returns[-1])

    files = {}
    for n in sizes or [None]:
        program = split.programs[n]
        for k, st in enumerate(split.stages):
            where = f"swap-in stage {k}, batch size {n or 1}"
            weights = [jax.ShapeDtypeStruct(weight_arrays[w].shape, weight_arrays[w].dtype)
                       for w in st.weights]
            ins = [jax.ShapeDtypeStruct(program.avals[v].shape, program.avals[v].dtype)
                   for v in st.ins]
            f = S.stage_function(program, st.lo, st.hi, st.weights, st.ins, st.outs)
            exp = jax.export.export(jax.jit(f, keep_unused=True), platforms=["cpu"])(
                weights, *ins)
            _check_plain(exp, len(weights) + len(ins), where)

            def full(tensors):
                return [(((n,) if batched and n is not None else ()) + tuple(shape), dt)
                        for _, shape, dt, batched in tensors]
            want_args = [(tuple(w.shape), dtypes.manifest_name(w.dtype)) for w in weights]
            want_args += full(takes[k])
            want_res = full(returns[k])
            names = [weight_names[w] for w in st.weights] + [t[0] for t in takes[k]]
            text = exp.mlir_module()
            _verify_signature(text, want_args, want_res, names, where)
            artifact = serialize_portable_artifact(text, target, strip_debug_info)
            _verify_signature(deserialize_portable_artifact(artifact), want_args, want_res,
                              names, where)
            files[B.swap_in_file(k, n or 1)] = artifact
    return entries, files


def _manifest_variant(vname, input_names, input_specs, specs, output_names, out_specs, v_out):
    """The manifest entry of a variant: the tensors whose shapes differ from
    the default's. Outputs keep the default's dtypes and ranks."""
    for nm, (shape, dt), (top_shape, top_dt) in zip(output_names, v_out, out_specs):
        if dt != top_dt or len(shape) != len(top_shape):
            raise ValueError(f"variant {vname!r}: output {nm!r} is {dt} {shape} but "
                             f"{top_dt} {top_shape} at the default shapes (variants change "
                             "extents only)")
    return B.Variant(
        name=vname,
        inputs={nm: shape for nm, (shape, _), (top, _) in zip(input_names, specs, input_specs)
                if shape != top},
        outputs={nm: shape for nm, (shape, _), (top, _) in zip(output_names, v_out, out_specs)
                 if shape != top})


def _verify_signature(text, want_args, want_res, arg_names, n):
    """n: the batch size, or a string saying which module it is."""
    where = n if isinstance(n, str) else f"batch size {n}"
    args, results = main_signature(text)
    if args != want_args:
        detail = [f"{nm}: module {got} vs expected {want}"
                  for nm, got, want in zip(arg_names, args, want_args) if got != want]
        raise ValueError(f"{where}: @main arguments do not match weights then inputs "
                         f"({len(args)} vs {len(want_args)} arguments) {detail}")
    if results != want_res:
        raise ValueError(f"{where}: @main results {results} != expected {want_res}")
