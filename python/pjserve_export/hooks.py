"""Bundles that carry C code: hooked models and meta models.

A *hooked* bundle is an exported model (`export_jax`) plus ``model.c``, whose
``pjserve_preprocess`` / ``pjserve_postprocess`` turn what clients send into
the executable's inputs and its outputs into what clients get; the manifest
declares the client side (``client_inputs`` / ``client_outputs``). A *meta*
bundle (`export_meta`) has no executable or weights at all: a manifest of
kind meta naming the sub-models its ``pjserve_run`` may call, the client
side, and ``model.c``. Both may carry other files the C code reads at load
(``pjserve_bundle_dir``), e.g. a labels file. include/pjserve/model.h is the
ABI; docs/hooks.md and docs/meta-models.md walk through both.

pjserve loads ``model.so``, built from ``model.c`` by ``pjserve build-hooks
BUNDLE``. A bundle is written into a staging directory and published with
one rename, so the build (when asked for with `build=`) runs before a
watching server can see the bundle: it never sees model.c without model.so.
"""

import shutil
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from . import bundle as B

HOOKS_SOURCE = "model.c"
HOOKS_LIBRARY = "model.so"

# How a file to add to a bundle is given: a path to copy, or its contents.
FileSource = Union[str, Path, bytes]
# Builds BUNDLE/model.so from BUNDLE/model.c (see `hooks_builder`).
Builder = Callable[[Path], None]

_REPO_INCLUDE = Path(__file__).resolve().parents[2] / "include"


def _check_extra_name(name) -> str:
    B.check_name("each extra file name", name)
    reserved = (B.MANIFEST_FILE, B.WEIGHTS_FILE, HOOKS_SOURCE, HOOKS_LIBRARY)
    if name in reserved or (name.startswith("model.") and name.endswith(".mlir")):
        raise ValueError(f"extra file {name!r} would replace a file the bundle format "
                         f"defines ({', '.join(reserved)}, model.*.mlir)")
    if name.startswith("."):
        raise ValueError(f"extra file {name!r}: names starting with '.' are not allowed")
    return name


def check_bundle_files(source: Optional[FileSource],
                       extra_files: Optional[Mapping[str, FileSource]]) -> None:
    """Fails early (before any export work) on a missing source or a bad name."""
    for what, f in [(HOOKS_SOURCE, source)] + list((extra_files or {}).items()):
        if what != HOOKS_SOURCE:
            _check_extra_name(what)
        if f is None:
            continue
        if not isinstance(f, (bytes, str, Path)):
            raise ValueError(f"{what}: give a path or the file's bytes, got {type(f).__name__}")
        if not isinstance(f, bytes) and not Path(f).is_file():
            raise ValueError(f"{what}: no such file {f}")


def add_bundle_files(staging: Path, source: Optional[FileSource],
                     extra_files: Optional[Mapping[str, FileSource]],
                     build: Optional[Builder]) -> None:
    """Copies model.c (`source`) and `extra_files` ({name in the bundle: path
    or bytes}) into `staging`, then runs `build` on it when given. Copies get
    the current time as their modification time, so a model.so built next is
    newer than its model.c."""
    check_bundle_files(source, extra_files)
    files = dict(extra_files or {})
    if source is not None:
        files[HOOKS_SOURCE] = source
    for name, f in files.items():
        dst = Path(staging) / name
        if isinstance(f, bytes):
            dst.write_bytes(f)
        else:
            shutil.copyfile(f, dst)
        dst.chmod(0o644)
    if build is not None:
        if source is None:
            raise ValueError("build= needs a model.c (source=)")
        build(Path(staging))


def hooks_builder(pjserve: Optional[Union[str, Path]] = None, *, cc: str = "cc",
                  include_dir: Optional[Union[str, Path]] = None) -> Builder:
    """A `build` for the exporters: ``pjserve build-hooks BUNDLE`` when the
    pjserve binary is given, else the same compilation by `cc` directly
    (``cc -std=c11 -O2 -fPIC -shared -Wall -I<include_dir> ... -lNAME... -lm``, a -lNAME
    for each of the manifest's hooks_libraries; include_dir defaults to
    this repository's include/, where pjserve/model.h lives)."""
    if pjserve is not None:
        binary = str(pjserve)

        def build(bundle_dir: Path) -> None:
            _run([binary, "build-hooks", str(bundle_dir)], bundle_dir)
        return build

    inc = Path(include_dir) if include_dir is not None else _REPO_INCLUDE
    if not (inc / "pjserve" / "model.h").is_file():
        raise ValueError(f"{inc}/pjserve/model.h not found: pass include_dir= (the directory "
                         "holding pjserve/model.h) or the pjserve binary")

    def build_cc(bundle_dir: Path) -> None:
        libraries = []
        if (bundle_dir / B.MANIFEST_FILE).is_file():
            libraries = B.read_manifest(bundle_dir).hooks_libraries
        _run([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", f"-I{inc}", "-o",
              str(bundle_dir / HOOKS_LIBRARY), str(bundle_dir / HOOKS_SOURCE)] +
             [f"-l{lib}" for lib in B.check_hooks_libraries(libraries)] + ["-lm"],
             bundle_dir)
    return build_cc


def _run(argv: Sequence[str], bundle_dir: Path) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"building the hooks of {bundle_dir.name} failed (exit code "
                         f"{r.returncode}): {' '.join(argv)}\n{r.stdout}{r.stderr}")


def export_meta(out_dir, *, name: str, calls: Sequence[str], client_inputs, client_outputs,
                source: FileSource, extra_files: Optional[Mapping[str, FileSource]] = None,
                description: Optional[str] = None, residency: str = "host",
                weight: float = 1.0, build: Optional[Builder] = None,
                decoupled: bool = False,
                hooks_libraries: Optional[Sequence[str]] = None) -> Path:
    """Writes the meta bundle ``out_dir/name/``; returns its path.

    calls: the sub-models ``pjserve_run`` may call (distinct names, not the
        meta itself; may be empty for a compute-only meta).
    client_inputs, client_outputs: what clients send and get: TensorSpecs or
        (name, dtype, shape) tuples (`bundle.tensor_spec`); dtype "bytes" and
        extents of -1 allowed.
    source: model.c (a path, or its bytes); it must define pjserve_run.
    extra_files: {file name in the bundle: path or bytes}, e.g. a vocabulary.
    build: run on the staged bundle before it is published, e.g.
        ``hooks_builder("build/pjserve")``; None leaves model.so to
        ``pjserve build-hooks``.
    decoupled: the run may send zero, one or many responses per request with
        ``pjserve_respond`` (served over gRPC ModelStreamInfer only).
    hooks_libraries: libraries model.c links with, as they follow -l.

    An existing bundle of the same name is replaced atomically."""
    B.check_name("name", name)
    if not isinstance(decoupled, bool):
        raise ValueError(f"decoupled must be True or False, got {decoupled!r}")
    calls = B.check_names("calls", calls)
    if name in calls:
        raise ValueError(f"meta {name!r} may not call itself")
    ins = B.check_client_tensors("client_inputs", client_inputs)
    outs = B.check_client_tensors("client_outputs", client_outputs)
    if not ins or not outs:
        raise ValueError("a meta needs client_inputs and client_outputs (non-empty)")
    clash = sorted({t.name for t in ins} & {t.name for t in outs})
    if clash:
        raise ValueError(f"names used for both a client input and a client output: {clash}")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"description must be a string, got {description!r}")
    if source is None:
        raise ValueError("a meta bundle needs its model.c (source=)")
    check_bundle_files(source, extra_files)
    manifest = B.Manifest(name=name, kind="meta", description=description, batch_sizes=[],
                          inputs=[], outputs=[], client_inputs=ins, client_outputs=outs,
                          calls=calls, residency=B.check_residency(residency),
                          weight=B.check_weight(weight), decoupled=decoupled,
                          hooks_libraries=B.check_hooks_libraries(hooks_libraries))
    with B.StagedBundle(out_dir, name) as staging:
        (staging / B.MANIFEST_FILE).write_text(B.manifest_yaml(manifest))
        add_bundle_files(staging, source, extra_files, build)
    return Path(out_dir) / name
