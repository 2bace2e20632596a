"""One relay policy under both protocols: `pjserve gateway` over two real
`pjserve serve` workers serves each KServe V2 operation the same way over
gRPC and REST (src/gateway/relay_policy.h).

Checked, each over both protocols with tritonclient:
- every operation reaches the workers its class names, seen in the
  gateway's own count of forwards per worker: none for the gateway's own
  answers, one worker for reads and a model's calls, every worker for
  fan-outs (log settings, shared-memory registration, CUDA shared memory
  included) and merges (index, statistics);
- a fan-out that one worker refuses names that worker and says the other
  succeeded, in the same words;
- statistics of a model one worker no longer has are merged from the worker
  that has it.
"""

import re
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
import tritonclient.utils.shared_memory as shm

from gateway_util import finish_cluster, wait_for
from protocol_util import parse_metrics, scrape


def forwarded(cluster):
    """(requests forwarded to each worker, whether every worker was ready
    with its breaker closed): a worker whose probe failed under load is
    legitimately routed around, so a call made then proves nothing."""
    samples, _ = parse_metrics(scrape(cluster.gateway.metrics_url))

    def value(name, i):
        return samples[(name, frozenset({("worker", str(i))}))]

    n = range(len(cluster.workers))
    routable = all(value("pjserve_gateway_worker_ready", i) == 1 and
                   value("pjserve_gateway_worker_breaker_open", i) == 0 for i in n)
    return [value("pjserve_gateway_forwarded_total", i) for i in n], routable


def clients(cluster):
    return {"gRPC": grpcclient.InferenceServerClient(cluster.gateway.grpc_url),
            "REST": httpclient.InferenceServerClient(cluster.gateway.http_url,
                                                     network_timeout=60)}


# (operation, call, the workers it reaches: "none", "one" or "every")
OPERATIONS = [
    ("ServerLive", lambda c: c.is_server_live(), "none"),
    ("ServerReady", lambda c: c.is_server_ready(), "none"),
    ("ServerMetadata", lambda c: c.get_server_metadata(), "one"),
    ("ModelMetadata", lambda c: c.get_model_metadata("mlp"), "one"),
    ("ModelReady", lambda c: c.is_model_ready("mlp"), "one"),
    ("ModelConfig", lambda c: c.get_model_config("mlp"), "one"),
    ("RepositoryIndex", lambda c: c.get_model_repository_index(), "every"),
    ("ModelStatistics", lambda c: c.get_inference_statistics("mlp"), "every"),
    ("ModelStatistics (all)", lambda c: c.get_inference_statistics(), "every"),
    ("LogSettings", lambda c: c.get_log_settings(), "every"),
    ("SystemSharedMemoryStatus", lambda c: c.get_system_shared_memory_status(), "one"),
    ("SystemSharedMemoryUnregister", lambda c: c.unregister_system_shared_memory(), "every"),
    ("CudaSharedMemoryStatus", lambda c: c.get_cuda_shared_memory_status(), "one"),
    ("CudaSharedMemoryUnregister", lambda c: c.unregister_cuda_shared_memory(), "every"),
]


def test_each_operation_reaches_the_same_workers_over_both_protocols(cluster_factory):
    c = cluster_factory()
    cs = clients(c)
    wrong = []
    try:
        for name, call, reaches in OPERATIONS:
            for protocol, client in cs.items():
                for _ in range(5):  # again while a probe saw a worker unready meanwhile
                    before, routable_before = forwarded(c)
                    call(client)
                    after, routable_after = forwarded(c)
                    if routable_before and routable_after:
                        break
                    time.sleep(0.5)
                delta = [a - b for a, b in zip(after, before)]
                want = {"none": sum(delta) == 0, "one": sorted(delta) == [0, 1],
                        "every": delta == [1, 1]}[reaches]
                if not want:
                    wrong.append(f"{name} over {protocol}: forwards per worker {delta}, "
                                 f"want {reaches}")
    finally:
        for client in cs.values():
            client.close()
    assert not wrong, "\n".join(wrong)
    finish_cluster(c)


def failure(call):
    """The message a call through the gateway fails with."""
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value)


def test_a_fan_out_one_worker_refuses_names_it_alike(cluster_factory):
    c = cluster_factory(worker_args=("--allow-client-shm",))
    key, size = "/pjs_gateway_relay_test", 64
    handle = shm.create_shared_memory_region("relay", key, size)
    worker0 = grpcclient.InferenceServerClient(c.workers[0].grpc_url)
    worker1 = grpcclient.InferenceServerClient(c.workers[1].grpc_url)
    cs = clients(c)
    said = {}
    try:
        # Worker 0 holds the region already: it refuses, worker 1 takes it.
        worker0.register_system_shared_memory("relay", key, size)
        for protocol, client in cs.items():
            said[protocol] = failure(
                lambda: client.register_system_shared_memory("relay", key, size))
            worker1.unregister_system_shared_memory("relay")
        worker0.unregister_system_shared_memory("relay")
    finally:
        for client in list(cs.values()) + [worker0, worker1]:
            client.close()
        shm.destroy_shared_memory_region(handle)
    named = {}
    for protocol, text in said.items():
        m = re.search(r"worker 0 \([^)]*\): (.*) \(the other 1 worker succeeded\)", text)
        assert m, f"{protocol}: {text}"
        named[protocol] = m.group(1)
    assert "already" in named["gRPC"] and named["gRPC"] == named["REST"], named
    finish_cluster(c)


def test_statistics_merge_the_workers_that_have_the_model(cluster_factory):
    c = cluster_factory()
    wait_for(lambda: all(grpcclient.InferenceServerClient(w.grpc_url).is_model_ready("two_io")
                         for w in c.workers), 30, "two_io not ready on both", c.describe)
    direct = grpcclient.InferenceServerClient(c.workers[1].grpc_url)
    direct.unload_model("two_io")
    direct.close()
    cs = clients(c)
    try:
        grpc_stats = cs["gRPC"].get_inference_statistics("two_io", as_json=True)
        rest_stats = cs["REST"].get_inference_statistics("two_io")
    finally:
        for client in cs.values():
            client.close()
    assert [s["name"] for s in grpc_stats["model_stats"]] == ["two_io"], grpc_stats
    assert [s["name"] for s in rest_stats["model_stats"]] == ["two_io"], rest_stats
    finish_cluster(c)
