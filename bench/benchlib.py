"""What the benchmark drivers (bench/server_overhead.py, scheduler.py, residency.py)
share: the repository's paths, logging, free ports, HTTP GETs, a server run as
its own process with its output in a log file (pjserve serve: its command
line, /metrics scraped, stopped), the CPU time of a server's process tree,
Prometheus text parsed, the fingerprint of
the exported bench models, perf_analyzer (command line, one measurement
retried when unstable, its CSV), the check for the built tools, machine and
revision info, --parts, and saving the results (JSON, markdown, the Python
that plots).

Not run by itself: the drivers import it from their own directory, which
Python puts on sys.path for a script (.venv/bin/python bench/scheduler.py).
"""

import csv
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

# A benchmark's own JAX (exporting, reference answers) shares the device with
# the server under test: on a GPU it must not take three quarters of the
# device's memory up front, as XLA's client does by default.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ROOT = Path(__file__).resolve().parents[1]
# The binary measured: build/pjserve, or $PJSERVE_BIN (e.g. another revision's
# build, for a before/after table from one run of the same script).
PJSERVE = Path(os.environ.get("PJSERVE_BIN") or ROOT / "build" / "pjserve")
RAW = ROOT / "build" / "pjs_bench_raw_execute"
FLOOR = ROOT / "build" / "pjs_bench_grpc_floor"
PERF_ANALYZER = ROOT / "scripts" / "perf_analyzer"
# Pythons that may have matplotlib, first found wins.
PLOTTERS = (ROOT / ".venv-bench-plot" / "bin" / "python",
            ROOT / ".venv-bench-mlserver" / "bin" / "python")


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


# ---- where clients and servers run ------------------------------------------------

PLACEMENTS = ("split", "shared")
_server_cpus = None  # set by place(): the CPUs servers (and in-process limits) run on


def place(placement):
    """Puts this driver, and the clients it starts (perf_analyzer, the C
    client), on their CPUs, and records the servers' for ServerProcess and
    on_server_cpus. "split": the clients get the last CPU this process may
    run on, the servers the others, so that neither preempts the other and a
    wake-up crosses CPUs only between client and server; "shared" (or a
    machine of one CPU): everything may run anywhere. Returns what the
    results record: {"placement", "client_cpus", "server_cpus"}."""
    global _server_cpus
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "split" and len(cpus) >= 2:
        client, _server_cpus = [cpus[-1]], cpus[:-1]
        os.sched_setaffinity(0, client)
        return {"placement": "split", "client_cpus": client, "server_cpus": _server_cpus}
    _server_cpus = None
    return {"placement": "shared", "client_cpus": cpus, "server_cpus": cpus}


def server_cpu_count():
    """How many CPUs a server may run on (what its thread defaults follow)."""
    return len(_server_cpus) if _server_cpus else len(os.sched_getaffinity(0))


def on_server_cpus():
    """A preexec_fn that moves a child to the servers' CPUs (None: no move)."""
    if not _server_cpus:
        return None
    cpus = list(_server_cpus)
    return lambda: os.sched_setaffinity(0, cpus)


class ServerProcess:
    """Base of a driver's server: runs `self.cmd` in ROOT as a new session on
    the servers' CPUs (place()), its output into `self.log_path`; sets
    `self.proc` and `self.log_file`."""

    def start_process(self):
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=on_server_cpus())

    def log_tail(self, n=30):
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""

    def terminate(self, name, timeout):
        """SIGTERM to the process if it still runs, then up to `timeout` s for
        it to exit; False (logged as "{name} did not stop ...; killing it")
        when it did not."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log(f"{name} did not stop on SIGTERM within {timeout} s; killing it")
                return False
        return True


class PjserveProcess(ServerProcess):
    """Base of a driver's `pjserve serve` on `self.repository` with
    `self.cache` and the extra arguments `self.extra`."""

    scrape_timeout = 5.0

    def serve_command(self):
        """Picks free ports (self.http, self.grpc, self.metrics) and sets self.cmd."""
        self.http, self.grpc, self.metrics = free_ports(3)
        self.cmd = [str(PJSERVE), "serve", "--model-repository", str(self.repository),
                    "--host", "127.0.0.1", "--http-port", str(self.http),
                    "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics),
                    "--cache-dir", str(self.cache), *self.extra]

    def wait_models_ready(self, models, deadline, timeout, interval, shown=str):
        """Polls each model's ready endpoint in turn every `interval` s until
        all answer 200; RuntimeError when the process exits or at `deadline`
        (time.monotonic(); reported as "{shown(pending)} not ready after
        {timeout} s")."""
        pending = list(models)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pjserve exited with status {self.proc.returncode}:\n"
                                   + self.log_tail())
            if time.monotonic() > deadline:
                raise RuntimeError(f"pjserve: {shown(pending)} not ready after {timeout} s:\n"
                                   + self.log_tail())
            if http_get(f"http://127.0.0.1:{self.http}/v2/models/{pending[0]}/ready",
                        timeout=5.0)[0] == 200:
                pending.pop(0)
            else:
                time.sleep(interval)

    def scrape(self):
        status, body = http_get(f"http://127.0.0.1:{self.metrics}/metrics",
                                timeout=self.scrape_timeout)
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        return parse_metrics(body.decode())

    def stop(self):
        if self.proc is None:
            return
        if not self.terminate("pjserve", 60):
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()
        self.proc = None


# ---- CPU time of a process tree ---------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid):
    """(ppid, session, CPU seconds) of a process from /proc/PID/stat, None if
    it is gone. The CPU time is utime + stime (every thread of the process,
    exited ones included) + cutime + cstime (its children that exited and
    were waited for), in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after it.
    fields = text[text.rindex(")") + 2:].split()
    ppid, session = int(fields[1]), int(fields[3])
    ticks = sum(int(v) for v in fields[11:15])
    return ppid, session, ticks / CLOCK_TICKS


def process_tree(root):
    """{pid: CPU seconds} of `root` and every process below it: its
    descendants by parent pid, and whatever runs in the session it leads
    (a server started with start_new_session=True; catches daemonised
    helpers that were re-parented)."""
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                procs[int(entry)] = st
    children = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree = {pid for pid, (_, session, _) in procs.items() if session == root}
    todo = [root] if root in procs else []
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(c for c in children.get(pid, ()) if c not in tree)
    return {pid: procs[pid][2] for pid in tree}


def tree_cpu_seconds(root):
    """User + system CPU seconds used so far by the process tree of `root`
    (see process_tree); clock-tick resolution (usually 10 ms per process)."""
    return sum(process_tree(root).values())


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


# ---- bench models ---------------------------------------------------------------

def model_fingerprint(script):
    """What a driver's exported bench models depend on: (the text of `script`
    between the "# ---- the bench model" and "# ---- servers" headers, the
    sha256 hex digest of pjserve_export's sources)."""
    # Headers matched at a line start, so the strings here and in the
    # drivers do not match themselves.
    source = Path(script).read_text()
    definition = source[source.index("\n# ---- the bench model"):
                        source.index("\n# ---- servers")]
    exporter = hashlib.sha256(b"".join(
        p.read_bytes() for p in sorted((ROOT / "python" / "pjserve_export").glob("*.py"))))
    return definition, exporter.hexdigest()


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

def missing_tools(build=None, extra=()):
    """What the drivers need built, as "... is missing (hint)" for each absent:
    pjserve and pjs_bench_raw_execute in `build` (default build/), the
    executables named in `extra` there too, and perf_analyzer."""
    build = Path(build) if build is not None else PJSERVE.parent
    problems = []
    built = [build / PJSERVE.name, build / RAW.name, *(build / name for name in extra)]
    for path, hint in ([(p, f"cmake --build {_shown(build)}") for p in built] +
                       [(ROOT / ".venv-perf" / "bin" / "perf_analyzer", "scripts/bootstrap")]):
        if not path.exists():
            problems.append(f"{_shown(path)} is missing ({hint})")
    return problems


def _shown(path):
    """`path` relative to ROOT when it is inside it."""
    path = Path(path).absolute()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


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
    # what the servers run on: $PJSERVE_PJRT_PLUGIN (pjserve's default is the
    # .venv's XLA CPU plugin) and the GPU, where nvidia-smi names one
    info["pjrt_plugin"] = os.environ.get("PJSERVE_PJRT_PLUGIN") or "xla-cpu-pjrt (.venv)"
    info["accelerator"] = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            info["accelerator"] = out.stdout.strip().splitlines()[0]
    return info


def git_revision():
    """The revision of the tree the measured binary was built in (its
    build/ directory's parent), as `git describe` names it."""
    tree = PJSERVE.resolve().parent.parent
    out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                         text=True, cwd=tree if (tree / ".git").exists() else ROOT)
    return out.stdout.strip() or "?"


# ---- command line -----------------------------------------------------------------

def parse_parts(ap, text, parts):
    """--parts' comma-separated list, checked against `parts` (ap.error if not)."""
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    if not set(chosen) <= set(parts):
        ap.error(f"--parts: unknown {sorted(set(chosen) - set(parts))}")
    return chosen


# ---- results --------------------------------------------------------------------

def fmt(v, spec):
    return "-" if v is None else format(v, spec)


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


def write_report(result, started, path, markdown):
    """save_result, then markdown(result) (which may use what save_result
    added) next to it (.md) and printed."""
    save_result(result, started, path)
    md = markdown(result)
    path.with_suffix(".md").write_text(md)
    print()
    print(md)
    log(f"wrote {path} and {path.with_suffix('.md')}")


def replace_between_markers(path, begin, end, text):
    """Puts `text` between the lines `begin` and `end` of the document at
    `path` (its generated table); False, changing nothing, when either
    marker is missing."""
    doc = Path(path).read_text()
    if begin not in doc or end not in doc:
        return False
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    Path(path).write_text(head + begin + "\n" + text + end + tail)
    return True


def find_plotter():
    """The first of PLOTTERS that exists, or None."""
    return next((p for p in PLOTTERS if p.exists()), None)
