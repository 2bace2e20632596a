"""A load with a configuration override: the `config` parameter of
RepositoryModelLoad and POST /v2/repository/models/NAME/load, as tritonclient's
load_model(config=json.dumps(...)) sends it (docs/serving.md, "Loading with a
configuration override").

Each test runs on both protocols against its own server over mlp (compiled at
batch sizes 1, 4 and 8):

  - a cap of 4 with dynamic_batching: the load answers once the model is ready,
    ModelConfig reports max_batch_size 4 and preferred sizes 1 and 4, 4 rows
    are answered correctly, 5 are refused naming the cap; a later load without
    config serves the bundle's 8 rows again;
  - dynamic_batching left out: ModelConfig has none, and concurrent requests
    each run as an execution of their own (the model's statistics count one
    execution per request);
  - the configuration ModelConfig returns, read back by the client (gRPC's with
    64-bit integers as strings) and changed, is accepted as it is;
  - fields pjserve cannot apply are refused together, each named, and the
    version serving keeps serving at its settings; a name that is not the
    model's, a cap that is no compiled size, and max_batch_size 0 on a model
    with a batch axis are refused with the reason;
  - `file:` overrides are refused as writing into the repository; over REST
    the config must be a string of JSON (an object in its place is refused);
  - default_queue_policy sets the model's default timeout and queue bound
    (read from the control surface of one serve process).
"""

import json

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from protocol_util import (finish_checked, grpc_code, grpc_infer_case, http_infer_case,
                           http_json, run_threads, serve_only)

MODEL = "mlp"
COMPILED = [1, 4, 8]


class Proto:
    """One protocol's client and the answers the tests compare."""

    def __init__(self, name, srv):
        self.name = name
        if name == "grpc":
            self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        else:
            self.client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120,
                                                           connection_timeout=120)

    def close(self):
        self.client.close()

    def config(self):
        if self.name == "grpc":
            return self.client.get_model_config(MODEL, as_json=True)["config"]
        return self.client.get_model_config(MODEL)

    def infer(self, case):
        return (grpc_infer_case if self.name == "grpc" else http_infer_case)(self.client, case)

    def stats(self):
        if self.name == "grpc":
            doc = self.client.get_inference_statistics(MODEL, as_json=True)
        else:
            doc = self.client.get_inference_statistics(MODEL)
        st = doc["model_stats"][0]
        return int(st.get("execution_count", 0)), int(st.get("inference_count", 0)), st

    def refused_code(self, e):
        return grpc_code(e) if self.name == "grpc" else e.status()


INVALID = {"grpc": "INVALID_ARGUMENT", "http": "400"}
UNSUPPORTED = {"grpc": "UNIMPLEMENTED", "http": "501"}


@pytest.fixture(params=["grpc", "http"])
def proto(request, server_factory):
    srv = server_factory(names=(MODEL,))
    p = Proto(request.param, srv)
    p.server = srv
    yield p
    p.close()
    finish_checked(srv)


def load(p, config=None):
    text = None if config is None else (config if isinstance(config, str)
                                         else json.dumps(config))
    p.client.load_model(MODEL, config=text)


def refused(p, config, code=None):
    with pytest.raises(InferenceServerException) as ei:
        load(p, config)
    assert p.refused_code(ei.value) == (code or INVALID)[p.name], ei.value
    return ei.value.message()


def test_cap_honoured(proto, cases):
    load(proto, {"name": MODEL, "max_batch_size": 4, "dynamic_batching": {}})
    # The load answered once the model was ready: it serves at once.
    assert proto.client.is_model_ready(MODEL)
    cfg = proto.config()
    assert int(cfg["max_batch_size"]) == 4, cfg
    assert [int(b) for b in cfg["dynamic_batching"]["preferred_batch_size"]] == [1, 4], cfg
    got, _ = proto.infer(cases.get(MODEL, 4))
    cases.get(MODEL, 4).check(got, f"{proto.name}: 4 rows under a cap of 4")
    with pytest.raises(InferenceServerException) as ei:
        proto.infer(cases.get(MODEL, 5))
    assert proto.refused_code(ei.value) == INVALID[proto.name], ei.value
    assert "max_batch_size" in ei.value.message() and "4" in ei.value.message(), ei.value

    # A load without config returns to the bundle's settings.
    load(proto)
    cfg = proto.config()
    assert int(cfg["max_batch_size"]) == 8, cfg
    assert [int(b) for b in cfg["dynamic_batching"]["preferred_batch_size"]] == COMPILED
    got, _ = proto.infer(cases.get(MODEL, 8))
    cases.get(MODEL, 8).check(got, f"{proto.name}: 8 rows after a load without config")


def test_dynamic_batching_off(proto, cases):
    load(proto, {"name": MODEL, "max_batch_size": 8})
    cfg = proto.config()
    assert int(cfg["max_batch_size"]) == 8 and "dynamic_batching" not in cfg, cfg
    executions0, rows0, _ = proto.stats()
    case = cases.get(MODEL, 1)
    n = 48

    def one(i):
        c = grpcclient.InferenceServerClient(proto.server.grpc_url) if proto.name == "grpc" \
            else httpclient.InferenceServerClient(proto.server.http_url)
        try:
            got, _ = (grpc_infer_case if proto.name == "grpc" else http_infer_case)(c, case)
            case.check(got, f"{proto.name}: request {i}")
        finally:
            c.close()

    _, errors = run_threads(one, n, timeout=300)
    assert not errors, errors[:3]
    executions, rows, st = proto.stats()
    assert rows - rows0 == n, st
    assert executions - executions0 == n, \
        f"{n} one-row requests with dynamic batching off ran as {executions - executions0} " \
        f"executions: {st}"
    assert all(int(b["batch_size"]) == 1 for b in st.get("batch_stats", [])), st


def test_model_config_round_trip(proto, cases):
    cfg = proto.config()
    cfg["max_batch_size"] = 4
    cfg["dynamic_batching"]["preferred_batch_size"] = [1, 4]
    load(proto, cfg)
    again = proto.config()
    assert int(again["max_batch_size"]) == 4, again
    assert "dynamic_batching" in again, again
    assert [i["name"] for i in again["input"]] == [i["name"] for i in cfg["input"]]


def test_refused_fields_named(proto, cases):
    msg = refused(proto, {
        "name": MODEL, "max_batch_size": 8,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "optimization": {"priority": "PRIORITY_MAX"},
        "dynamic_batching": {"priority_levels": 2},
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [16],
                   "reshape": {"shape": [4, 4]}}],
    })
    for field in ("'instance_group'", "'optimization'", "'dynamic_batching.priority_levels'",
                  "'input[0].reshape'"):
        assert field in msg, msg
    assert "pjserve cannot apply" in msg and "max_batch_size" in msg, msg
    # The version serving keeps serving, at its settings.
    assert int(proto.config()["max_batch_size"]) == 8
    got, _ = proto.infer(cases.get(MODEL, 8))
    cases.get(MODEL, 8).check(got, f"{proto.name}: after a refused config")


@pytest.mark.parametrize("config, words", [
    ({"name": "other", "max_batch_size": 8}, ['name "other" is not the model being loaded']),
    ({"max_batch_size": 16}, ["larger than its largest compiled batch size",
                              "compiled: 1, 4, 8"]),
    ({"max_batch_size": 3}, ["not one of its compiled batch sizes (1, 4, 8)"]),
    ({"max_batch_size": 0}, ["without a batch axis", "1, 4, 8"]),
    ({}, ["max_batch_size 0 (or absent)"]),
    ({"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32",
                                      "dims": [32]}]},
     ["input[0]", "dims [32] differs from the model's [16]"]),
    ({"max_batch_size": 8, "input": [{"name": "nope"}]}, ['no input "nope"']),
    ({"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 100}},
     ["never holds a request back"]),
    ("{\"max_batch_size\": 8,", ["not a JSON ModelConfig"]),
])
def test_refused_with_reason(proto, config, words):
    msg = refused(proto, config)
    for w in words:
        assert w in msg, msg
    assert int(proto.config()["max_batch_size"]) == 8


def test_file_override_refused(proto):
    cfg = json.dumps({"name": MODEL, "max_batch_size": 8, "dynamic_batching": {}})
    if proto.name == "grpc":
        with pytest.raises(InferenceServerException) as ei:
            proto.client.load_model(MODEL, config=cfg, files={"file:1/model.onnx": b"\0onnx"})
        code, msg = grpc_code(ei.value), ei.value.message()
    else:  # tritonclient's HTTP client cannot encode files; the request it means to send
        status, doc, raw = http_json(proto.server.http_url, "POST",
                                     f"/v2/repository/models/{MODEL}/load",
                                     {"parameters": {"config": cfg,
                                                     "file:1/model.onnx": "AG9ubng="}})
        code, msg = str(status), (doc or {}).get("error", raw.decode())
    assert code == UNSUPPORTED[proto.name], msg
    assert "file:1/model.onnx" in msg and "model repository" in msg, msg


@pytest.mark.parametrize("path", ["A" * 256, "1/" + "B" * 300 + "/model.onnx", "/etc/passwd",
                                  "1/../../x", ""])
def test_file_override_with_impossible_path(proto, path):
    """A `file:` path no model directory could hold is answered as Triton
    answers it (gRPC INTERNAL, "failed to poll from model repository"; its
    model control example checks both), and the server stays up with the
    model as it was."""
    key = "file:" + path
    if proto.name == "grpc":
        with pytest.raises(InferenceServerException) as ei:
            proto.client.load_model(MODEL, config="{}", files={key: b"a"})
        code, msg = grpc_code(ei.value), ei.value.message()
        assert code == "INTERNAL", msg
    else:
        status, doc, raw = http_json(proto.server.http_url, "POST",
                                     f"/v2/repository/models/{MODEL}/load",
                                     {"parameters": {"config": "{}", key: "YQ=="}})
        code, msg = str(status), (doc or {}).get("error", raw.decode())
        assert code == "500", msg
    assert "failed to poll from model repository" in msg, msg
    assert "cannot name a file in a model directory" in msg, msg
    assert proto.client.is_server_live()
    assert int(proto.config()["max_batch_size"]) == 8


@serve_only("the control surface is each worker's")
def test_queue_policy(proto):
    load(proto, {"name": MODEL, "max_batch_size": 8, "dynamic_batching": {
        "default_queue_policy": {"default_timeout_microseconds": "250000",
                                 "max_queue_size": 7, "timeout_action": "REJECT",
                                 "allow_timeout_override": True}}})
    status, doc, raw = http_json(proto.server.http_url, "GET", "/v2/pjserve/control")
    assert status == 200, raw
    mlp = next(m for m in doc["models"] if m["name"] == MODEL)
    assert (mlp["default_timeout_us"], mlp["max_queue_depth"]) == (250000, 7), mlp
    msg = refused(proto, {"name": MODEL, "max_batch_size": 8, "dynamic_batching": {
        "default_queue_policy": {"timeout_action": "DELAY", "allow_timeout_override": False}}})
    assert "'dynamic_batching.default_queue_policy.timeout_action'" in msg, msg
    assert "'dynamic_batching.default_queue_policy.allow_timeout_override'" in msg, msg
    load(proto)
    status, doc, raw = http_json(proto.server.http_url, "GET", "/v2/pjserve/control")
    mlp = next(m for m in doc["models"] if m["name"] == MODEL)
    assert (mlp["default_timeout_us"], mlp["max_queue_depth"]) == (0, 1024), mlp


def test_config_must_be_a_string(server_factory):
    """REST: the config is JSON text in a string, as tritonclient sends it; an
    object in its place is refused, naming the parameter."""
    srv = server_factory(names=(MODEL,))
    status, doc, raw = http_json(srv.http_url, "POST", f"/v2/repository/models/{MODEL}/load",
                                 {"parameters": {"config": {"max_batch_size": 4}}})
    assert status == 400, raw
    assert "\"config\" must be a string" in doc["error"], doc
    status, _, raw = http_json(srv.http_url, "POST", f"/v2/repository/models/{MODEL}/load",
                               {"parameters": {"config": json.dumps({"max_batch_size": 4})}})
    assert status == 200, raw
    status, doc, raw = http_json(srv.http_url, "GET", f"/v2/models/{MODEL}/config")
    assert status == 200 and doc["max_batch_size"] == 4 and "dynamic_batching" not in doc, raw
    finish_checked(srv)
