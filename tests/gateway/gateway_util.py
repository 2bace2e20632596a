"""Gateway test helpers: a `pjserve gateway` process and a cluster of
workers behind one."""

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import List

import pytest

from protocol_util import ServerProcess, finish_checked, free_ports, start_or_fail


class GatewayProcess(ServerProcess):
    """`pjserve gateway` over the given workers; ready when its REST
    readiness answers 200 (some worker available and, with strict
    readiness, every available worker ready). Each --worker gives the
    worker's metrics address unless worker_metrics is false."""

    def __init__(self, binary, workers: List[ServerProcess], workdir: Path,
                 extra_args=(), name="gateway", worker_metrics=True):
        super().__init__(binary, Path("/nonexistent"), Path("/nonexistent"), Path("/nonexistent"),
                         workdir, extra_args, name)
        self.workers = workers
        self.worker_metrics = worker_metrics

    def start(self, ready_timeout: float = 60):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.argv = [str(self.binary), "gateway", "--host", "127.0.0.1",
                     "--http-port", str(self.http_port),
                     "--grpc-port", str(self.grpc_port),
                     "--metrics-port", str(self.metrics_port)]
        for w in self.workers:
            metrics = f",metrics=127.0.0.1:{w.metrics_port}" if self.worker_metrics else ""
            self.argv += ["--worker", f"grpc={w.grpc_url},http={w.http_url}{metrics}"]
        self.argv += self.extra_args
        env = dict(os.environ)
        env.setdefault("PJSERVE_LOG_LEVEL", "info")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, env=env,
                                         stdin=subprocess.DEVNULL)
        self.wait_ready(ready_timeout)
        return self


class Cluster:
    """Workers and the gateway in front of them."""

    def __init__(self, workers, gateway):
        self.workers = workers
        self.gateway = gateway

    def describe(self) -> str:
        return "\n\n".join(p.describe() for p in [self.gateway] + self.workers)


def finish_cluster(c: Cluster, expected_errors=()):
    """Stops the gateway, then the workers, each checked like a server."""
    finish_checked(c.gateway, expected_errors)
    for w in c.workers:
        if w.alive():
            finish_checked(w, expected_errors)


def restart_same_ports(w: ServerProcess, ready_timeout: float = 120):
    """Starts a stopped worker again with its command line (its ports), as
    `pjserve node` restarts one."""
    env = dict(os.environ)
    env.setdefault("PJSERVE_LOG_LEVEL", "info")
    with open(w.stderr_path, "ab") as err, open(w.stdout_path, "ab") as out:
        w.proc = subprocess.Popen(w.argv, stdout=out, stderr=err, env=env,
                                  stdin=subprocess.DEVNULL)
    w.wait_ready(ready_timeout)


def wait_for(predicate, timeout: float, what: str, describe):
    """Polls predicate() until it holds; fails with `what` and describe()
    (the processes' logs) when it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"{what} within {timeout} s\n{describe()}", pytrace=False)


@contextlib.contextmanager
def gateway_over_two_workers(pjserve_bin, plugin_path, repo, cache_dir, work: Path,
                             worker_metrics=True):
    """A started `pjserve gateway` over two `pjserve serve` workers of one
    repository (GatewayProcess's worker_metrics); at the end every process
    is stopped and its exit checked."""
    started = []
    try:
        for i in range(2):
            started.append(start_or_fail(ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                                                       work / f"w{i}", [], f"worker{i}")))
        g = start_or_fail(GatewayProcess(pjserve_bin, list(started), work / "gw",
                                         worker_metrics=worker_metrics))
        started.insert(0, g)
        yield g
        for p in started:
            finish_checked(p)
    finally:
        for p in started:
            p.kill()
