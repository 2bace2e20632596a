"""Bundle layout: the manifest, file names, atomic publication, reading back.

A bundle is a directory ``<out_dir>/<name>/`` holding ``manifest.yaml``,
``model.b{N}.mlir`` for each compiled batch size N (and
``model.<variant>.b{N}.mlir`` for each input-shape variant), and
``weights.safetensors`` (see docs/bundle-format.md for the schema and
docs/exporter.md for how the exporter fills it in). A hooked bundle adds
``model.c`` (and the ``model.so`` built from it) and declares the tensors
clients see (``client_inputs`` / ``client_outputs``); a bundle of kind meta has
only the manifest, ``model.c`` and ``model.so`` (docs/hooks.md,
docs/meta-models.md). A model split into swap-in stages adds
``swap_in.s{k}.b{N}.mlir`` for each stage k and batch size N.

Nothing here depends on jax: examples/run_demo.py and the tests use
`read_manifest` and `random_inputs` to drive a server from a bundle alone.
"""

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import dtypes

FORMAT_VERSION = "2.0"
MANIFEST_FILE = "manifest.yaml"
WEIGHTS_FILE = "weights.safetensors"
RESIDENCIES = ("host", "device", "unpinned")
BATCH_AXIS = "batch"
BATCH_SIZE_MAX = 65536  # the server's limit (docs/bundle-format.md)
DEFAULT_VARIANT = "default"  # the top-level shapes, as the server names them
VARIANTS_MAX = 16  # variants besides the default (the server's limit)
SWAP_IN_STAGES_MIN = 2  # entries of swap_in_stages (the server's limits)
SWAP_IN_STAGES_MAX = 16

NAME_RE = re.compile(r"[A-Za-z0-9_.-]+\Z")


def module_file(batch_size: int, variant: Optional[str] = None) -> str:
    """File name of the module compiled for `batch_size` (of `variant`, when
    it is not None or "default")."""
    if variant is None or variant == DEFAULT_VARIANT:
        return f"model.b{int(batch_size)}.mlir"
    return f"model.{variant}.b{int(batch_size)}.mlir"


def swap_in_file(stage: int, batch_size: int) -> str:
    """File name of swap-in stage `stage`'s module compiled for `batch_size`."""
    return f"swap_in.s{int(stage)}.b{int(batch_size)}.mlir"


@dataclass
class TensorSpec:
    """One input or output as the manifest declares it.

    `shape` is the per-example shape (without the batch axis) when `batched`,
    the full shape otherwise. Client tensors (client_inputs / client_outputs)
    may have extents of -1 (any size) and the dtype "bytes"."""
    name: str
    dtype: str                      # manifest dtype name, e.g. "f32"
    shape: Tuple[int, ...]
    batched: bool = True
    format: Optional[str] = None    # inputs only: "NHWC" | "NCHW" (an image layout)
    # outputs only: a file in the bundle naming the classes, one per line
    # (clients asking for classification get "score:index:label")
    labels: Optional[str] = None

    def full_shape(self, n: int) -> Tuple[int, ...]:
        return ((n,) if self.batched else ()) + tuple(self.shape)

    @property
    def numpy_dtype(self) -> np.dtype:
        return dtypes.from_manifest(self.dtype)


@dataclass
class Variant:
    """An input-shape variant as the manifest declares it: the shapes of the
    tensors that differ from the top level, per example (without the batch
    axis) for batched tensors, in full otherwise."""
    name: str
    inputs: Dict[str, Tuple[int, ...]]
    outputs: Dict[str, Tuple[int, ...]] = field(default_factory=dict)


@dataclass
class SwapInStage:
    """One entry of swap_in_stages: the weights the stage's module takes (in
    argument_order order) and the tensors it hands to the next stage (empty
    on the last stage, which returns the model's outputs)."""
    weights: List[str]
    outputs: List[TensorSpec] = field(default_factory=list)


@dataclass
class Manifest:
    name: str
    batch_sizes: List[int]
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    description: Optional[str] = None
    residency: str = "host"
    weight: float = 1.0
    kind: str = "model"
    format_version: str = FORMAT_VERSION
    variants: List[Variant] = field(default_factory=list)  # besides the default
    # What clients see of a hooked model (empty: the executable's own inputs
    # and outputs) or of a meta (always declared).
    client_inputs: List[TensorSpec] = field(default_factory=list)
    client_outputs: List[TensorSpec] = field(default_factory=list)
    calls: Optional[List[str]] = None  # kind meta: the sub-models its run may call
    decoupled: bool = False  # kind meta: may send many responses per request (ModelStreamInfer)
    # A stateful model (kind model): (state input, state output) pairs the
    # server carries from one request of a sequence to the next, and the
    # sequence section's limits (None: the server's defaults).
    sequence_state: List[Tuple[str, str]] = field(default_factory=list)
    # Control inputs the server fills per step: {"start"|"end"|"ready"|
    # "corrid": input name}.
    sequence_controls: Dict[str, str] = field(default_factory=dict)
    idle_timeout_ms: Optional[int] = None
    max_sequences: Optional[int] = None
    max_sequences_per_client: Optional[int] = None
    evict_after_idle_ms: Optional[int] = None
    # Libraries model.c links with, as they follow -l (pjserve build-hooks
    # appends -lNAME); kinds model and meta.
    hooks_libraries: List[str] = field(default_factory=list)
    # A model split into stages for its first execution after its weights
    # were copied to the device (kind model; empty: not split).
    swap_in_stages: List[SwapInStage] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # keys this reader does not know

    def variant_names(self) -> List[str]:
        """"default", then the manifest's variants in order."""
        return [DEFAULT_VARIANT] + [v.name for v in self.variants]

    def _variant(self, name: str) -> Optional[Variant]:
        if name == DEFAULT_VARIANT:
            return None
        for v in self.variants:
            if v.name == name:
                return v
        raise ValueError(f"model {self.name!r} has no variant {name!r}; "
                         f"it has {self.variant_names()}")

    def variant_inputs(self, name: str = DEFAULT_VARIANT) -> List[TensorSpec]:
        """The inputs of variant `name`, with its shapes."""
        v = self._variant(name)
        return [replace(t, shape=tuple(v.inputs[t.name])) if v and t.name in v.inputs else t
                for t in self.inputs]

    def variant_outputs(self, name: str = DEFAULT_VARIANT) -> List[TensorSpec]:
        """The outputs of variant `name`, with its shapes."""
        v = self._variant(name)
        return [replace(t, shape=tuple(v.outputs[t.name])) if v and t.name in v.outputs else t
                for t in self.outputs]


# ---- validation ------------------------------------------------------------

def check_name(what: str, name) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"{what} must be a non-empty string of letters, digits, '_', '.' "
                         f"or '-', got {name!r}")
    return name


IMAGE_FORMATS = ("NHWC", "NCHW")


def check_input_formats(formats: Optional[Mapping[str, str]], input_names: Sequence[str],
                        shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, str]:
    """{input name: "NHWC" | "NCHW"}, checked: known inputs with three extents
    per example (the server refuses any other layout declaration)."""
    if formats is None:
        return {}
    if not isinstance(formats, Mapping):
        raise ValueError(f"input_formats must be a mapping of input names to NHWC or NCHW, "
                         f"got {formats!r}")
    out = {}
    for name, fmt in formats.items():
        if name not in input_names:
            raise ValueError(f"input_formats names {name!r}, which is not an input "
                             f"(inputs: {list(input_names)})")
        if fmt not in IMAGE_FORMATS:
            raise ValueError(f"input_formats[{name!r}] must be NHWC or NCHW, got {fmt!r}")
        if len(shapes[name]) != 3:
            raise ValueError(f"input_formats[{name!r}]: an image layout needs three extents "
                             f"per example, the input has shape {tuple(shapes[name])}")
        out[name] = fmt
    return out


def tensor_spec(name: str, dtype, shape: Sequence, format: Optional[str] = None) -> TensorSpec:
    """A client tensor: `shape` as the manifest writes it, its first element
    may be "batch"; -1 marks an extent that varies. `dtype` is a manifest name
    (bytes included) or a numpy dtype. `format` (NHWC | NCHW): the layout of
    an image input."""
    shape = list(shape)
    batched = bool(shape) and shape[0] == BATCH_AXIS
    dt = dtype if isinstance(dtype, str) else dtypes.manifest_name(dtype)
    return TensorSpec(name=name, dtype=dt, shape=tuple(shape[1:] if batched else shape),
                      batched=batched, format=format)


MAX_RANK = 8  # the server's limit (pjserve/model.h PJSERVE_MAX_RANK)


def check_client_tensors(what: str, specs) -> List[TensorSpec]:
    """client_inputs or client_outputs: TensorSpecs (or (name, dtype, shape
    [, format]) tuples as `tensor_spec` takes them) with unique names, known
    dtypes (bytes allowed) and extents >= -1; only inputs may have a format."""
    if specs is None or isinstance(specs, (str, bytes)):
        raise ValueError(f"{what} must be a list of tensors, got {specs!r}")
    out = []
    for s in specs:
        if not isinstance(s, TensorSpec):
            if not isinstance(s, (tuple, list)) or len(s) not in (3, 4):
                raise ValueError(f"each of {what} must be a TensorSpec or a (name, dtype, "
                                 f"shape[, format]) tuple, got {s!r}")
            s = tensor_spec(*s)
        check_name(f"each name of {what}", s.name)
        if s.dtype not in dtypes.CLIENT_MANIFEST_NAMES:
            raise ValueError(f"{what} {s.name!r}: dtype must be one of "
                             f"{', '.join(dtypes.CLIENT_MANIFEST_NAMES)}, got {s.dtype!r}")
        rank = len(s.shape) + (1 if s.batched else 0)
        if rank > MAX_RANK:
            raise ValueError(f"{what} {s.name!r}: at most {MAX_RANK} extents, got {rank}")
        for d in s.shape:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < -1:
                raise ValueError(f"{what} {s.name!r}: extents are ints >= 0, or -1 for one "
                                 f"that varies; got shape {list(s.shape)}")
        if s.format is not None:
            if what != "client_inputs":
                raise ValueError(f"{what} {s.name!r}: only inputs have an image format")
            check_input_formats({s.name: s.format}, [s.name], {s.name: s.shape})
        if s.labels is not None:
            if what != "client_outputs":
                raise ValueError(f"{what} {s.name!r}: only outputs have labels")
            check_labels(s)
        out.append(TensorSpec(s.name, s.dtype, tuple(int(d) for d in s.shape), s.batched,
                              s.format, s.labels))
    check_names(what, [s.name for s in out])
    return out


def check_labels(spec: TensorSpec) -> None:
    """An output's labels file: a plain file name in the bundle, on an output
    with numbers to rank (the server refuses labels on bool and bytes)."""
    check_name(f"output {spec.name!r}: labels file", spec.labels)
    if spec.labels.startswith("."):
        raise ValueError(f"output {spec.name!r}: labels file {spec.labels!r} must not start "
                         "with '.'")
    if spec.dtype in ("bool", "bytes"):
        raise ValueError(f"output {spec.name!r} is {spec.dtype}: only numeric outputs have "
                         "classes to label")


def check_names(what: str, names: Sequence[str], expected_count: Optional[int] = None,
                counted: str = "") -> List[str]:
    if isinstance(names, str):
        raise ValueError(f"{what} must be a sequence of names, not the string {names!r}")
    names = list(names)
    for n in names:
        check_name(f"each of {what}", n)
    if expected_count is not None and len(names) != expected_count:
        raise ValueError(f"{what} has {len(names)} name(s) {names} but {counted} "
                         f"has {expected_count}")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"{what} must be unique; repeated: {dups}")
    return names


def check_batch_sizes(batch_sizes) -> List[int]:
    try:
        sizes = list(batch_sizes)
    except TypeError:
        raise ValueError(f"batch_sizes must be a sequence of ints, got {batch_sizes!r}") from None
    if not sizes:
        raise ValueError("batch_sizes must not be empty")
    for b in sizes:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"batch_sizes must be positive ints, got {batch_sizes!r}")
    sizes = [int(b) for b in sizes]
    if max(sizes) > BATCH_SIZE_MAX:
        raise ValueError(f"batch_sizes must be at most {BATCH_SIZE_MAX}, got {max(sizes)}")
    if any(a >= b for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"batch_sizes must be strictly ascending, got {sizes}")
    return sizes


def check_residency(residency) -> str:
    if residency not in RESIDENCIES:
        raise ValueError(f"residency must be one of {RESIDENCIES}, got {residency!r}")
    return residency


def check_weight(weight) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(weight)) or float(weight) <= 0:
        raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
    return float(weight)


# ---- writing ---------------------------------------------------------------

def _yaml_str(s: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar, and quoting keeps
    # names like "true", "1e3" or "null" strings.
    return json.dumps(s, ensure_ascii=True)


def _yaml_shape(shape, batched: bool) -> str:
    dims = ([BATCH_AXIS] if batched else []) + [str(int(d)) for d in shape]
    return f"[{', '.join(dims)}]"


def _yaml_tensor(t: TensorSpec) -> str:
    fmt = f", format: {t.format}" if t.format else ""
    labels = f", labels: {_yaml_str(t.labels)}" if t.labels else ""
    return (f"  - {{name: {_yaml_str(t.name)}, dtype: {t.dtype}, "
            f"shape: {_yaml_shape(t.shape, t.batched)}{fmt}{labels}}}\n")


def _yaml_shapes(shapes: Dict[str, Tuple[int, ...]], specs: List[TensorSpec]) -> str:
    batched = {t.name: t.batched for t in specs}
    return "{" + ", ".join(f"{_yaml_str(n)}: {_yaml_shape(s, batched[n])}"
                           for n, s in shapes.items()) + "}"


def _yaml_variant(v: Variant, m: "Manifest") -> str:
    out = f"  - name: {_yaml_str(v.name)}\n    inputs: {_yaml_shapes(v.inputs, m.inputs)}\n"
    if v.outputs:
        out += f"    outputs: {_yaml_shapes(v.outputs, m.outputs)}\n"
    return out


def _yaml_tensors(key: str, specs: List[TensorSpec]) -> List[str]:
    return [f"{key}:\n"] + [_yaml_tensor(t) for t in specs]


def _yaml_swap_in_stage(stage: SwapInStage) -> str:
    out = f"  - weights: [{', '.join(_yaml_str(w) for w in stage.weights)}]\n"
    if stage.outputs:
        out += "    outputs:\n" + "".join("    " + _yaml_tensor(t) for t in stage.outputs)
    return out


def manifest_yaml(m: Manifest) -> str:
    """The manifest.yaml text for `m` (kind model, hooked or not, or meta)."""
    out = [f'format_version: "{m.format_version}"\n',
           f"name: {_yaml_str(m.name)}\n",
           f"kind: {m.kind}\n"]
    if m.description is not None:
        out.append(f"description: {_yaml_str(m.description)}\n")
    if m.kind == "meta":
        calls = ", ".join(_yaml_str(c) for c in (m.calls or []))
        out.append(f"meta:\n  calls: [{calls}]\n")
    else:
        out.append(f"batch_sizes: [{', '.join(str(b) for b in m.batch_sizes)}]\n")
        out += _yaml_tensors("inputs", m.inputs)
        out += _yaml_tensors("outputs", m.outputs)
        if m.variants:
            out.append("variants:\n")
            out += [_yaml_variant(v, m) for v in m.variants]
        if m.swap_in_stages:
            out.append("swap_in_stages:\n")
            out += [_yaml_swap_in_stage(st) for st in m.swap_in_stages]
    if m.client_inputs or m.kind == "meta":
        out += _yaml_tensors("client_inputs", m.client_inputs)
    if m.client_outputs or m.kind == "meta":
        out += _yaml_tensors("client_outputs", m.client_outputs)
    out.append(f"residency: {m.residency}\n")
    out.append(f"weight: {m.weight!r}\n")
    if m.decoupled:
        out.append("decoupled: true\n")
    if m.hooks_libraries:
        out.append(f"hooks_libraries: [{', '.join(_yaml_str(x) for x in m.hooks_libraries)}]\n")
    if m.sequence_state or m.sequence_controls:
        out.append("sequence:\n")
        if m.sequence_state:
            out.append("  state:\n")
            out += [f"    - {{input: {_yaml_str(i)}, output: {_yaml_str(o)}, initial: zeros}}\n"
                    for i, o in m.sequence_state]
        if m.sequence_controls:
            out.append("  controls:\n")
            out += [f"    {k}: {_yaml_str(v)}\n" for k, v in m.sequence_controls.items()]
        if m.idle_timeout_ms is not None:
            out.append(f"  idle_timeout_ms: {int(m.idle_timeout_ms)}\n")
        if m.max_sequences is not None:
            out.append(f"  max_sequences: {int(m.max_sequences)}\n")
        if m.max_sequences_per_client is not None:
            out.append(f"  max_sequences_per_client: {int(m.max_sequences_per_client)}\n")
        if m.evict_after_idle_ms is not None:
            out.append(f"  evict_after_idle_ms: {int(m.evict_after_idle_ms)}\n")
    return "".join(out)


_LIBRARY_NAME = re.compile(r"[A-Za-z0-9_+.][A-Za-z0-9_+.-]{0,63}")


def check_hooks_libraries(libraries) -> List[str]:
    """hooks_libraries: names as they follow -l (``turbojpeg`` for
    -lturbojpeg): 1 to 64 of [A-Za-z0-9_+.-], not starting with '-', each
    once, as the server's manifest parser requires."""
    if libraries is None:
        return []
    if isinstance(libraries, (str, bytes)):
        raise ValueError(f"hooks_libraries must be a list of names, got {libraries!r}")
    out = []
    for lib in libraries:
        if not isinstance(lib, str) or not _LIBRARY_NAME.fullmatch(lib):
            raise ValueError(f"hooks_libraries: {lib!r} is not a library name as it follows -l "
                             "(1 to 64 of [A-Za-z0-9_+.-], not starting with '-')")
        if lib in out:
            raise ValueError(f"hooks_libraries: {lib!r} is listed twice")
        out.append(lib)
    return out


def check_sequence_state(sequence_state, input_names: Sequence[str],
                         output_names: Sequence[str]) -> List[Tuple[str, str]]:
    """[(state input, state output)], each naming an input and an output once."""
    pairs = []
    for entry in sequence_state:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"sequence_state entries are (input name, output name) pairs, "
                             f"got {entry!r}")
        i, o = str(entry[0]), str(entry[1])
        if i not in input_names:
            raise ValueError(f"sequence_state: {i!r} is not one of the inputs {list(input_names)}")
        if o not in output_names:
            raise ValueError(f"sequence_state: {o!r} is not one of the outputs "
                             f"{list(output_names)}")
        if any(i == a or o == b for a, b in pairs):
            raise ValueError(f"sequence_state: {entry!r} reuses a tensor of another pair")
        pairs.append((i, o))
    return pairs


SEQUENCE_CONTROLS = ("start", "end", "ready", "corrid")


def check_sequence_controls(controls, input_names: Sequence[str],
                            state_pairs: Sequence[Tuple[str, str]]) -> Dict[str, str]:
    """{control: input name} (controls in SEQUENCE_CONTROLS, each naming an
    input that is neither state nor another control), in SEQUENCE_CONTROLS
    order; checks that clients still send at least one input."""
    controls = dict(controls or {})
    unknown = sorted(set(controls) - set(SEQUENCE_CONTROLS))
    if unknown:
        raise ValueError(f"sequence_controls: unknown controls {unknown}; known: "
                         f"{list(SEQUENCE_CONTROLS)}")
    taken = {i for i, _ in state_pairs}
    out = {}
    for k in SEQUENCE_CONTROLS:
        if k not in controls:
            continue
        name = str(controls[k])
        if name not in input_names:
            raise ValueError(f"sequence_controls: {k}: {name!r} is not one of the inputs "
                             f"{list(input_names)}")
        if name in taken:
            raise ValueError(f"sequence_controls: {k}: {name!r} already takes state or "
                             "another control")
        taken.add(name)
        out[k] = name
    if taken and len(taken) == len(input_names):
        raise ValueError("sequence_state / sequence_controls take every input; clients must "
                         "send at least one")
    return out


class StagedBundle:
    """A bundle directory built under a hidden temporary name next to its final
    place and moved there in one rename, so a server watching `out_dir` never
    sees a half-written bundle.

        with StagedBundle(out_dir, name) as staging:
            (staging / "manifest.yaml").write_text(...)
        # now out_dir/name exists
    """

    def __init__(self, out_dir, name: str):
        self.out_dir = Path(out_dir)
        self.name = name
        self.final = self.out_dir / name
        self.tmp: Optional[Path] = None

    def __enter__(self) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.final.exists() and not _replaceable(self.final):
            raise ValueError(f"{self.final} exists and is not a pjserve bundle; "
                             "refusing to replace it")
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}.tmp-", dir=self.out_dir))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        os.chmod(self.tmp, 0o755)  # mkdtemp makes it 0700
        old = None
        if self.final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.name}.old-", dir=self.out_dir))
            os.rename(self.final, old / self.name)
        os.rename(self.tmp, self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


def _replaceable(path: Path) -> bool:
    if not path.is_dir():
        return False
    return (path / MANIFEST_FILE).is_file() or not any(path.iterdir())


# ---- reading ---------------------------------------------------------------

def _parse_tensor(entry, where: str) -> TensorSpec:
    shape = list(entry["shape"])
    batched = bool(shape) and shape[0] == BATCH_AXIS
    dims = shape[1:] if batched else shape
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ValueError(f"{where}.shape: dimension {d!r} is not an int")
    fmt, labels = entry.get("format"), entry.get("labels")
    return TensorSpec(name=str(entry["name"]), dtype=str(entry["dtype"]), shape=tuple(dims),
                      batched=batched, format=None if fmt is None else str(fmt),
                      labels=None if labels is None else str(labels))


def _variant_shapes(mapping, where: str) -> Dict[str, Tuple[int, ...]]:
    shapes = {}
    for name, shape in (mapping or {}).items():
        dims = list(shape)[1:] if list(shape)[:1] == [BATCH_AXIS] else list(shape)
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, int):
                raise ValueError(f"{where}.{name}: dimension {d!r} is not an int")
        shapes[str(name)] = tuple(dims)
    return shapes


def _parse_variant(entry, where: str) -> Variant:
    return Variant(name=str(entry["name"]),
                   inputs=_variant_shapes(entry.get("inputs"), f"{where}.inputs"),
                   outputs=_variant_shapes(entry.get("outputs"), f"{where}.outputs"))


def read_manifest(bundle_dir) -> Manifest:
    """Parses `bundle_dir`/manifest.yaml (needs PyYAML). Not a validator: the
    server is the authority on what it accepts."""
    import yaml  # optional dependency: only readers need it

    path = Path(bundle_dir) / MANIFEST_FILE
    doc = yaml.safe_load(path.read_text())
    known = {"format_version", "name", "kind", "description", "batch_sizes", "inputs",
             "outputs", "variants", "residency", "weight", "client_inputs", "client_outputs",
             "meta", "decoupled", "sequence", "hooks_libraries", "swap_in_stages"}

    def tensors(key):
        return [_parse_tensor(e, f"{key}[{i}]") for i, e in enumerate(doc.get(key) or [])]

    meta = doc.get("meta")
    sequence = doc.get("sequence") or {}
    return Manifest(
        name=str(doc["name"]),
        kind=str(doc.get("kind", "model")),
        format_version=str(doc.get("format_version")),
        description=doc.get("description"),
        batch_sizes=[int(b) for b in doc.get("batch_sizes") or []],
        inputs=tensors("inputs"),
        outputs=tensors("outputs"),
        variants=[_parse_variant(e, f"variants[{i}]")
                  for i, e in enumerate(doc.get("variants") or [])],
        residency=str(doc.get("residency", "host")),
        weight=float(doc.get("weight", 1.0)),
        client_inputs=tensors("client_inputs"),
        client_outputs=tensors("client_outputs"),
        calls=None if meta is None else [str(c) for c in meta.get("calls") or []],
        decoupled=bool(doc.get("decoupled", False)),
        sequence_state=[(str(e["input"]), str(e["output"])) for e in sequence.get("state") or []],
        sequence_controls={str(k): str(v) for k, v in (sequence.get("controls") or {}).items()},
        idle_timeout_ms=sequence.get("idle_timeout_ms"),
        max_sequences=sequence.get("max_sequences"),
        max_sequences_per_client=sequence.get("max_sequences_per_client"),
        evict_after_idle_ms=sequence.get("evict_after_idle_ms"),
        hooks_libraries=[str(x) for x in doc.get("hooks_libraries") or []],
        swap_in_stages=[
            SwapInStage(weights=[str(w) for w in e.get("weights") or []],
                        outputs=[_parse_tensor(t, f"swap_in_stages[{i}].outputs[{j}]")
                                 for j, t in enumerate(e.get("outputs") or [])])
            for i, e in enumerate(doc.get("swap_in_stages") or [])],
        extra={k: v for k, v in doc.items() if k not in known},
    )


def random_inputs(manifest: Manifest, n: int, seed: int = 0,
                  variant: str = DEFAULT_VARIANT) -> dict:
    """Deterministic random inputs {name: array} for a batch of `n` examples
    at the shapes of `variant`.

    Floats are standard normal, signed ints in [-5, 5], unsigned in [0, 10],
    bools fair coin flips; cast to each input's manifest dtype."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in manifest.variant_inputs(variant):
        shape = spec.full_shape(n)
        dt = spec.numpy_dtype
        if dt == np.bool_:
            a = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dt, np.unsignedinteger):
            a = rng.integers(0, 11, size=shape).astype(dt)
        elif np.issubdtype(dt, np.integer):
            a = rng.integers(-5, 6, size=shape).astype(dt)
        else:
            a = rng.standard_normal(size=shape).astype(np.float32).astype(dt)
        out[spec.name] = a
    return out
