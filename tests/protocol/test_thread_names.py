"""Thread names: an operator's `top -H` tells pjserve's threads apart.

Each of the server's own threads is named for its role (docs/serving.md, How
a request flows): as many pjs-grpc threads as --grpc-threads, the
dispatcher's pjs-device workers, the model-load pool, and pjs-prefetch only
when weights can be copied ahead (a weight budget with --weight-prefetch on),
10 nice levels below the threads serving requests.
"""

import os
from collections import Counter
from pathlib import Path

import pytest

from protocol_util import finish_checked, serve_only


def thread_nice(pid: int, name: str) -> set:
    """The nice values of pid's threads called `name` (field 19 of
    /proc/PID/task/TID/stat)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() != name:
                continue
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        out.add(int(stat[stat.rindex(")") + 2:].split()[16]))
    return out


def thread_names(pid: int) -> Counter:
    names = Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names[Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()] += 1
        except OSError:
            continue  # the thread ended meanwhile
    return names


@serve_only("the threads of one serve process")
def test_threads_are_named_for_their_roles(server_factory):
    s = server_factory(["--grpc-threads", "3", "--device-weight-budget", "64MiB"])
    names = thread_names(s.proc.pid)
    assert names["pjs-grpc"] == 3, names
    assert names["pjs-device"] >= 1, names
    assert names["pjs-prefetch"] == 1, names
    assert names["model loads"] == 1, names
    # copies ahead of need yield the CPU to requests (server/dispatch.c):
    # 10 nice levels below the process's own, 19 at most
    (base,) = thread_nice(s.proc.pid, "pjs-device")
    assert thread_nice(s.proc.pid, "pjs-prefetch") == {min(19, base + 10)}
    finish_checked(s)


@serve_only("the threads of one serve process")
@pytest.mark.parametrize("args", [["--weight-prefetch", "false", "--device-weight-budget", "64MiB"],
                                  []], ids=["prefetch-off", "no-budget"])
def test_no_prefetch_thread_when_nothing_is_copied_ahead(server_factory, args):
    s = server_factory(args)
    assert thread_names(s.proc.pid)["pjs-prefetch"] == 0
    finish_checked(s)
