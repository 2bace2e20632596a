"""The run directory of `pjserve node` (its status file, the workers' admin
token): a default one is fresh and private (mode 0700, a name made by
mkdtemp, not the pid), so symbolic links planted at the pid-based names an
older node used are never followed; a --run-dir that is a symbolic link,
another user's, or open to group or others is refused with a message that
says what to do.

    PJSERVE_BIN=build/pjserve .venv/bin/python -m pytest -q tests/node/test_node_run_dir.py
"""

import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from protocol_util import EXIT_TIMEOUT_S, finish_checked

FRESH_NAME = re.compile(r"pjserve-node-[A-Za-z0-9]{6}")


def worker_flag(pid, flag):
    """The value of `flag` on a worker's command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(flag.encode()) + 1].decode()


def assert_private_dir(path):
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode), path
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == os.geteuid()


def node_run_dir(node):
    """The run directory a node made, from the paths its workers are given."""
    pid = node.status()["workers"][0]["pid"]
    flag = "--node-status-file" if len(node.status()["workers"]) == 1 else "--admin-token-file"
    return Path(worker_flag(pid, flag)).parent


def test_default_run_dir_is_fresh_and_private(node_factory, monkeypatch, tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    xdg.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    node = node_factory(run_dir=None)
    run_dir = node_run_dir(node)
    assert run_dir.parent == xdg
    assert FRESH_NAME.fullmatch(run_dir.name), run_dir
    assert run_dir.name != f"pjserve-node-{node.proc.pid}"
    assert_private_dir(run_dir)
    status = run_dir / "node-status.json"
    assert stat.S_IMODE(os.lstat(status).st_mode) == 0o600
    assert '"workers"' in status.read_text()
    finish_checked(node)
    assert not run_dir.exists(), "the run directory the node made is left behind"


@pytest.mark.parametrize("workers", [1, 2])
def test_symlinks_planted_at_pid_based_names_are_not_followed(node_factory, monkeypatch,
                                                              tmp_path, workers):
    """Another user who plants a symbolic link at /tmp/pjserve-node-PID for
    the pids to come must not get the node to write its status file or its
    token there, nor to read a token from there: the node's directory has a
    name nobody can guess. (A node of an older build running on the same
    machine meanwhile may follow the links: what is checked is what this
    node wrote.)"""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o700)
    planted_files = {"node-status.json": "precious\n", "worker-admin-token": "planted\n"}
    for name, text in planted_files.items():
        (victim / name).write_text(text)
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    planted = []
    try:
        for k in range(1, 301):
            link = Path(f"/tmp/pjserve-node-{(last + k) % pid_max}")
            try:
                link.symlink_to(victim)
            except FileExistsError:
                continue
            planted.append(link)
        node = node_factory(["--workers", str(workers)], run_dir=None)
        assert Path(f"/tmp/pjserve-node-{node.proc.pid}") in planted, \
            f"the node's pid {node.proc.pid} is not among those planted for"
        run_dir = node_run_dir(node)
        assert run_dir.parent == Path("/tmp") and FRESH_NAME.fullmatch(run_dir.name), run_dir
        assert_private_dir(run_dir)
        if workers > 1:
            token = (run_dir / "worker-admin-token").read_text()
            assert re.fullmatch(r"[0-9a-f]{64}\n", token), token
            assert (victim / "worker-admin-token").read_text() != token
        else:
            status = (run_dir / "node-status.json").read_text()
            assert node.http_url in status
            assert node.http_url not in (victim / "node-status.json").read_text()
        finish_checked(node)
        assert not run_dir.exists()
    finally:
        for link in planted:
            link.unlink()
    assert sorted(p.name for p in victim.iterdir()) == sorted(planted_files)


def refused(node_factory, run_dir):
    """The node's stderr after it refused `run_dir` (exit status 1)."""
    node = node_factory(ready=False, run_dir=run_dir)
    rc = node.wait_exit(EXIT_TIMEOUT_S)
    assert rc == 1, node.describe()
    return node.stderr_text()


def test_a_run_dir_that_is_a_symlink_is_refused(node_factory, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    err = refused(node_factory, link)
    assert f"run directory {link}: a symbolic link, which the node does not follow; " \
           "name the directory itself" in err, err
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("mode", [0o750, 0o705, 0o1777], ids=oct)
def test_a_run_dir_open_to_group_or_others_is_refused(node_factory, tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(mode)
    err = refused(node_factory, d)
    assert f"run directory {d}: mode {mode:04o} lets its group or others in; chmod 700 it" \
        in err, err
    assert list(d.iterdir()) == []


def test_a_run_dir_another_user_made_is_refused(node_factory, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a directory as another user (setpriv --reuid) needs root")
    nobody = pwd.getpwnam("nobody")
    # Made by that user first in a directory open to everyone, as in /tmp
    # (one that user can reach: tmp_path is closed to others).
    shared = Path(tempfile.mkdtemp(prefix="pjserve-test-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        theirs = shared / "run"
        subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                        "--clear-groups", "mkdir", "-m", "700", str(theirs)], check=True)
        assert os.lstat(theirs).st_uid == nobody.pw_uid
        err = refused(node_factory, theirs)
        assert f"run directory {theirs}: belongs to uid {nobody.pw_uid}, not to this user " \
               f"(uid {os.geteuid()})" in err, err
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_run_dir_inside_a_directory_others_may_change_is_refused(node_factory, tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    err = refused(node_factory, loose / "run")
    assert "lets others replace it; name one inside a directory only this user can " \
           "change" in err, err
    assert not (loose / "run").exists()


def test_a_given_run_dir_is_made_private_and_removed(node_factory, tmp_path):
    given = tmp_path / "made"
    node = node_factory(run_dir=given)
    assert_private_dir(given)
    finish_checked(node)
    assert not given.exists()
