"""The composition examples served by `pjserve serve`, called with tritonclient
over gRPC, HTTP with binary tensors and HTTP with JSON, against the pure numpy
references of the whole pipelines (python/pjserve_export/
pipeline_reference.py), max abs error printed.

    image_classifier   C hooks: any-size u8 image in, top-3 labels (BYTES) out
    detector           meta: stage 1, threshold + NMS + pooling in C, stage 2
    greedy_decoder     meta: decoder_step in a loop until the end token

Every data-dependent edge is reached by inputs the references pick (zero
boxes, more boxes than stage 2's largest batch size, two chunks of stage-2
calls, the box limit; the end token at step one, MAX_TOKENS, the context
filled, MAX_TOKENS 0), and the hooks' own errors reach the client.
"""

import queue
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protocol"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from pjserve_export import hooks as H  # noqa: E402
from pjserve_export import pipeline_reference as R  # noqa: E402
from pjserve_export import pipelines as P  # noqa: E402
from protocol_util import ServerFailure, ServerProcess, grpc_code  # noqa: E402

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

PROTOCOLS = ("grpc", "http-binary", "http-json")
# The served pipelines compute in float32, the references in float64.
ATOL = 1e-4


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, pjserve_bin):
    repo = tmp_path_factory.mktemp("composition-repository")
    return P.export_pipelines(repo, build=H.hooks_builder(pjserve_bin))


@pytest.fixture(scope="module")
def server(bundles, pjserve_bin, plugin_path, tmp_path_factory):
    repo = bundles["detector"].parent
    s = ServerProcess(pjserve_bin, plugin_path, repo, tmp_path_factory.mktemp("cache"),
                      tmp_path_factory.mktemp("server"), [], "composition")
    try:
        s.start()
    except ServerFailure as e:
        s.kill()
        pytest.fail(str(e), pytrace=False)
    yield s
    problems = s.stop_and_check()
    if problems:
        pytest.fail("the server did not shut down cleanly:\n- " + "\n- ".join(problems)
                    + "\n" + s.describe(), pytrace=False)


@pytest.fixture(scope="module")
def clients(server):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    h = httpclient.InferenceServerClient(server.http_url)
    yield {"grpc": g, "http": h}
    g.close()
    h.close()


def infer(clients, protocol, model, inputs, outputs):
    """{output: array} from one request; inputs {name: (datatype, array)}."""
    if protocol == "grpc":
        mod, client, kw = grpcclient, clients["grpc"], {}
    else:
        mod, client = httpclient, clients["http"]
        kw = {"binary_data": protocol == "http-binary"}
    ins = []
    for name, (dt, arr) in inputs.items():
        t = mod.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr, **kw)
        ins.append(t)
    outs = [mod.InferRequestedOutput(n, **kw) for n in outputs]
    r = client.infer(model, ins, outputs=outs)
    return {n: r.as_numpy(n) for n in outputs}


def labels(array):
    """CLASSES as bytes (tritonclient gives str for JSON strings, bytes otherwise)."""
    return [c.encode() if isinstance(c, str) else bytes(c) for c in array]


def infer_error(clients, protocol, model, inputs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        infer(clients, protocol, model, inputs, [])
    return e.value


def assert_invalid_argument(protocol, e: InferenceServerException, message: str):
    if protocol == "grpc":
        assert grpc_code(e) == "INVALID_ARGUMENT", e
    else:
        assert e.status() == "400", e
    assert message in e.message(), e


# ---- discovery -------------------------------------------------------------------

def test_index_shows_the_pipelines_not_their_stages(clients):
    names = {m["name"] for m in clients["grpc"].get_model_repository_index(as_json=True)
             ["models"]}
    assert {"image_classifier", "detector", "greedy_decoder"} <= names
    assert not names & {"detector_stage1", "detector_stage2", "decoder_step"}


@pytest.mark.parametrize("model,inputs,outputs", [
    ("image_classifier", [("IMAGE", "UINT8", [-1, -1, 3])],
     [("CLASSES", "BYTES", [3]), ("SCORES", "FP32", [3])]),
    ("detector", [("IMAGE", "FP32", [3, 64, 64]), ("SCORE_THRESHOLD", "FP32", [1])],
     [("BOXES", "FP32", [-1, 4]), ("SCORES", "FP32", [-1]), ("LABELS", "INT32", [-1])]),
    ("greedy_decoder", [("PROMPT", "INT32", [-1]), ("MAX_TOKENS", "INT32", [1])],
     [("TOKENS", "INT32", [-1])]),
])
def test_metadata_is_the_client_side(clients, model, inputs, outputs):
    for protocol in ("grpc", "http"):
        meta = clients[protocol].get_model_metadata(model, as_json=True) \
            if protocol == "grpc" else clients[protocol].get_model_metadata(model)
        got_in = [(t["name"], t["datatype"], [int(d) for d in t["shape"]])
                  for t in meta["inputs"]]
        got_out = [(t["name"], t["datatype"], [int(d) for d in t["shape"]])
                   for t in meta["outputs"]]
        assert (got_in, got_out) == (inputs, outputs), protocol


def test_classifier_config_reports_the_image_layout(clients):
    config = clients["grpc"].get_model_config("image_classifier", as_json=True)["config"]
    image = config["input"][0]
    assert (image["name"], image["data_type"], image.get("format")) == (
        "IMAGE", "TYPE_UINT8", "FORMAT_NHWC")
    assert [o["data_type"] for o in config["output"]] == ["TYPE_STRING", "TYPE_FP32"]


# ---- image_classifier ----------------------------------------------------------

@pytest.fixture(scope="module")
def classifier_ref(bundles):
    return R.ImageClassifierReference(bundles["image_classifier"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classifier_matches_reference(clients, classifier_ref, protocol):
    worst = 0.0
    for img in R.classifier_cases(classifier_ref):
        want = classifier_ref(img)
        got = infer(clients, protocol, "image_classifier", {"IMAGE": ("UINT8", img)},
                    ["CLASSES", "SCORES"])
        assert got["CLASSES"].shape == (P.CLS_TOP_K,)
        assert labels(got["CLASSES"]) == want.classes, img.shape
        assert got["SCORES"].dtype == np.float32
        worst = max(worst, float(np.abs(got["SCORES"] - want.scores).max()))
    print(f"image_classifier over {protocol}: max abs error {worst:.2e}")
    assert worst < ATOL


def test_classifier_concurrent_requests(clients, classifier_ref):
    """Concurrent one-image requests of different sizes (which the server may
    coalesce into one execution) each get their own answer."""
    images = R.classifier_cases(classifier_ref)
    client = clients["grpc"]
    pending = []
    for img in images:
        t = grpcclient.InferInput("IMAGE", list(img.shape), "UINT8")
        t.set_data_from_numpy(img)
        results = []
        client.async_infer("image_classifier", [t],
                           lambda result, error, out=results: out.append((result, error)))
        pending.append((img, results))
    worst = 0.0
    for img, results in pending:
        for _ in range(600):
            if results:
                break
            time.sleep(0.05)
        r, e = results[0]
        assert e is None, e
        want = classifier_ref(img)
        assert labels(r.as_numpy("CLASSES")) == want.classes
        worst = max(worst, float(np.abs(r.as_numpy("SCORES") - want.scores).max()))
    print(f"image_classifier, {len(images)} concurrent requests: max abs error {worst:.2e}")
    assert worst < ATOL


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classifier_preprocess_error_reaches_the_client(clients, protocol):
    e = infer_error(clients, protocol, "image_classifier",
                    {"IMAGE": ("UINT8", np.zeros((0, 5, 3), np.uint8))})
    assert_invalid_argument(protocol, e, "IMAGE must be [height, width, 3] with 1 to 8192 "
                                         "pixels a side, got [0, 5, 3]")


# ---- detector ------------------------------------------------------------------

@pytest.fixture(scope="module")
def detector_ref(bundles):
    return R.DetectorReference(bundles["detector_stage1"], bundles["detector_stage2"])


@pytest.fixture(scope="module")
def detector_cases(detector_ref):
    return R.detector_cases(detector_ref)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_detector_matches_reference(clients, detector_ref, detector_cases, protocol):
    worst = 0.0
    for image, threshold, edge in detector_cases:
        want = detector_ref(image, threshold)
        got = infer(clients, protocol, "detector",
                    {"IMAGE": ("FP32", image),
                     "SCORE_THRESHOLD": ("FP32", np.array([threshold], np.float32))},
                    ["BOXES", "SCORES", "LABELS"])
        n = len(want.boxes)
        assert got["BOXES"].shape == (n, 4), edge
        assert got["SCORES"].shape == (n,) and got["LABELS"].shape == (n,), edge
        assert got["LABELS"].dtype == np.int32
        np.testing.assert_array_equal(got["LABELS"], want.labels, err_msg=edge)
        err = max([0.0] + [float(np.abs(got[k] - w).max())
                           for k, w in (("BOXES", want.boxes), ("SCORES", want.scores)) if n])
        print(f"detector over {protocol}, {edge}: {n} boxes, max abs error {err:.2e}")
        assert err < ATOL, edge
        worst = max(worst, err)
    print(f"detector over {protocol}: max abs error {worst:.2e}")


def stage2_counts(server):
    """(rows, executions) of detector_stage2 so far, from /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        for metric in ("nv_inference_count", "nv_inference_exec_count"):
            if line.startswith(metric + '{model="detector_stage2",'):
                found[metric] = int(float(line.rsplit(" ", 1)[1]))
    return found["nv_inference_count"], found["nv_inference_exec_count"]


def test_detector_stage2_calls(server, clients, detector_ref, detector_cases):
    """Stage 2 runs once per kept box: not at all for zero boxes, in several
    executions for a chunk past its largest compiled batch size."""
    largest = P.DET_STAGE2_BATCH_SIZES[-1]
    for image, threshold, edge in detector_cases:
        n = len(detector_ref(image, threshold).boxes)
        rows0, execs0 = stage2_counts(server)
        infer(clients, "grpc", "detector",
              {"IMAGE": ("FP32", image),
               "SCORE_THRESHOLD": ("FP32", np.array([threshold], np.float32))}, ["SCORES"])
        rows1, execs1 = stage2_counts(server)
        chunks = [min(P.DET_CHUNK, n - i) for i in range(0, n, P.DET_CHUNK)]
        least = sum(-(-c // largest) for c in chunks)
        print(f"detector {edge}: {n} boxes, stage-2 chunks {chunks}, "
              f"{execs1 - execs0} executions")
        assert rows1 - rows0 == n, edge
        assert (execs1 - execs0 == 0) if n == 0 else (execs1 - execs0 >= least), edge


@pytest.mark.parametrize("protocol", ["grpc", "http-binary"])  # JSON has no NaN
def test_detector_refuses_nan_threshold(clients, protocol):
    e = infer_error(clients, protocol, "detector",
                    {"IMAGE": ("FP32", np.zeros((3, 64, 64), np.float32)),
                     "SCORE_THRESHOLD": ("FP32", np.array([np.nan], np.float32))})
    assert_invalid_argument(protocol, e, "SCORE_THRESHOLD is NaN")


# ---- greedy_decoder ------------------------------------------------------------

@pytest.fixture(scope="module")
def decoder_ref(bundles):
    return R.GreedyDecoderReference(bundles["decoder_step"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_decoder_matches_reference(clients, decoder_ref, protocol):
    for prompt, max_tokens, edge in R.decoder_cases(decoder_ref):
        want = decoder_ref(prompt, max_tokens)
        got = infer(clients, protocol, "greedy_decoder",
                    {"PROMPT": ("INT32", np.array(prompt, np.int32)),
                     "MAX_TOKENS": ("INT32", np.array([max_tokens], np.int32))}, ["TOKENS"])
        assert got["TOKENS"].dtype == np.int32
        np.testing.assert_array_equal(got["TOKENS"], want.tokens, err_msg=edge)
        print(f"greedy_decoder over {protocol}, {edge}: {prompt} -> {want.tokens.tolist()} "
              f"({want.steps} steps, exact)")


def stream_decoder(url, prompt, max_tokens):
    """[(TOKENS, final flag)] of greedy_decoder_stream's responses to one
    request, read through its final response, or the stream's error."""
    got: "queue.Queue" = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    ins = []
    for name, v in (("PROMPT", prompt), ("MAX_TOKENS", [max_tokens])):
        t = grpcclient.InferInput(name, [len(v)], "INT32")
        t.set_data_from_numpy(np.array(v, np.int32))
        ins.append(t)
    responses = []
    try:
        c.async_stream_infer("greedy_decoder_stream", ins, enable_empty_final_response=True)
        while not responses or not responses[-1][1]:
            result, error = got.get(timeout=60)
            if error is not None:
                return responses, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            responses.append((result.as_numpy("TOKENS"), final))
    finally:
        c.stop_stream()
        c.close()
    return responses, None


def test_decoder_stream_matches_the_unary_decoder(server, clients, decoder_ref):
    for prompt, max_tokens, edge in R.decoder_cases(decoder_ref):
        unary = infer(clients, "grpc", "greedy_decoder",
                      {"PROMPT": ("INT32", np.array(prompt, np.int32)),
                       "MAX_TOKENS": ("INT32", np.array([max_tokens], np.int32))}, ["TOKENS"])
        responses, error = stream_decoder(server.grpc_url, prompt, max_tokens)
        assert error is None, (edge, error)
        *tokens, (last, final) = responses
        assert final and last is None, edge  # the empty final response
        assert all(t.shape == (1,) and not f for t, f in tokens), (edge, tokens)
        streamed = np.array([int(t[0]) for t, _ in tokens], np.int32)
        np.testing.assert_array_equal(streamed, unary["TOKENS"], err_msg=edge)
        np.testing.assert_array_equal(streamed, decoder_ref(prompt, max_tokens).tokens,
                                      err_msg=edge)
        print(f"greedy_decoder_stream, {edge}: {prompt} -> {streamed.tolist()} in "
              f"{len(tokens)} responses + the final one")


def test_decoder_stream_error_reaches_the_stream(server):
    responses, error = stream_decoder(server.grpc_url, [3, 32], 4)
    assert responses == [] and "PROMPT[1] is 32; token ids are 0 to 31" in str(error)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("prompt,max_tokens,message", [
    ([3, 32], 4, "PROMPT[1] is 32; token ids are 0 to 31"),
    (list(range(2, 18)), 4, "PROMPT must hold 1 to 15 tokens, got 16"),
    ([3], -2, "MAX_TOKENS must be 0 or more, got -2"),
])
def test_decoder_run_error_reaches_the_client(clients, protocol, prompt, max_tokens, message):
    e = infer_error(clients, protocol, "greedy_decoder",
                    {"PROMPT": ("INT32", np.array(prompt, np.int32)),
                     "MAX_TOKENS": ("INT32", np.array([max_tokens], np.int32))})
    assert_invalid_argument(protocol, e, message)
