"""A Triton model repository to a pjserve model repository.

    python -m pjserve_export.import_triton TRITON_REPO OUT_REPO [options]
    pjserve import-triton TRITON_REPO OUT_REPO [options]      (the same, from the binary)

Each model directory of TRITON_REPO is read through its config.pbtxt, parsed
by protobuf's text parser against Triton's ModelConfig schema (as
tritonclient ships it: tritonclient.grpc.model_config_pb2), and becomes one
bundle of OUT_REPO:

- ONNX models (platform onnxruntime_onnx or backend onnxruntime, the file
  <version>/model.onnx or default_model_filename) go through export_onnx, one
  module per compiled batch size;
- TorchScript models (platform pytorch_libtorch or backend pytorch,
  <version>/model.pt) are written as ONNX first, by torch.onnx.export's
  TorchScript-based exporter at the config's shapes, checked against
  TorchScript itself with onnxruntime on random inputs, then go the same
  way; inputs and outputs are matched to forward()'s arguments and results
  as Triton's PyTorch backend matches them (NAME__INDEX, else argument names,
  else the config's order for outputs). Scripted control flow becomes ONNX
  Loop/If, which export_onnx refuses naming the op;
- ensembles (platform ensemble) become declarative ensemble bundles (a
  manifest of steps).

Every field of a config that is set is either mapped, judged harmless and
noted, or refused: the model is then not written and the summary says why,
naming the model and the field (docs/coming-from-triton.md has the table).
Fields that change nothing about the answers but that pjserve cannot honour
(instance_group on GPUs, optimization, parameters, response_cache, ...) are
refused unless --ignore FIELD says to import without them.

Dynamic batching's queue policy (default_queue_policy's timeout and queue
size) is a per-model policy of the server's configuration file, not of the
bundle: those settings are written into OUT_REPO/pjserve.yaml (merged with
what is there), to serve with --config OUT_REPO/pjserve.yaml.

Exit status: 0 when every model was converted; 1 when any was refused (the
models that converted are written all the same); 2 for a usage error.
"""

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

CONFIG_FILE = "config.pbtxt"
POLICY_FILE = "pjserve.yaml"
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+\Z")
ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"

# Fields that change how Triton runs a model but not what it answers:
# refused by default (pjserve cannot honour them), imported without them
# with --ignore FIELD.
IGNORABLE = {
    "instance_group": "pjserve runs one execution at a time on the device its PJRT plugin "
                      "drives (serve with a GPU plugin, --pjrt-plugin, for a GPU; pjserve node "
                      "for several)",
    "optimization": "XLA compiles the whole program ahead of time; there are no execution "
                    "accelerators or graph levels to set",
    "parameters": "pjserve bundles take no backend parameters",
    "response_cache": "pjserve has no response cache: every request executes",
    "model_metrics": "pjserve's metrics are fixed (docs/observability.md)",
    "metric_tags": "pjserve's metrics carry no custom tags",
    "cc_model_filenames": "one program per model serves every device",
    "dynamic_batching.priority_levels": "pjserve has no priority levels (scheduler "
                                        "disciplines fair, fifo or edf share the device)",
}

# Triton data types -> (manifest dtype served, note when it changes)
_SERVED = {
    "TYPE_BOOL": "bool", "TYPE_UINT8": "u8", "TYPE_UINT16": "u16", "TYPE_UINT32": "u32",
    "TYPE_UINT64": "u32", "TYPE_INT8": "i8", "TYPE_INT16": "i16", "TYPE_INT32": "i32",
    "TYPE_INT64": "i32", "TYPE_FP16": "f16", "TYPE_FP32": "f32", "TYPE_FP64": "f32",
    "TYPE_BF16": "bf16",
}
_KSERVE = {"bool": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "i8": "INT8",
           "i16": "INT16", "i32": "INT32", "f16": "FP16", "f32": "FP32", "bf16": "BF16"}
# ONNX TensorProto element types -> Triton data types
_ONNX_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16",
               5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING",
               9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32",
               13: "TYPE_UINT64", 16: "TYPE_BF16"}
_CONTROL_KINDS = {"CONTROL_SEQUENCE_START": "start", "CONTROL_SEQUENCE_END": "end",
                  "CONTROL_SEQUENCE_READY": "ready", "CONTROL_SEQUENCE_CORRID": "corrid"}
MAX_QUEUE_DEPTH = 16777216
MAX_TIMEOUT_US = 86400000000
MAX_IDLE_MS = 86400000


class Refused(Exception):
    """A model import-triton does not convert; the message says why."""


def _pb():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise ImportError(f"import-triton reads config.pbtxt with Triton's schema from "
                          f"tritonclient (tritonclient.grpc.model_config_pb2) and protobuf: "
                          f"{e}; they are in .venv-torch (make bootstrap-torch)") from e
    return text_format, model_config_pb2


@dataclass
class Options:
    batch_sizes: Optional[List[int]] = None           # --batch-sizes LIST (every model)
    model_batch_sizes: Dict[str, List[int]] = field(default_factory=dict)  # NAME=LIST
    shapes: Dict[Tuple[str, str], List[int]] = field(default_factory=dict)  # --shape
    ignore: List[str] = field(default_factory=list)
    force: bool = False


@dataclass
class Outcome:
    name: str
    ok: bool
    message: str = ""
    notes: List[str] = field(default_factory=list)
    kind: str = ""                 # "onnx" | "ensemble"
    version: Optional[int] = None  # the Triton version imported
    manifest: object = None        # the bundle's, read back
    policy: Dict[str, int] = field(default_factory=dict)
    stateful: bool = False


class Checker:
    """The problems and notes of one model's config: refusals name the field
    and say what to do; an ignorable one becomes a note under --ignore."""

    def __init__(self, ignore: Sequence[str]):
        self.ignore = set(ignore)
        self.problems: List[str] = []
        self.notes: List[str] = []

    def refuse(self, path: str, why: str):
        self.problems.append(f"{path}: {why}")

    def ignorable(self, key: str, path: str, what: str):
        if key in self.ignore:
            self.notes.append(f"{path}: {what}: ignored (--ignore {key})")
        else:
            self.refuse(path, f"{what}: {IGNORABLE[key]}; remove it from {CONFIG_FILE}, or "
                        f"pass --ignore {key} to import the model without it")

    def note(self, text: str):
        self.notes.append(text)

    def raise_if_refused(self):
        if self.problems:
            raise Refused("; ".join(self.problems))


def _set_fields(msg) -> List[str]:
    return [f.name for f, _ in msg.ListFields()]


# Why a field pjserve has nothing for is refused (others: a generic reason).
_WHY = {
    "model_transaction_policy": "a decoupled model (zero or many responses per request) is a "
                                "pjserve meta model in C (docs/meta-models.md § Decoupled "
                                "models), written by hand",
    "iterative_sequence": "pjserve has no iterative sequences",
    "batch_input": "ragged batching: an executable's extents are fixed per compiled batch size",
    "batch_output": "ragged batching: an executable's extents are fixed per compiled batch size",
    "model_operations": "custom operation libraries cannot run inside a StableHLO executable",
    "model_repository_agents": "repository agents (checksums, decryption) do not run here: "
                               "prepare the files and remove the agents before importing",
    "runtime": "a custom backend library: pjserve imports onnxruntime models and ensembles",
    "ensemble_scheduling": "only an ensemble (platform \"ensemble\") has steps",
    "max_inflight_requests": "pjserve bounds ensembles by its meta gate (--meta-concurrency)",
    "model_namespace": "pjserve has one model namespace",
    "dynamic_batching": "only a model's own scheduling",
    "sequence_batching": "only a model's own scheduling",
}


def _unhandled(chk: Checker, msg, handled: Sequence[str], path: str):
    for name in _set_fields(msg):
        if name not in handled:
            why = _WHY.get(name) or ("pjserve has no counterpart (import-triton maps no "
                                     f"such field); remove it from {CONFIG_FILE} if the "
                                     "model works without it")
            chk.refuse(f"{path}.{name}" if path else name, f"not supported: {why}")


def _type_name(pb, t: int) -> str:
    return pb.DataType.Name(t)


def _served(pb, chk: Checker, where: str, t: int) -> Optional[str]:
    name = _type_name(pb, t)
    if name == "TYPE_STRING":
        chk.refuse(where, "TYPE_STRING: an executable takes no strings (a pjserve hooked or "
                   "meta model converts them in C: docs/hooks.md)")
        return None
    if name not in _SERVED:
        chk.refuse(where, f"data type {name} is not supported")
        return None
    served = _SERVED[name]
    if name in ("TYPE_INT64", "TYPE_UINT64", "TYPE_FP64"):
        chk.note(f"{where}: {name} is served as {_KSERVE[served]} (JAX computes without 64-bit "
                 f"types): clients send and get {_KSERVE[served]}")
    return served


# ---- reading a repository ----------------------------------------------------------------

def read_config(model_dir: Path):
    """The ModelConfig of model_dir/config.pbtxt; Refused when missing or malformed."""
    text_format, pb = _pb()
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        raise Refused(f"no {CONFIG_FILE} (Triton's auto-completed configurations are not "
                      f"reproduced): write one with name, platform, max_batch_size, input and "
                      f"output")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise Refused(f"{CONFIG_FILE} cannot be read: {e}") from None
    cfg = pb.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        raise Refused(f"{CONFIG_FILE} is not a valid Triton model configuration: {e}") from None
    return cfg


def _versions(model_dir: Path) -> List[int]:
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def pick_version(cfg, model_dir: Path, filename: str, chk: Checker) -> Tuple[int, Path]:
    """The version to import (one: pjserve serves one per model) and its model file."""
    have = _versions(model_dir)
    policy = cfg.version_policy
    which = policy.WhichOneof("policy_choice") or "latest"
    if which == "latest":
        n = policy.latest.num_versions or 1
        candidates = have[-n:]
        if n > 1 and len(candidates) > 1:
            chk.note(f"version_policy latest {{ num_versions: {n} }}: only the latest, "
                     f"{candidates[-1]}, is imported (pjserve serves one version per model)")
    elif which == "all":
        candidates = have
        if len(have) > 1:
            chk.note(f"version_policy all: only the latest version, {have[-1]}, is imported "
                     f"(pjserve serves one version per model)")
    else:
        wanted = list(policy.specific.versions)
        missing = [v for v in wanted if v not in have]
        if missing:
            raise Refused(f"version_policy specific names versions {missing} that have no "
                          f"directory in {model_dir}")
        candidates = sorted(wanted)
        if len(candidates) > 1:
            chk.note(f"version_policy specific {candidates}: only {candidates[-1]} is "
                     f"imported (pjserve serves one version per model)")
    if not candidates:
        raise Refused(f"no version directory (such as 1/) holding {filename} in {model_dir}")
    v = candidates[-1]
    f = model_dir / str(v) / filename
    if f.is_dir() and (f / "model.onnx").is_file():
        f = f / "model.onnx"  # Triton's ONNX model directories
    if not f.is_file():
        raise Refused(f"version {v} has no {filename} ({f})")
    if v != 1:
        chk.note(f"Triton version {v} is served as pjserve's version 1 (requests without a "
                 f"version, or for version 1, reach it)")
    return v, f


# ---- the fields of a config ----------------------------------------------------------------

def check_common(cfg, name: str, chk: Checker, pb):
    if cfg.name and cfg.name != name:
        chk.refuse("name", f"{cfg.name!r} differs from the directory's name {name!r} "
                   "(a pjserve bundle is named after its directory)")
    before = len(chk.problems) + len(chk.notes)
    for i, g in enumerate(cfg.instance_group):
        kind = pb.ModelInstanceGroup.Kind.Name(g.kind)
        path = f"instance_group[{i}]"
        if kind == "KIND_GPU" or g.gpus:
            chk.ignorable("instance_group", path, f"kind {kind}" +
                          (f", gpus {list(g.gpus)}" if g.gpus else ""))
        other = [f for f in _set_fields(g) if f not in ("name", "kind", "count", "gpus")]
        if other:
            chk.ignorable("instance_group", path, ", ".join(other))
    if cfg.instance_group and len(chk.problems) + len(chk.notes) == before:
        chk.note("instance_group: harmless, not mapped (pjserve runs one execution at a "
                 "time per device; requests coalesce instead of running on instances)")
    for key in ("optimization", "parameters", "response_cache", "model_metrics",
                "metric_tags", "cc_model_filenames"):
        if key in _set_fields(cfg):
            chk.ignorable(key, key, "set")
    if cfg.model_warmup:
        chk.note("model_warmup: harmless, not mapped (pjserve runs every compiled batch size "
                 "at load, --warmup-runs)")


def tensor_dims(t) -> List[int]:
    return [int(d) for d in t.dims]


def check_tensor_fields(chk: Checker, t, what: str, i: int, handled: Sequence[str]):
    path = f"{what}[{i}] ({t.name})" if t.name else f"{what}[{i}]"
    extra = [f for f in _set_fields(t) if f not in handled]
    why = {"reshape": "the tensor must have the shape the model takes (re-export it with that "
                      "shape)",
           "is_shape_tensor": "shape tensors are a TensorRT notion",
           "allow_ragged_batch": "an executable's extents are fixed per compiled batch size",
           "optional": "every input of an executable must be sent",
           "is_non_linear_format_io": "a TensorRT notion"}
    for f in extra:
        chk.refuse(f"{path}.{f}", f"not supported: {why.get(f, 'no pjserve counterpart')}")
    if not NAME_RE.match(t.name or "") or t.name.startswith("."):
        chk.refuse(path, f"name {t.name!r}: pjserve tensor names are letters, digits, '_', '.' "
                   "and '-' (rename the tensor in the model and the config)")
    return path


# ---- ONNX ----------------------------------------------------------------------------------

def _onnx_dims(value_info) -> Optional[List[Optional[int]]]:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def _reconcile(chk: Checker, path: str, want: List[int], onnx_dims, batched: bool,
               given: Optional[List[int]]) -> Optional[List[int]]:
    """The per-example extents to compile `path` at: the config's, the ONNX
    file's where the config says -1, or --shape's; None (and a refusal)
    when an extent stays open or they disagree."""
    if onnx_dims is not None:
        if batched:
            if len(onnx_dims) != len(want) + 1:
                chk.refuse(path, f"dims {want} with max_batch_size > 0 means rank {len(want) + 1}"
                           f" with the batch axis, but the ONNX file's shape is "
                           f"{_show(onnx_dims)}")
                return None
            if onnx_dims[0] is not None:
                chk.refuse(path, f"the ONNX file fixes the batch axis at {onnx_dims[0]}: "
                           "re-export it with that axis dynamic (torch.onnx.export's "
                           "dynamic_axes={name: {0: 'batch'}})")
                return None
            onnx_dims = onnx_dims[1:]
        elif len(onnx_dims) != len(want):
            chk.refuse(path, f"dims {want} but the ONNX file's shape is {_show(onnx_dims)}")
            return None
    if given is not None:
        if len(given) != len(want) or any(w not in (-1, g) for w, g in zip(want, given)):
            chk.refuse(path, f"--shape {given} does not fit the config's dims {want}")
            return None
        want = list(given)
    out = []
    for k, w in enumerate(want):
        o = onnx_dims[k] if onnx_dims is not None else None
        if w >= 0:
            if o is not None and o != w:
                chk.refuse(path, f"dims {want} but the ONNX file's shape is {_show(onnx_dims)}")
                return None
            out.append(w)
        elif o is not None:
            out.append(o)
        else:
            chk.refuse(path, f"dims {want}: dims[{k}] is -1 and the ONNX file leaves that "
                       "extent open; a pjserve executable has fixed extents: pass --shape "
                       "MODEL:INPUT=D1,D2,... to compile one shape (re-export with "
                       "export_onnx(..., variants=...) for several)")
            return None
    if given is not None:
        chk.note(f"{path}: compiled at dims {out} (--shape)")
    elif any(w == -1 for w in want):
        chk.note(f"{path}: dims {want}: compiled at {out}, the ONNX file's extents")
    return out


def _copy(cls, msg):
    c = cls()
    c.CopyFrom(msg)
    return c


def _show(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def batch_sizes_for(name: str, max_batch_size: int, preferred: Sequence[int],
                    opts: Options, chk: Checker) -> List[int]:
    if name in opts.model_batch_sizes:
        sizes = set(opts.model_batch_sizes[name])
    elif opts.batch_sizes is not None:
        sizes = set(opts.batch_sizes)
    else:
        sizes = {1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size}
    over = sorted(b for b in sizes if b > max_batch_size)
    if over:
        chk.note(f"batch sizes {over} are above max_batch_size {max_batch_size}: left out")
    sizes = {b for b in sizes if b <= max_batch_size}
    for b in preferred:
        if b > max_batch_size:
            chk.refuse("dynamic_batching.preferred_batch_size",
                       f"{b} is above max_batch_size {max_batch_size}")
        elif b > 0:
            sizes.add(b)
    sizes.add(max_batch_size)  # the largest compiled size is the max_batch_size reported
    return sorted(sizes)


def queue_policy(chk: Checker, db, pb) -> Dict[str, int]:
    """dynamic_batching's default_queue_policy as the server's model policy."""
    policy = {}
    if not db.HasField("default_queue_policy"):
        return policy
    q = db.default_queue_policy
    path = "dynamic_batching.default_queue_policy"
    _unhandled(chk, q, ("timeout_action", "default_timeout_microseconds",
                        "allow_timeout_override", "max_queue_size"), path)
    if q.timeout_action == pb.ModelQueuePolicy.DELAY:
        chk.refuse(f"{path}.timeout_action", "DELAY: pjserve answers a request whose deadline "
                   "passed DEADLINE_EXCEEDED and never runs it (REJECT)")
    if q.default_timeout_microseconds:
        if q.default_timeout_microseconds > MAX_TIMEOUT_US:
            chk.refuse(f"{path}.default_timeout_microseconds",
                       f"{q.default_timeout_microseconds} is above pjserve's {MAX_TIMEOUT_US}")
        else:
            policy["default_timeout_us"] = int(q.default_timeout_microseconds)
            if not q.allow_timeout_override:
                chk.note(f"{path}.allow_timeout_override false: pjserve honours a request's own "
                         "timeout always")
    if q.max_queue_size:
        if q.max_queue_size > MAX_QUEUE_DEPTH:
            chk.refuse(f"{path}.max_queue_size", f"{q.max_queue_size} is above pjserve's "
                       f"{MAX_QUEUE_DEPTH}")
        else:
            policy["max_queue_depth"] = int(q.max_queue_size)
    return policy


def check_dynamic_batching(cfg, chk: Checker, pb) -> Tuple[List[int], Dict[str, int]]:
    if not cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size > 0 and not cfg.HasField("sequence_batching"):
            chk.note("no dynamic_batching: pjserve coalesces the queued requests of every "
                     "model with a batch axis (rows are computed independently, so each "
                     "answer is the same)")
        return [], {}
    db = cfg.dynamic_batching
    _unhandled(chk, db, ("preferred_batch_size", "max_queue_delay_microseconds",
                         "preserve_ordering", "priority_levels", "default_priority_level",
                         "priority_queue_policy", "default_queue_policy"), "dynamic_batching")
    if cfg.max_batch_size <= 0:
        chk.refuse("dynamic_batching", "needs max_batch_size > 0 (Triton refuses it too)")
    if db.max_queue_delay_microseconds:
        chk.note(f"dynamic_batching.max_queue_delay_microseconds "
                 f"{db.max_queue_delay_microseconds}: harmless, not mapped (pjserve never "
                 "holds a request back waiting for more; it coalesces what is queued when "
                 "the device frees up)")
    if db.preserve_ordering:
        chk.note("dynamic_batching.preserve_ordering: harmless (pjserve answers each "
                 "stream's requests in order)")
    for f in ("priority_levels", "default_priority_level", "priority_queue_policy"):
        if f in _set_fields(db):
            chk.ignorable("dynamic_batching.priority_levels", f"dynamic_batching.{f}", "set")
    return list(db.preferred_batch_size), queue_policy(chk, db, pb)


@dataclass
class Sequence_:
    state: List[Tuple[str, str]]
    state_dims: Dict[str, Tuple[str, List[int]]]   # state input -> (Triton type, dims)
    controls: Dict[str, str]                       # control kind -> input name
    control_types: Dict[str, str]                  # input name -> Triton type
    idle_timeout_ms: Optional[int]


def check_sequence(cfg, chk: Checker, pb) -> Optional[Sequence_]:
    if not cfg.HasField("sequence_batching"):
        return None
    sb = cfg.sequence_batching
    path = "sequence_batching"
    _unhandled(chk, sb, ("direct", "oldest", "max_sequence_idle_microseconds",
                         "control_input", "state"), path)
    if cfg.max_batch_size <= 0:
        chk.refuse(path, "pjserve keeps a sequence's state in one row of a batch: the model "
                   "needs max_batch_size > 0")
    strategy = sb.WhichOneof("strategy_choice") or "direct"
    strat = getattr(sb, strategy)
    settings = ", ".join(_set_fields(strat))
    chk.note(f"{path}.{strategy}{' (' + settings + ')' if settings else ''}: harmless, not "
             "mapped (pjserve runs each sequence's requests in order and coalesces steps of "
             "different sequences, as Triton's oldest; an ONNX model keeps no state of its own, "
             "so its answers are the same under either strategy)")
    idle = None
    if sb.max_sequence_idle_microseconds:
        idle = max(1, math.ceil(sb.max_sequence_idle_microseconds / 1000))
        if idle > MAX_IDLE_MS:
            chk.refuse(f"{path}.max_sequence_idle_microseconds", f"above pjserve's "
                       f"{MAX_IDLE_MS} ms")
    controls, control_types = {}, {}
    for i, ci in enumerate(sb.control_input):
        p = f"{path}.control_input[{i}] ({ci.name})"
        _unhandled(chk, ci, ("name", "control"), p)
        if len(ci.control) != 1:
            chk.refuse(p, f"{len(ci.control)} controls on one input; pjserve fills one control "
                       "per input")
            continue
        c = ci.control[0]
        kind = pb.ModelSequenceBatching.Control.Kind.Name(c.kind)
        k = _CONTROL_KINDS[kind]
        if k in controls:
            chk.refuse(p, f"a second {kind} input")
            continue
        if k == "corrid":
            t = _type_name(pb, c.data_type)
            if t not in ("TYPE_INT32", "TYPE_INT64", "TYPE_UINT32", "TYPE_UINT64"):
                chk.refuse(p, f"{kind} of {t}: pjserve's sequence id is an integer input "
                           "(TYPE_INT32, TYPE_INT64, TYPE_UINT32 or TYPE_UINT64)")
                continue
        else:
            values = [(list(c.int32_false_true), "TYPE_INT32", [0, 1]),
                      (list(c.fp32_false_true), "TYPE_FP32", [0.0, 1.0]),
                      (list(c.bool_false_true), "TYPE_BOOL", [False, True])]
            given = [(v, t, want) for v, t, want in values if v]
            if len(given) != 1:
                chk.refuse(p, f"{kind} needs one of int32_false_true, fp32_false_true or "
                           "bool_false_true")
                continue
            v, t, want = given[0]
            if v != want:
                chk.refuse(p, f"{kind} with false/true values {v}: pjserve fills flags with "
                           f"{want}")
                continue
        controls[k] = ci.name
        control_types[ci.name] = t
    state, state_dims = [], {}
    for i, s in enumerate(sb.state):
        p = f"{path}.state[{i}] ({s.input_name})"
        _unhandled(chk, s, ("input_name", "output_name", "data_type", "dims", "initial_state",
                            "use_same_buffer_for_input_output"), p)
        dims = tensor_dims(s)
        if any(d < 0 for d in dims):
            chk.refuse(p, f"dims {dims}: pjserve keeps state of a fixed shape")
        for j, init in enumerate(s.initial_state):
            if init.WhichOneof("state_data") != "zero_data":
                chk.refuse(f"{p}.initial_state[{j}]", "data_file: pjserve starts every "
                           "sequence's state as zeros (zero_data)")
        if not s.initial_state:
            chk.note(f"{p}: no initial_state: pjserve starts the state as zeros")
        state.append((s.input_name, s.output_name))
        state_dims[s.input_name] = (_type_name(pb, s.data_type), dims)
    if not state and not controls:
        chk.refuse(path, "neither state nor control inputs: nothing for pjserve's sequence "
                   "section to keep (a plain model does the same without sequence_batching)")
    return Sequence_(state, state_dims, controls, control_types, idle)


def _torch_dtype(torch, t: str):
    return {"TYPE_BOOL": torch.bool, "TYPE_UINT8": torch.uint8, "TYPE_INT8": torch.int8,
            "TYPE_INT16": torch.int16, "TYPE_INT32": torch.int32, "TYPE_INT64": torch.int64,
            "TYPE_FP16": torch.float16, "TYPE_FP32": torch.float32,
            "TYPE_FP64": torch.float64, "TYPE_BF16": torch.bfloat16}.get(t)


def _positions(names: Sequence[str], what: str, forward_args: Optional[Sequence[str]]):
    """The order in which TorchScript's forward() takes (returns) the config's
    tensors, as Triton's PyTorch backend reads them: NAME__INDEX names by
    their index, else inputs by forward()'s argument names, else (outputs)
    the config's order."""
    idx = [re.fullmatch(r".*__(\d+)", n) for n in names]
    if all(idx):
        order = sorted(names, key=lambda n: int(n.rsplit("__", 1)[1]))
        ks = sorted(int(m.group(1)) for m in idx)
        if ks != list(range(len(names))):
            raise Refused(f"{what} names {list(names)}: their __INDEX suffixes are not 0.."
                          f"{len(names) - 1}")
        return order
    if forward_args is not None:
        if set(names) == set(forward_args):
            return list(forward_args)
        raise Refused(f"{what} names {list(names)} neither follow NAME__INDEX nor are "
                      f"forward()'s arguments {list(forward_args)}")
    return list(names)


def torchscript_to_onnx(path: Path, declared_in, declared_out, batched: bool, opts: Options,
                        name: str, staging: Path):
    """model.pt (TorchScript) as an ONNX graph, with torch.onnx.export's
    TorchScript-based exporter; checked against TorchScript itself with
    onnxruntime on random inputs."""
    import warnings
    import numpy as np
    try:
        import onnx
        import torch
    except ImportError as e:
        raise Refused(f"platform pytorch_libtorch needs torch in this Python ({e}): run it in "
                      ".venv-torch (make bootstrap-torch) or set PJSERVE_PYTHON") from None
    try:
        module = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as e:  # noqa: BLE001
        raise Refused(f"{path.name} is not a TorchScript file torch.jit.load reads: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    try:
        args = [a.name for a in module.forward.schema.arguments][1:]  # without self
    except (AttributeError, RuntimeError):
        args = None
    in_order = _positions(list(declared_in), "input", args)
    out_order = _positions(list(declared_out), "output", None)
    examples = []
    for n in in_order:
        t, dims, p = declared_in[n]
        if dims is None:
            dims = [1]  # a control input
        given = opts.shapes.get((name, n))
        if given is not None:
            dims = given
        if any(d < 0 for d in dims):
            raise Refused(f"{p}: dims {dims}: a TorchScript file says nothing of its shapes: "
                          "pass --shape MODEL:INPUT=D1,D2,... to compile one")
        dt = _torch_dtype(torch, t)
        if dt is None:
            raise Refused(f"{p}: {t} is not supported")
        examples.append((dt, ([2] if batched else []) + list(dims)))

    def tensors(seed):
        g = torch.Generator().manual_seed(seed)
        out = []
        for dt, shape in examples:
            if dt.is_floating_point:
                out.append(torch.randn(shape, generator=g).to(dt))
            elif dt == torch.bool:
                out.append(torch.randint(0, 2, shape, generator=g).bool())
            else:
                out.append(torch.randint(0, 2, shape, generator=g).to(dt))
        return out

    onnx_path = staging / f".{name}.torchscript.onnx"
    axes = {n: {0: "batch"} for n in in_order + out_order} if batched else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, tuple(tensors(0)), str(onnx_path), input_names=in_order,
                              output_names=out_order, opset_version=17, dynamo=False,
                              dynamic_axes=axes)
    except Exception as e:  # noqa: BLE001
        raise Refused(f"{path.name}: torch.onnx.export cannot export this TorchScript module: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; export "
                      "the original torch.nn.Module with export_torch instead") from None
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:  # the ONNX graph computes what TorchScript does
        xs = tensors(1)
        with torch.no_grad():
            want = module(*xs)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        sess = ort.InferenceSession(str(onnx_path))
        feed = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs)}
        got = sess.run(None, feed)
        for n, w, g in zip(out_order, want, got):
            w = w.detach()
            w = w.float().numpy() if w.is_floating_point() else w.numpy()
            err = float(np.max(np.abs(g.astype(np.float64) - w))) / max(
                1.0, float(np.max(np.abs(w)))) if w.size else 0.0
            if err > 1e-4:
                raise Refused(f"{path.name}: its ONNX export computes output {n!r} "
                              f"{err:.1e} away from TorchScript; export the original "
                              "torch.nn.Module with export_torch instead")
    proto = onnx.load(str(onnx_path))
    onnx_path.unlink()
    return proto


def import_onnx(name: str, model_dir: Path, cfg, opts: Options, staging: Path,
                out: Outcome, pb, torchscript: bool = False) -> Path:
    chk = Checker(opts.ignore)
    check_common(cfg, name, chk, pb)
    # which fields this path reads; every other one set is refused by name
    _unhandled(chk, cfg, ("name", "platform", "backend", "version_policy", "max_batch_size",
                          "input", "output", "dynamic_batching", "sequence_batching",
                          "instance_group", "default_model_filename", "model_warmup",
                          "optimization", "parameters", "response_cache", "model_metrics",
                          "metric_tags", "cc_model_filenames"), "")
    mbs = int(cfg.max_batch_size)
    batched = mbs > 0
    preferred, policy = check_dynamic_batching(cfg, chk, pb)
    seq = check_sequence(cfg, chk, pb)
    filename = cfg.default_model_filename or ("model.pt" if torchscript else "model.onnx")
    try:
        version, onnx_path = pick_version(cfg, model_dir, filename, chk)
    except Refused as e:
        chk.refuse("model file", str(e))
        chk.raise_if_refused()
    out.version = version
    if not cfg.input:
        chk.refuse("input", "no inputs declared")
    if not cfg.output:
        chk.refuse("output", "no outputs declared")

    # what the config declares: name -> (Triton type, dims, path)
    declared_in, declared_out = {}, {}
    formats, labels = {}, {}
    for i, t in enumerate(cfg.input):
        p = check_tensor_fields(chk, t, "input", i, ("name", "data_type", "format", "dims"))
        fmt = pb.ModelInput.Format.Name(t.format)
        if fmt in ("FORMAT_NHWC", "FORMAT_NCHW"):
            formats[t.name] = fmt[len("FORMAT_"):]
        declared_in[t.name] = (_type_name(pb, t.data_type), tensor_dims(t), p)
    for i, t in enumerate(cfg.output):
        p = check_tensor_fields(chk, t, "output", i,
                                ("name", "data_type", "dims", "label_filename"))
        declared_out[t.name] = (_type_name(pb, t.data_type), tensor_dims(t), p)
        if t.label_filename:
            labels[t.name] = (t.label_filename, p)
    if seq is not None:
        for ctl_name, t in seq.control_types.items():
            declared_in.setdefault(ctl_name, (t, None, f"sequence_batching control {ctl_name}"))
        for (si, so) in seq.state:
            t, dims = seq.state_dims[si]
            declared_in.setdefault(si, (t, dims, f"sequence_batching state {si}"))
            declared_out.setdefault(so, (t, dims, f"sequence_batching state {so}"))
    chk.raise_if_refused()

    import onnx
    import numpy as np
    if torchscript:
        proto = torchscript_to_onnx(onnx_path, declared_in, declared_out, batched, opts, name,
                                    staging)
        chk.note(f"{onnx_path.name}: written as ONNX by torch.onnx.export (TorchScript-based, "
                 "opset 17) and checked against TorchScript with onnxruntime")
    else:
        try:
            proto = onnx.load(str(onnx_path))
        except Exception as e:  # noqa: BLE001 - any reason the file does not load
            raise Refused(f"{onnx_path.relative_to(model_dir)} is not a readable ONNX model: "
                          f"{e}") from None
    graph = proto.graph
    inits = {i.name for i in graph.initializer}
    g_inputs = {i.name: i for i in graph.input if i.name not in inits}
    g_outputs = {o.name: o for o in graph.output}
    for n in g_inputs:
        if n not in declared_in:
            chk.refuse(f"input {n}", f"the ONNX file takes input {n!r}, which {CONFIG_FILE} "
                       "does not declare")
    for n, (_, _, p) in declared_in.items():
        if n not in g_inputs:
            chk.refuse(p, f"the ONNX file has no input {n!r} (it has {sorted(g_inputs)})")
    for n, (_, _, p) in declared_out.items():
        if n not in g_outputs:
            chk.refuse(p, f"the ONNX file has no output {n!r} (it has {sorted(g_outputs)})")
    chk.raise_if_refused()

    # inputs in the config's order (then controls and state), outputs likewise
    examples, input_names = [], []
    for n, (t, dims, p) in declared_in.items():
        vi = g_inputs[n]
        onnx_type = _ONNX_TYPES.get(vi.type.tensor_type.elem_type, "an unsupported type")
        if onnx_type != t:
            chk.refuse(p, f"{CONFIG_FILE} says {t}, the ONNX file {onnx_type}")
            continue
        served = _served(pb, chk, p, pb.DataType.Value(t))
        odims = _onnx_dims(vi)
        if dims is None:  # a control input: one element per row
            rank = len(odims) if odims is not None else 2
            if rank not in (1, 2):
                chk.refuse(p, f"a control input has one element per row ([batch] or "
                           f"[batch, 1]); the ONNX file's shape is {_show(odims)}")
                continue
            dims = [1] * (rank - 1)
        shape = _reconcile(chk, p, dims, odims, batched, opts.shapes.get((name, n)))
        if shape is None or served is None:
            continue
        from . import dtypes
        examples.append(np.zeros(([1] if batched else []) + shape,
                                 dtypes.from_manifest(served)))
        input_names.append(n)
    for n in opts.shapes:
        if n[0] == name and n[1] not in declared_in:
            chk.refuse(f"--shape {n[0]}:{n[1]}", f"the model has no input {n[1]!r}")
    output_names = list(declared_out)
    for n, (t, _, p) in declared_out.items():
        onnx_type = _ONNX_TYPES.get(g_outputs[n].type.tensor_type.elem_type)
        if onnx_type is not None and onnx_type != t:
            chk.refuse(p, f"{CONFIG_FILE} says {t}, the ONNX file {onnx_type}")
        _served(pb, chk, p, pb.DataType.Value(t))
    sizes = batch_sizes_for(name, mbs, preferred, opts, chk) if batched else None
    chk.raise_if_refused()

    # the graph as the bundle takes it: inputs and outputs in the config's order
    kept_inputs = [_copy(onnx.ValueInfoProto, g_inputs[n]) for n in input_names]
    kept_outputs = [_copy(onnx.ValueInfoProto, g_outputs[n]) for n in output_names]
    dropped = sorted(set(g_outputs) - set(output_names))
    del graph.input[:]
    graph.input.extend(kept_inputs)
    del graph.output[:]
    graph.output.extend(kept_outputs)
    if dropped:
        chk.note(f"ONNX outputs {dropped} are not in {CONFIG_FILE}: left out, as Triton "
                 "leaves them out")

    extra_files, output_labels = {}, {}
    for n, (fname, p) in labels.items():
        src = model_dir / fname
        if not src.is_file():
            chk.refuse(f"{p}.label_filename", f"{fname}: no such file in {model_dir}")
        elif not NAME_RE.match(fname) or fname.startswith("."):
            chk.refuse(f"{p}.label_filename", f"{fname!r}: a bundle's labels file is a plain "
                       "name of letters, digits, '_', '.' and '-'")
        else:
            extra_files[fname] = src
            output_labels[n] = fname
    chk.raise_if_refused()

    what = ", ".join(filter(None, [
        f"version {version}",
        f"max_batch_size {mbs} -> batch sizes {','.join(map(str, sizes))}" if batched else
        "max_batch_size 0 -> no batch axis",
        "sequence" if seq else ""]))
    _progress(f"{name}: {'torchscript' if torchscript else 'onnx'}, {what} ...")
    from .onnx_export import export_onnx
    kw = {}
    if seq is not None:
        kw = dict(sequence_state=seq.state or None, sequence_controls=seq.controls or None)
        if seq.idle_timeout_ms:
            kw["idle_timeout_ms"] = seq.idle_timeout_ms
        out.stateful = True
    try:
        path = export_onnx(proto, staging, name=name, batch_sizes=sizes,
                           input_names=input_names, output_names=output_names,
                           example_inputs=examples, input_formats=formats or None,
                           output_labels=output_labels or None,
                           extra_files=extra_files or None,
                           description=f"imported from Triton: {model_dir.name} version "
                                       f"{version} ({onnx_path.name})", **kw)
    except Exception as e:  # noqa: BLE001 - export_onnx's refusals and any failure
        raise Refused(f"{onnx_path.relative_to(model_dir)}: {e}") from None
    from .bundle import read_manifest
    m = read_manifest(path)
    # the outputs as the config declares them
    for spec in m.outputs:
        t, dims, p = declared_out[spec.name]
        if spec.dtype != _SERVED.get(t):
            chk.refuse(p, f"the model computes {spec.dtype}, {CONFIG_FILE} says {t}")
        if spec.batched != batched:
            chk.refuse(p, "the model's output has no batch axis" if batched else
                       "max_batch_size 0 but the output depends on a batch axis")
        elif len(dims) != len(spec.shape) or any(d not in (-1, s)
                                                  for d, s in zip(dims, spec.shape)):
            chk.refuse(p, f"the model computes shape {list(spec.shape)} per "
                       f"{'row' if batched else 'request'}, {CONFIG_FILE} says dims {dims}")
        if spec.name in output_labels:
            lines = (model_dir / output_labels[spec.name]).read_bytes().split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            classes = int(np.prod(spec.shape)) if spec.shape else 1
            if len(lines) < classes:
                chk.refuse(f"{p}.label_filename", f"{output_labels[spec.name]} has "
                           f"{len(lines)} lines for {classes} classes")
    if chk.problems:
        shutil.rmtree(path, ignore_errors=True)
    chk.raise_if_refused()
    out.notes += chk.notes
    out.policy = policy
    out.manifest = m
    return path


# ---- ensembles -------------------------------------------------------------------------------

def import_ensemble(name: str, model_dir: Path, cfg, opts: Options, staging: Path,
                    out: Outcome, done: Dict[str, Outcome], out_repo: Path, pb) -> Path:
    from . import bundle as B
    chk = Checker(opts.ignore)
    check_common(cfg, name, chk, pb)
    _unhandled(chk, cfg, ("name", "platform", "max_batch_size", "input", "output",
                          "ensemble_scheduling", "instance_group", "version_policy",
                          "optimization", "parameters", "response_cache", "model_metrics",
                          "metric_tags", "model_warmup"), "")
    if cfg.HasField("version_policy"):
        chk.note("version_policy: harmless on an ensemble (it has no model files)")
    batched = cfg.max_batch_size > 0
    ens = cfg.ensemble_scheduling
    _unhandled(chk, ens, ("step",), "ensemble_scheduling")
    if not ens.step:
        chk.refuse("ensemble_scheduling", "no steps")

    def client(tensors, what):
        specs = []
        for i, t in enumerate(tensors):
            p = check_tensor_fields(chk, t, what, i, ("name", "data_type", "dims", "format",
                                                      "label_filename"))
            served = _served(pb, chk, p, t.data_type)
            fmt = None
            if what == "input":
                f = pb.ModelInput.Format.Name(t.format)
                fmt = f[len("FORMAT_"):] if f != "FORMAT_NONE" else None
            spec = B.TensorSpec(t.name, served or "f32", tuple(tensor_dims(t)), batched, fmt)
            if what == "output" and t.label_filename:
                spec.labels = t.label_filename
            specs.append(spec)
        return specs

    ins, outs = client(cfg.input, "input"), client(cfg.output, "output")
    steps = []
    for i, s in enumerate(ens.step):
        p = f"ensemble_scheduling.step[{i}] ({s.model_name})"
        _unhandled(chk, s, ("model_name", "model_version", "input_map", "output_map"), p)
        called = done.get(s.model_name)
        manifest = None
        if called is not None and called.kind == "ensemble":
            chk.refuse(p, f"model {s.model_name!r} is an ensemble: a pjserve ensemble's steps "
                       "call plain models")
        elif called is not None and called.ok:
            if called.kind not in ("onnx", "torchscript"):
                chk.refuse(p, f"model {s.model_name!r} is an {called.kind}: a pjserve "
                           "ensemble's steps call plain models")
            elif called.stateful:
                chk.refuse(p, f"model {s.model_name!r} keeps sequence state: a step carries no "
                           "sequence")
            manifest = called.manifest
            if s.model_version not in (-1, 0) and s.model_version != called.version:
                chk.refuse(p, f"model_version {s.model_version}: import-triton imported "
                           f"version {called.version} of {s.model_name!r} (pjserve serves "
                           "one version)")
        elif called is not None:
            chk.refuse(p, f"model {s.model_name!r} was refused (see its line)")
        elif (out_repo / s.model_name / B.MANIFEST_FILE).is_file():
            try:
                manifest = B.read_manifest(out_repo / s.model_name)
            except Exception as e:  # noqa: BLE001
                chk.refuse(p, f"{out_repo / s.model_name}: {e}")
            else:
                chk.note(f"step {i} calls {s.model_name!r}, already in {out_repo}")
            if s.model_version not in (-1, 0):
                chk.refuse(p, f"model_version {s.model_version}: pjserve serves one version "
                           "of each model; use -1")
        else:
            chk.refuse(p, f"model {s.model_name!r} is neither in the Triton repository nor "
                       f"in {out_repo}")
        if manifest is not None:
            # dtypes where a step meets the client tensors; the server checks the rest
            m_in = {t.name: t for t in manifest.inputs}
            m_out = {t.name: t for t in manifest.outputs}
            c_in = {t.name: t for t in ins}
            c_out = {t.name: t for t in outs}
            for k, v in s.input_map.items():
                if k not in m_in:
                    chk.refuse(f"{p}.input_map", f"model {s.model_name!r} has no input {k!r}")
                elif v in c_in and c_in[v].dtype != m_in[k].dtype:
                    chk.refuse(f"{p}.input_map", f"ensemble input {v!r} is served as "
                               f"{c_in[v].dtype}, model {s.model_name!r}'s input {k!r} as "
                               f"{m_in[k].dtype}")
            for k, v in s.output_map.items():
                if k not in m_out:
                    chk.refuse(f"{p}.output_map", f"model {s.model_name!r} has no output "
                               f"{k!r}")
                elif v in c_out and c_out[v].dtype != m_out[k].dtype:
                    chk.refuse(f"{p}.output_map", f"ensemble output {v!r} is "
                               f"{c_out[v].dtype}, model {s.model_name!r}'s output {k!r} is "
                               f"{m_out[k].dtype}")
        for k, v in list(s.input_map.items()) + list(s.output_map.items()):
            if not NAME_RE.match(v) or v.startswith("."):
                chk.refuse(p, f"ensemble tensor {v!r}: pjserve tensor names are letters, "
                           "digits, '_', '.' and '-'")
        steps.append((s.model_name, dict(s.input_map), dict(s.output_map)))
    extra = {}
    for t in outs:
        if t.labels:
            src = model_dir / t.labels
            if not src.is_file():
                chk.refuse(f"output ({t.name}).label_filename", f"{t.labels}: no such file")
            elif not NAME_RE.match(t.labels) or t.labels.startswith("."):
                chk.refuse(f"output ({t.name}).label_filename", f"{t.labels!r} is not a plain "
                           "file name")
            else:
                extra[t.labels] = src
    chk.raise_if_refused()
    _progress(f"{name}: ensemble of {' -> '.join(s[0] for s in steps)} ...")

    def tensors(key, specs):
        return [f"{key}:\n"] + [B._yaml_tensor(t) for t in specs]

    def mapping(d):
        return "{" + ", ".join(f"{B._yaml_str(k)}: {B._yaml_str(v)}" for k, v in d.items()) + "}"

    text = [f'format_version: "{B.FORMAT_VERSION}"\n', f"name: {B._yaml_str(name)}\n",
            "kind: ensemble\n",
            f"description: {B._yaml_str(f'imported from Triton: {model_dir.name}')}\n"]
    text += tensors("client_inputs", ins) + tensors("client_outputs", outs)
    text.append("ensemble:\n  steps:\n")
    for model, imap, omap in steps:
        text.append(f"    - model: {B._yaml_str(model)}\n      input_map: {mapping(imap)}\n"
                    f"      output_map: {mapping(omap)}\n")
    with B.StagedBundle(staging, name) as d:
        (d / B.MANIFEST_FILE).write_text("".join(text))
        for fname, src in extra.items():
            shutil.copyfile(src, d / fname)
    out.notes += chk.notes
    return staging / name


# ---- the command -------------------------------------------------------------------------

_open_line = [False]  # a progress line waits for its " done in ..."


def _progress(text: str):
    print(text, end="", flush=True)
    _open_line[0] = not text.endswith("\n")


def _say(text: str):
    if _open_line[0]:
        print(flush=True)
        _open_line[0] = False
    print(text, flush=True)


def publish(staged: Path, out_repo: Path, name: str):
    """staged (a bundle under out_repo's hidden staging directory) becomes
    out_repo/name in one rename; a bundle there before is replaced."""
    final = out_repo / name
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=out_repo))
        os.rename(final, old / name)
    os.chmod(staged, 0o755)
    os.rename(staged, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_policies(out_repo: Path, outcomes: Sequence[Outcome]) -> Optional[Path]:
    """Each converted model's queue policy into out_repo/pjserve.yaml (the
    server's --config file), merged with the file's other settings. None
    when there is nothing to write."""
    import yaml
    path = out_repo / POLICY_FILE
    converted = [o for o in outcomes if o.ok]
    data = {}
    if path.exists():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise Refused(f"{path} cannot be read to merge queue policies into it: {e}") \
                from None
        if not isinstance(data, dict) or not isinstance(data.get("models") or {}, dict):
            raise Refused(f"{path} is not a pjserve configuration file (a mapping with "
                          "'models:' as a mapping)")
    elif not any(o.policy for o in converted):
        return None
    models = data.get("models") or {}
    for o in converted:
        entry = dict(models.get(o.name) or {})
        for k in ("max_queue_depth", "default_timeout_us"):
            entry.pop(k, None)
        entry.update(o.policy)
        if entry:
            models[o.name] = entry
        else:
            models.pop(o.name, None)
    data["models"] = models
    header = ("# pjserve serve --model-repository DIR --config DIR/pjserve.yaml "
              "(docs/serving.md)\n"
              "# models.NAME: queue policies pjserve import-triton took from Triton's\n"
              "# dynamic_batching.default_queue_policy\n")
    tmp = path.with_name(f".{POLICY_FILE}.tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    os.rename(tmp, path)
    return path


def _sizes(text: str) -> List[int]:
    try:
        sizes = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") \
            from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return sizes


def parse_args(argv) -> Tuple[argparse.Namespace, Options]:
    ap = argparse.ArgumentParser(
        prog="pjserve import-triton",
        description="Convert a Triton model repository (config.pbtxt + ONNX models, "
                    "ensembles) into a pjserve model repository.",
        epilog="Exit status: 0 every model converted, 1 some refused (the others are "
               "written), 2 usage. See docs/coming-from-triton.md.")
    ap.add_argument("triton_repo", type=Path, help="the Triton model repository")
    ap.add_argument("out_repo", type=Path, help="the pjserve model repository to write into")
    ap.add_argument("--batch-sizes", action="append", default=[], metavar="[NAME=]LIST",
                    help="compiled batch sizes (comma-separated) instead of the powers of two "
                         "up to max_batch_size; max_batch_size and the preferred sizes are "
                         "always added, sizes above it left out. NAME=LIST: for one model. "
                         "Repeatable")
    ap.add_argument("--shape", action="append", default=[], metavar="MODEL:INPUT=D1,D2,...",
                    help="the per-example extents to compile an input at where config.pbtxt "
                         "and the ONNX file leave an extent open (-1); repeatable")
    ap.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                    choices=sorted(IGNORABLE),
                    help="import models that set FIELD without it (one of: "
                         f"{', '.join(sorted(IGNORABLE))}); repeatable")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="convert only this model (repeatable); an ensemble's steps must be "
                         "among them or already in OUT_REPO")
    ap.add_argument("--force", action="store_true",
                    help="replace bundles of the same names in OUT_REPO (default: such "
                         "models are refused)")
    a = ap.parse_args(argv)
    opts = Options(ignore=a.ignore, force=a.force)
    for b in a.batch_sizes:
        try:
            if "=" in b:
                n, lst = b.split("=", 1)
                opts.model_batch_sizes[n] = _sizes(lst)
            else:
                opts.batch_sizes = _sizes(b)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--batch-sizes {e}")
    for s in a.shape:
        m = re.fullmatch(r"([^:=]+):([^:=]+)=([0-9, ]+)", s)
        if not m:
            ap.error(f"--shape {s!r}: expected MODEL:INPUT=D1,D2,... (the extents without "
                     "the batch axis)")
        opts.shapes[(m.group(1), m.group(2))] = [int(d) for d in m.group(3).split(",")
                                                 if d.strip()]
    return a, opts


def main(argv=None) -> int:
    a, opts = parse_args(sys.argv[1:] if argv is None else argv)
    triton, out_repo = a.triton_repo, a.out_repo
    if not triton.is_dir():
        print(f"pjserve: error: {triton} is not a directory (the Triton model "
              "repository)", file=sys.stderr)
        return 2
    try:
        _, pb = _pb()
        import onnx  # noqa: F401
    except ImportError as e:
        print(f"pjserve: error: {sys.executable} lacks what the converter needs "
              f"({e.name or e}): no Python with onnx found: set PJSERVE_PYTHON to one that has "
              "onnx and tritonclient, or run make bootstrap-torch (.venv-torch)",
              file=sys.stderr)
        return 1
    if out_repo.resolve() == triton.resolve():
        print("pjserve: error: OUT_REPO must not be TRITON_REPO",
              file=sys.stderr)
        return 2
    out_repo.mkdir(parents=True, exist_ok=True)
    model_dirs = sorted(p for p in triton.iterdir() if p.is_dir() and not p.name.startswith("."))
    unknown = sorted(set(a.only) - {p.name for p in model_dirs})
    if unknown:
        print(f"pjserve: error: --only {', '.join(unknown)}: no such model in "
              f"{triton}", file=sys.stderr)
        return 2
    if a.only:
        model_dirs = [p for p in model_dirs if p.name in a.only]
    print(f"import-triton: {triton} -> {out_repo} ({len(model_dirs)} models; Python "
          f"{sys.executable})", flush=True)

    outcomes: Dict[str, Outcome] = {}
    configs = {}
    for d in model_dirs:
        o = outcomes[d.name] = Outcome(d.name, False)
        try:
            if not NAME_RE.match(d.name):
                raise Refused("a pjserve model name is letters, digits, '_', '.' and '-'")
            configs[d.name] = read_config(d)
            o.kind = "ensemble" if configs[d.name].platform == "ensemble" else ""
        except Refused as e:
            o.message = str(e)
    staging = Path(tempfile.mkdtemp(prefix=".import-triton-", dir=out_repo))
    try:
        # plain models first: ensembles check their steps against them
        order = sorted(outcomes, key=lambda n: outcomes[n].kind == "ensemble")
        for name in order:
            cfg, o, d = configs.get(name), outcomes[name], triton / name
            if cfg is None:  # refused as it was read
                _say(f"{name}: refused: {o.message}")
                continue
            start = time.monotonic()
            try:
                final = out_repo / name
                if final.exists() and not opts.force:
                    raise Refused(f"{final} exists: pass --force to replace it")
                if final.exists() and not ((final / "manifest.yaml").is_file()
                                           or not any(final.iterdir())):
                    raise Refused(f"{final} exists and is not a pjserve bundle; not replacing "
                                  "it")
                platform, backend = cfg.platform, cfg.backend
                if platform == "ensemble":
                    o.kind = "ensemble"
                    staged = import_ensemble(name, d, cfg, opts, staging, o, outcomes,
                                             out_repo, pb)
                elif platform == ONNX_PLATFORM or backend == ONNX_BACKEND or \
                        (not platform and not backend and
                         (d / "1" / (cfg.default_model_filename or "model.onnx")).exists()):
                    if platform and platform != ONNX_PLATFORM:
                        raise Refused(f"platform {platform!r} with backend {backend!r}: "
                                      "contradictory")
                    if backend and backend != ONNX_BACKEND:
                        raise Refused(f"backend {backend!r} with platform {platform!r}: "
                                      "contradictory")
                    o.kind = "onnx"
                    if not platform and not backend:
                        o.notes.append("no platform or backend: taken as an ONNX model "
                                       "(onnxruntime), from its model file")
                    staged = import_onnx(name, d, cfg, opts, staging, o, pb)
                elif platform == "pytorch_libtorch" or backend == "pytorch":
                    if platform and platform != "pytorch_libtorch" or \
                            backend and backend != "pytorch":
                        raise Refused(f"platform {platform!r} with backend {backend!r}: "
                                      "contradictory")
                    o.kind = "torchscript"
                    staged = import_onnx(name, d, cfg, opts, staging, o, pb, torchscript=True)
                else:
                    what = f"platform {platform!r}" if platform else f"backend {backend!r}"
                    if not platform and not backend:
                        what = "no platform or backend"
                    raise Refused(f"{what}: pjserve imports ONNX models (platform "
                                  f"{ONNX_PLATFORM!r} or backend {ONNX_BACKEND!r}) and "
                                  "ensembles; export this model's framework code with "
                                  "pjserve_export (export_jax, export_torch, export_keras, "
                                  "export_onnx: docs/exporter.md)")
                publish(staged, out_repo, name)
                o.ok = True
                _progress(f" done in {time.monotonic() - start:.1f} s\n")
            except Refused as e:
                o.message = str(e)
            except Exception as e:  # noqa: BLE001 - one model's failure is its own
                o.message = f"failed: {type(e).__name__}: {e}"
            if not o.ok:
                _say(f"{name}: refused: {o.message}")
            for n in o.notes:
                _say(f"  {name}: note: {n}")
        policy_path = None
        try:
            policy_path = write_policies(out_repo, list(outcomes.values()))
        except Refused as e:
            _say(f"import-triton: warning: {e}; the queue policies were not written")
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    ok = [o.name for o in outcomes.values() if o.ok]
    refused = [o for o in outcomes.values() if not o.ok]
    print(f"\nimport-triton: {len(ok)} converted, {len(refused)} refused")
    if ok:
        print(f"  converted: {', '.join(sorted(ok))}")
    for o in sorted(refused, key=lambda o: o.name):
        print(f"  refused: {o.name}: {o.message}")
    if ok:
        config = f" --config {policy_path}" if policy_path else ""
        print(f"serve with: pjserve serve --model-repository {out_repo}{config}")
    sys.stdout.flush()
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
