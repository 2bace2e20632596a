"""gpu_package - what scripts/gpu-check and scripts/gpu-bench share.

Both make a package here, where pjserve is built, that runs on a GPU machine
with no network and none of pjserve's build dependencies: the binaries, every
shared library they load except the C and C++ runtimes, bundles whose large
weights are written there from their safetensors header, and the script
itself. This module travels in both packages, beside the script.
"""

import glob
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
# A package is copied to a machine that may have no network: it stays small.
CARRY_LIMIT = 64 * MIB
# Libraries every Linux machine has (glibc's parts, the C++ runtime, the
# dynamic loader and the kernel's vDSO): never packaged.
SYSTEM_LIBRARIES = {
    "linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libpthread.so.0",
    "libdl.so.2", "librt.so.1", "libresolv.so.2", "libutil.so.1", "libanl.so.1",
    "libstdc++.so.6", "libgcc_s.so.1",
}


class UsageError(Exception):
    """A usage or packaging error: said, and the script exits 3."""


def library_closure(binary):
    """{soname: path} of every shared library `binary` loads, as ldd resolves them,
    less SYSTEM_LIBRARIES. UsageError when one is not found."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if out.returncode != 0:
        raise UsageError(f"ldd {binary} failed: {out.stderr.strip()}")
    libs, missing = {}, []
    for line in out.stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        name = Path(parts[0]).name
        if name in SYSTEM_LIBRARIES:
            continue
        if "=>" in parts and "not" in parts and "found" in parts:
            missing.append(name)
        elif "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs[name] = parts[2]
    if missing:
        raise UsageError(f"{binary} needs libraries ldd cannot find: {', '.join(missing)}")
    return libs


def venv_python(repo):
    """A python with jax and the exporter: None when this one has them, else the
    repository's .venv."""
    try:
        import jax  # noqa: F401
        return None
    except ImportError:
        candidate = repo / ".venv" / "bin" / "python"
        if candidate.exists():
            return candidate
        raise UsageError("packaging exports the demo bundles with jax: run scripts/bootstrap "
                         "(or make gpu-check / make gpu-bench), or run this script with "
                         ".venv/bin/python")


def tree_bytes(path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def gpu_present():
    """(True, what nvidia-smi lists) or (False, why not)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "nvidia-smi is not installed"
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    gpus = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
    if r.returncode != 0 or not gpus:
        return False, f"nvidia-smi lists no GPU ({(r.stderr or r.stdout).strip() or 'nothing'})"
    return True, gpus[0]


def find_cuda_plugin():
    """The CUDA PJRT plugin of an installed jax-cuda13-pjrt / jax-cuda12-pjrt."""
    if os.environ.get("PJSERVE_PJRT_PLUGIN"):
        return Path(os.environ["PJSERVE_PJRT_PLUGIN"])
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    roots += glob.glob("/opt/*/.venv/lib/python3*/site-packages")
    roots += glob.glob("/usr/local/lib/python3*/dist-packages")
    roots += glob.glob("/usr/lib/python3/dist-packages")
    for flavour in ("xla_cuda13", "xla_cuda12"):
        for root in roots:
            so = Path(root) / "jax_plugins" / flavour / "xla_cuda_plugin.so"
            if so.exists():
                return so
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def copy_binaries(out, binaries):
    """Copies each binary to out/bin and every library they need to out/lib;
    returns the sorted library names."""
    (out / "bin").mkdir(parents=True, exist_ok=True)
    (out / "lib").mkdir(exist_ok=True)
    libs = {}
    for binary in binaries:
        binary = Path(binary)
        if not binary.exists():
            raise UsageError(f"{binary} does not exist: build it first (make build)")
        shutil.copy2(binary, out / "bin" / binary.name)
        libs.update(library_closure(binary))
    for name, path in sorted(libs.items()):
        shutil.copyfile(path, out / "lib" / name)
    return sorted(libs)


def packaged_env(pkg):
    """os.environ with the package's lib/ first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(pkg / "lib") + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def split_safetensors(path):
    """(header bytes with their length prefix, size of the data after them)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = struct.pack("<Q", n) + f.read(n)
    return header, os.path.getsize(path) - len(header)
