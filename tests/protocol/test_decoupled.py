"""Decoupled meta models over ModelStreamInfer (manifest `decoupled: true`).

A counting meta sends COUNT responses N = 0, 1, ... with pjserve_respond and
returns without outputs, so the server closes the request with the final
flag; FAIL_AFTER >= 0 makes the run fail after that many responses. Checked
with tritonclient's stream API as Triton's decoupled examples use it:
responses in order, one per pjserve_respond, triton_final_response false on
each and true on an empty final response when the client asked for one (else,
as Triton, no flag-only response: each data response leaves at once and none
is held back for the flag), zero responses, an error
after some, refusal over unary gRPC and HTTP, the model configuration on both
protocols, and many concurrent streams.
"""
import json
import queue
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bundle_code import start_server, stop_server, tensor_yaml, write_meta
from protocol_util import REPO, tail

COUNTER_C = r"""
#include <pjserve/model.h>

/* COUNT i32 [1], FAIL_AFTER i32 [1] -> N i32 [1], one response per value */
int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)n_in, (void)n_out;
    int32_t count = *(const int32_t *)in[0].data, fail_after = *(const int32_t *)in[1].data;
    for (int32_t i = 0; i < count; i++) {
        if (i == fail_after) {
            pjserve_error(ctx, "failed on purpose after %d responses", (int)i);
            return PJSERVE_INTERNAL;
        }
        int32_t *v = pjserve_alloc(ctx, sizeof *v);
        if (v == NULL) {
            pjserve_error(ctx, "out of memory");
            return PJSERVE_RESOURCE_EXHAUSTED;
        }
        *v = i;
        pjserve_tensor n = out[0];
        n.shape[0] = 1;
        n.data = v;
        n.nbytes = sizeof *v;
        int rc = pjserve_respond(ctx, &n, 1, false);
        if (rc != PJSERVE_OK)
            return rc;
    }
    return PJSERVE_OK;
}
"""

MODEL = "counter"
ERRORS = [r"failed on purpose"]


@pytest.fixture(scope="module")
def server(pjserve_bin, plugin_path, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled-repository")
    d = write_meta(repo, MODEL, [],
                   tensor_yaml("COUNT", "i32", [1]) + tensor_yaml("FAIL_AFTER", "i32", [1]),
                   tensor_yaml("N", "i32", [1]), COUNTER_C, pjserve_bin)
    with open(d / "manifest.yaml", "a") as f:
        f.write("decoupled: true\n")
    s = start_server(pjserve_bin, plugin_path, repo, cache_dir,
                     tmp_path_factory.mktemp("decoupled-server"),
                     ["--model-control-mode", "static"], "decoupled")
    yield s
    stop_server(s, ERRORS)


def inputs(count: int, fail_after: int = -1):
    out = []
    for name, v in (("COUNT", count), ("FAIL_AFTER", fail_after)):
        t = grpcclient.InferInput(name, [1], "INT32")
        t.set_data_from_numpy(np.array([v], np.int32))
        out.append(t)
    return out


def stream(url: str, requests, empty_final: bool = True):
    """[(request id, [(N or None, final flag)], error or None)] per request,
    read until each request's final response (or error)."""
    got: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for i, (count, fail_after) in enumerate(requests):
            client.async_stream_infer(MODEL, inputs(count, fail_after), request_id=str(i),
                                      enable_empty_final_response=empty_final)
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
            resp = result.get_response()
            final = resp.parameters["triton_final_response"].bool_param
            n = result.as_numpy("N")
            answers[resp.id][0].append((None if n is None else int(n[0]), final))
            if final:
                open_ids.discard(resp.id)
    finally:
        client.stop_stream()
        client.close()
    return answers


def test_responses_in_order_with_empty_final(server):
    a = stream(server.grpc_url, [(5, -1)])
    assert a["0"] == ([(0, False), (1, False), (2, False), (3, False), (4, False),
                       (None, True)], None)


def test_without_empty_final_no_flag_only_response(server):
    """Without triton_enable_empty_final_response the three data responses
    come as sent (final false) and the run's end sends nothing: the next
    message on the stream is the answer to the next request."""
    got: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(MODEL, inputs(3, -1), request_id="a",
                                  enable_empty_final_response=False)
        first = [got.get(timeout=60) for _ in range(3)]
        client.async_stream_infer(MODEL, inputs(1, -1), request_id="b",
                                  enable_empty_final_response=True)
        rest = [got.get(timeout=60) for _ in range(2)]
    finally:
        client.stop_stream()
        client.close()

    def seen(messages):
        out = []
        for result, error in messages:
            assert error is None, error
            resp = result.get_response()
            n = result.as_numpy("N")
            out.append((resp.id, None if n is None else int(n[0]),
                        resp.parameters["triton_final_response"].bool_param))
        return out
    assert seen(first) == [("a", 0, False), ("a", 1, False), ("a", 2, False)]
    assert seen(rest) == [("b", 0, False), ("b", None, True)]


def test_zero_responses(server):
    a = stream(server.grpc_url, [(0, -1)])
    assert a["0"] == ([(None, True)], None)


def test_error_after_some_responses(server):
    a = stream(server.grpc_url, [(6, 2)])
    sent, error = a["0"]
    assert sent == [(0, False), (1, False)]
    assert "failed on purpose after 2 responses" in error


def test_requests_of_one_stream(server):
    a = stream(server.grpc_url, [(2, -1), (0, -1), (3, -1)])
    assert a["0"][0] == [(0, False), (1, False), (None, True)]
    assert a["1"][0] == [(None, True)]
    assert a["2"][0] == [(0, False), (1, False), (2, False), (None, True)]


def test_many_concurrent_streams(server):
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda k: stream(server.grpc_url, [(k % 7 + 1, -1)] * 3),
                                range(32)))
    for k, a in enumerate(results):
        want = [(i, False) for i in range(k % 7 + 1)] + [(None, True)]
        assert all(a[rid] == (want, None) for rid in a), (k, a)


def test_more_responses_than_the_write_queue_holds(server):
    a = stream(server.grpc_url, [(500, -1)])
    assert a["0"][0] == [(i, False) for i in range(500)] + [(None, True)]


def test_unary_grpc_refused(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        c.infer(MODEL, inputs(1))
    assert "ModelStreamInfer" in str(e.value) and "decoupled" in str(e.value)


def test_http_refused(server):
    c = httpclient.InferenceServerClient(server.http_url)
    ins = []
    for name in ("COUNT", "FAIL_AFTER"):
        t = httpclient.InferInput(name, [1], "INT32")
        t.set_data_from_numpy(np.array([1], np.int32))
        ins.append(t)
    with pytest.raises(InferenceServerException) as e:
        c.infer(MODEL, ins)
    assert "ModelStreamInfer" in str(e.value) and "decoupled" in str(e.value)


def test_config_says_decoupled(server):
    g = grpcclient.InferenceServerClient(server.grpc_url).get_model_config(MODEL).config
    assert g.model_transaction_policy.decoupled is True
    h = httpclient.InferenceServerClient(server.http_url).get_model_config(MODEL)
    assert h["model_transaction_policy"] == {"decoupled": True}


def test_perf_analyzer_streaming_without_a_version(server, tmp_path):
    """perf_analyzer --streaming against the decoupled meta, no -x: it finds the
    version to report by the queue count that grew, which a meta's runs count."""
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"COUNT": [3], "FAIL_AFTER": [-1]}]}))
    args = [str(REPO / "scripts" / "perf_analyzer"), "-m", MODEL, "-i", "grpc", "--streaming",
            "-u", server.grpc_url, "--input-data", str(data), "--concurrency-range", "1:2",
            "--measurement-interval", "500", "--stability-percentage", "1000",
            "--max-trials", "6"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)
    out = r.stdout + "\n" + r.stderr
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}\n{tail(out, 60)}"
    assert "failed to find the requested model version" not in out
    lines = re.findall(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec", out)
    assert [c for c, _ in lines] == ["1", "2"], tail(out, 60)
