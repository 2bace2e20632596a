"""What the benchmark drivers (bench/server_overhead.py, scheduler.py, residency.py)
share: the repository's paths, logging, free ports, HTTP GETs, a server run as
its own process with its output in a log file, Prometheus text parsed,
perf_analyzer (command line, one measurement retried when unstable, its CSV),
the check for the built tools, machine and revision info, and saving the
results.

Not run by itself: the drivers import it from their own directory, which
Python puts on sys.path for a script (.venv/bin/python bench/scheduler.py).
"""

import csv
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PJSERVE = ROOT / "build" / "pjserve"
RAW = ROOT / "build" / "pjs_bench_raw_execute"
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- servers ------------------------------------------------------------------

def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def http_get(url, timeout):
    """(status, body) of a GET; (None, b"") when nothing answers in `timeout` s."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


class ServerProcess:
    """Base of a driver's server: runs `self.cmd` in ROOT as a new session, its
    output into `self.log_path`; sets `self.proc` and `self.log_file`."""

    def start_process(self):
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, n=30):
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


# ---- metrics --------------------------------------------------------------------

METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text -> {(name, frozenset of (label, value)): float}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        if m:
            labels = frozenset(LABEL.findall(m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(sample, name, model, **labels):
    """Sum of the samples of `name` for `model` carrying `labels` (0 if none)."""
    total = 0.0
    for (n, ls), v in sample.items():
        if n != name:
            continue
        d = dict(ls)
        if d.get("model") == model and all(d.get(k) == v2 for k, v2 in labels.items()):
            total += v
    return total


# ---- perf_analyzer ------------------------------------------------------------

def pa_command(model, url, protocol, concurrency, window_ms, stability, max_trials,
               csv_path):
    """perf_analyzer with batch-1 requests at one concurrency, p50 as the
    stability criterion, the verbose CSV into csv_path."""
    return [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol,
            "-b", "1", "--concurrency-range", str(concurrency),
            "--measurement-interval", str(window_ms), "--percentile", "50",
            "--stability-percentage", str(stability), "--max-trials", str(max_trials),
            "-f", str(csv_path), "--verbose-csv"]


def run_perf_analyzer(command, csv_path, stability, what, tag):
    """One perf_analyzer measurement, `command(tolerance)` being its command
    line; on an unstable one, retries once with twice the tolerance. Raises
    RuntimeError when both fail ("perf_analyzer failed {what}: ..."); logs the
    retry as "{tag}: not stable ...". Returns {"stability_percentage",
    "wall_s"} of the run that wrote csv_path."""
    for attempt, tolerance in enumerate((stability, 2 * stability)):
        cmd = command(tolerance)
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"perf_analyzer {what} did not finish in 300 s:\n"
                               f"{' '.join(cmd)}")
        wall = time.monotonic() - t0
        if out.returncode == 0 and csv_path.exists():
            break
        if attempt == 1 or "stable" not in out.stdout + out.stderr:
            raise RuntimeError(f"perf_analyzer failed {what}:\n{' '.join(cmd)}\n"
                               f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
        log(f"{tag}: not stable within {tolerance}%, retrying with {2 * tolerance}%")
    return {"stability_percentage": tolerance, "wall_s": round(wall, 2)}


def read_pa_csv(csv_path):
    """The first row of perf_analyzer's CSV (a dict by column); deletes the file."""
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    csv_path.unlink()
    return row


# ---- environment ----------------------------------------------------------------

def missing_tools():
    """What the drivers need built, as "... is missing (hint)" for each absent."""
    problems = []
    for path, hint in ((PJSERVE, "cmake --build build"), (RAW, "cmake --build build"),
                       (ROOT / ".venv-perf" / "bin" / "perf_analyzer", "scripts/bootstrap")):
        if not path.exists():
            problems.append(f"{path.relative_to(ROOT)} is missing ({hint})")
    return problems


def machine_info(glibc=False):
    info = {"cpu": "?", "cores": os.cpu_count(), "platform": platform.platform()}
    if glibc:
        info["glibc"] = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "?"
    info["python"] = platform.python_version()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
        info["debian"] = open("/etc/debian_version").read().strip()
    except OSError:
        pass
    return info


def git_revision():
    out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                         text=True, cwd=ROOT)
    return out.stdout.strip() or "?"


# ---- results --------------------------------------------------------------------

def remove_workdir(work, keep):
    if keep:
        log(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def save_result(result, started, path):
    """Adds the end's load average, the elapsed time and the date to `result`
    and writes it to `path` as JSON."""
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = round(time.time() - started, 1)
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
