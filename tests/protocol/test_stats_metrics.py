"""ModelStatistics (gRPC and HTTP) and the Prometheus metrics after known
traffic. Counters are compared as differences, so earlier tests do not matter
(tests run one at a time)."""

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from protocol_util import (ALL_MODELS, grpc_infer_case, http_infer_case, http_json,
                           metric, parse_metrics, scrape, serve_only)

MODEL = "mlp_f16"
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")


def _traffic(gclient, hclient, cases):
    """3 gRPC requests of 2 rows, 2 HTTP requests of 3 rows, 1 bad request:
    5 successes, 12 inferences, 5 executions."""
    for _ in range(3):
        case = cases.get(MODEL, 2)
        got, _ = grpc_infer_case(gclient, case)
        case.check(got)
    for _ in range(2):
        case = cases.get(MODEL, 3)
        got, _ = http_infer_case(hclient, case)
        case.check(got)
    bad = grpcclient.InferInput("x", [1, 15], "FP16")
    bad.set_data_from_numpy(np.zeros((1, 15), np.float16))
    with pytest.raises(InferenceServerException):
        gclient.infer(MODEL, [bad])
    return 5, 12, 5


def _grpc_stats(gclient, model):
    resp = gclient.get_inference_statistics(model_name=model)
    assert len(resp.model_stats) == 1, resp
    return resp.model_stats[0]


def test_grpc_statistics_move_with_traffic(gclient, hclient, cases):
    before = _grpc_stats(gclient, MODEL)
    n_ok, n_inf, n_exec = _traffic(gclient, hclient, cases)
    after = _grpc_stats(gclient, MODEL)
    assert after.name == MODEL and after.version == "1"
    s0, s1 = before.inference_stats, after.inference_stats
    assert s1.success.count - s0.success.count == n_ok
    assert after.inference_count - before.inference_count == n_inf
    assert after.execution_count - before.execution_count == n_exec
    assert s1.fail.count - s0.fail.count in (0, 1)  # Triton counts only some rejections
    assert s1.success.ns > s0.success.ns
    assert s1.compute_infer.count - s0.compute_infer.count == n_exec \
        or s1.compute_infer.count - s0.compute_infer.count == n_ok
    assert s1.compute_infer.ns > s0.compute_infer.ns
    assert s1.queue.count - s0.queue.count == n_ok
    assert after.last_inference >= before.last_inference and after.last_inference > 0
    # last_inference is milliseconds since the epoch
    assert after.last_inference > 1_600_000_000_000, after.last_inference


def test_grpc_statistics_all_models(gclient):
    resp = gclient.get_inference_statistics()
    names = sorted(s.name for s in resp.model_stats)
    assert names == sorted(ALL_MODELS), names


def test_http_statistics_every_field_present(gclient, hclient, server, cases):
    """perf_analyzer reads these fields without checking they exist."""
    _traffic(gclient, hclient, cases)
    for path in (f"/v2/models/{MODEL}/stats", f"/v2/models/{MODEL}/versions/1/stats",
                 "/v2/models/stats"):
        status, doc, body = http_json(server.http_url, "GET", path)
        assert status == 200, f"GET {path}: {body!r}"
        stats = doc["model_stats"]
        if path == "/v2/models/stats":
            assert sorted(s["name"] for s in stats) == sorted(ALL_MODELS)
        else:
            assert len(stats) == 1
        for s in stats:
            for key in ("name", "version", "last_inference", "inference_count",
                        "execution_count", "inference_stats", "batch_stats"):
                assert key in s, f"{path}: {key} missing in {s}"
            for d in DURATIONS:
                assert d in s["inference_stats"], f"{path}: inference_stats.{d} missing: {s}"
                for k in ("count", "ns"):
                    v = s["inference_stats"][d].get(k)
                    assert isinstance(v, int) and v >= 0, \
                        f"{path}: inference_stats.{d}.{k} = {v!r} (want a number)"
            for b in s["batch_stats"]:
                assert "batch_size" in b, b
                for d in ("compute_input", "compute_infer", "compute_output"):
                    assert isinstance(b[d]["count"], int) and isinstance(b[d]["ns"], int), b
        # gRPC and HTTP agree
        if path == f"/v2/models/{MODEL}/stats":
            g = _grpc_stats(gclient, MODEL)
            s = stats[0]
            assert s["inference_count"] == g.inference_count
            assert s["execution_count"] == g.execution_count
            assert s["inference_stats"]["success"]["count"] == g.inference_stats.success.count
            assert s["version"] == "1"


def test_statistics_unknown_model(gclient, server):
    with pytest.raises(InferenceServerException) as ei:
        gclient.get_inference_statistics(model_name="no_such_model")
    assert "NOT_FOUND" in (ei.value.status() or ""), ei.value
    status, _, _ = http_json(server.http_url, "GET", "/v2/models/no_such_model/stats")
    assert status == 404


COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure",
            "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us")


def test_metrics_after_known_traffic(gclient, hclient, server, cases):
    samples0, types = parse_metrics(scrape(server.metrics_url))
    for name in COUNTERS:
        assert types.get(name) == "counter", f"# TYPE {name} counter missing ({types.get(name)})"
        for model in ALL_MODELS:
            assert metric(samples0, name, model=model, version="1") is not None, \
                f"{name}{{model=\"{model}\",version=\"1\"}} missing"
    n_ok, n_inf, n_exec = _traffic(gclient, hclient, cases)
    samples1, _ = parse_metrics(scrape(server.metrics_url))

    def delta(name):
        return (metric(samples1, name, model=MODEL, version="1")
                - metric(samples0, name, model=MODEL, version="1"))
    assert delta("nv_inference_request_success") == n_ok
    assert delta("nv_inference_count") == n_inf
    assert delta("nv_inference_exec_count") == n_exec
    assert delta("nv_inference_request_failure") in (0, 1)
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_compute_infer_duration_us") > 0
    assert delta("nv_inference_queue_duration_us") >= 0
    # other models did not move
    for name in ("nv_inference_request_success", "nv_inference_count"):
        assert metric(samples1, name, model="convnet", version="1") == \
            metric(samples0, name, model="convnet", version="1")
    # the metrics agree with the statistics extension
    g = _grpc_stats(gclient, MODEL)
    assert metric(samples1, "nv_inference_request_success", model=MODEL, version="1") == \
        g.inference_stats.success.count
    assert metric(samples1, "nv_inference_count", model=MODEL, version="1") == g.inference_count


PJSERVE_FAMILIES = {
    "pjserve_model_dispatches_total": "counter",
    "pjserve_model_device_seconds_total": "counter",
    "pjserve_model_recent_utilization": "gauge",
    "pjserve_model_weight": "gauge",
    "pjserve_model_queue_depth": "gauge",
    "pjserve_model_requests_in_flight": "gauge",
    "pjserve_model_queue_wait_seconds": "summary",
    "pjserve_model_batch_rows": "histogram",
    "pjserve_model_requests_expired_total": "counter",
    "pjserve_model_requests_shed_total": "counter",
    "pjserve_model_requests_rejected_total": "counter",
    "pjserve_scheduler_info": "gauge",
}
QUANTILES = ("0.5", "0.9", "0.99")


def _rows_buckets(samples, model, batch_sizes):
    """{le: cumulative executions} of pjserve_model_batch_rows for model."""
    out = {}
    for le in [str(b) for b in batch_sizes] + ["+Inf"]:
        v = metric(samples, "pjserve_model_batch_rows_bucket", model=model, version="1", le=le)
        assert v is not None, f"pjserve_model_batch_rows_bucket{{model={model!r},le={le!r}}} missing"
        out[le] = v
    return out


@serve_only("the scheduler gauges are each worker's")
def test_scheduler_metrics_after_known_traffic(gclient, hclient, server, exported, cases):
    samples0, types = parse_metrics(scrape(server.metrics_url))
    for name, kind in PJSERVE_FAMILIES.items():
        assert types.get(name) == kind, f"# TYPE {name} {kind} missing ({types.get(name)})"
    n_ok, n_inf, n_exec = _traffic(gclient, hclient, cases)
    samples1, _ = parse_metrics(scrape(server.metrics_url))
    g = _grpc_stats(gclient, MODEL)

    def at(samples, name, **labels):
        v = metric(samples, name, model=MODEL, version="1", **labels)
        assert v is not None, f"{name}{{model={MODEL!r},{labels}}} missing"
        return v

    # dispatches are executions, and agree with ModelStatistics
    assert at(samples1, "pjserve_model_dispatches_total") == g.execution_count
    assert (at(samples1, "pjserve_model_dispatches_total")
            - at(samples0, "pjserve_model_dispatches_total")) == n_exec
    assert at(samples1, "pjserve_model_device_seconds_total") > \
        at(samples0, "pjserve_model_device_seconds_total")
    # the rows histogram: one execution per dispatch, rows add up to inferences
    sizes = exported[MODEL].manifest.batch_sizes
    buckets0 = _rows_buckets(samples0, MODEL, sizes)
    buckets1 = _rows_buckets(samples1, MODEL, sizes)
    values = list(buckets1.values())
    assert values == sorted(values), f"buckets not cumulative: {buckets1}"
    count = at(samples1, "pjserve_model_batch_rows_count")
    assert buckets1["+Inf"] == count
    assert count == at(samples1, "pjserve_model_dispatches_total")
    assert count - at(samples0, "pjserve_model_batch_rows_count") == n_exec
    assert (at(samples1, "pjserve_model_batch_rows_sum")
            - at(samples0, "pjserve_model_batch_rows_sum")) == n_inf
    # requests of 2 and 3 rows, one at a time: 3 executions of 2 rows, 2 of 3 (le="4")
    assert buckets1["1"] - buckets0["1"] == 0, (buckets0, buckets1)
    assert buckets1["4"] - buckets0["4"] == n_exec, (buckets0, buckets1)
    # the queue-wait summary
    waits = [at(samples1, "pjserve_model_queue_wait_seconds", quantile=q) for q in QUANTILES]
    assert all(w >= 0 for w in waits) and waits == sorted(waits), waits
    assert at(samples1, "pjserve_model_queue_wait_seconds_count") == g.inference_stats.queue.count
    assert at(samples1, "pjserve_model_queue_wait_seconds_sum") == \
        pytest.approx(g.inference_stats.queue.ns / 1e9, abs=1e-9)
    # the scheduler's view, idle now
    for model in ("mlp", "convnet", MODEL):
        assert metric(samples1, "pjserve_model_queue_depth", model=model, version="1") == 0
        assert metric(samples1, "pjserve_model_requests_in_flight", model=model,
                      version="1") == 0
        assert metric(samples1, "pjserve_model_weight", model=model, version="1") > 0
        u = metric(samples1, "pjserve_model_recent_utilization", model=model, version="1")
        assert u is not None and 0 <= u <= 1, u
        for name in ("pjserve_model_requests_expired_total", "pjserve_model_requests_shed_total"):
            assert metric(samples1, name, model=model, version="1") >= 0
        assert metric(samples1, "pjserve_model_requests_rejected_total", model=model,
                      version="1", reason="queue_full") >= 0
    # the default discipline, reported once
    info = [(labels, v) for (name, labels), v in samples1.items()
            if name == "pjserve_scheduler_info"]
    assert info == [(frozenset({("discipline", "fair")}), 1.0)], info


def test_metrics_unknown_path(server):
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/nope"), timeout=10)
    assert ei.value.code == 404


@serve_only("a gateway merges its workers' expositions")
def test_metrics_for_the_models_that_matter(server_factory, cases):
    """--metrics-models 1 over three models: series of their own for the one
    in use, every model still counted in the pjserve_all_models_* totals.
    Models rank by recent device time (after those busy or resident), which
    decays with the scheduler's half-life: mlp's earlier requests must have
    faded before the scrape whatever their device time on a loaded machine,
    so the half-life is short and a pause comes between."""
    srv = server_factory(names=("mlp", "two_io", "convnet"),
                         extra_args=("--metrics-models", "1", "--scheduler-half-life-ms", "50"))
    used = cases.get("two_io", 2, seed=91)
    other = cases.get("mlp", 1, seed=92)
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        for _ in range(3):
            grpc_infer_case(c, other)
        time.sleep(1.0)  # 20 half-lives
        for _ in range(20):
            got, _ = grpc_infer_case(c, used)
            used.check(got, "two_io")
    samples, _ = parse_metrics(scrape(srv.metrics_url))
    with_series = {dict(labels)["model"] for (name, labels), _ in samples.items()
                   if name == "nv_inference_request_success"}
    assert with_series == {"two_io"}, with_series
    assert metric(samples, "pjserve_models_loaded") == 3
    assert metric(samples, "pjserve_models_with_series") == 1
    assert metric(samples, "pjserve_all_models_requests_total", outcome="success") == 23
    assert metric(samples, "pjserve_all_models_requests_total", outcome="failure") == 0
    assert metric(samples, "pjserve_all_models_inferences_total") == 43  # 20 x 2 rows + 3
    assert srv.stop_and_check() == []
