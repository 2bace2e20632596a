"""Health, server and model metadata, model config, log settings, the
grpc.health.v1 service and server reflection."""

import json
import subprocess

import grpc
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from .conftest import _start, small_repository
from protocol_util import (ALL_MODELS, CONFIG_DTYPE, client_dims, finish_checked, grpc_channel,
                           grpc_code, http_json, http_request, kserve_dtype, pb_decode, pb_field_bytes,
                           pb_get)

# Extensions pjserve implements and clients (perf_analyzer, tritonclient) look for.
# (system_shared_memory is checked on the server that allows it.)
REQUIRED_EXTENSIONS = {"binary_tensor_data", "model_repository", "model_configuration",
                       "statistics", "logging", "trace", "cuda_shared_memory"}


# ---- health -------------------------------------------------------------------

def test_http_health(server):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready",
                 "/v2/models/mlp/versions/1/ready"):
        status, _, body = http_request(server.http_url, "GET", path)
        assert status == 200, f"GET {path}: {status} {body!r}"
    # the kserve SDK reads these bodies (Triton's clients only the status)
    for kind in ("live", "ready"):
        status, _, body = http_request(server.http_url, "GET", f"/v2/health/{kind}")
        assert (status, json.loads(body)) == (200, {kind: True}), body
    status, _, _ = http_request(server.http_url, "GET", "/v2/models/no_such_model/ready")
    assert status in (400, 404), f"ready of an unknown model: HTTP {status}"


def test_grpc_health(gclient, hclient):
    assert gclient.is_server_live()
    assert gclient.is_server_ready()
    for m in ALL_MODELS:
        assert gclient.is_model_ready(m), m
        assert hclient.is_model_ready(m), m
    assert gclient.is_model_ready("mlp", "1")
    try:
        ready = gclient.is_model_ready("no_such_model")
    except InferenceServerException as e:
        assert grpc_code(e) == "NOT_FOUND", e
    else:
        assert ready is False
    assert hclient.is_server_live() and hclient.is_server_ready()


def _health_check(channel, service: str):
    call = channel.unary_unary("/grpc.health.v1.Health/Check")
    req = pb_field_bytes(1, service.encode()) if service else b""
    resp = call(req, timeout=10)
    status = pb_get(pb_decode(resp), 1)
    return status[0] if status else 0  # proto3: UNKNOWN (0) is not sent


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService"])
def test_grpc_health_v1_serving(server, service):
    with grpc_channel(server.grpc_url) as ch:
        assert _health_check(ch, service) == 1, "expected SERVING (1)"


def test_grpc_health_v1_watch(server):
    """Watch streams the current status first (SERVING)."""
    with grpc_channel(server.grpc_url) as ch:
        call = ch.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=10)
        first = next(call)
        call.cancel()
    assert (pb_get(pb_decode(first), 1) or [0])[0] == 1, "expected SERVING (1)"


def test_grpc_health_v1_unknown_service(server):
    with grpc_channel(server.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            _health_check(ch, "no.such.Service")
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND, ei.value


# ---- server metadata ------------------------------------------------------------

def _server_metadata(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        md = c.get_server_metadata()
    finally:
        c.close()
    status, doc, body = http_json(srv.http_url, "GET", "/v2")
    assert status == 200, body
    return md, doc


def test_server_metadata(server):
    """Triton reports one extension list (the core's) on both protocols."""
    md, doc = _server_metadata(server)
    assert md.name, md
    assert md.version, md
    assert doc["name"] == md.name and doc["version"] == md.version, doc
    assert sorted(doc["extensions"]) == sorted(md.extensions), \
        f"extensions differ: HTTP {doc['extensions']}, gRPC {list(md.extensions)}"
    for proto, ext in (("gRPC", list(md.extensions)), ("HTTP", doc["extensions"])):
        missing = REQUIRED_EXTENSIONS - set(ext)
        assert not missing, f"{proto} server metadata extensions lack {sorted(missing)}: {ext}"


def test_server_name_is_pjserve_or_as_set(server, server_factory):
    """pjserve by default; --server-name sets it on both protocols (Triton's
    health_metadata examples check for "triton"); a bad name is a usage
    error."""
    md, doc = _server_metadata(server)
    assert md.name == doc["name"] == "pjserve"
    s = server_factory(["--server-name", "triton"])
    md, doc = _server_metadata(s)
    assert md.name == doc["name"] == "triton"
    finish_checked(s)
    for bad in ("", "has space", "x" * 65, "a/b"):
        r = subprocess.run([str(s.binary), "serve", "--model-repository", str(s.repository),
                            "--server-name", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r
        assert "--server-name" in r.stderr, r.stderr


def test_server_metadata_with_client_shm(shm_server):
    md, doc = _server_metadata(shm_server)
    assert "system_shared_memory" in md.extensions, list(md.extensions)
    assert "system_shared_memory" in doc["extensions"], doc


# ---- model metadata -------------------------------------------------------------

def _expected_metadata(exported, model):
    m = exported[model].manifest

    def tensors(specs, output):
        dims = [client_dims(m, s, output) for s in specs]
        return [{"name": s.name, "datatype": kserve_dtype(s),
                 "shape": [-1] + d if s.batched else d}
                for s, d in zip(specs, dims)]
    return tensors(m.inputs, False), tensors(m.outputs, True)


@pytest.mark.parametrize("model", ALL_MODELS)
def test_model_metadata(gclient, server, exported, model):
    want_in, want_out = _expected_metadata(exported, model)
    md = gclient.get_model_metadata(model)
    assert md.name == model
    assert list(md.versions) == ["1"]
    assert md.platform, "platform is empty"
    got_in = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in md.inputs]
    got_out = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
               for t in md.outputs]
    assert got_in == want_in
    assert got_out == want_out

    for path in (f"/v2/models/{model}", f"/v2/models/{model}/versions/1"):
        status, doc, body = http_json(server.http_url, "GET", path)
        assert status == 200, f"GET {path}: {body!r}"
        assert doc["name"] == model and doc["versions"] == ["1"], doc
        assert doc["platform"] == md.platform
        assert doc["inputs"] == want_in, doc
        assert doc["outputs"] == want_out, doc


def test_model_metadata_unknown(gclient, server):
    for model, version in (("no_such_model", ""), ("mlp", "2")):
        with pytest.raises(InferenceServerException) as ei:
            gclient.get_model_metadata(model, version)
        assert grpc_code(ei.value) == "NOT_FOUND", ei.value
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        status, doc, body = http_json(server.http_url, "GET", path)
        assert status == 404, f"GET {path}: {status} {body!r}"
        assert "error" in doc, doc


# ---- model config -----------------------------------------------------------------

@pytest.mark.parametrize("model", ALL_MODELS)
def test_model_config(gclient, server, exported, model):
    m = exported[model].manifest
    cfg = gclient.get_model_config(model).config
    assert cfg.name == model
    assert cfg.max_batch_size == max(m.batch_sizes) == 8
    assert [i.name for i in cfg.input] == [s.name for s in m.inputs]
    assert [o.name for o in cfg.output] == [s.name for s in m.outputs]
    tensors = [(g, s, False) for g, s in zip(cfg.input, m.inputs)] + \
        [(g, s, True) for g, s in zip(cfg.output, m.outputs)]
    for got, spec, output in tensors:
        want_type = CONFIG_DTYPE[kserve_dtype(spec)]
        assert model_config_pb2.DataType.Name(got.data_type) == want_type, got
        dims = client_dims(m, spec, output)  # per-example: no batch axis
        if dims:
            assert list(got.dims) == dims, got
        else:
            # A per-example scalar: [] or Triton's [1] with reshape to [].
            assert list(got.dims) in ([], [1]), got
            if list(got.dims) == [1]:
                assert got.HasField("reshape") and list(got.reshape.shape) == [], got

    status, doc, body = http_json(server.http_url, "GET", f"/v2/models/{model}/config")
    assert status == 200, body
    assert doc["name"] == model
    assert doc["max_batch_size"] == 8, doc
    tensors = [(g, s, False) for g, s in zip(doc["input"], m.inputs)] + \
        [(g, s, True) for g, s in zip(doc["output"], m.outputs)]
    for got, spec, output in tensors:
        assert got["name"] == spec.name
        assert got["data_type"] == CONFIG_DTYPE[kserve_dtype(spec)], got
        dims = got.get("dims", [])
        assert all(isinstance(d, int) for d in dims), f"dims must be JSON numbers: {got}"
        assert dims == client_dims(m, spec, output) or (not spec.shape and dims == [1]), got
    status, doc2, _ = http_json(server.http_url, "GET", f"/v2/models/{model}/versions/1/config")
    assert status == 200 and doc2 == doc


@pytest.mark.parametrize("model", ALL_MODELS)
def test_model_config_dynamic_batching(gclient, server, exported, model):
    """Every tensor of these models has a batch axis, so requests are coalesced:
    both protocols report dynamic_batching with the compiled batch sizes."""
    m = exported[model].manifest
    assert all(s.batched for s in list(m.inputs) + list(m.outputs)), m
    sizes = list(m.batch_sizes)
    cfg = gclient.get_model_config(model).config
    assert cfg.WhichOneof("scheduling_choice") == "dynamic_batching", cfg
    assert list(cfg.dynamic_batching.preferred_batch_size) == sizes, cfg.dynamic_batching
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 0
    status, doc, body = http_json(server.http_url, "GET", f"/v2/models/{model}/config")
    assert status == 200, body
    assert doc.get("dynamic_batching") == {"preferred_batch_size": sizes,
                                           "max_queue_delay_microseconds": 0}, doc


def test_model_config_unknown(gclient, server):
    with pytest.raises(InferenceServerException) as ei:
        gclient.get_model_config("no_such_model")
    assert grpc_code(ei.value) == "NOT_FOUND", ei.value
    status, _, _ = http_json(server.http_url, "GET", "/v2/models/no_such_model/config")
    assert status == 404


# ---- log settings -------------------------------------------------------------------

LOG_KEYS = {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}


def test_log_settings(gclient, server):
    settings = gclient.get_log_settings().settings
    assert LOG_KEYS <= set(settings.keys()), sorted(settings.keys())
    level = settings["log_verbose_level"].uint32_param
    resp = gclient.update_log_settings({"log_verbose_level": level})
    assert resp.settings["log_verbose_level"].uint32_param == level

    status, doc, body = http_json(server.http_url, "GET", "/v2/logging")
    assert status == 200, body
    assert LOG_KEYS <= set(doc), doc
    status, doc2, body = http_json(server.http_url, "POST", "/v2/logging",
                                   {"log_verbose_level": doc["log_verbose_level"]})
    assert status == 200, body
    assert doc2["log_verbose_level"] == doc["log_verbose_level"]
    status, doc3, body = http_json(server.http_url, "POST", "/v2/logging",
                                   {"log_verbose_level": "loud"})
    assert status == 400, f"a string verbose level: HTTP {status} {body!r}"
    assert "error" in doc3


# ---- reflection -----------------------------------------------------------------------

REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _reflect(channel, requests):
    """Sends ServerReflectionRequest bodies (bytes) on one stream; returns the
    decoded responses."""
    call = channel.stream_stream(REFLECTION)
    return [pb_decode(r) for r in call(iter(requests), timeout=20)]


def _list_services(channel):
    (resp,) = _reflect(channel, [pb_field_bytes(7, b"")])
    lst = pb_get(resp, 6)
    assert lst, f"no list_services_response: {resp}"
    return [pb_get(pb_decode(s), 1)[0].decode() for s in pb_get(pb_decode(lst[0]), 1)]


def _files_for(channel, field, value):
    (resp,) = _reflect(channel, [pb_field_bytes(field, value.encode())])
    fdr = pb_get(resp, 4)
    if not fdr:
        err = pb_get(resp, 7)
        return None, (pb_decode(err[0]) if err else resp)
    files = []
    for raw in pb_get(pb_decode(fdr[0]), 1):
        fd = descriptor_pb2.FileDescriptorProto()
        fd.ParseFromString(raw)
        files.append(fd)
    return files, None


def test_reflection_lists_services(server):
    with grpc_channel(server.grpc_url) as ch:
        services = _list_services(ch)
    for s in ("inference.GRPCInferenceService", "grpc.health.v1.Health"):
        assert s in services, f"{s} not listed by reflection: {services}"


def test_reflection_unknown_symbol(server):
    with grpc_channel(server.grpc_url) as ch:
        files, err = _files_for(ch, 4, "no.such.Symbol")
    assert files is None, "descriptors returned for an unknown symbol"
    codes = pb_get(err, 1)
    assert codes and codes[0] == grpc.StatusCode.NOT_FOUND.value[0], err


def _reflected_files(channel):
    files, err = _files_for(channel, 4, "inference.GRPCInferenceService")
    assert files is not None, f"file_containing_symbol failed: {err}"
    by_name = {f.name: f for f in files}
    # Fetch missing dependencies by file name, as grpcurl does.
    todo = [d for f in files for d in f.dependency]
    while todo:
        d = todo.pop()
        if d in by_name:
            continue
        more, err = _files_for(channel, 3, d)
        assert more is not None, f"file_by_filename {d!r} failed: {err}"
        for f in more:
            if f.name not in by_name:
                by_name[f.name] = f
                todo += list(f.dependency)
    return by_name


def test_reflection_descriptors_match_triton(server):
    """The reflected .proto files agree with tritonclient's grpc_service.proto and
    model_config.proto: every message pjserve defines has Triton's field names,
    numbers, types and labels, and the service has every Triton method with the
    same request/response types and streaming."""
    with grpc_channel(server.grpc_url) as ch:
        files = _reflected_files(ch)

    ours = {}
    for f in files.values():
        def walk(prefix, msgs):
            for m in msgs:
                full = f"{prefix}.{m.name}"
                ours[full] = m
                walk(full, m.nested_type)
        walk(f.package, f.message_type)
    services = {f"{f.package}.{s.name}": s for f in files.values() for s in f.service}
    assert "inference.GRPCInferenceService" in services, sorted(services)

    triton = {}
    for mod in (service_pb2, model_config_pb2):
        fd = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fd)

        def walk(prefix, msgs):
            for m in msgs:
                full = f"{prefix}.{m.name}"
                triton[full] = m
                walk(full, m.nested_type)
        walk(fd.package, fd.message_type)
        if mod is service_pb2:
            triton_service = fd.service[0]

    problems = []
    for name, m in ours.items():
        if name not in triton:
            continue
        tfields = {f.number: f for f in triton[name].field}
        for f in m.field:
            t = tfields.get(f.number)
            if t is None:
                problems.append(f"{name}.{f.name} = {f.number}: Triton has no field {f.number}")
            elif (t.name, t.type, t.label, t.type_name.lstrip(".")) != \
                    (f.name, f.type, f.label, f.type_name.lstrip(".")):
                problems.append(f"{name} field {f.number}: ours {f.name} type {f.type} "
                                f"{f.type_name} label {f.label}, Triton {t.name} type {t.type} "
                                f"{t.type_name} label {t.label}")
    ours_methods = {m.name: m for m in services["inference.GRPCInferenceService"].method}
    for tm in triton_service.method:
        om = ours_methods.get(tm.name)
        if om is None:
            problems.append(f"method {tm.name} missing")
            continue
        if (om.input_type.lstrip("."), om.output_type.lstrip("."), om.client_streaming,
                om.server_streaming) != (tm.input_type.lstrip("."), tm.output_type.lstrip("."),
                                         tm.client_streaming, tm.server_streaming):
            problems.append(f"method {tm.name}: ours {om}, Triton {tm}")
    for needed in ("inference.ModelInferRequest", "inference.ModelInferResponse",
                   "inference.ModelConfig", "inference.ModelStatistics"):
        if needed not in ours:
            problems.append(f"message {needed} not described")
    assert not problems, "\n".join(problems)


def test_model_config_input_format(pjserve_bin, plugin_path, cache_dir, exported, tmp_path):
    """An input's `format` in the manifest is what ModelConfig reports, on both
    protocols (image clients read C, H and W by it); inputs without one
    report FORMAT_NONE."""
    repo = small_repository(exported, tmp_path / "repo", ("convnet", "mlp"))
    manifest = repo / "convnet" / "manifest.yaml"
    text = manifest.read_text()
    declared = "shape: [batch, 28, 28, 1]}"
    assert declared in text, text
    manifest.write_text(text.replace(declared, "shape: [batch, 28, 28, 1], format: NHWC}"))
    s = _start(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "srv", [], "format")
    g = grpcclient.InferenceServerClient(s.grpc_url)
    try:
        for model, want in (("convnet", "FORMAT_NHWC"), ("mlp", "FORMAT_NONE")):
            cfg = g.get_model_config(model).config
            assert model_config_pb2.ModelInput.Format.Name(cfg.input[0].format) == want, cfg
            status, doc, raw = http_json(s.http_url, "GET", f"/v2/models/{model}/config")
            assert status == 200 and doc["input"][0]["format"] == want, raw
    finally:
        g.close()
        finish_checked(s)
