"""The shared host weight store (`pjserve serve --shared-weights DIR`) with
real workers: several `pjserve serve` processes on one directory under
/dev/shm, as `pjserve node` runs them.

Checked here: the answers are the same with and without the store (and match
numpy); one segment per bundle appears, mode 0600 (0660 and the group with
--shared-weights-group), mapped by every worker (/proc/PID/maps: one file,
one inode, several processes); a segment stays while any worker maps it and
goes with the last one (shutdown, unload, residency `unpinned`); segments of workers killed with
SIGKILL are reclaimed by the next worker's start; a worker restarted beside a
live one maps the same segment; a segment whose bytes, size or header were
changed is refused by the next worker, which says why, makes a fresh copy
and answers correctly; a segment changed under a worker that maps it is
refused at that worker's next load of the model (FAILED_PRECONDITION naming
it), and a reload makes a fresh copy; unsafe directories (open to others, a
symbolic link, another user's) are refused at start. `pjserve node
--shared-weights auto` gives its workers a fresh private directory and
removes it at exit; a directory another user made first stops the node
before any worker starts, saying what to do.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_shared_weights.py
"""

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
import protocol_util as pu  # noqa: E402
from protocol_util import (EXIT_TIMEOUT_S, ServerProcess, finish_checked,  # noqa: E402
                           start_or_fail)

import common  # noqa: E402  (tests/common.py, on the path protocol_util set)

import tritonclient.http as httpclient  # noqa: E402

# Two dense models, x[batch, K] -> x @ w + b, with different weights: each
# bundle gets its own segment. K = 1024: 4 MiB of weights each.
K = 1024
MODELS = ("dense_a", "dense_b")


def _params(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((K, K), dtype=np.float32) / np.float32(K ** 0.5),
            "b": rng.standard_normal((K,), dtype=np.float32)}


PARAMS = {name: _params(i + 1) for i, name in enumerate(MODELS)}


@pytest.fixture(scope="module")
def pjserve_bin():
    p = common.pjserve_bin_path()
    why = common.missing_binary_message(p)
    if why:
        pytest.fail(why, pytrace=False)
    return p


@pytest.fixture(scope="module")
def plugin():
    p, why = common.plugin_path_or_message()
    if why:
        pytest.fail(why, pytrace=False)
    return p


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    from pjserve_export import export_jax

    repo = tmp_path_factory.mktemp("shared-weights-repo")
    for name in MODELS:
        export_jax(lambda p, x: x @ p["w"] + p["b"], PARAMS[name],
                   [np.zeros((1, K), np.float32)], repo, name=name, batch_sizes=(1, 4),
                   input_names=["x"], output_names=["y"])
    return repo


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("shared-weights-cache")


@pytest.fixture
def store_dir():
    d = Path("/dev/shm") / f"pjserve-test-{uuid.uuid4().hex[:12]}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def workers(pjserve_bin, plugin, repository, cache_dir, tmp_path):
    """start(name, store=None, extra=(), repo=None) -> a running worker;
    every worker still running at the end is stopped and must exit cleanly
    (besides the warnings a test expects)."""
    started = []

    def start(name, store=None, extra=(), repo=None):
        args = list(extra)
        if store is not None:
            args = ["--shared-weights", str(store)] + args
        s = ServerProcess(pjserve_bin, plugin, repo or repository, cache_dir, tmp_path,
                          args, name=name)
        started.append(s)
        return start_or_fail(s)

    yield start
    for s in started:
        if s.alive():
            finish_checked(s)


def infer(worker, model, x):
    client = httpclient.InferenceServerClient(worker.http_url)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer(model, [inp])
    return result.as_numpy("y")


def check_answers(worker, reference=None):
    """Every model answers as numpy says (and bit for bit as `reference`,
    a worker without the store, when given)."""
    x = np.random.default_rng(7).standard_normal((4, K), dtype=np.float32)
    for name in MODELS:
        got = infer(worker, name, x)
        want = x @ PARAMS[name]["w"] + PARAMS[name]["b"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        if reference is not None:
            np.testing.assert_array_equal(got, infer(reference, name, x))


def segments(store):
    return sorted(p for p in store.iterdir() if p.name.endswith(".weights"))


def mapped_segments(worker):
    """{(path, inode)} of the segment files the worker's process maps."""
    out = set()
    for line in Path(f"/proc/{worker.proc.pid}/maps").read_text().splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].endswith(".weights"):
            out.add((fields[5], int(fields[4])))
    return out


def on_disk(store):
    return {(str(p), p.stat().st_ino) for p in segments(store)}


def unload(worker, model):
    status, body = pu.http_request(worker.http_url, "POST",
                                   f"/v2/repository/models/{model}/unload")[:2]
    assert status == 200, body


def test_answers_and_one_segment_per_bundle_mapped_by_every_worker(workers, store_dir):
    private = workers("private")
    a = workers("a", store_dir)
    b = workers("b", store_dir)
    check_answers(a, reference=private)
    check_answers(b, reference=private)

    assert len(segments(store_dir)) == len(MODELS)
    assert store_dir.stat().st_mode & 0o7777 == 0o700
    for seg in segments(store_dir):
        assert seg.stat().st_mode & 0o7777 == 0o600
        # a header, then the 4 MiB matrix and the bias, page-rounded
        assert seg.stat().st_size >= 4 * (K * K + K)
    assert mapped_segments(a) == on_disk(store_dir)
    assert mapped_segments(b) == on_disk(store_dir)
    assert mapped_segments(private) == set()
    assert "host weights written to" in a.stderr_text() + b.stderr_text()
    assert "host weights shared from" in a.stderr_text() + b.stderr_text()

    finish_checked(a)
    assert mapped_segments(b) == on_disk(store_dir)  # b still maps them: kept
    check_answers(b, reference=private)
    finish_checked(b)
    assert segments(store_dir) == []  # the last worker gone: removed


def test_group_mode(workers, store_dir):
    group = str(os.getegid())
    w = workers("grouped", store_dir, ["--shared-weights-group", group])
    check_answers(w)
    assert store_dir.stat().st_mode & 0o7777 == 0o2770
    for seg in segments(store_dir):
        st = seg.stat()
        assert st.st_mode & 0o7777 == 0o660
        assert st.st_gid == os.getegid()


def test_unload_removes_the_segment_once_no_worker_maps_it(workers, store_dir):
    a = workers("a", store_dir)
    b = workers("b", store_dir)
    before = on_disk(store_dir)
    unload(a, "dense_a")
    assert on_disk(store_dir) == before  # b maps both
    unload(b, "dense_a")
    after = on_disk(store_dir)
    assert len(after) == 1 and after < before
    assert mapped_segments(a) == after == mapped_segments(b)
    x = np.ones((1, K), np.float32)
    np.testing.assert_allclose(infer(a, "dense_b", x),
                               x @ PARAMS["dense_b"]["w"] + PARAMS["dense_b"]["b"],
                               atol=1e-4, rtol=1e-4)


def set_residency(worker, model, residency):
    status, _, body = pu.http_request(worker.http_url, "POST",
                                      f"/v2/pjserve/models/{model}/residency",
                                      json.dumps({"residency": residency}).encode())
    assert status == 200, body


def test_residency_unpinned_lets_go_of_the_segment(workers, store_dir):
    w = workers("w", store_dir)
    before = on_disk(store_dir)
    set_residency(w, "dense_a", "unpinned")  # no host floor: the segment goes
    after = on_disk(store_dir)
    assert len(after) == 1 and after < before and mapped_segments(w) == after
    check_answers(w)
    set_residency(w, "dense_a", "host")  # a floor again: written again
    assert len(on_disk(store_dir)) == 2 and mapped_segments(w) == on_disk(store_dir)
    check_answers(w)


def test_killed_workers_segments_reclaimed_and_reused_across_a_restart(workers, repository,
                                                                        store_dir, tmp_path):
    a = workers("a", store_dir)
    b = workers("b", store_dir)
    shared = on_disk(store_dir)

    # One worker killed and started again beside a live one: the same segments.
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait()
    assert on_disk(store_dir) == shared
    a2 = workers("a2", store_dir)
    assert mapped_segments(a2) == shared
    assert "host weights shared from" in a2.stderr_text()
    check_answers(a2)

    # Every worker killed: nobody releases, the segments stay ...
    for w in (a2, b):
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
    assert on_disk(store_dir) == shared

    # ... until the next worker starts: it removes what nobody maps (dense_a,
    # which its repository lacks) and writes dense_b again.
    only_b = tmp_path / "only-b"
    only_b.mkdir()
    shutil.copytree(repository / "dense_b", only_b / "dense_b")
    c = workers("c", store_dir, repo=only_b)
    assert re.search(r"removed .*\.weights .*no worker maps it", c.stderr_text())
    now = on_disk(store_dir)
    assert len(now) == 1 and now == mapped_segments(c)
    assert now != shared and not (now & shared)  # a new file, not the dead one's
    x = np.ones((2, K), np.float32)
    np.testing.assert_allclose(infer(c, "dense_b", x),
                               x @ PARAMS["dense_b"]["w"] + PARAMS["dense_b"]["b"],
                               atol=1e-4, rtol=1e-4)


def _segment_of(worker, model_name):
    """The segment file holding `model_name`'s weights, from the worker's log."""
    m = re.search(rf"model {model_name}: host weights (?:written to|shared from) (\S+\.weights)",
                  worker.stderr_text())
    assert m, worker.stderr_text()
    return Path(m.group(1))


REFUSED = r"shared weights segment .* refused"


@pytest.mark.parametrize("corruption", ["bytes", "size", "hash"])
def test_bad_segment_refused_and_replaced(workers, store_dir, corruption):
    holder = workers("holder", store_dir)  # keeps the segments from being swept
    seg = _segment_of(holder, "dense_a")
    ino = seg.stat().st_ino
    with open(seg, "r+b") as f:
        if corruption == "bytes":  # one weight byte, past the 4 KiB header
            f.seek(4096 + 1000)
            b = f.read(1)
            f.seek(4096 + 1000)
            f.write(bytes([b[0] ^ 0x10]))
        elif corruption == "size":
            f.truncate(seg.stat().st_size - 4096)
        else:  # the content key recorded in the header
            f.seek(32)
            f.write(b"\x01\x02\x03\x04\x05\x06\x07\x08")

    fresh = workers("fresh", store_dir)
    why = {"bytes": "holds other bytes than the weights file", "size": "its size is",
           "hash": "content key"}[corruption]
    refused = [ln for ln in fresh.stderr_text().splitlines() if re.search(REFUSED, ln)]
    assert len(refused) == 1 and str(seg) in refused[0] and why in refused[0], refused
    check_answers(fresh)
    assert seg.stat().st_ino != ino  # a fresh copy under the same name
    assert (str(seg), seg.stat().st_ino) in mapped_segments(fresh)
    check_answers(holder)  # its device copy was made before the damage


def test_segment_changed_under_a_worker_refused_at_its_next_load(workers, store_dir):
    # A budget that holds one model: each request for the other one loads it.
    w = workers("w", store_dir, ["--device-weight-budget", "5Mi"])
    x = np.ones((1, K), np.float32)
    want = {m: x @ PARAMS[m]["w"] + PARAMS[m]["b"] for m in MODELS}
    np.testing.assert_allclose(infer(w, "dense_a", x), want["dense_a"], atol=1e-4, rtol=1e-4)
    seg = _segment_of(w, "dense_a")
    with open(seg, "r+b") as f:  # the file w maps, changed in place
        f.seek(4096 + 1000)
        b = f.read(1)
        f.seek(4096 + 1000)
        f.write(bytes([b[0] ^ 0x10]))
    np.testing.assert_allclose(infer(w, "dense_b", x), want["dense_b"], atol=1e-4, rtol=1e-4)
    with pytest.raises(pu.InferenceServerException) as e:
        infer(w, "dense_a", x)  # evicted by dense_b: loaded again from the segment
    assert "changed after it was checked" in str(e.value) and str(seg) in str(e.value)
    assert "reload the model" in str(e.value)

    status, _, body = pu.http_request(w.http_url, "POST", "/v2/repository/models/dense_a/load")
    assert status == 200, body
    np.testing.assert_allclose(infer(w, "dense_a", x), want["dense_a"], atol=1e-4, rtol=1e-4)
    refused = [ln for ln in w.stderr_text().splitlines() if re.search(REFUSED, ln)]
    assert len(refused) == 1 and str(seg) in refused[0], refused
    np.testing.assert_allclose(infer(w, "dense_b", x), want["dense_b"], atol=1e-4, rtol=1e-4)


def test_unsafe_directories_refused(pjserve_bin, plugin, repository, cache_dir, tmp_path):
    def refused(directory, extra=()):
        s = ServerProcess(pjserve_bin, plugin, repository, cache_dir, tmp_path,
                          ["--shared-weights", str(directory)] + list(extra),
                          name=f"refused{len(list(tmp_path.iterdir()))}")
        with pytest.raises(pu.ServerFailure):
            s.start(ready_timeout=60)
        assert s.proc.returncode != 0
        return s.stderr_text()

    not_tmpfs = tmp_path / "on-disk"
    if _fs_type(tmp_path) != "tmpfs":
        assert "not on a tmpfs" in refused(not_tmpfs)
    open_dir = Path("/dev/shm") / f"pjserve-test-{uuid.uuid4().hex[:12]}"
    open_dir.mkdir()
    try:
        open_dir.chmod(0o777)
        assert "writable by others" in refused(open_dir)
        assert "no such group" in refused(open_dir, ["--shared-weights-group",
                                                      "no-such-group-pjserve"])
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def test_serve_refuses_a_symbolic_link(pjserve_bin, plugin, repository, cache_dir, tmp_path):
    target = Path(tempfile.mkdtemp(prefix="pjserve-test-", dir="/dev/shm"))
    link = Path("/dev/shm") / f"pjserve-test-link-{uuid.uuid4().hex[:12]}"
    try:
        link.symlink_to(target)
        s = ServerProcess(pjserve_bin, plugin, repository, cache_dir, tmp_path,
                          ["--shared-weights", str(link)], name="symlink")
        with pytest.raises(pu.ServerFailure):
            s.start(ready_timeout=60)
        assert f"--shared-weights {link}: a symbolic link, which is not followed" in \
            s.stderr_text()
        assert list(target.iterdir()) == []
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)


# ---- pjserve node ------------------------------------------------------------------


def _worker_flag(pid, flag):
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(flag.encode()) + 1].decode()


def test_node_auto_makes_a_private_directory_for_its_workers(node_factory):
    node = node_factory(["--workers", "2", "--shared-weights", "auto"])
    dirs = {_worker_flag(w["pid"], "--shared-weights") for w in node.status()["workers"]}
    assert len(dirs) == 1, dirs
    store = Path(dirs.pop())
    assert store.parent == Path("/dev/shm"), store
    assert re.fullmatch(r"pjserve-weights-[A-Za-z0-9]{6}", store.name), store
    st = os.lstat(store)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()
    assert segments(store), "the workers share no segment there"
    finish_checked(node)
    assert not store.exists(), "the directory the node made is left behind"


def test_node_refuses_a_directory_another_user_made_first(node_factory):
    """A fixed name under /dev/shm that another user made first is refused
    by the node itself, before any worker starts, with what to do."""
    if os.geteuid() != 0:
        pytest.skip("making a directory as another user (setpriv --reuid) needs root")
    nobody = pwd.getpwnam("nobody")
    theirs = Path("/dev/shm") / f"pjserve-test-{uuid.uuid4().hex[:12]}"
    try:
        subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                        "--clear-groups", "mkdir", "-m", "755", str(theirs)], check=True)
        node = node_factory(["--workers", "2", "--shared-weights", str(theirs)], ready=False)
        assert node.wait_exit(EXIT_TIMEOUT_S) == 1, node.describe()
        err = node.stderr_text()
        assert f"--shared-weights {theirs}: owned by uid {nobody.pw_uid}" in err, err
        assert "pjserve node --shared-weights auto" in err, err
        assert "[worker " not in err, "a worker was started"
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


def test_auto_is_the_nodes_alone(pjserve_bin, tmp_path):
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(tmp_path),
                        "--shared-weights", "auto"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "only `pjserve node` makes a directory" in r.stderr, r.stderr
    r = subprocess.run([str(pjserve_bin), "node", "--model-repository", str(tmp_path),
                        "--shared-weights", "auto", "--shared-weights-group", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--shared-weights-group needs a DIR" in r.stderr, r.stderr


def _fs_type(path):
    """The file system type of path's mount (the longest mount point above it)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        if str(Path(path).resolve()).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind
