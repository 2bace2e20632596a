"""NodeProcess: `pjserve node` on free local ports, as ServerProcess runs
`pjserve serve` (tests/protocol/protocol_util.py), plus what the node tests
read: its status (GET /v2/pjserve/node, or the status file in its run
directory while the worker cannot answer), its workers' pids, and waits
for a condition with a bound (a hang guard, not a timed assertion).
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, List, Optional

from protocol_util import REPO, ServerProcess, free_ports, http_json

# Seconds a worker may take to be restarted and ready again (the executable
# cache is warm; the bound only guards against a hang).
RESTART_TIMEOUT_S = 60


# NodeProcess(run_dir=DEFAULT_RUN_DIR): --run-dir workdir/run.
DEFAULT_RUN_DIR = object()


class NodeProcess(ServerProcess):
    """One `pjserve node` (stderr kept in a file); its run directory is
    workdir/run unless run_dir names another (a path given as --run-dir, or
    None: no --run-dir, the node makes its own), so the status file and
    token are where a test looks."""

    def __init__(self, *args, run_dir=DEFAULT_RUN_DIR, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_dir_flag = self.workdir / "run" if run_dir is DEFAULT_RUN_DIR else run_dir
        self.run_dir = self.run_dir_flag
        self.known_worker_pids = set()

    @property
    def status_file(self) -> Path:
        return self.run_dir / "node-status.json"

    def launch(self):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.argv = [str(self.binary), "node",
                     "--model-repository", str(self.repository),
                     "--host", "127.0.0.1",
                     "--http-port", str(self.http_port),
                     "--grpc-port", str(self.grpc_port),
                     "--metrics-port", str(self.metrics_port),
                     "--pjrt-plugin", str(self.plugin),
                     "--cache-dir", str(self.cache_dir)] + \
            (["--run-dir", str(self.run_dir_flag)] if self.run_dir_flag is not None else []) + \
            self.extra_args
        env = dict(os.environ)
        env.setdefault("PJSERVE_LOG_LEVEL", "info")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL)
        return self

    def start(self, ready_timeout: float = None):
        self.launch()
        if ready_timeout is None:
            self.wait_ready(float(os.environ.get("PJSERVE_READY_TIMEOUT", "240")))
        else:
            self.wait_ready(ready_timeout)
        # The node marks a worker ready at its next probe, after the worker
        # answered the health probe above.
        self.wait_for("every worker ready in /v2/pjserve/node",
                      lambda: all(w["state"] == "ready" for w in self.status()["workers"]))
        self.remember_workers()
        return self

    # ---- status ------------------------------------------------------------

    def status(self) -> dict:
        """GET /v2/pjserve/node on the public REST port."""
        code, doc, raw = http_json(self.http_url, "GET", "/v2/pjserve/node", timeout=10)
        assert code == 200, f"GET /v2/pjserve/node: {code} {raw[:200]!r}"
        return doc

    def status_from_file(self) -> Optional[dict]:
        if self.run_dir is None:
            return None
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def remember_workers(self):
        doc = self.status_from_file()
        for w in (doc or {}).get("workers", []):
            if w.get("pid"):
                self.known_worker_pids.add(w["pid"])

    def worker(self, i: int = 0, from_file: bool = True) -> dict:
        doc = self.status_from_file() if from_file else self.status()
        assert doc is not None, f"no status file at {self.status_file}\n{self.describe()}"
        w = doc["workers"][i]
        if w.get("pid"):
            self.known_worker_pids.add(w["pid"])
        return w

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float = RESTART_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            if self.proc.poll() is not None and not what.startswith("exit"):
                raise AssertionError(f"the node exited ({self.proc.returncode}) while waiting "
                                     f"for {what}\n{self.describe()}")
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout:.0f} s\n{self.describe()}")

    def log_lines(self, needle: str) -> List[str]:
        return [ln for ln in self.stderr_text().splitlines() if needle in ln]

    # ---- cleanup -----------------------------------------------------------

    def kill_all(self):
        """Kills the node and every worker it still runs (a leftover after a
        failed test must not hold ports); only processes whose parent is the
        node are touched."""
        self.remember_workers()
        if self.proc is not None and self.proc.poll() is None:
            for pid in self.known_worker_pids:
                try:
                    if parent_of(pid) == self.proc.pid:
                        os.kill(pid, signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError):
                    pass
        self.kill()


def process_alive(pid: int) -> bool:
    """True while pid is a process that has not exited (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def tcp_listeners(pid: int):
    """The local "address:port" (hex, as /proc/net/tcp shows it) of every
    TCP socket of process pid that listens."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    listening.append(fields[1])
    return listening
