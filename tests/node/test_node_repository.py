"""`pjserve node --workers 2` in dynamic mode: one watcher, the node's, follows
the repository and has every worker load, reload or drop what changed.

Traffic: client threads (gRPC and HTTP) ask the node whether a new bundle is
READY, and from the moment it says so send it requests without pause. Every
one must succeed with the bundle's outputs (never NOT_FOUND: the gateway
routes the model only to workers that have it), and when the bundle's
weights are then overwritten in place, every answer is the old or the new
weights, each thread gets the new ones within a bound and, once it has,
never the old again (the workers switch as two generations, not one by one).

Restart: a worker killed with SIGKILL misses a bundle added while it is
down; once the node reports it ready again it serves that bundle, asked
directly, and a bundle the watcher had acted on before the kill is not
loaded again on top of the new process's own start-up load.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_node_repository.py
"""

import os
import signal
import threading
import time

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from protocol_util import finish_checked, grpc_infer_case
from test_lifecycle import infer_case, mlp_case, weights_file, which_case, write_mlp_copy

POLL_MS = 100
SWITCH_BOUND_S = 120  # a change reaching every worker (two loads on a slow machine)
REQUEST_TIMEOUT_S = 60
WEIGHTS = "weights.safetensors"


class Traffic:
    """One thread per protocol: ModelReady through the node until it says
    READY, then the request of cands[0] again and again; each answer is
    classified by the candidate (Case) whose outputs it matches. Anything
    else after READY is a failure."""

    def __init__(self, node, cands):
        self.node, self.cands = node, cands
        self.lock = threading.Lock()
        self.stopping = False
        self.ready_at = {}
        self.history = {"grpc": [], "http": []}
        self.failures = []
        self.threads = [threading.Thread(target=self._run, args=(p,), daemon=True)
                        for p in self.history]
        for t in self.threads:
            t.start()

    def _client(self, proto):
        if proto == "grpc":
            return grpcclient.InferenceServerClient(self.node.grpc_url)
        return httpclient.InferenceServerClient(self.node.http_url,
                                                network_timeout=REQUEST_TIMEOUT_S)

    def _run(self, proto):
        client = self._client(proto)
        try:
            while not self.stopping:
                if proto not in self.ready_at:
                    try:
                        ready = client.is_model_ready(self.cands[0].model)
                    except Exception:  # noqa: BLE001 - not ready yet, in any words
                        ready = False
                    if ready:
                        with self.lock:
                            self.ready_at[proto] = time.monotonic()
                    else:
                        time.sleep(0.01)
                    continue
                try:
                    k = which_case(infer_case(client, proto, self.cands[0]), self.cands)
                    outcome = k if k is not None else "outputs match no candidate"
                except Exception as e:  # noqa: BLE001 - every failure is recorded
                    outcome = repr(e)
                with self.lock:
                    if isinstance(outcome, int):
                        self.history[proto].append(outcome)
                    else:
                        self.failures.append(f"{proto}: {outcome}")
        finally:
            client.close()

    def count(self, proto, k):
        with self.lock:
            return self.history[proto].count(k)

    def wait(self, what, cond, node, timeout=SWITCH_BOUND_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.failures:
                    break
            if cond():
                return
            assert node.proc.poll() is None, f"the node exited\n{node.describe()}"
            time.sleep(0.05)
        self.stop()
        assert not self.failures, (f"requests failed before {what}:\n  " +
                                   "\n  ".join(self.failures[:20]) + f"\n{node.describe()}")
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{node.describe()}")

    def stop(self):
        self.stopping = True
        for t in self.threads:
            t.join(REQUEST_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self.threads), "a request hangs"

    def check(self, what):
        assert not self.failures, (f"{len(self.failures)} requests failed during {what}:\n  " +
                                   "\n  ".join(self.failures[:20]))


def more_answers(traffic, n=20):
    """A condition: each thread got n more answers than now."""
    before = {p: len(h) for p, h in traffic.history.items()}
    return lambda: all(len(traffic.history[p]) >= before[p] + n for p in before)


def test_added_then_changed_bundle_under_traffic(node_factory, exported):
    node = node_factory(["--workers", "2", "--repository-poll-ms", str(POLL_MS)], names=("mlp",))
    assert node.log_lines("model control mode dynamic: the node watches")
    assert not node.log_lines("[worker 0] repository: watching"), "a worker watches too"
    repo = node.repository
    old, new = mlp_case(exported, "newcomer", 0.5), mlp_case(exported, "newcomer", 2.0)
    traffic = Traffic(node, [old, new])
    try:
        # Added: from the first READY on, every request succeeds.
        staging = write_mlp_copy(exported, repo / ".newcomer.tmp", "newcomer", scale=0.5)
        os.rename(staging, repo / "newcomer")
        traffic.wait("READY and answers on both protocols", more_answers(traffic, 50), node)
        traffic.check("the addition")
        assert node.log_lines("repository: model newcomer added, loading it on every worker")
        # Changed in place: old, then new, never an error, within the bound.
        with open(repo / "newcomer" / WEIGHTS, "r+b") as f:
            f.truncate(0)
            f.write(weights_file(exported, 2.0))
        traffic.wait("the new weights on both protocols",
                     lambda: traffic.count("grpc", 1) and traffic.count("http", 1), node)
        traffic.wait("more answers after the switch", more_answers(traffic), node)
    finally:
        traffic.stop()
    traffic.check("the change")
    for proto, h in traffic.history.items():
        first_new = h.index(1)
        assert 0 not in h[first_new:], f"{proto}: the old weights after the new"
    finish_checked(node)


def worker_serves(w, case):
    """Whether worker `w` (from the node's status), asked directly on its
    private gRPC socket, answers `case` correctly."""
    direct = grpcclient.InferenceServerClient(w["grpc"])
    try:
        got, _ = grpc_infer_case(direct, case, client_timeout=REQUEST_TIMEOUT_S)
        case.check(got, f"worker {w['id']} directly")
        return True
    finally:
        direct.close()


def test_restarted_worker_serves_a_bundle_added_while_it_was_down(node_factory, exported):
    node = node_factory(["--workers", "2", "--repository-poll-ms", str(POLL_MS)], names=("mlp",))
    repo = node.repository
    before_kill = mlp_case(exported, "alpha", 1.5)
    write_mlp_copy(exported, repo / "alpha", "alpha", scale=1.5)
    node.wait_for("alpha on every worker",
                  lambda: all("alpha" in w["models"] for w in node.status()["workers"]))
    victim = node.status()["workers"][0]["pid"]
    node.known_worker_pids.add(victim)
    os.kill(victim, signal.SIGKILL)
    write_mlp_copy(exported, repo / "beta", "beta", scale=3.0)
    added = mlp_case(exported, "beta", 3.0)
    node.wait_for("worker 0 restarted and ready, beta on every worker",
                  lambda: all(w["state"] == "ready" and w["pid"] != victim and
                              "beta" in w["models"] for w in node.status()["workers"]))
    node.remember_workers()
    for w in node.status()["workers"]:
        assert worker_serves(w, added) and worker_serves(w, before_kill)
    with grpcclient.InferenceServerClient(node.grpc_url) as g:
        for k in range(6):  # round robin over both workers
            got, _ = grpc_infer_case(g, added, client_timeout=REQUEST_TIMEOUT_S)
            added.check(got, f"beta through the node #{k}")
    # alpha: loaded once by the watcher's change, once by the new process at
    # its start; not sent to it again.
    loads = node.log_lines("[worker 0]")
    assert len([ln for ln in loads if "loading model alpha from" in ln]) == 2, \
        "\n".join(ln for ln in loads if "alpha" in ln)
    finish_checked(node)
