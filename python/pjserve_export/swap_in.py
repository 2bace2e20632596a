"""Swap-in stages: a model split into modules that run one after another.

A model whose weights live in host memory has them copied to the device
before a cold execution. With its modules split into K stages, the server
copies stage k+1's weights while stage k executes, so the copy of all but the
first stage's weights hides behind computation. The stage modules are used
only for a model's first execution after its weights were copied; warm
executions run the whole-model modules (docs/bundle-format.md, *Swap-in
stages*).

How a model is split:

1. ``fn(params, *inputs)`` is traced to a jaxpr at every batch size (and at
   one more, max(batch_sizes) + 1, to tell which values have the batch axis
   first). Calls of jitted functions at the top level are inlined, so a
   function made of jitted layers still has cut points between them. The
   result is a flat list of operations over numbered values (`Program`);
   traces at different batch sizes must have the same operations.
2. A *cut* c splits the operations into [.., c) and [c, ..). It is valid
   when every value carried across it (a model input or a value computed
   before c that an operation from c on uses, or that is a model output) has
   a dtype bundles know, at most 8 extents, and either a fixed shape or the
   batch axis first. Weights are never carried (each stage takes the weights
   it uses), nor are constants (each stage that uses one embeds it).
3. A weight's *stage* is the first stage that uses it; an unused weight
   belongs to the last. The best cuts lie just before a weight's first use:
   moving a cut later over operations that use no new weight only adds
   computation to the earlier stage, which overlaps the next stage's copy.
   So the candidates are, for each amount of weight bytes first used before
   a cut, the latest valid cut with that amount.
4. ``swap_in_stages=K`` picks K-1 candidates that split the weight bytes
   most evenly (least sum of squared stage bytes).

The exporter then writes the weights sorted by stage (so each stage's new
weights are one contiguous block of argument_order), exports each stage as a
module, and checks that the chained stages compute what ``fn`` computes.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from . import bundle as B
from . import dtypes

def _jit_primitive():
    from jax.extend.core import primitives
    return getattr(primitives, "jit_p", None) or getattr(primitives, "pjit_p")


# ---- the traced program ----------------------------------------------------

@dataclass
class Op:
    prim: Any
    params: Dict[str, Any]
    ctx: Any                 # the equation's context (its bind-time settings)
    ins: Tuple[int, ...]     # value ids
    outs: Tuple[int, ...]


@dataclass
class Program:
    """fn as a flat list of operations. Values are numbered: 0..n_weights-1
    the weights (in params' flattening order), then the inputs, then
    constants and operation results as met."""
    n_weights: int
    n_inputs: int
    ops: List[Op] = field(default_factory=list)
    outputs: List[int] = field(default_factory=list)
    consts: Dict[int, Any] = field(default_factory=dict)   # value id -> constant
    avals: List[Any] = field(default_factory=list)         # value id -> jax aval

    def is_weight(self, v: int) -> bool:
        return v < self.n_weights

    def structure(self):
        return ([(op.prim, op.ins, op.outs) for op in self.ops], self.outputs,
                sorted(self.consts), len(self.avals))


class _Builder:
    def __init__(self, program: Program):
        self.p = program
        self.jit_p = _jit_primitive()

    def new(self, aval) -> int:
        self.p.avals.append(aval)
        return len(self.p.avals) - 1

    def const(self, aval, value) -> int:
        v = self.new(aval)
        self.p.consts[v] = value
        return v

    def walk(self, jaxpr, consts, args: Sequence[int]) -> List[int]:
        from jax.extend.core import Literal
        from jax._src.core import DropVar
        env = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.const(var.aval, c)
        for var, v in zip(jaxpr.invars, args):
            env[var] = v

        def read(atom):
            if isinstance(atom, Literal):
                return self.const(atom.aval, atom.val)
            return env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            if eqn.primitive is self.jit_p:
                inner = eqn.params["jaxpr"]
                outs = self.walk(inner.jaxpr, inner.consts, ins)
            else:
                outs = [self.new(var.aval) for var in eqn.outvars]
                self.p.ops.append(Op(eqn.primitive, dict(eqn.params), eqn.ctx, tuple(ins),
                                     tuple(outs)))
            for var, v in zip(eqn.outvars, outs):
                if not isinstance(var, DropVar):
                    env[var] = v
        return [read(a) for a in jaxpr.outvars]


def trace(fn: Callable, treedef, weight_structs: Sequence[jax.ShapeDtypeStruct],
          input_structs: Sequence[jax.ShapeDtypeStruct], n_outputs: int) -> Program:
    """fn(params, *inputs) as a Program, for params of `treedef` with leaves
    `weight_structs` and inputs `input_structs`."""
    def flat(ws, *xs):
        return fn(jax.tree_util.tree_unflatten(treedef, ws), *xs)

    closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(list(weight_structs),
                                                                *input_structs)
    leaves, tree = jax.tree_util.tree_flatten(out_shape)
    leaf = jax.tree_util.tree_structure(0)
    if tree not in (jax.tree_util.tree_structure(tuple(leaves)),
                    jax.tree_util.tree_structure(list(leaves))) and tree != leaf:
        raise ValueError(f"fn must return an array or a tuple of arrays, got the structure {tree}")
    if len(leaves) != n_outputs:
        raise ValueError(f"fn returns {len(leaves)} output(s) but output_names has {n_outputs}")
    p = Program(len(weight_structs), len(input_structs))
    b = _Builder(p)
    jaxpr = closed.jaxpr
    args = [b.new(var.aval) for var in jaxpr.invars]
    p.outputs = b.walk(jaxpr, closed.consts, args)
    return p


def evaluate(p: Program, lo: int, hi: int, values: Dict[int, Any],
             wanted: Sequence[int]) -> List[Any]:
    """Runs operations lo..hi-1 of `p` on `values` (value id -> array: the
    weights and carried values they need) and returns the `wanted` values.
    Binds each primitive with its parameters, as jax's own jaxpr evaluator
    does, so it works under jit and export as well as eagerly."""
    env = dict(p.consts)
    env.update(values)
    for op in p.ops[lo:hi]:
        subfuns, params = op.prim.get_bind_params(op.params)
        with op.ctx.manager:
            out = op.prim.bind(*subfuns, *(env[v] for v in op.ins), **params)
        if not op.prim.multiple_results:
            out = [out]
        env.update(zip(op.outs, out))
    return [env[v] for v in wanted]


# ---- where a program may be cut --------------------------------------------

@dataclass
class Carry:
    """How a carried value appears in the manifest: its dtype, and its shape
    per example (batched) or in full (fixed)."""
    dtype: str
    shape: Tuple[int, ...]
    batched: bool


def carry_kinds(progs: Dict[Optional[int], Program]) -> List[Optional[Carry]]:
    """For each value: how it could be carried, or None when it cannot (a
    batch-dependent extent other than the first, an unknown dtype, more than
    8 extents). `progs` holds the programs traced at each batch size (one
    program under None for a model without batch axis)."""
    sizes = list(progs)
    kinds: List[Optional[Carry]] = []
    for v in range(len(progs[sizes[0]].avals)):
        avals = {n: progs[n].avals[v] for n in sizes}
        kind = None
        try:
            dt = dtypes.manifest_name(np.dtype(avals[sizes[0]].dtype))
        except (TypeError, ValueError):
            dt = None
        shapes = {n: tuple(a.shape) for n, a in avals.items()}
        s0 = shapes[sizes[0]]
        if dt is not None and len(s0) <= B.MAX_RANK:
            if all(s == s0 for s in shapes.values()):
                kind = Carry(dt, s0, False)
            elif all(len(s) == len(s0) and len(s) >= 1 and s[0] == n and s[1:] == s0[1:]
                     for n, s in shapes.items()):
                kind = Carry(dt, s0[1:], True)
        kinds.append(kind)
    return kinds


@dataclass
class Liveness:
    defined: List[int]    # per value: index of the op that makes it (-1: an input)
    last_use: List[int]   # per value: index of the last op using it (len(ops): an output)


def liveness(p: Program) -> Liveness:
    nv = len(p.avals)
    defined = [-1] * nv
    last_use = [-2] * nv
    for i, op in enumerate(p.ops):
        for v in op.outs:
            defined[v] = i
        for v in op.ins:
            last_use[v] = i
    for v in p.outputs:
        last_use[v] = len(p.ops)
    return Liveness(defined, last_use)


def carried(p: Program, live: Liveness, c: int) -> List[int]:
    """The values carried across cut c, in order of definition (inputs first)."""
    return [v for v in range(p.n_weights, len(p.avals))
            if v not in p.consts and live.defined[v] < c <= live.last_use[v]]


def valid_cuts(p: Program, live: Liveness, kinds: List[Optional[Carry]]) -> List[bool]:
    """valid[c] for c in 0..len(ops): c cuts between two operations, something
    is carried across it and all of that can be."""
    e = len(p.ops)
    n_live = np.zeros(e + 2, np.int64)
    n_bad = np.zeros(e + 2, np.int64)
    for v in range(p.n_weights, len(p.avals)):
        if v in p.consts or live.last_use[v] <= live.defined[v]:
            continue
        lo, hi = live.defined[v] + 1, min(live.last_use[v], e)   # carried at lo..hi
        n_live[lo] += 1
        n_live[hi + 1] -= 1
        if kinds[v] is None:
            n_bad[lo] += 1
            n_bad[hi + 1] -= 1
    n_live, n_bad = np.cumsum(n_live), np.cumsum(n_bad)
    return [0 < c < e and n_live[c] > 0 and n_bad[c] == 0 for c in range(e + 1)]


def weight_first_use(p: Program) -> List[int]:
    """Per weight: the index of the first op using it; len(ops) for a weight
    only returned as an output, len(ops) + 1 for an unused one."""
    first = [len(p.ops) + 1] * p.n_weights
    for i, op in enumerate(p.ops):
        for v in op.ins:
            if p.is_weight(v) and first[v] > i:
                first[v] = i
    for v in p.outputs:
        if p.is_weight(v) and first[v] > len(p.ops):
            first[v] = len(p.ops)
    return first


def candidate_cuts(valid: List[bool], first_use: List[int],
                   weight_bytes: Sequence[int]) -> Tuple[List[int], List[int], int]:
    """(cuts, bytes first used before each cut, total bytes of used weights):
    for each amount strictly between nothing and everything, the latest
    valid cut before which exactly that many weight bytes are first used."""
    e = len(valid) - 1
    before = np.zeros(e + 2, np.int64)
    for f, nb in zip(first_use, weight_bytes):
        if f <= e:
            before[min(f + 1, e + 1)] += nb
    before = np.cumsum(before)          # before[c]: bytes first used by ops < c
    total = int(sum(nb for f, nb in zip(first_use, weight_bytes) if f <= e))
    best: Dict[int, int] = {}
    for c in range(1, e):
        if valid[c] and 0 < before[c] < total:
            best[int(before[c])] = c
    amounts = sorted(best)
    return [best[a] for a in amounts], amounts, total


def balanced_cuts(amounts: Sequence[int], total: int, stages: int) -> List[int]:
    """Indices of min(stages - 1, len(amounts)) of the candidate cuts whose
    stages' byte counts have the least sum of squares. `amounts` (strictly
    ascending, each in (0, total)) are the bytes before each candidate."""
    m = min(stages - 1, len(amounts))
    if m <= 0:
        return []
    a = np.asarray(amounts, np.float64)
    g = len(a)
    cost = a ** 2                      # one cut, at candidate i
    back = []
    for _ in range(1, m):
        # next[i] = min over j < i of cost[j] + (a[i] - a[j])^2
        step = cost[None, :] + (a[:, None] - a[None, :]) ** 2
        step[np.triu_indices(g)] = np.inf   # only j < i
        prev = np.argmin(step, axis=1)
        cost = step[np.arange(g), prev]
        back.append(prev)
    last = int(np.argmin(cost + (total - a) ** 2))
    picks = [last]
    for prev in reversed(back):
        picks.append(int(prev[picks[-1]]))
    return sorted(picks)


# ---- stages ------------------------------------------------------------------

def stage_weights(p: Program, lo: int, hi: int, last: bool) -> List[int]:
    """The weights operations lo..hi-1 use (the last stage: also weights that
    are model outputs), ascending."""
    used = {v for op in p.ops[lo:hi] for v in op.ins if p.is_weight(v)}
    if last:
        used |= {v for v in p.outputs if p.is_weight(v)}
    return sorted(used)


def stage_function(p: Program, lo: int, hi: int, weights: Sequence[int],
                   ins: Sequence[int], outs: Sequence[int]) -> Callable:
    """fn(weight list, *carried in) -> tuple(carried out) for ops lo..hi-1."""
    def stage(ws, *xs):
        values = dict(zip(weights, ws))
        values.update(zip(ins, xs))
        return tuple(evaluate(p, lo, hi, values, outs))
    return stage


@dataclass
class Stage:
    lo: int
    hi: int
    weights: List[int]       # weight ids (indices in params' flattening order)
    ins: List[int]           # value ids taken after the weights
    outs: List[int]          # value ids returned


def stages_at_cuts(p: Program, live: Liveness, cuts: Sequence[int]) -> List[Stage]:
    bounds = [0] + list(cuts) + [len(p.ops)]
    result = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        last = k == len(bounds) - 2
        ins = carried(p, live, lo) if k else list(range(p.n_weights, p.n_weights + p.n_inputs))
        outs = list(p.outputs) if last else carried(p, live, hi)
        result.append(Stage(lo, hi, stage_weights(p, lo, hi, last), ins, outs))
    return result


def stage_of_weights(n_weights: int, stages: Sequence[Stage]) -> List[int]:
    """Per weight: its stage, the first that takes it (the last for a weight
    no stage takes)."""
    stage_of = [len(stages) - 1] * n_weights
    for k in reversed(range(len(stages))):
        for w in stages[k].weights:
            stage_of[w] = k
    return stage_of


def weight_order(n_weights: int, stages: Sequence[Stage]) -> List[int]:
    """The weights sorted by their stage, then by params' order."""
    stage_of = stage_of_weights(n_weights, stages)
    return sorted(range(n_weights), key=lambda w: (stage_of[w], w))


def choose_cuts(p: Program, live: Liveness, kinds: List[Optional[Carry]],
                weight_bytes: Sequence[int], stages: int) -> List[int]:
    """The cuts for `stages` stages that split the weight bytes most evenly."""
    valid = valid_cuts(p, live, kinds)
    first = weight_first_use(p)
    cuts, amounts, total = candidate_cuts(valid, first, weight_bytes)
    return [cuts[i] for i in balanced_cuts(amounts, total, stages)]


def example_inputs(input_structs: Sequence[jax.ShapeDtypeStruct], seed: int = 0):
    """Deterministic random inputs of the given shapes and dtypes (floats
    standard normal, signed ints in [-5, 5], unsigned in [0, 10], bools)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in input_structs:
        dt = np.dtype(s.dtype)
        if dt == np.bool_:
            a = rng.integers(0, 2, size=s.shape).astype(np.bool_)
        elif np.issubdtype(dt, np.unsignedinteger):
            a = rng.integers(0, 11, size=s.shape).astype(dt)
        elif np.issubdtype(dt, np.integer):
            a = rng.integers(-5, 6, size=s.shape).astype(dt)
        else:
            a = rng.standard_normal(size=s.shape).astype(np.float32).astype(dt)
        out.append(a)
    return out


def _tolerance(dt: np.dtype) -> Tuple[float, float]:
    """(rtol, atol relative to the reference's largest magnitude) for
    comparing the chained stages with fn: tight for 32- and 64-bit floats;
    16-bit floats round every intermediate, so an operation's fusion with its
    neighbours (which a cut changes) shows at their precision."""
    return (1e-5, 1e-6) if np.dtype(dt).itemsize >= 4 else (1e-2, 1e-2)


def check_stages(fn: Callable, params, p: Program, stages: Sequence[Stage],
                 weights: Sequence[np.ndarray], inputs: Sequence[np.ndarray],
                 output_names: Sequence[str]) -> None:
    """Runs the stages one after another with jax on `inputs` and compares
    their results with fn's; raises ValueError naming the first output that
    differs."""
    want = jax.jit(fn)(params, *inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    values = list(inputs)
    for s in stages:
        f = jax.jit(stage_function(p, s.lo, s.hi, s.weights, s.ins, s.outs))
        values = list(f([weights[w] for w in s.weights], *values))
    for name, got, ref in zip(output_names, values, want):
        got, ref = np.asarray(got), np.asarray(ref)
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise ValueError(f"swap-in stages: output {name!r} of the chained stages is "
                             f"{got.dtype} {got.shape}, fn's is {ref.dtype} {ref.shape}")
        if np.issubdtype(ref.dtype, np.inexact):
            rtol, atol = _tolerance(ref.dtype)
            r64, g64 = ref.astype(np.float64), got.astype(np.float64)
            scale = max(1.0, float(np.max(np.abs(r64), initial=0.0)))
            ok = np.allclose(g64, r64, rtol=rtol, atol=atol * scale, equal_nan=True)
        else:
            ok = np.array_equal(got, ref)
        if not ok:
            diff = np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)), initial=0.0)
            raise ValueError(f"swap-in stages: the chained stages' output {name!r} differs from "
                             f"fn's (largest difference {diff:.3g}); the stages do not compose "
                             "to the model")


# ---- splitting a model -------------------------------------------------------

@dataclass
class Split:
    """A model split into stages: the weights' new argument order, the
    stages (their weights listed in that order) and the programs they run,
    per batch size (None: a model without batch axis)."""
    order: List[int]
    stages: List[Stage]
    programs: Dict[Optional[int], Program]
    kinds: List[Optional[Carry]]


def split_model(fn: Callable, params, weight_arrays: Sequence[np.ndarray],
                input_structs: Callable[[Optional[int]], List[jax.ShapeDtypeStruct]],
                sizes: Optional[Sequence[int]], stages, output_names: Sequence[str]
                ) -> Optional[Split]:
    """Splits fn(params, *inputs) into at most `stages` stages, checks that the chained stages compute what fn does, and returns
    the Split, or None when the model has no cut worth making (then it is
    exported whole). `input_structs(n)` gives the inputs at batch size n."""
    treedef = jax.tree_util.tree_structure(params)
    wstructs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in weight_arrays]
    traced = list(sizes) + [max(sizes) + 1] if sizes else [None]
    progs = {n: trace(fn, treedef, wstructs, input_structs(n), len(output_names))
             for n in traced}
    first = traced[0]
    shape = progs[first].structure()
    for n, p in progs.items():
        if p.structure() != shape:
            raise ValueError(f"swap_in_stages: fn traces to other operations at batch size {n} "
                             f"than at batch size {first}, so the stages cannot be cut at the "
                             "same places for every batch size")
    p0 = progs[first]
    live = liveness(p0)
    kinds = carry_kinds(progs)
    examples = example_inputs(input_structs(first))
    cuts = choose_cuts(p0, live, kinds, [a.nbytes for a in weight_arrays], stages)
    if not cuts:
        return None
    result = stages_at_cuts(p0, live, cuts)
    order = weight_order(p0.n_weights, result)
    position = {w: i for i, w in enumerate(order)}
    for s in result:
        s.weights.sort(key=position.__getitem__)
    check_stages(fn, params, p0, result, weight_arrays, examples, output_names)
    return Split(order, result, {n: progs[n] for n in (sizes or [None])}, kinds)
