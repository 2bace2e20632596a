"""A decoupled model's stream whose client reads nothing
(--grpc-stream-write-timeout-ms).

A decoupled compute-only meta runs on one of 16 threads of its own, and its
pjserve_respond waits for room once 64 responses are queued for the stream.
A client that never reads would hold the run, and the thread, until the
request's deadline, or forever without one: 16 such streams would stop every
decoupled model of the server. With the bound, a wait that sees no write
complete for that long closes the stream (RESOURCE_EXHAUSTED), the run's
pjserve_respond fails and its thread is free.

The `flood` meta answers COUNT responses of 8 KiB each. Checked: 16
streams that send a long flood and never read do not keep a reading
client's flood from being answered, each is reported in the log and ends
with RESOURCE_EXHAUSTED when finally read; and a client that pauses for less
than the bound but reads on keeps its stream, since the bound counts time
without progress, not the run's length. Behind a node, the gateway that
relays the stream applies the same bound to its client: a short flood the
worker finished is cut off there too, not kept open for as long as the
client is.
"""
import queue
import threading
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from bundle_code import start_server, stop_server, tensor_yaml, write_meta
from protocol_util import NODE_WORKERS, grpc_stub

MODEL = "flood"
STREAM_THREADS = 16  # the server's threads for decoupled compute-only metas
STALL_MS = 1000  # past 300 ms pauses by a margin a loaded machine keeps
CHUNK = 8192

FLOOD_C = r"""
#include <string.h>
#include <pjserve/model.h>

/* COUNT i32 [1] -> DATA u8 [8192] per response: zeros after the
 * response's index (first four bytes). One buffer serves every response:
 * pjserve_respond has encoded it when it returns. */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    int32_t count = *(const int32_t *)in[0].data;
    pjserve_tensor data = out[0];
    data.shape[0] = 8192;
    data.nbytes = 8192;
    unsigned char *bytes = pjserve_alloc(ctx, data.nbytes);
    if (bytes == NULL) {
        pjserve_error(ctx, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    memset(bytes, 0, data.nbytes);
    data.data = bytes;
    for (int32_t i = 0; i < count; i++) {
        memcpy(bytes, &i, sizeof i);
        int rc = pjserve_respond(ctx, &data, 1, false);
        if (rc != PJSERVE_OK)
            return rc;
    }
    return PJSERVE_OK;
}
"""


@pytest.fixture(scope="module")
def server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("stall-repository")
    d = write_meta(repo, MODEL, [], tensor_yaml("COUNT", "i32", [1]),
                   tensor_yaml("DATA", "u8", [CHUNK]), FLOOD_C, pjserve_bin)
    with open(d / "manifest.yaml", "a") as f:
        f.write("decoupled: true\n")
    s = start_server(pjserve_bin, plugin_path, repo, cache_dir,
                     tmp_path_factory.mktemp("stall-server"),
                     ["--model-control-mode", "static",
                      "--grpc-stream-write-timeout-ms", str(STALL_MS)], "stall")
    yield s
    stop_server(s)


def request(count: int, rid: str) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name=MODEL, id=rid)
    r.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    r.raw_input_contents.append(np.array([count], np.int32).tobytes())
    return r


def open_stream(url: str, count: int, rid: str):
    """A stream with one flood request on it, half-closed; nothing is read
    until the caller iterates the returned responses."""
    # Without BDP probing the client's flow-control window stays at 64 KB, so
    # a stream that is not read stalls after little data (a sanitizer build
    # packs every byte slowly).
    channel = grpc.insecure_channel(url, options=[("grpc.http2.bdp_probe", 0),
                                                  ("grpc.max_receive_message_length", -1)])
    return channel, grpc_stub(channel).ModelStreamInfer(iter([request(count, rid)]))


def index_of(msg: service_pb2.ModelStreamInferResponse) -> int:
    assert msg.error_message == "", msg.error_message
    return int(np.frombuffer(msg.infer_response.raw_output_contents[0][:4], np.int32)[0])


def read_until_cut_off(responses) -> list:
    """The indices a cut-off stream still delivers, checked to be the first
    ones in order, and that it then ends with the stall bound's status."""
    indices = []
    with pytest.raises(grpc.RpcError) as e:
        for msg in responses:
            indices.append(index_of(msg))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    assert f"{STALL_MS} ms" in e.value.details()
    assert indices == list(range(len(indices)))
    return indices


def stall_warnings(s) -> int:
    """Streams closed for their client (by a worker or, behind a node, by
    the gateway too: a stream may be closed by both, which race)."""
    return s.stderr_text().count("the client read none of")


def test_streams_that_read_nothing_are_closed_and_free_their_threads(server):
    before = stall_warnings(server)
    stalled = [open_stream(server.grpc_url, 1_000_000, f"stalled-{i}")
               for i in range(STREAM_THREADS)]
    try:
        # Every decoupled thread now runs a flood nobody reads. A reading
        # client's flood needs one of those threads: it is answered only
        # because the stalled runs were stopped.
        got: "queue.Queue" = queue.Queue()
        channel, responses = open_stream(server.grpc_url, 3, "reader")

        def read():
            try:
                for msg in responses:
                    got.put(msg)
                got.put(None)
            except grpc.RpcError as e:
                got.put(e)
        threading.Thread(target=read, daemon=True).start()
        seen = []
        while True:
            msg = got.get(timeout=60)
            assert not isinstance(msg, grpc.RpcError), msg
            if msg is None:
                break
            if not msg.infer_response.parameters["triton_final_response"].bool_param:
                seen.append(index_of(msg))
        channel.close()
        assert seen == [0, 1, 2]

        deadline = time.monotonic() + 60
        while stall_warnings(server) - before < STREAM_THREADS and time.monotonic() < deadline:
            time.sleep(0.1)
        closed = stall_warnings(server) - before
        assert (closed >= STREAM_THREADS if NODE_WORKERS else closed == STREAM_THREADS), \
            server.stderr_text()[-4000:]

        # What a stalled client finally reads: the responses that were on
        # their way, in order, then the stream's status.
        _, first = stalled[0]
        indices = read_until_cut_off(first)
        assert 0 < len(indices) < 1_000_000
    finally:
        for channel, _ in stalled:
            channel.close()


def test_a_client_that_pauses_but_reads_on_keeps_its_stream(server):
    """Two pauses of 300 ms with the write queue full (under the 1000 ms
    bound each), the whole run well over it: every response arrives. (With
    a 500 ms bound, a pause stretched by two busy CPUs was cut once.)"""
    before = stall_warnings(server)
    channel, responses = open_stream(server.grpc_url, 2000, "pausing")
    try:
        indices = []
        for msg in responses:
            if msg.infer_response.parameters["triton_final_response"].bool_param:
                break
            indices.append(index_of(msg))
            if len(indices) in (1, 1000):
                time.sleep(0.3)
    finally:
        channel.close()
    assert indices == list(range(2000))
    assert stall_warnings(server) == before


@pytest.mark.skipif(not NODE_WORKERS, reason="the gateway's bound: runs behind a node")
def test_the_gateway_cuts_off_a_client_that_reads_nothing(server):
    """20 responses (160 KiB): the worker queues them all and ends its run,
    so its own bound never fires; the gateway holds the stream for the
    client, whose window took the first few. It closes the stream once a
    message has waited for the bound."""
    line = "gateway: /inference.GRPCInferenceService/ModelStreamInfer from"
    before = server.stderr_text().count(line)
    channel, responses = open_stream(server.grpc_url, 20, "short-stalled")
    try:
        deadline = time.monotonic() + 30
        while server.stderr_text().count(line) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.stderr_text().count(line) == before + 1, server.stderr_text()[-4000:]
        assert len(read_until_cut_off(responses)) < 20
    finally:
        channel.close()
