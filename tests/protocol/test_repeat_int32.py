"""repeat_int32, the decoupled example model Triton's
simple_grpc_custom_repeat.py calls, exported by
python/pjserve_export/triton_examples.py as `make models` exports it (C in
examples/bundles/repeat_int32/model.c), driven with tritonclient's gRPC
stream as that client drives it.

IN i32 [n], DELAY u32 [n], WAIT u32 [1]: one response per value, in order,
OUT = [IN[i]] and IDX = [i], each after its delay in ms, then the final
response after WAIT ms. Checked: the values and indices in order with the
final flag on an empty final response, or without one only the data
responses;
only OUT when the client asks for OUT alone (as the example does); an empty
IN (the final flag alone); mismatched IN and DELAY lengths, a DELAY or WAIT
over 10 s and delays adding up to more than a minute refused with messages
naming the values; a wait cut short by the request's deadline
(DEADLINE_EXCEEDED); unary ModelInfer refused as for every decoupled model; the
model configuration (no batch axis, decoupled); a client closing its stream
mid-request: the run stops at its next response (the request is counted as
failed long before its remaining delays could have passed) and later
requests are answered; a client closing its stream during a 10 s delay
(the run sees pjserve_cancelled and fails at once); runs waiting between
responses, more of them than compute-only meta threads, do not hold up
another compute-only meta (simple_identity answers while they wait); 20
streams and a greedy one of long-waiting runs leave threads for another
client's request (threads started on demand, 4 runs per stream). Delays are a few ms, so the
suite is fast; no
assertion depends on timing. Under PJSERVE_PROTOCOL_NODE_WORKERS the same
runs through a node's gateway.
"""
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pjserve_export import hooks as H
from pjserve_export.triton_examples import export_triton_example
from protocol_util import ServerProcess, finish_checked, grpc_code, guard_alive, start_or_fail

MODEL = "repeat_int32"
# The run's cap on each DELAY and WAIT, and on their sum (model.c).
MAX_WAIT_MS = 10000
MAX_TOTAL_MS = 60000


@pytest.fixture(scope="module")
def repeat_server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-repeat")
    export_triton_example(MODEL, repo, build=H.hooks_builder(pjserve_bin))
    export_triton_example("simple_identity", repo, build=H.hooks_builder(pjserve_bin))
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-repeat"), [], "repeat")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(repeat_server):
    yield from guard_alive(repeat_server)


def repeat_inputs(values, delays, wait_ms):
    out = []
    for name, array, datatype in (("IN", np.array(values, np.int32), "INT32"),
                                  ("DELAY", np.array(delays, np.uint32), "UINT32"),
                                  ("WAIT", np.array([wait_ms], np.uint32), "UINT32")):
        t = grpcclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        out.append(t)
    return out


def as_value(result, name):
    a = result.as_numpy(name)
    if a is None:
        return None
    assert a.shape == (1,), (name, a.shape)
    return int(a[0])


def stream(url, requests, empty_final=True, outputs=None):
    """{request id: ([(OUT, IDX, final flag)], error or None)} for
    requests [(values, delays, wait_ms)] sent on one stream, read until
    each request's final response or error."""
    got: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for i, request in enumerate(requests):
            client.async_stream_infer(MODEL, repeat_inputs(*request), request_id=str(i),
                                      outputs=outputs, enable_empty_final_response=empty_final)
        answers = {str(i): ([], None) for i in range(len(requests))}
        open_ids = set(answers)
        while open_ids:
            result, error = got.get(timeout=60)
            if error is not None:
                # The stream's error_message carries no id: requests fail in order.
                rid = min(open_ids, key=int)
                answers[rid] = (answers[rid][0], str(error))
                open_ids.discard(rid)
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            answers[response.id][0].append((as_value(result, "OUT"), as_value(result, "IDX"),
                                            final))
            if final:
                open_ids.discard(response.id)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return answers


def one(url, values, delays, wait_ms, **kwargs):
    return stream(url, [(values, delays, wait_ms)], **kwargs)["0"]


def test_responses_in_order_with_empty_final(server):
    values = [100, 101, -7, 2**31 - 1, -2**31]
    sent, error = one(server.grpc_url, values, [0, 5, 20, 1, 0], 10)
    assert error is None
    assert sent == [(v, i, False) for i, v in enumerate(values)] + [(None, None, True)]


def test_without_empty_final_only_the_data_responses(server):
    """As simple_grpc_custom_repeat.py asks (no empty final response): the
    values, none held back, and no flag-only message (as Triton); a second
    request on the stream is answered next."""
    got: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(MODEL, repeat_inputs([5, 6, 7], [2, 0, 3], 5),
                                  request_id="a")
        first = [got.get(timeout=60) for _ in range(3)]
        client.async_stream_infer(MODEL, repeat_inputs([8], [0], 0), request_id="b",
                                  enable_empty_final_response=True)
        rest = [got.get(timeout=60) for _ in range(2)]
    finally:
        client.stop_stream()
        client.close()
    seen = [(r.get_response().id, as_value(r, "OUT"),
             r.get_response().parameters["triton_final_response"].bool_param)
            for r, e in first + rest if e is None]
    assert seen == [("a", 5, False), ("a", 6, False), ("a", 7, False), ("b", 8, False),
                    ("b", None, True)]


def test_only_out_when_the_client_asks_for_out(server):
    """simple_grpc_custom_repeat.py requests OUT alone."""
    sent, error = one(server.grpc_url, [100, 101, 102], [1, 1, 1], 1,
                      outputs=[grpcclient.InferRequestedOutput("OUT")])
    assert error is None
    assert sent == [(100, None, False), (101, None, False), (102, None, False),
                    (None, None, True)]


def test_empty_in_sends_only_the_final_flag(server):
    assert one(server.grpc_url, [], [], 3) == ([(None, None, True)], None)


def test_requests_of_one_stream(server):
    a = stream(server.grpc_url, [([1, 2], [3, 0], 0), ([], [], 0), ([9], [1], 2)])
    assert a["0"] == ([(1, 0, False), (2, 1, False), (None, None, True)], None)
    assert a["1"] == ([(None, None, True)], None)
    assert a["2"] == ([(9, 0, False), (None, None, True)], None)


@pytest.mark.parametrize("values,delays,wait_ms,words", [
    ([1, 2, 3], [0, 0], 0, ["IN holds 3 values", "DELAY 2"]),
    ([1], [0, 0, 0], 0, ["IN holds 1 values", "DELAY 3"]),
    ([1, 2], [0, MAX_WAIT_MS + 1], 0, [f"DELAY[1] is {MAX_WAIT_MS + 1} ms",
                                       f"at most {MAX_WAIT_MS} ms"]),
    ([1], [0], MAX_WAIT_MS + 1, [f"WAIT is {MAX_WAIT_MS + 1} ms", f"at most {MAX_WAIT_MS} ms"]),
    ([1] * 7, [MAX_WAIT_MS] * 7, 0, ["add up to 70000 ms", f"at most {MAX_TOTAL_MS} ms"]),
    ([1] * 6, [MAX_WAIT_MS] * 6, 1, ["add up to 60001 ms", f"at most {MAX_TOTAL_MS} ms"]),
], ids=["more-values", "more-delays", "long-delay", "long-wait", "long-total", "total-plus-wait"])
def test_refused_before_any_response(server, values, delays, wait_ms, words):
    sent, error = one(server.grpc_url, values, delays, wait_ms)
    assert sent == []
    assert error is not None and all(w in error for w in words), error


def test_a_wait_stops_at_the_deadline(server):
    """A request with a 300 ms timeout whose second delay is 10 s: the first
    response, then DEADLINE_EXCEEDED instead of the second."""
    got: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(MODEL, repeat_inputs([7, 8], [0, MAX_WAIT_MS], 0),
                                  enable_empty_final_response=True, timeout=300_000)
        result, error = got.get(timeout=60)
        assert error is None and (as_value(result, "OUT"), as_value(result, "IDX")) == (7, 0)
        result, error = got.get(timeout=60)
        assert result is None and "deadline passed while waiting" in str(error), error
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_unary_model_infer_refused(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        c.infer(MODEL, repeat_inputs([1], [0], 0))
    assert "ModelStreamInfer" in str(e.value) and "decoupled" in str(e.value)
    assert grpc_code(e.value) == "UNIMPLEMENTED"


def test_config_and_metadata(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    config = c.get_model_config(MODEL).config
    assert config.model_transaction_policy.decoupled is True
    assert config.max_batch_size == 0
    assert [(t.name, grpcclient.model_config_pb2.DataType.Name(t.data_type), list(t.dims))
            for t in config.input] == [("IN", "TYPE_INT32", [-1]), ("DELAY", "TYPE_UINT32", [-1]),
                                       ("WAIT", "TYPE_UINT32", [1])]
    assert [(t.name, grpcclient.model_config_pb2.DataType.Name(t.data_type), list(t.dims))
            for t in config.output] == [("OUT", "TYPE_INT32", [1]), ("IDX", "TYPE_UINT32", [1])]
    meta = c.get_model_metadata(MODEL)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("IN", "INT32", [-1]), ("DELAY", "UINT32", [-1]), ("WAIT", "UINT32", [1])]


def finished_requests(client):
    stats = client.get_inference_statistics(MODEL).model_stats[0].inference_stats
    return stats.success.count, stats.fail.count


def close_after_first_response(url, values, delays, wait_ms):
    """Sends one request, reads its first response (OUT, IDX), closes the
    stream, and waits until the server counts the request as finished:
    returns (first response, (successes, failures) before, after)."""
    client = grpcclient.InferenceServerClient(url)
    before = finished_requests(client)
    got: "queue.Queue" = queue.Queue()
    closing = grpcclient.InferenceServerClient(url)
    closing.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        closing.async_stream_infer(MODEL, repeat_inputs(values, delays, wait_ms),
                                   enable_empty_final_response=True)
        result, error = got.get(timeout=60)
        assert error is None, error
        first = (as_value(result, "OUT"), as_value(result, "IDX"))
    finally:
        closing.stop_stream(cancel_requests=True)
        closing.close()
    give_up = time.monotonic() + 30
    while finished_requests(client) == before and time.monotonic() < give_up:
        time.sleep(0.05)
    after = finished_requests(client)
    client.close()
    return first, before, after


def test_client_closing_mid_request(server):
    """The client reads the first response and closes its stream while the
    run sleeps 50 ms. The run's next pjserve_respond fails and it returns:
    the request counts as failed while four 10 s delays would still be
    ahead of it. Later requests, on new streams, are answered."""
    first, before, after = close_after_first_response(
        server.grpc_url, [1, 2, 3, 4, 5, 6], [0, 50] + [MAX_WAIT_MS] * 4, 0)
    assert first == (1, 0)
    assert after == (before[0], before[1] + 1), (before, after)
    sent, error = one(server.grpc_url, [41, 42], [1, 1], 0)
    assert (sent, error) == ([(41, 0, False), (42, 1, False), (None, None, True)], None)


def test_client_closing_during_a_long_delay(server):
    """The client closes its stream while the run sleeps 10 s: the run sees
    pjserve_cancelled within its 50 ms slice and returns, so the request
    counts as failed in well under the delay, and its thread is free."""
    started = time.monotonic()
    first, before, after = close_after_first_response(
        server.grpc_url, [1, 2], [0, MAX_WAIT_MS], 0)
    took = time.monotonic() - started
    assert first == (1, 0)
    assert after == (before[0], before[1] + 1), (before, after)
    assert took < MAX_WAIT_MS / 1000 / 2, took


def test_the_longest_allowed_request_is_accepted(server):
    """Delays and wait at the caps, all of them summing to the total cap: the
    first response comes (no refusal); the client then closes the stream."""
    delays = [0, 50, MAX_WAIT_MS, MAX_WAIT_MS, MAX_WAIT_MS, MAX_WAIT_MS, MAX_WAIT_MS - 50]
    assert sum(delays) + MAX_WAIT_MS == MAX_TOTAL_MS
    first, before, after = close_after_first_response(server.grpc_url, list(range(7)), delays,
                                                      MAX_WAIT_MS)
    assert first == (0, 0)
    assert after == (before[0], before[1] + 1), (before, after)


def test_waiting_runs_do_not_hold_up_other_compute_only_metas(server):
    """Three repeat_int32 runs (more than the two threads non-decoupled
    compute-only metas run on) each send a response and then wait 3 s: while
    all three wait, simple_identity is answered, so it ran on a thread no
    waiting run held (decoupled compute-only metas have threads of their
    own). Checked by order, not time: none of the three has sent its second
    response when the identity answer arrives."""
    streams = []
    try:
        for _ in range(3):
            got: "queue.Queue" = queue.Queue()
            c = grpcclient.InferenceServerClient(server.grpc_url)
            c.start_stream(callback=lambda result, error, got=got: got.put((result, error)))
            c.async_stream_infer(MODEL, repeat_inputs([1, 2], [0, 3000], 0))
            streams.append((c, got))
        for _, got in streams:
            result, error = got.get(timeout=60)
            assert error is None, error
            assert as_value(result, "OUT") == 1
        g = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.array([[b"still", b"served"]], dtype=object)
        i = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
        i.set_data_from_numpy(x)
        answer = g.infer("simple_identity", [i]).as_numpy("OUTPUT0")
        g.close()
        assert answer.tolist() == x.tolist()
        early = [got.get_nowait() for _, got in streams if not got.empty()]
        assert not early, f"a waiting run finished first: {[(as_value(r, 'OUT') if r else None, e) for r, e in early]}"
        for _, got in streams:  # each run then sends its second value
            result, error = got.get(timeout=60)
            assert error is None and as_value(result, "OUT") == 2
    finally:
        for c, _ in streams:
            c.stop_stream(cancel_requests=True)
            c.close()


def test_streams_that_wait_long_do_not_take_every_thread(server):
    """20 streams each with a run that sent one response and now waits
    10 s, and one stream with 8 such runs (at most 4 of them run at once):
    more than the 16 threads decoupled compute-only metas start with. Another
    client's one-value request is answered within 3 s: a waiting run holds a
    thread of its own, started on demand, not one every client shares (with
    16 fixed threads it waited for a sleeping run to end, 10 s here)."""
    streams = []

    def open_stream(requests):
        got: "queue.Queue" = queue.Queue()
        c = grpcclient.InferenceServerClient(server.grpc_url)
        c.start_stream(callback=lambda result, error, got=got: got.put((result, error)))
        for i in range(requests):
            c.async_stream_infer(MODEL, repeat_inputs([1, 2], [0, MAX_WAIT_MS], 0),
                                 request_id=str(i))
        streams.append((c, got))
        return got

    try:
        waiting = [open_stream(1) for _ in range(20)]
        greedy = open_stream(8)
        for got in waiting[:16]:  # as many as there are threads at the start
            result, error = got.get(timeout=30)
            assert error is None and as_value(result, "OUT") == 1, error
        started = time.monotonic()
        sent, error = one(server.grpc_url, [5], [0], 0)
        took = time.monotonic() - started
        assert (sent, error) == ([(5, 0, False), (None, None, True)], None)
        assert took < 3.0, f"the other client waited {took:.1f} s"
        for got in waiting[16:] + [greedy] * 4:
            result, error = got.get(timeout=3)
            assert error is None and as_value(result, "OUT") == 1, error
        assert greedy.empty(), "a fifth run of the greedy stream started while four waited"
    finally:
        for c, _ in streams:
            c.stop_stream(cancel_requests=True)
            c.close()
