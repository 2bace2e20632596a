#!/usr/bin/env python3
"""Host tier benchmark: how fast pjserve reads a model's weights from its file.

    .venv/bin/python bench/host_tier.py          # or: make bench-host-tier

With --host-weight-budget the host floors are a cache: a model evicted from
both host memory and the device is read from its bundle's weights file when
it runs next. This measures that read against what the machine can do with
the same file, in one run:

  pjserve    for each --sizes S (MiB, default 64,256) one dense model of S MiB
             and a hard-linked copy under a second name (bench/residency.py's
             models), served with host and device budgets of 1.5 S each and
             prefetch off, so that requests alternating between them read each
             one's floor from its file every time. Per read: delta
             pjserve_host_weight_load_seconds_total over delta
             pjserve_host_weight_loads_total, each interval between two scrapes
             holding one read (the median of --rounds). Twice: "cold", the file
             dropped from the page cache (posix_fadvise DONTNEED) before each
             request, as a catalogue larger than memory would find it, and
             "page cache", as a recently used model would.
  raw        the same file read by this script, the same two ways: buffered
             16 MiB reads into one buffer (cold: after DONTNEED), and direct
             I/O (dd iflag=direct bs=16M), which bypasses the page cache: the
             disk's own rate.

A read by pjserve also allocates the floor (page faults) and checksums every
weight against the checksums taken when the model loaded (a changed file is
refused), so it cannot beat the raw buffered read; the table shows how close
it comes.

Writes bench/results/host_tier.json and .md. Needs build/pjserve and .venv.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, fmt, git_revision, log, machine_info
from residency import (MIB, Client, Pjserve, copy_bundle, export_models, make_repository, side,
                       total, weight_bytes, MODELS_DIR)

HOST_LOADS = "pjserve_host_weight_loads_total"
HOST_SECONDS = "pjserve_host_weight_load_seconds_total"
CHUNK = 16 * MIB


def drop_from_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd) if os.access(path, os.W_OK) else None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def buffered_read_s(path, cold):
    if cold:
        drop_from_page_cache(path)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


def direct_read_s(path):
    """dd's own timing of a direct-I/O read of the file."""
    r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                       capture_output=True, text=True, check=True)
    m = re.search(r"copied, ([0-9.]+) s", r.stderr)
    if m is None:
        raise RuntimeError(f"dd said: {r.stderr}")
    return float(m.group(1))


def pjserve_reads(server, client, names, files, rounds, cold):
    """Seconds of each floor read of `rounds` alternations between the two models."""
    per_read, odd = [], 0
    prev = server.scrape()
    for _ in range(rounds):
        for name in names:
            if cold:
                drop_from_page_cache(files[name])
            client.infer(name)
            cur = server.scrape()
            if total(cur, HOST_LOADS) - total(prev, HOST_LOADS) == 1:
                per_read.append(total(cur, HOST_SECONDS) - total(prev, HOST_SECONDS))
            else:
                odd += 1
            prev = cur
    return per_read, odd


def measure(size, path, rounds, cache, work):
    k = side(size)
    nbytes = weight_bytes(k)
    copy = copy_bundle(path, path.name + "_b", MODELS_DIR / "copies")
    repo = make_repository([path, copy], work / f"repo-{path.name}")
    budget = str(int(1.5 * nbytes))
    server = Pjserve(repo, cache, work / f"pjserve-{path.name}.log",
                     ["--host-weight-budget", budget, "--device-weight-budget", budget,
                      "--weight-prefetch", "false", "--warmup-runs", "0",
                      "--model-control-mode", "static"])
    names = [path.name, copy.name]
    files = {n: str(p / "weights.safetensors") for n, p in zip(names, (path, copy))}
    file_bytes = os.path.getsize(files[names[0]])
    log(f"{path.name}: {nbytes / MIB:.1f} MiB of weights")
    server.start(names)
    client = Client(server, k)
    row = {"size_mib": size, "weight_bytes": nbytes, "file_bytes": file_bytes}
    try:
        for n in names + names:
            client.infer(n)
        for mode, cold in (("cold", True), ("page_cache", False)):
            reads, odd = pjserve_reads(server, client, names, files, rounds, cold)
            s = statistics.median(reads) if reads else None
            row[f"pjserve_{mode}_read_ms"] = None if s is None else s * 1e3
            row[f"pjserve_{mode}_gb_per_s"] = None if not s else nbytes / s / 1e9
            row[f"pjserve_{mode}_reads"] = len(reads)
            row[f"pjserve_{mode}_intervals_without_one_read"] = odd
    finally:
        client.close()
        server.stop()
    f = files[names[0]]
    cold_s = statistics.median(buffered_read_s(f, True) for _ in range(rounds))
    warm_s = statistics.median(buffered_read_s(f, False) for _ in range(rounds))
    direct_s = statistics.median(direct_read_s(f) for _ in range(min(rounds, 3)))
    row.update({"raw_cold_gb_per_s": file_bytes / cold_s / 1e9,
                "raw_page_cache_gb_per_s": file_bytes / warm_s / 1e9,
                "raw_direct_gb_per_s": file_bytes / direct_s / 1e9})
    log(f"  pjserve cold {fmt(row['pjserve_cold_gb_per_s'], '.2f')} GB/s, page cache "
        f"{fmt(row['pjserve_page_cache_gb_per_s'], '.2f')} GB/s; raw cold "
        f"{row['raw_cold_gb_per_s']:.2f}, direct {row['raw_direct_gb_per_s']:.2f}, page cache "
        f"{row['raw_page_cache_gb_per_s']:.2f} GB/s")
    return row


def machine_line(m):
    return (f"{m.get('cpu', '?')}, {m.get('cores', '?')} CPUs, {m.get('memory_gib', '?')} GiB, "
            f"Debian {m.get('debian', '?')}")


def markdown(result):
    lines = [f"# Host tier: reading a model's weights from its file ({result['date']})", "",
             f"{machine_line(result['machine'])}; {result['rounds']} reads of each kind per "
             "size, medians.",
             "", "| weights | pjserve, cold | raw buffered, cold | raw direct I/O | pjserve, "
             "page cache | raw, page cache |", "|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['size_mib']} MiB | {fmt(r['pjserve_cold_gb_per_s'], '.2f')} GB/s "
            f"({fmt(r['pjserve_cold_read_ms'], '.0f')} ms) | {r['raw_cold_gb_per_s']:.2f} GB/s | "
            f"{r['raw_direct_gb_per_s']:.2f} GB/s | "
            f"{fmt(r['pjserve_page_cache_gb_per_s'], '.2f')} GB/s "
            f"({fmt(r['pjserve_page_cache_read_ms'], '.0f')} ms) | "
            f"{r['raw_page_cache_gb_per_s']:.2f} GB/s |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,256", help="MiB of weights per model (default 64,256)")
    ap.add_argument("--rounds", type=int, default=5, help="reads of each kind per size")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "host_tier.json")
    args = ap.parse_args(argv)
    sizes = [float(s) if "." in s else int(s) for s in args.sizes.split(",")]
    paths = export_models(sizes, False)
    started = time.strftime("%Y-%m-%d")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pjs-host-tier-") as tmp:
        work = Path(tmp)
        for s in sizes:
            rows.append(measure(s, paths[s], args.rounds, work / "cache", work))
    result = {"date": started, "machine": machine_info(), "revision": git_revision(),
              "rounds": args.rounds, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    args.json.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
