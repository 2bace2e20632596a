"""Thread names: an operator's `top -H` tells pjserve's threads apart.

Each of the server's own threads is named for its role (docs/serving.md, How
a request flows): as many pjs-grpc threads as --grpc-threads, the
dispatcher's pjs-device workers, the model-load pool, and pjs-prefetch only
when weights can be copied ahead (a weight budget with --weight-prefetch on).
"""

import os
from collections import Counter
from pathlib import Path

import pytest

from protocol_util import finish_checked, serve_only


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
    finish_checked(s)


@serve_only("the threads of one serve process")
@pytest.mark.parametrize("args", [["--weight-prefetch", "false", "--device-weight-budget", "64MiB"],
                                  []], ids=["prefetch-off", "no-budget"])
def test_no_prefetch_thread_when_nothing_is_copied_ahead(server_factory, args):
    s = server_factory(args)
    assert thread_names(s.proc.pid)["pjs-prefetch"] == 0
    finish_checked(s)
