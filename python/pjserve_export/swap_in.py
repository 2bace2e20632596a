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
   most evenly (least sum of squared stage bytes). ``"auto"`` splits into up
   to 32 fine segments that way, measures the host-to-device bandwidth and
   each segment's execution time on jax's default device, and groups the
   segments into the stages that minimize the modelled cold latency
   (`plan_stages`).

The exporter then writes the weights sorted by stage (so each stage's new
weights are one contiguous block of argument_order), exports each stage as a
module, and checks that the chained stages compute what ``fn`` computes.
"""

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from . import bundle as B
from . import dtypes

# The modelled costs (seconds) of one host-to-device copy and of one module
# execution, beyond what the bytes and the computation take: what a stage
# adds to a cold execution even when nothing is left to overlap.
COPY_OVERHEAD_S = 20e-6
LAUNCH_OVERHEAD_S = 30e-6
# "auto" times the model in at most this many segments.
AUTO_SEGMENTS_MAX = 32
# Repetitions of each measurement ("auto"): the best copy, the median run.
COPY_REPEATS = 3
RUN_REPEATS = 5


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
        bound = op.prim.get_bind_params(op.params)
        # jax up to 0.8 returns (subfunctions, params); later ones the params alone
        subfuns, params = ((), bound) if isinstance(bound, dict) else bound
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


# ---- the "auto" plan -------------------------------------------------------

@dataclass
class StagePlan:
    ends: List[int]                 # per stage: the segment it ends before (the last: M)
    latency_s: float                # the modelled cold latency of this plan
    by_stages: Dict[int, float]     # the best modelled latency for each stage count


def plan_stages(segment_bytes: Sequence[float], segment_s: Sequence[float],
                bandwidth: float, copy_overhead_s: float = COPY_OVERHEAD_S,
                launch_overhead_s: float = LAUNCH_OVERHEAD_S,
                max_stages: int = B.SWAP_IN_STAGES_MAX) -> StagePlan:
    """Groups M segments (bytes each copies first, seconds each computes)
    into the stages with the least modelled cold latency.

    Copies run back to back: stage k's copy ends at
    X_k = (bytes of stages 0..k) / bandwidth + (k + 1) * copy_overhead_s.
    Stage k computes once its copy and stage k-1 are done:
    C_k = max(X_k, C_{k-1}) + (its segments' seconds) + launch_overhead_s.
    The plan minimizes C of the last stage over every grouping of 1 to
    max_stages stages (the fewer stages on a tie). Since C_k grows with
    C_{k-1}, the best plan ending stage k at segment j extends the best one
    ending stage k-1 somewhere before j: a DP over (segment end, stage count)."""
    nb = np.asarray(segment_bytes, np.float64)
    ns = np.asarray(segment_s, np.float64)
    m = len(nb)
    if m == 0 or len(ns) != m:
        raise ValueError("plan_stages needs as many segment times as segment sizes, at least one")
    prefix_b = np.concatenate([[0.0], np.cumsum(nb)])
    prefix_s = np.concatenate([[0.0], np.cumsum(ns)])
    inf = float("inf")
    # best[k][j]: least C_k with stage k ending before segment j; how[k][j]: its start
    best = [[inf] * (m + 1) for _ in range(min(m, max_stages))]
    how = [[-1] * (m + 1) for _ in range(min(m, max_stages))]
    for k in range(len(best)):
        for j in range(k + 1, m + 1):
            x = prefix_b[j] / bandwidth + (k + 1) * copy_overhead_s
            starts = [0] if k == 0 else range(k, j)
            for i in starts:
                before = 0.0 if k == 0 else best[k - 1][i]
                c = max(x, before) + (prefix_s[j] - prefix_s[i]) + launch_overhead_s
                if c < best[k][j]:
                    best[k][j], how[k][j] = c, i
    by_stages = {k + 1: float(best[k][m]) for k in range(len(best))}
    k = min(by_stages, key=lambda s: (by_stages[s], s)) - 1
    ends, j = [], m
    while k >= 0:
        ends.append(j)
        j = how[k][j]
        k -= 1
    return StagePlan(sorted(ends), by_stages[len(ends)], by_stages)


def _copier(x: np.ndarray) -> Callable[[], Any]:
    """A function copying `x` to jax's default device: from pinned host
    memory where the device has it (as the server copies, from its page-locked
    floors), else from `x` itself."""
    dev = jax.devices()[0]
    try:
        host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
        pinned = jax.device_put(x, host)
        jax.block_until_ready(pinned)
        target = jax.sharding.SingleDeviceSharding(dev, memory_kind="device")
        jax.block_until_ready(jax.device_put(pinned, target))
        return lambda: jax.device_put(pinned, target)
    except Exception:   # no memory kinds (the CPU), or no pinned host memory
        return lambda: jax.device_put(x, dev)


def _best_time(f: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f())
        best = min(best, time.perf_counter() - t0)
    return best


def _measure_bandwidth(arrays: Sequence[np.ndarray]) -> float:
    """Bytes per second of copying the weights to jax's default device as
    one block, as the server copies a stage's weights: the best of
    COPY_REPEATS copies of the whole block less the best of as many copies
    of one byte (the fixed cost of a copy is COPY_OVERHEAD_S's part)."""
    block = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                            for a in arrays] + [np.zeros(1, np.uint8)])
    seconds = _best_time(_copier(block), COPY_REPEATS) - \
        _best_time(_copier(np.zeros(1, np.uint8)), COPY_REPEATS)
    return block.nbytes / seconds if seconds > 0 else float("inf")


def _median_time(f: Callable[[], Any], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f())
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def _measure_segments(p: Program, segments: Sequence["Stage"], weights: Sequence[np.ndarray],
                      inputs: Sequence[np.ndarray]) -> List[float]:
    """Seconds each segment takes on jax's default device at the batch size
    of `inputs`: the median of RUN_REPEATS runs after a warm-up run, less the
    median of as many runs of a trivial computation (the cost of calling and
    waiting, which LAUNCH_OVERHEAD_S models for the server)."""
    values = {p.n_weights + i: jax.device_put(x) for i, x in enumerate(inputs)}
    dev_weights = jax.device_put(list(weights))
    one = jax.device_put(np.zeros((), np.float32))
    trivial = jax.jit(lambda x: x + 1)
    jax.block_until_ready(trivial(one))
    baseline = _median_time(lambda: trivial(one), RUN_REPEATS)
    times = []
    for s in segments:
        seg = jax.jit(stage_function(p, s.lo, s.hi, s.weights, s.ins, s.outs))
        args = ([dev_weights[w] for w in s.weights], *(values[v] for v in s.ins))
        out = jax.block_until_ready(seg(*args))
        times.append(max(0.0, _median_time(lambda: seg(*args), RUN_REPEATS) - baseline))
        values.update(zip(s.outs, out))
    return times


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


def choose_cuts_auto(p: Program, live: Liveness, kinds: List[Optional[Carry]],
                     weights: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> List[int]:
    """The cuts of the plan with the least modelled cold latency on jax's
    default device ([] when one stage is best)."""
    weight_bytes = [a.nbytes for a in weights]
    fine = choose_cuts(p, live, kinds, weight_bytes, AUTO_SEGMENTS_MAX)
    if not fine:
        return []
    segs = stages_at_cuts(p, live, fine)
    seg_bytes = [0] * len(segs)
    for w, k in enumerate(stage_of_weights(p.n_weights, segs)):
        seg_bytes[k] += weight_bytes[w]
    bandwidth = _measure_bandwidth(weights)
    seg_s = _measure_segments(p, segs, weights, inputs)
    plan = plan_stages(seg_bytes, seg_s, bandwidth)
    return [fine[j - 1] for j in plan.ends[:-1]]


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
    """Splits fn(params, *inputs) into at most `stages` stages (an int, or
    "auto"), checks that the chained stages compute what fn does, and returns
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
    if stages == "auto":
        cuts = choose_cuts_auto(p0, live, kinds, weight_arrays, examples)
    else:
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
