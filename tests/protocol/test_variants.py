"""A model with input-shape variants over KServe V2: gapnet takes x at
[batch, 16, 16, 3] (its top-level shapes, variant "default") and at
[batch, 16, 32, 3] (variant "wide"), with heatmap [batch, 16, W] following the
width. Each request runs on the variant its shapes name; requests of both
variants in flight at once (streams, async calls) must each get their own
variant's answer; a shape matching no variant is refused with the accepted
shapes; metadata and config show -1 for the extents that vary."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from protocol_util import grpc_code, grpc_infer_case, grpc_inputs, http_infer_case, http_json

MODEL = "gapnet"
VARIANTS = ("default", "wide")
WIDTH = {"default": 16, "wide": 32}
ACCEPTED = "default [-1, 16, 16, 3], wide [-1, 16, 32, 3]"


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("variant", VARIANTS)
def test_grpc_infer_matches_jax(gclient, cases, variant, n):
    case = cases.get(MODEL, n, variant=variant)
    got, result = grpc_infer_case(gclient, case)
    case.check(got, f"grpc {variant}")
    shapes = {o.name: list(o.shape) for o in result.get_response().outputs}
    assert shapes == {"logits": [n, 10], "heatmap": [n, 16, WIDTH[variant]]}, shapes


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_http_infer_matches_jax(hclient, cases, variant, n, binary):
    case = cases.get(MODEL, n, variant=variant)
    got, result = http_infer_case(hclient, case, binary_in=binary, binary_out=binary)
    case.check(got, f"http {variant} binary={binary}")
    shapes = {o["name"]: o["shape"] for o in result.get_response()["outputs"]}
    assert shapes == {"logits": [n, 10], "heatmap": [n, 16, WIDTH[variant]]}, shapes


def test_both_variants_in_flight_on_one_stream(server, cases):
    """Requests of both variants, interleaved on one stream, each come back
    with their own variant's outputs (batching never mixes variants)."""
    plan = [cases.get(MODEL, n, variant=v) for n in (1, 2, 3, 5) for v in VARIANTS] * 3
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for i, case in enumerate(plan):
            client.async_stream_infer(MODEL, grpc_inputs(case), request_id=f"v{i}")
        got = {}
        for _ in plan:
            result, error = results.get(timeout=90)
            assert error is None, f"stream error: {error}"
            got[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()
    assert sorted(got) == sorted(f"v{i}" for i in range(len(plan)))
    for i, case in enumerate(plan):
        r = got[f"v{i}"]
        case.check({n: r.as_numpy(n) for n in case.output_names()}, f"stream v{i}")


def _bad_x(width=24):
    return np.zeros((2, 16, width, 3), np.float32)


def test_grpc_shape_matching_no_variant(gclient):
    x = grpcclient.InferInput("x", [2, 16, 24, 3], "FP32")
    x.set_data_from_numpy(_bad_x())
    with pytest.raises(InferenceServerException) as ei:
        gclient.infer(MODEL, [x])
    assert grpc_code(ei.value) == "INVALID_ARGUMENT", ei.value
    msg = ei.value.message()
    assert f"model {MODEL}" in msg and "shape [2, 16, 24, 3] matches no variant" in msg, msg
    assert ACCEPTED in msg, msg


def test_http_shape_matching_no_variant(server):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16, 24, 3],
                        "data": _bad_x().reshape(-1).tolist()}]}
    status, doc, raw = http_json(server.http_url, "POST", f"/v2/models/{MODEL}/infer", body)
    assert status == 400, raw
    assert "matches no variant" in doc["error"] and ACCEPTED in doc["error"], doc


def test_shape_of_another_rank_is_refused(server):
    """Rank 3: no variant; over raw HTTP so that the client does not object."""
    x = np.zeros((2, 16, 48), np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                        "data": x.reshape(-1).tolist()}]}
    status, doc, raw = http_json(server.http_url, "POST", f"/v2/models/{MODEL}/infer", body)
    assert status == 400 and ACCEPTED in doc["error"], raw


def test_server_still_answers_both_variants_after_refusals(gclient, cases):
    for variant in VARIANTS:
        case = cases.get(MODEL, 2, variant=variant)
        got, _ = grpc_infer_case(gclient, case)
        case.check(got, f"after refusals {variant}")


def test_metadata_shows_varying_extents_as_minus_one(gclient, server):
    want_in = [{"name": "x", "datatype": "FP32", "shape": [-1, 16, -1, 3]}]
    want_out = [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                {"name": "heatmap", "datatype": "FP32", "shape": [-1, 16, -1]}]
    md = gclient.get_model_metadata(MODEL)
    assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in md.inputs] == want_in
    assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in md.outputs] == want_out
    status, doc, body = http_json(server.http_url, "GET", f"/v2/models/{MODEL}")
    assert status == 200, body
    assert doc["inputs"] == want_in and doc["outputs"] == want_out, doc


def test_config_shows_varying_extents_as_minus_one(gclient, server):
    cfg = gclient.get_model_config(MODEL).config
    assert cfg.max_batch_size == 8
    assert [list(t.dims) for t in cfg.input] == [[16, -1, 3]]
    assert [list(t.dims) for t in cfg.output] == [[10], [16, -1]]
    status, doc, body = http_json(server.http_url, "GET", f"/v2/models/{MODEL}/config")
    assert status == 200, body
    assert [t["dims"] for t in doc["input"]] == [[16, -1, 3]], doc
    assert [t["dims"] for t in doc["output"]] == [[10], [16, -1]], doc
