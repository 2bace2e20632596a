"""PyTorch modules to pjserve bundles, through torchax and jax.export.

    export_torch(module, example_inputs, out_dir, *, name, batch_sizes,
                 input_names, output_names, **export_jax_options) -> Path

torchax runs a module's forward on tensors backed by JAX arrays, so the
forward becomes a JAX-traceable function of the module's state and inputs
(torchax.extract_jax). export_jax then does what it does for any JAX
function: one trace and one StableHLO module per compiled batch size, the
weights as module arguments written once. So:

- the weights are the module's parameters and buffers, named as in
  module.state_dict() ("layer1.0.conv1.weight", "bn1.running_mean") and
  passed in the order of those names, sorted: the same for every export of
  the same architecture; but an nn.Linear keeps its weight transposed,
  [in, out], as "fc.weight_t" (_transposed_linear: XLA's CPU backend
  multiplies 2 or more rows by a [out, in] weight 3 to 15 times slower);
- each batch size is its own trace of forward, so a forward that reshapes by
  its input's batch size is exported correctly at every size (a single
  torch.export graph would have to be exported with a symbolic batch
  dimension for that);
- the module runs in eval mode (batch norm from its running statistics, no
  dropout) and without gradients; export_torch puts it there and leaves it so,
  its parameters and buffers as they were (tied weights included), so it
  still runs in PyTorch afterwards;
- depthwise convolutions (MobileNet, EfficientNet, ConvNeXt) are traced as
  sums of kernel-tap products and 1x1 convolutions as matrix products, which
  XLA's CPU backend runs several times faster than the convolutions (same
  weights, rounding differences; _convolution_rewrites);
- while it is traced, torch.compiler.is_compiling() answers True, as under
  torch.compile: libraries that skip work by looking at a tensor's values
  when not compiling take their traceable path instead (transformers'
  encoders test whether an attention mask is all ones before building it,
  which a trace cannot answer).

forward may return one tensor, a tuple or list of them (output_names name
them in order), or a mapping such as a transformers ModelOutput (output_names
pick its entries by key). Inputs are numpy arrays or CPU tensors with a
leading batch axis of any size; only their per-example shapes and dtypes are
used. 64-bit integers become 32-bit ones, as JAX computes without x64: give
token ids as int32 (torch's embeddings accept them).

torch, torchax and friends are heavy, so they live in their own environment
(.venv-torch, made by scripts/bootstrap); importing this module elsewhere
fails with a message that says so.
"""

import contextlib
from typing import Any, Mapping, Sequence

import numpy as np

from .jax_export import export_jax

_MISSING = ("export_torch needs torch and torchax, which live in .venv-torch "
            "(scripts/bootstrap makes it): run .venv-torch/bin/python")


def _modules():
    try:
        import torch
        import torchax
    except ImportError as e:
        raise ImportError(f"{_MISSING} ({e})") from e
    return torch, torchax


def _as_numpy(x) -> np.ndarray:
    torch, _ = _modules()
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype == np.int64:
        a = a.astype(np.int32)
    elif a.dtype == np.uint64:
        a = a.astype(np.uint32)
    return a


def _refuse_parametrized(module):
    """Weights computed by torch.nn.utils.parametrize (weight_norm,
    spectral_norm, orthogonal) cannot be traced: tracing swaps tensors into
    the module, and assigning a parametrized weight calls set_, which torchax
    has no lowering for. Refused by name, with the remedy."""
    from torch.nn.utils import parametrize
    found = [f"{name}.{t}" if name else t for name, m in module.named_modules()
             if parametrize.is_parametrized(m) for t in m.parametrizations.keys()]
    if found:
        raise ValueError(
            f"module has parametrized weights ({', '.join(found[:4])}"
            f"{', ...' if len(found) > 4 else ''}: weight_norm, spectral_norm or another "
            f"torch.nn.utils.parametrize parametrization), which export_torch cannot trace; "
            f"remove them first, keeping the weights they compute: "
            f"torch.nn.utils.parametrize.remove_parametrizations(submodule, name, "
            f"leave_parametrized=True) for each")


@contextlib.contextmanager
def _module_kept(module):
    """The module's parameters and buffers as they were, after the export:
    tracing swaps JAX-backed tensors in by name, and a weight shared under
    two names (tied embeddings, as T5's) came back swapped under one."""
    entries = [(m, table, name, t) for m in module.modules()
               for table in (m._parameters, m._buffers) for name, t in table.items()]
    data = {id(t): (t, t.data) for _, _, _, t in entries if t is not None}
    try:
        yield
    finally:
        for _, table, name, t in entries:
            if table.get(name) is not t:
                table[name] = t
        for t, d in data.values():
            if type(t.data) is not type(d):
                t.data = d


def _convolution_rewrites(torch):
    """Two kinds of Conv2d that XLA's CPU backend runs several times slower
    as convolutions than as the same arithmetic written otherwise (same
    weights, answers that differ by rounding only: another summation
    order). Returns rewrite(conv) -> a module holding the conv's own
    Parameters, or None for a conv left as it is.

    - Depthwise (groups == in_channels == out_channels > 1): a sum of
      kernel-tap products, each tap a slice of the padded input (of one of
      its phases, for a strided conv) times that tap's per-channel weight,
      which XLA fuses into one loop
      (a 3x3 one over 64 channels at 160x224: 69 ms as a grouped
      convolution, 2.8 ms so).
    - Pointwise (1x1 kernel, one group, no padding): a matrix product of the
      weights and the input's channels, strided first if the conv is (16 to
      64 channels at 160x224: 2.3 ms as a convolution, 0.9 so; ResNet's
      bottlenecks and MobileNet's expansions are mostly these)."""
    F = torch.nn.functional

    class DepthwiseTaps(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.weight, self.bias = conv.weight, conv.bias  # the same Parameters
            self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation

        def forward(self, x):
            kh, kw = self.weight.shape[-2:]
            (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
            x = F.pad(x, (pw, pw, ph, ph))
            rows = (x.shape[-2] - dh * (kh - 1) - 1) // sh + 1
            cols = (x.shape[-1] - dw * (kw - 1) - 1) // sw + 1
            # A strided conv reads its input as sh x sw phases (every sh-th
            # row from row a, every sw-th column from column b), each laid
            # out contiguously once: its taps are then plain slices, which
            # XLA reads faster than strided ones (a 3x3 with stride 2 over
            # 64 channels at 160x224: 4.1 -> 2.6 ms).
            high = sh * ((kh - 1) * dh // sh + rows)
            wide = sw * ((kw - 1) * dw // sw + cols)
            x = F.pad(x, (0, max(0, wide - x.shape[-1]), 0, max(0, high - x.shape[-2])))
            n, c = x.shape[:2]
            phases = x[:, :, :high, :wide].reshape(n, c, high // sh, sh, wide // sw, sw) \
                .permute(0, 1, 3, 5, 2, 4)
            out = None
            for i in range(kh):
                for j in range(kw):
                    (y0, a), (x0, b) = divmod(i * dh, sh), divmod(j * dw, sw)
                    tap = phases[:, :, a, b, y0:y0 + rows, x0:x0 + cols]
                    term = tap * self.weight[:, 0, i, j][None, :, None, None]
                    out = term if out is None else out + term
            if self.bias is not None:
                out = out + self.bias[None, :, None, None]
            return out

    class PointwiseMatmul(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.weight, self.bias = conv.weight, conv.bias
            self.stride = conv.stride

        def forward(self, x):
            sh, sw = self.stride
            if (sh, sw) != (1, 1):
                x = x[:, :, ::sh, ::sw]
            n, c, h, w = x.shape
            out = torch.matmul(self.weight[:, :, 0, 0], x.reshape(n, c, h * w))
            if self.bias is not None:
                out = out + self.bias[None, :, None]
            return out.reshape(n, -1, h, w)

    def rewrite(conv):
        if type(conv) is not torch.nn.Conv2d or conv.padding_mode != "zeros" \
                or isinstance(conv.padding, str):
            return None
        if conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels:
            return DepthwiseTaps(conv)
        if conv.groups == 1 and tuple(conv.kernel_size) == (1, 1) \
                and tuple(conv.padding) == (0, 0):
            return PointwiseMatmul(conv)
        return None

    return rewrite


def _transposed_linear(torch, module):
    """rewrite(child) -> an nn.Linear of module as a module holding its weight
    transposed (weight_t, [in, out]; `weight` still reads [out, in]), or None.

    XLA's CPU backend runs x @ W.T, the product nn.Linear traces to, at its
    speed for one row only: from 2 rows on, against the same weight stored
    [in, out], it measured 13x slower (a 768-3072-768 MLP at batch 2: 6.6
    against 0.49 ms), 6.6x at batch 8, 2.9x at 32, 2.5x over 128 tokens,
    and the same at batch 1. Left as they are: subclasses of nn.Linear
    (their owners may read the weight directly, as MultiheadAttention does
    its out_proj's) and a weight tied to another parameter (a language
    model's head and its embedding), which a transposed copy would store
    twice."""
    counts = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1

    class TransposedLinear(torch.nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.weight_t = torch.nn.Parameter(linear.weight.detach().t().contiguous(),
                                               requires_grad=False)
            self.bias = linear.bias
            self.in_features, self.out_features = linear.in_features, linear.out_features

        def __getattr__(self, name):
            # `weight` for code that reads it (T5 checks its dtype); not an
            # attribute torchax would collect as a tensor of the module
            if name == "weight":
                return self.weight_t.t()
            return super().__getattr__(name)

        def forward(self, x):
            out = x @ self.weight_t
            return out if self.bias is None else out + self.bias

    def rewrite(linear):
        if type(linear) is not torch.nn.Linear or counts[id(linear.weight)] > 1:
            return None
        return TransposedLinear(linear)

    return rewrite


def replace_submodules(module, rewrite):
    """Puts rewrite(child) in place of every submodule of module (below it)
    for which it is not None; returns [(parent, name, child replaced)]."""
    swapped = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            replacement = rewrite(child)
            if replacement is not None:
                swapped.append((parent, name, child))
                setattr(parent, name, replacement)
    return swapped


@contextlib.contextmanager
def _rewritten(torch, module):
    """Within, every Conv2d of module that _convolution_rewrites rewrites is
    its rewrite, holding the same weights under the same names, and every
    nn.Linear that _transposed_linear rewrites is its rewrite; afterwards
    the module is as it was."""
    convolution, linear = _convolution_rewrites(torch), _transposed_linear(torch, module)
    swapped = replace_submodules(module, lambda m: convolution(m) or linear(m))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


@contextlib.contextmanager
def _compiling(torch):
    """torch.compiler.is_compiling() answers True within (see the module's
    docstring)."""
    saved = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = saved


def pick_outputs(result: Any, output_names: Sequence[str]):
    """forward's result as a tuple in output_names order: a mapping by key, a
    sequence by position, a single array as the only output."""
    if isinstance(result, Mapping) or (hasattr(result, "keys") and hasattr(result, "__getitem__")):
        missing = [n for n in output_names if n not in result.keys()]
        if missing:
            raise ValueError(f"forward returned the entries {sorted(result.keys())}; "
                             f"output_names asks for {missing}")
        return tuple(result[n] for n in output_names)
    if isinstance(result, (tuple, list)):
        if len(result) != len(output_names):
            raise ValueError(f"forward returned {len(result)} outputs; output_names names "
                             f"{len(output_names)}")
        return tuple(result)
    if len(output_names) != 1:
        raise ValueError(f"forward returned one output; output_names names {len(output_names)}")
    return (result,)


def export_torch(module, example_inputs: Sequence[Any], out_dir, *, name: str,
                 batch_sizes: Sequence[int], input_names: Sequence[str],
                 output_names: Sequence[str], **options):
    """Exports module.forward(*inputs) as the bundle out_dir/name/; returns its
    path. options are export_jax's (description, residency, input_formats,
    variants, target_stablehlo_version, ...)."""
    torch, torchax = _modules()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    module.eval()
    _refuse_parametrized(module)
    options.setdefault("description", f"{type(module).__name__} exported from PyTorch "
                                      f"{torch.__version__} with torchax {torchax.__version__}")
    with _module_kept(module), _rewritten(torch, module), _compiling(torch):
        with torch.no_grad():
            states, forward = torchax.extract_jax(module)

        def fn(params, *inputs):
            return pick_outputs(forward(params, inputs), output_names)

        try:
            return export_jax(fn, dict(states), [_as_numpy(x) for x in example_inputs],
                              out_dir, name=name, batch_sizes=batch_sizes,
                              input_names=input_names, output_names=output_names, **options)
        except torchax.tensor.OperatorNotFound as e:
            raise NotImplementedError(
                f"{e}: forward uses a PyTorch operation that torchax "
                f"{torchax.__version__} cannot translate to JAX; rewrite that part of the "
                f"module with operations it has (torchax's jaten.py lists them), or export "
                f"the module to ONNX and use export_onnx") from e


def torch_reference(module, inputs: Sequence[Any], output_names: Sequence[str]):
    """The module's own answer in eager PyTorch, as numpy arrays in
    output_names order (integer inputs as the exported model takes them)."""
    torch, _ = _modules()
    module.eval()
    with torch.no_grad():
        args = [torch.from_numpy(np.ascontiguousarray(_as_numpy(x))) for x in inputs]
        result = module(*args)
    return tuple(t.detach().cpu().numpy() for t in pick_outputs(result, output_names))
