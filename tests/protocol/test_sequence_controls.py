"""Sequence control inputs (manifest `sequence.controls`: start, end, ready,
corrid) against the real server with tritonclient, on both protocols.

The models are Triton's sequence examples as `make models` exports them
(python/pjserve_export/triton_examples.py):

    simple_sequence              OUTPUT = INPUT + START
    simple_dyna_sequence         OUTPUT = INPUT + START + END * CORRID
    simple_string_dyna_sequence  running sum of INPUT (state) + END * CORRID

Checked here, with what Triton's example clients check (read from their
simple_*_sequence_* clients, plain and -d modes): each step's answer for
integer and string ids; string ids of decimal digits as the id a CORRID
input takes, other strings refused naming the input; steps of many sequences
coalescing with each row's controls its own (and padding rows not
disturbing them); the control inputs absent from metadata, refused as client
inputs, and reported in the configuration as Triton's control_input; the
exporter refusing what the server would.
"""

import functools
import queue
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import pjserve_export as pe
from pjserve_export.triton_examples import SEQUENCE_EXAMPLE_NAMES, export_triton_example
from protocol_util import (ServerProcess, finish_checked, guard_alive, metric,
                           parse_metrics, scrape, start_or_fail)

VALUES = [11, 7, 5, 3, 2, 0, 1]  # what Triton's sequence clients send after a first value


@pytest.fixture(scope="module")
def controls_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-sequence-controls")
    for name in SEQUENCE_EXAMPLE_NAMES:
        export_triton_example(name, repo)
    # More gRPC threads than CPUs let a burst of steps queue behind an
    # execution, and so run batched, more often (..._in_bursts_get_their_own_controls).
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-sequence-controls"),
                      ["--grpc-threads", "8"], "sequence-controls")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(controls_server):
    yield from guard_alive(controls_server)


@pytest.fixture(params=["grpc", "http"])
def proto_client(server, request):
    """(protocol, a tritonclient client of it), closed after the test."""
    proto = request.param
    if proto == "grpc":
        c = grpcclient.InferenceServerClient(server.grpc_url)
    else:
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield proto, c
    c.close()


def value_input(proto, value):
    mod = grpcclient if proto == "grpc" else httpclient
    i = mod.InferInput("INPUT", [1, 1], "INT32")
    i.set_data_from_numpy(np.full((1, 1), value, np.int32))
    return i


def run_sequence(client, proto, model, seq, values):
    """Sends values as one sequence, one request each; the answers."""
    out = []
    for k, v in enumerate(values):
        r = client.infer(model, [value_input(proto, v)], sequence_id=seq,
                         sequence_start=k == 0, sequence_end=k == len(values) - 1)
        out.append(int(r.as_numpy("OUTPUT")[0, 0]))
    return out


def test_simple_sequence_adds_start(proto_client):
    proto, c = proto_client
    assert run_sequence(c, proto, "simple_sequence", 1000, [0] + VALUES) == [1] + VALUES
    negated = [-v for v in VALUES]
    assert run_sequence(c, proto, "simple_sequence", "any-string-id", [20] + negated) == \
        [21] + negated


def test_dyna_sequence_adds_the_id_on_the_last_request(proto_client):
    proto, c = proto_client
    got = run_sequence(c, proto, "simple_dyna_sequence", 1001, [100] + VALUES)
    assert got == [101] + VALUES[:-1] + [VALUES[-1] + 1001]
    # A string id of decimal digits is the number CORRID takes.
    got = run_sequence(c, proto, "simple_dyna_sequence", "4242", [0, 5, 6])
    assert got == [1, 5, 6 + 4242]


def test_string_dyna_sequence_keeps_a_running_sum(proto_client):
    proto, c = proto_client
    values = [20] + [-v for v in VALUES]
    got = run_sequence(c, proto, "simple_string_dyna_sequence", "1002", values)
    sums = list(np.cumsum(values))
    assert got == sums[:-1] + [sums[-1] + 1002]


def test_id_that_is_not_a_number_is_refused_for_corrid(proto_client):
    proto, c = proto_client
    for seq in ("alpha", "12x", str(2 ** 32)):
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple_dyna_sequence", [value_input(proto, 1)], sequence_id=seq,
                    sequence_start=True)
        text = str(e.value)
        assert "CORRID" in text and "integer" in text, text
    # Nothing was started: the same id as a number works afterwards.
    assert run_sequence(c, proto, "simple_dyna_sequence", 77, [1, 2]) == [2, 2 + 77]


def run_rounds_of_dyna_steps(server, first_id: int, n_seq: int, steps: int):
    """n_seq dyna sequences step together (each round sent at once, one
    connection per sequence), `steps` rounds: every row gets its own START, END and
    CORRID. Returns (requests, executions) the server counted."""
    model = "simple_dyna_sequence"
    conns = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(n_seq)]
    samples, _ = parse_metrics(scrape(server.metrics_url))
    exec0 = metric(samples, "nv_inference_exec_count", model=model, version="1")
    req0 = metric(samples, "nv_inference_request_success", model=model, version="1")
    done = queue.Queue()

    def finished(i, result, error):
        done.put((i, result, error))

    try:
        for k in range(steps):
            for i in range(n_seq):
                conns[i % len(conns)].async_infer(
                    model, [value_input("grpc", 10 * i + k)],
                    callback=functools.partial(finished, i),
                    sequence_id=first_id + i, sequence_start=k == 0,
                    sequence_end=k == steps - 1)
            for _ in range(n_seq):
                i, r, e = done.get(timeout=120)
                assert e is None, f"sequence {first_id + i} step {k}: {e}"
                want = 10 * i + k + (k == 0) + (first_id + i if k == steps - 1 else 0)
                assert int(r.as_numpy("OUTPUT")[0, 0]) == want, \
                    f"sequence {first_id + i} step {k}"
    finally:
        for c in conns:
            c.close()
    samples, _ = parse_metrics(scrape(server.metrics_url))
    executions = metric(samples, "nv_inference_exec_count", model=model, version="1") - exec0
    requests = metric(samples, "nv_inference_request_success", model=model, version="1") - req0
    return requests, executions


def test_steps_of_many_sequences_in_bursts_get_their_own_controls(server):
    """32 dyna sequences step together, three rounds (run_rounds_of_dyna_steps):
    every row gets its own START, END and CORRID, whether it ran alone or
    batched with others and padding rows, and every step is counted once.
    Steps batch only when they queue behind an execution; a server that keeps
    up with the burst runs them one by one, so how many batched is not
    asserted."""
    n_seq, steps = 32, 3
    requests, executions = run_rounds_of_dyna_steps(server, 7000, n_seq, steps)
    assert requests == n_seq * steps
    assert executions <= requests


def test_control_inputs_are_not_client_inputs(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        meta = c.get_model_metadata("simple_dyna_sequence", as_json=True)
        assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
        assert [t["name"] for t in h.get_model_metadata("simple_dyna_sequence")["inputs"]] == \
            ["INPUT"]
        meta = c.get_model_metadata("simple_string_dyna_sequence", as_json=True)
        assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
        assert [t["name"] for t in meta["outputs"]] == ["OUTPUT"]
        start = grpcclient.InferInput("START", [1, 1], "INT32")
        start.set_data_from_numpy(np.ones((1, 1), np.int32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple_sequence", [value_input("grpc", 1), start], sequence_id=5,
                    sequence_start=True)
        assert 'unexpected input "START"' in str(e.value)
    finally:
        c.close()
        h.close()


def test_model_config_reports_control_inputs(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    want = {
        "START": ("CONTROL_SEQUENCE_START", None),
        "END": ("CONTROL_SEQUENCE_END", None),
        "READY": ("CONTROL_SEQUENCE_READY", None),
        "CORRID": ("CONTROL_SEQUENCE_CORRID", "TYPE_UINT32"),
    }
    try:
        for cfg in (c.get_model_config("simple_dyna_sequence", as_json=True)["config"],
                    h.get_model_config("simple_dyna_sequence")):
            controls = cfg["sequence_batching"]["control_input"]
            assert [ci["name"] for ci in controls] == ["START", "END", "READY", "CORRID"]
            for ci in controls:
                kind, dtype = want[ci["name"]]
                (control,) = ci["control"]
                # gRPC's JSON leaves out enum zero (CONTROL_SEQUENCE_START).
                assert control.get("kind", "CONTROL_SEQUENCE_START") == kind
                if dtype is None:
                    assert [int(v) for v in control["int32_false_true"]] == [0, 1]
                else:
                    assert control["data_type"] == dtype
            assert [t["name"] for t in cfg["input"]] == ["INPUT"]
        cfg = c.get_model_config("simple_string_dyna_sequence", as_json=True)["config"]
        assert cfg["sequence_batching"]["state"][0]["input_name"] == "TOTAL"
        assert [ci["name"] for ci in cfg["sequence_batching"]["control_input"]] == \
            ["END", "CORRID"]
    finally:
        c.close()
        h.close()


def test_exporter_refuses_what_the_server_would(tmp_path):
    col = np.zeros((1, 1), np.int32)
    kw = dict(name="bad", batch_sizes=(1,), input_names=["x", "start"], output_names=["y"])

    def fn(p, x, s):
        return x + s

    with pytest.raises(ValueError, match="unknown controls"):
        pe.export_jax(fn, {}, [col, col], tmp_path, sequence_controls={"begin": "start"}, **kw)
    with pytest.raises(ValueError, match="not one of the inputs"):
        pe.export_jax(fn, {}, [col, col], tmp_path, sequence_controls={"start": "nope"}, **kw)
    with pytest.raises(ValueError, match="clients must send at least one"):
        pe.export_jax(fn, {}, [col, col], tmp_path,
                      sequence_controls={"start": "start", "ready": "x"}, **kw)
    path = pe.export_jax(fn, {}, [col, col], tmp_path, sequence_controls={"start": "start"},
                         idle_timeout_ms=500, **kw)
    m = pe.read_manifest(path)
    assert m.sequence_controls == {"start": "start"}
    assert m.idle_timeout_ms == 500


def test_server_refuses_a_control_it_cannot_fill(pjserve_bin, plugin_path, tmp_path):
    """A control input with more than one element per row, or a flag in a
    dtype Triton's controls do not have: the load fails naming the input."""
    col = np.zeros((1, 1), np.int32)
    wide = np.zeros((1, 2), np.int32)
    path = pe.export_jax(lambda p, x, s: x + s[:, :1], {}, [col, wide], tmp_path, name="wide",
                         batch_sizes=(1,), input_names=["x", "start"], output_names=["y"],
                         sequence_controls={"start": "start"})
    r = subprocess.run([pjserve_bin, "check", "--pjrt-plugin", plugin_path, str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "sequence.controls.start" in r.stderr and "one element per row" in r.stderr, r.stderr
