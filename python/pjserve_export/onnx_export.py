"""ONNX models to pjserve bundles: the ONNX graph run as a JAX function.

    export_onnx(model, out_dir, *, name, batch_sizes, input_names=None,
                output_names=None, example_inputs=None, **export_jax_options) -> Path

`model` is an .onnx path or an onnx.ModelProto. Each node of the graph is
lowered to jax.numpy / jax.lax by the table OPS below, and export_jax exports
the resulting function as any JAX function, one trace per compiled batch
size. So:

- the weights are the graph's floating-point initializers, named as in the
  graph ("conv1.weight"; characters other than letters, digits, "_" and "."
  become "_"); integer initializers (shapes, axes, indices) are constants of
  the trace. One used only as a Gemm's B with transB=1 (a Linear layer as
  torch.onnx.export writes it) is stored transposed, as "fc.weight_t":
  XLA's CPU backend multiplies 2 or more rows by it several times faster so
  (_stored_transposed);
- every batch size is its own trace, so the shape arithmetic ONNX exporters
  write (Shape, Gather, Concat, Reshape on the result) is computed while
  tracing, from the concrete shapes: it costs nothing at run time;
- the graph's inputs are its inputs, in order, and their first axis is the
  batch axis when the graph leaves it open (dim_param or unset); any other
  open extent needs example_inputs at the shape to compile. 64-bit inputs
  (int64 token ids) are served as 32-bit ones, as JAX computes;
- a node whose op this table does not have, or an attribute value it does
  not handle, is refused at export, naming the node, the op and what to do.

Supported ops: see OPS; their attributes are read as opsets 11 to 18 define
them (axes as an attribute or as an input), and the tests use the files
torch.onnx.export writes at opset 17. onnx is in .venv-torch
(scripts/requirements-torch.txt).
"""

import re
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .jax_export import export_jax


class UnsupportedOnnx(ValueError):
    """A graph export_onnx cannot lower: the message names the node and op."""


def _onnx():
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError("export_onnx needs the onnx package: it is in .venv-torch "
                          "(make bootstrap-torch)") from e
    return onnx


# ONNX TensorProto element types -> numpy
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
           9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _np_dtype(elem_type, where):
    if elem_type not in _DTYPES:
        raise UnsupportedOnnx(f"{where}: element type {elem_type} is not supported")
    return _DTYPES[elem_type]


def _attrs(node):
    onnx = _onnx()
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = onnx.numpy_helper.to_array(v)
        elif isinstance(v, (list, tuple)):
            v = list(v)
        out[a.name] = v
    return out


# ---- lowering ------------------------------------------------------------------------
#
# A value is a numpy array while it is known at trace time (initializers that
# are not weights, shapes, and what is computed from them only) and a jax array
# otherwise; `_lib` picks numpy or jax.numpy for an op by its inputs, so shape
# arithmetic stays constant.

def _jnp():
    import jax.numpy as jnp
    return jnp


def _lib(*xs):
    return np if all(x is None or isinstance(x, (np.ndarray, np.generic)) for x in xs) else _jnp()


def _static(x, node, what):
    if not isinstance(x, (np.ndarray, np.generic)):
        raise UnsupportedOnnx(f"node {node.name!r} ({node.op_type}): its {what} must be known "
                              f"when the graph is traced (a constant or computed from shapes)")
    return np.asarray(x)


def _pairs(pads, n):
    """ONNX pads [b1, ..., bn, e1, ..., en] as [(b1, e1), ...]."""
    pads = list(pads) if pads else [0] * (2 * n)
    return [(int(pads[i]), int(pads[i + n])) for i in range(n)]


def _check_auto_pad(node, a):
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOnnx(f"node {node.name!r} ({node.op_type}): auto_pad "
                              f"{a['auto_pad']} is not supported; export with explicit pads")


def _conv(node, x, w, b=None, **a):
    import jax
    _check_auto_pad(node, a)
    n = w.ndim - 2
    if not 1 <= n <= 3:
        raise UnsupportedOnnx(f"node {node.name!r} (Conv): {n} spatial dimensions")
    spatial = "DHW"[3 - n:]
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NC" + spatial, "OI" + spatial,
                                                           "NC" + spatial))
    y = jax.lax.conv_general_dilated(
        x, w, window_strides=a.get("strides", [1] * n), padding=_pairs(a.get("pads"), n),
        rhs_dilation=a.get("dilations", [1] * n), dimension_numbers=dn,
        feature_group_count=int(a.get("group", 1)))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _pool(node, x, kind, **a):
    import jax
    jnp = _jnp()
    _check_auto_pad(node, a)
    k = list(a["kernel_shape"])
    n = len(k)
    strides = list(a.get("strides", [1] * n))
    dil = list(a.get("dilations", [1] * n))
    pads = _pairs(a.get("pads"), n)
    if a.get("ceil_mode", 0):
        # pad the end so that the last partial window counts, as ceil does
        for i in range(n):
            size = x.shape[2 + i] + pads[i][0] + pads[i][1]
            eff = (k[i] - 1) * dil[i] + 1
            out = -(-(size - eff) // strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1  # a window must start inside the input or its left padding
            extra = (out - 1) * strides[i] + eff - size
            pads[i] = (pads[i][0], pads[i][1] + max(0, extra))
    window = (1, 1) + tuple(k)
    wstrides = (1, 1) + tuple(strides)
    wdil = (1, 1) + tuple(dil)
    padding = ((0, 0), (0, 0)) + tuple(pads)
    if kind == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, wstrides, padding,
                                     window_dilation=wdil)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, wstrides, padding,
                                  window_dilation=wdil)
    if a.get("count_include_pad", 0):
        explicit = tuple(_pairs(a.get("pads"), n))
        ones = jnp.pad(jnp.ones(x.shape[2:], x.dtype), explicit)
        counts = jax.lax.reduce_window(ones, 0.0, jax.lax.add, tuple(k), tuple(strides),
                                       tuple((0, p[1] - e[1]) for p, e in zip(pads, explicit)),
                                       window_dilation=tuple(dil))
    else:
        counts = jax.lax.reduce_window(jnp.ones(x.shape[2:], x.dtype), 0.0, jax.lax.add,
                                       tuple(k), tuple(strides), tuple(pads),
                                       window_dilation=tuple(dil))
    return total / counts


def _gemm(node, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = a.T if transA else a
    b = b.T if transB else b
    y = alpha * (a @ b)
    return y if c is None else y + beta * c


def _batch_norm(node, x, scale, bias, mean, var, epsilon=1e-5, **a):
    jnp = _jnp()
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / jnp.sqrt(var + epsilon)
    return x * inv.reshape(shape) + (bias - mean * inv).reshape(shape)


def _layer_norm(node, x, scale, bias=None, axis=-1, epsilon=1e-5, **a):
    jnp = _jnp()
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + epsilon) * scale
    return y if bias is None else y + bias


def _reshape(node, x, shape, allowzero=0):
    shape = [int(s) for s in _static(shape, node, "shape")]
    if not allowzero:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return _lib(x).reshape(x, shape)


def _axes(node, a, given, what="axes"):
    """Axes from the input (opset 13 on) or the attribute (before): both
    arrive here by name."""
    if given is None:
        return list(a.get("axes", []))
    if isinstance(given, (list, tuple)):
        return [int(v) for v in given]
    return [int(v) for v in _static(given, node, what)]


def _unsqueeze(node, x, axes=None, **a):
    out = x
    rank = x.ndim + len(_axes(node, a, axes))
    for ax in sorted(v % rank for v in _axes(node, a, axes)):
        out = _lib(x).expand_dims(out, ax)
    return out


def _squeeze(node, x, axes=None, **a):
    ax = _axes(node, a, axes)
    return _lib(x).squeeze(x, axis=tuple(v % x.ndim for v in ax) if ax else None)


def _slice(node, x, starts, ends, axes=None, steps=None):
    starts = _static(starts, node, "starts")
    ends = _static(ends, node, "ends")
    axes = range(len(starts)) if axes is None else _static(axes, node, "axes")
    steps = [1] * len(starts) if steps is None else _static(steps, node, "steps")
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        size = x.shape[int(ax)]
        s, e, st = int(s), int(e), int(st)
        # clamp as ONNX does: INT64_MAX-style ends mean "to the end"
        s = max(-size, min(size, s)) if st > 0 else max(-size - 1, min(size - 1, s))
        e = max(-size, min(size, e)) if st > 0 else max(-size - 1, min(size, e))
        index[int(ax) % x.ndim] = slice(s, None if (st < 0 and e < -size) else e, st)
    return x[tuple(index)]


def _gather(node, x, idx, axis=0):
    if isinstance(idx, (np.ndarray, np.generic)):
        idx = np.asarray(idx)
        idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return _lib(x, idx).take(x, idx, axis=axis)


def _concat(node, *xs, axis):
    return _lib(*xs).concatenate(xs, axis=axis)


def _split(node, x, split=None, axis=0, num_outputs=None, **a):
    sizes = _static(split, node, "split") if split is not None else a.get("split")
    if sizes is None:
        parts = num_outputs or len(node.output)
        step = -(-x.shape[axis] // parts)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(parts)]
    cuts = np.cumsum(sizes)[:-1]
    return tuple(_lib(x).split(x, cuts, axis=axis))


def _clip(node, x, lo=None, hi=None, **a):
    lo = a.get("min") if lo is None else lo
    hi = a.get("max") if hi is None else hi
    return _lib(x).clip(x, lo, hi)


def _reduce(name):
    def reduce(node, x, axes=None, keepdims=1, noop_with_empty_axes=0, **a):
        ax = _axes(node, a, axes)
        if not ax and noop_with_empty_axes:
            return x
        f = getattr(_lib(x), name)
        return f(x, axis=tuple(ax) if ax else None, keepdims=bool(keepdims))
    return reduce


def _softmax(kind):
    def softmax(node, x, axis=-1):
        import jax
        f = jax.nn.softmax if kind == "softmax" else jax.nn.log_softmax
        return f(x, axis=axis)
    return softmax


def _cast(node, x, to, **a):
    return x.astype(_np_dtype(to, f"node {node.name!r} (Cast)"))


def _constant(node, **a):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in a:
            return np.asarray(a[key])
    raise UnsupportedOnnx(f"node {node.name!r} (Constant): {sorted(a)} is not supported")


def _constant_of_shape(node, shape, value=None):
    shape = [int(s) for s in _static(shape, node, "shape")]
    fill = np.asarray(value).reshape(-1)[0] if value is not None else np.float32(0)
    return np.full(shape, fill, dtype=np.asarray(fill).dtype)


def _expand(node, x, shape):
    shape = [int(s) for s in _static(shape, node, "shape")]
    target = np.broadcast_shapes(tuple(x.shape), tuple(shape))
    return _lib(x).broadcast_to(x, target)


def _where(node, c, a, b):
    return _lib(c, a, b).where(c, a, b)


def _pad(node, x, pads, value=None, axes=None, mode="constant"):
    if mode != "constant":
        raise UnsupportedOnnx(f"node {node.name!r} (Pad): mode {mode!r} is not supported")
    p = [int(v) for v in _static(pads, node, "pads")]
    n = len(p) // 2
    ax = range(x.ndim) if axes is None else [int(a) % x.ndim for a in _static(axes, node, "axes")]
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(ax):
        width[a] = (p[i], p[i + n])
    fill = 0 if value is None else np.asarray(value).reshape(-1)[0]
    return _lib(x).pad(x, width, constant_values=fill)


def _range(node, start, limit, delta):
    return np.arange(_static(start, node, "start"), _static(limit, node, "limit"),
                     _static(delta, node, "delta"))


def _unary(f):
    return lambda node, x: f(_lib(x), x)


def _binary(f):
    return lambda node, a, b: f(a, b)


def _sigmoid(node, x):
    import jax
    return jax.nn.sigmoid(x)


def _erf(node, x):
    import jax
    return jax.scipy.special.erf(x)


def _gelu(node, x, approximate="none"):
    import jax
    return jax.nn.gelu(x, approximate=approximate == "tanh")


OPS = {
    "Conv": _conv,
    "Gemm": _gemm,
    "MatMul": lambda node, a, b: a @ b,
    "Add": _binary(lambda a, b: a + b),
    "Sub": _binary(lambda a, b: a - b),
    "Mul": _binary(lambda a, b: a * b),
    "Div": lambda node, a, b: a // b if np.issubdtype(a.dtype, np.integer) else a / b,
    "Pow": _binary(lambda a, b: a ** b),
    "Equal": lambda node, a, b: _lib(a, b).equal(a, b),
    "Less": lambda node, a, b: _lib(a, b).less(a, b),
    "Greater": lambda node, a, b: _lib(a, b).greater(a, b),
    "Not": _unary(lambda m, x: m.logical_not(x)),
    "Where": _where,
    "Relu": _unary(lambda m, x: m.maximum(x, 0)),
    "LeakyRelu": lambda node, x, alpha=0.01: _lib(x).where(x >= 0, x, alpha * x),
    "Sigmoid": _sigmoid,
    "HardSigmoid": lambda node, x, alpha=0.2, beta=0.5: _lib(x).clip(alpha * x + beta, 0, 1),
    "HardSwish": lambda node, x: x * _lib(x).clip(x / 6 + 0.5, 0, 1),
    "Tanh": _unary(lambda m, x: m.tanh(x)),
    "Erf": _erf,
    "Gelu": _gelu,
    "Exp": _unary(lambda m, x: m.exp(x)),
    "Log": _unary(lambda m, x: m.log(x)),
    "Sqrt": _unary(lambda m, x: m.sqrt(x)),
    "Neg": _unary(lambda m, x: -x),
    "Abs": _unary(lambda m, x: m.abs(x)),
    "Clip": _clip,
    "Softmax": _softmax("softmax"),
    "LogSoftmax": _softmax("log_softmax"),
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "MaxPool": lambda node, x, **a: _pool(node, x, "max", **a),
    "AveragePool": lambda node, x, **a: _pool(node, x, "avg", **a),
    "GlobalAveragePool": lambda node, x: x.mean(axis=tuple(range(2, x.ndim)), keepdims=True),
    "GlobalMaxPool": lambda node, x: x.max(axis=tuple(range(2, x.ndim)), keepdims=True),
    "Flatten": lambda node, x, axis=1: _lib(x).reshape(
        x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))),
    "Reshape": _reshape,
    "Transpose": lambda node, x, perm=None: _lib(x).transpose(x, perm),
    "Concat": _concat,
    "Split": _split,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Slice": _slice,
    "Gather": _gather,
    "Shape": lambda node, x, start=0, end=None: np.asarray(x.shape[start:end], np.int64),
    "Cast": _cast,
    "Identity": lambda node, x: x,
    "Dropout": lambda node, x, *rest, **a: x,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Range": _range,
    "Pad": _pad,
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
}


def _check_supported(node):
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOnnx(f"node {node.name!r}: op {node.domain}.{node.op_type} is not an "
                              f"ONNX standard op")
    if node.op_type not in OPS:
        raise UnsupportedOnnx(
            f"node {node.name!r}: ONNX op {node.op_type} is not supported by export_onnx "
            f"(supported: {', '.join(sorted(OPS))}); export the model without it, or export "
            f"it from its framework (export_torch, export_keras, export_jax)")


def _run_graph(graph, values):
    """Evaluates graph's nodes in order over values (name -> array)."""
    for node in graph.node:
        _check_supported(node)
        lower = OPS[node.op_type]
        args = [values[i] if i else None for i in node.input]
        while args and args[-1] is None:
            args.pop()
        out = lower(node, *args, **_attrs(node))
        outs = out if isinstance(out, tuple) else (out,)
        for name, v in zip(node.output, outs):
            if name:
                values[name] = v
    return values


def _weight_name(name, taken):
    clean = re.sub(r"[^A-Za-z0-9_.]", "_", name).strip(".") or "w"
    base, k = clean, 1
    while clean in taken:
        clean = f"{base}_{k}"
        k += 1
    taken.add(clean)
    return clean


def _stored_transposed(graph, weights):
    """The weights whose every use is as a Gemm's B with transB=1: stored
    [K, N] rather than [N, K], and transposed back in the trace, where XLA
    cancels the two transpositions. (torch_export.py's _transposed_linear
    measures why.)"""
    onnx = _onnx()
    as_b = {}
    for node in graph.node:
        trans_b = any(a.name == "transB" and onnx.helper.get_attribute_value(a) == 1
                      for a in node.attribute)
        for k, name in enumerate(node.input):
            if name in weights:
                ok = node.op_type == "Gemm" and k == 1 and trans_b
                as_b[name] = as_b.get(name, True) and ok
    return {name for name, ok in as_b.items() if ok and weights[name].ndim == 2}


def export_onnx(model, out_dir, *, name: str, batch_sizes: Sequence[int],
                input_names: Optional[Sequence[str]] = None,
                output_names: Optional[Sequence[str]] = None,
                example_inputs: Optional[Sequence[Any]] = None, **export_jax_options) -> Path:
    """Exports an ONNX model (path or ModelProto) as the bundle out_dir/name/;
    returns its path. See the module's documentation."""
    onnx = _onnx()
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    graph = proto.graph
    for node in graph.node:  # refuse before tracing anything
        _check_supported(node)
    floats, constants, taken = {}, {}, set()
    for init in graph.initializer:
        arr = onnx.numpy_helper.to_array(init)
        if np.issubdtype(arr.dtype, np.floating):
            floats[init.name] = arr
        else:
            constants[init.name] = arr
    transposed = _stored_transposed(graph, floats)
    weights = {}
    for init_name, arr in floats.items():
        if init_name in transposed:
            weights[init_name] = (_weight_name(init_name + "_t", taken),
                                  np.ascontiguousarray(arr.T))
        else:
            weights[init_name] = (_weight_name(init_name, taken), arr)
    graph_inputs = [i for i in graph.input if i.name not in weights and i.name not in constants]
    if example_inputs is None:
        example_inputs = []
        for i in graph_inputs:
            t = i.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            open_axes = [k for k, d in enumerate(dims[1:], 1) if d is None]
            if open_axes:
                raise UnsupportedOnnx(
                    f"input {i.name!r} has shape {dims}, open at axis {open_axes[0]}: give "
                    f"example_inputs at the shape to compile (and variants= for more)")
            example_inputs.append(np.zeros([1] + dims[1:], _np_dtype(t.elem_type, i.name)))
    # JAX computes without 64-bit types: 64-bit inputs (token ids) are 32-bit ones
    example_inputs = [np.asarray(x) for x in example_inputs]
    example_inputs = [x.astype(np.int32) if x.dtype == np.int64 else
                      x.astype(np.float32) if x.dtype == np.float64 else x
                      for x in example_inputs]
    if len(example_inputs) != len(graph_inputs):
        raise ValueError(f"{len(example_inputs)} example inputs for the graph's "
                         f"{len(graph_inputs)} inputs")
    params = {clean: arr for clean, arr in weights.values()}
    graph_output_names = [o.name for o in graph.output]

    def forward(p, *inputs):
        values = dict(constants)
        values.update({name: p[clean].T if name in transposed else p[clean]
                       for name, (clean, _) in weights.items()})
        values.update({i.name: x for i, x in zip(graph_inputs, inputs)})
        _run_graph(graph, values)
        outs = tuple(_jnp().asarray(values[o]) for o in graph_output_names)
        return outs if len(outs) > 1 else outs[0]

    return export_jax(forward, params, example_inputs, out_dir, name=name,
                      batch_sizes=batch_sizes,
                      input_names=list(input_names or [i.name for i in graph_inputs]),
                      output_names=list(output_names or graph_output_names),
                      **export_jax_options)
