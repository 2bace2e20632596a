"""Many clients at once: 32 threads, each with its own client, mixing models,
batch sizes and protocols (gRPC, HTTP binary, HTTP JSON, gRPC streaming). Every
reply must be correct and none may hang."""

import os
import queue

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from protocol_util import (BF16_MODEL, DEMO_MODELS, NODE_WORKERS, grpc_infer_case, grpc_inputs,
                           http_infer_case, metric, parse_metrics, run_threads, scrape)

THREADS = 32
PER_THREAD = 6
PROTOCOLS = ("grpc", "http-binary", "http-json", "grpc-stream")


def test_32_threads_mixed(server, cases):
    plan = []
    for model in DEMO_MODELS + (BF16_MODEL,):
        for n in (1, 3, 8):
            plan.append(cases.get(model, n, seed=50 + n))  # computed before the threads start

    def worker(tid):
        proto = PROTOCOLS[tid % len(PROTOCOLS)]
        done = 0
        if proto.startswith("grpc"):
            client = grpcclient.InferenceServerClient(server.grpc_url)
        else:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=120,
                                                      connection_timeout=60)
        try:
            if proto == "grpc-stream":
                results = queue.Queue()
                client.start_stream(callback=lambda result, error: results.put((result, error)))
                sent = {}
                for i in range(PER_THREAD):
                    case = plan[(tid * 7 + i) % len(plan)]
                    sent[f"t{tid}-{i}"] = case
                    client.async_stream_infer(case.model, grpc_inputs(case),
                                              request_id=f"t{tid}-{i}")
                for _ in range(PER_THREAD):
                    result, error = results.get(timeout=120)
                    assert error is None, f"thread {tid} stream: {error}"
                    rid = result.get_response().id
                    case = sent.pop(rid)
                    case.check({n: result.as_numpy(n) for n in case.output_names()},
                               f"thread {tid} {proto} {rid}")
                    done += 1
                client.stop_stream()
                return done
            for i in range(PER_THREAD):
                case = plan[(tid * 7 + i) % len(plan)]
                if proto == "grpc":
                    got, _ = grpc_infer_case(case=case, client=client, client_timeout=120)
                elif proto == "http-binary" or case.model == BF16_MODEL:
                    got, _ = http_infer_case(client, case)
                else:
                    got, _ = http_infer_case(client, case, binary_in=False, binary_out=False)
                case.check(got, f"thread {tid} {proto} request {i}")
                done += 1
            return done
        finally:
            client.close()

    results, errors = run_threads(worker, THREADS, timeout=300)
    assert not errors, (f"{len(errors)} of {THREADS} threads failed; first: thread "
                        f"{errors[0][0]}: {errors[0][1]!r}")
    assert sum(results) == THREADS * PER_THREAD


PLANS = "pjserve_device_plans_total"


def device_plans(server):
    """(plans run by request threads, by workers, executions of every model)."""
    samples, _ = parse_metrics(scrape(server.metrics_url))
    executions = sum(v for (name, _), v in samples.items() if name == "nv_inference_exec_count")
    return (metric(samples, PLANS, owner="request_thread"), metric(samples, PLANS, owner="worker"),
            executions)


def device_seconds(server):
    """Device time of every model so far: input + infer + output, seconds."""
    samples, _ = parse_metrics(scrape(server.metrics_url))
    names = ("nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
             "nv_inference_compute_output_duration_us")
    return sum(v for (name, _), v in samples.items() if name in names) / 1e6


def test_idle_device_runs_on_the_request_thread(server, gclient, hclient, cases):
    """One client at a time: the device is always free when a request arrives,
    so the thread that received it executes it (no hand-off to a worker)."""
    _, _, exec_before = device_plans(server)
    case = cases.get("mlp", 2, seed=71)
    # The request thread runs only executions known to take under 2 ms; a
    # cost estimate inflated by the busy tests before settles within a few
    # runs. A build too slow for that (ThreadSanitizer) cannot show it.
    compute0 = device_seconds(server)
    for _ in range(20):
        grpc_infer_case(gclient, case)
    _, _, warm0 = device_plans(server)
    per_execution_us = (device_seconds(server) - compute0) * 1e6 / max(1.0, warm0 - exec_before)
    # A node's workers on a machine of few CPUs get one gRPC thread each: a
    # thread that is its front end's only one runs only executions under
    # 100 us itself (test_sole_grpc_thread_leaves_long_executions_to_workers).
    limit_us = 50 if NODE_WORKERS and (os.cpu_count() or 1) // int(NODE_WORKERS) < 2 else 1000
    if per_execution_us > limit_us:
        pytest.skip(f"an execution takes {per_execution_us:.0f} us in this build, too close to "
                    "what a request thread runs itself")
    # One execution slower than 2 ms (a sanitizer build on a busy machine)
    # sends the next few to a worker until the estimate settles again, as
    # designed: a block of 30 is retried, up to three times, for one that
    # ran on the request threads alone.
    blocks = []
    for _ in range(3):
        inline0, worker0, exec0 = device_plans(server)
        for i in range(15):
            got, _ = grpc_infer_case(gclient, case)
            case.check(got, f"gRPC request {i}")
            got, _ = http_infer_case(hclient, case)
            case.check(got, f"HTTP request {i}")
        inline1, worker1, exec1 = device_plans(server)
        assert exec1 - exec0 == 30
        blocks.append((inline1 - inline0, worker1 - worker0))
        if blocks[-1] == (30, 0):
            return
    pytest.fail(f"no block of 30 sequential requests ran on the request threads alone: "
                f"(on request threads, on workers) per block: {blocks}")


def checked_from_threads(grpc_url, case, threads, each):
    """`threads` clients at once, each sending `each` requests of case over
    gRPC and checking every reply."""
    def worker(tid):
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            for i in range(each):
                got, _ = grpc_infer_case(client, case)
                case.check(got, f"thread {tid} request {i}")
        finally:
            client.close()

    _, errors = run_threads(worker, threads, timeout=300)
    assert not errors, f"first failure: {errors[0][1]!r}"


def test_busy_device_plans_add_up(server, cases):
    """Many clients at once: every execution was run by exactly one owner,
    a request thread or a worker, and the replies are right."""
    case = cases.get("convnet", 3, seed=72)
    inline0, worker0, exec0 = device_plans(server)
    checked_from_threads(server.grpc_url, case, 8, 10)
    inline1, worker1, exec1 = device_plans(server)
    assert 1 <= exec1 - exec0 <= 80  # coalescing may merge requests
    assert (inline1 - inline0) + (worker1 - worker0) == exec1 - exec0


def test_statistics_consistent_after_concurrency(gclient):
    """inference_count >= execution_count; success count equals the number of
    completed requests as seen by the queue counter."""
    for s in gclient.get_inference_statistics().model_stats:
        st = s.inference_stats
        assert s.inference_count >= s.execution_count, s
        assert st.queue.count == st.success.count, s


def test_sole_grpc_thread_leaves_long_executions_to_workers(server_factory, cases):
    """With one gRPC thread, a request thread that ran a long execution itself
    would read no new request meanwhile, and nothing would coalesce: on a GPU,
    where a round trip takes hundreds of microseconds, concurrency 4 ran at
    half the throughput of two threads. So that thread leaves executions
    longer than 100 us to the dispatcher's workers and goes back to reading,
    and what arrives meanwhile rides in the same executions."""
    srv = server_factory(names=("convnet",), extra_args=("--grpc-threads", "1"))
    case = cases.get("convnet", 2, seed=73)  # executed at compiled size 4
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        for i in range(10):  # the cost estimate settles
            got, _ = grpc_infer_case(c, case)
            case.check(got, f"warm-up request {i}")
    compute0, (inline0, worker0, exec0) = device_seconds(srv), device_plans(srv)
    with grpcclient.InferenceServerClient(srv.grpc_url) as c:
        for i in range(5):
            got, _ = grpc_infer_case(c, case)
            case.check(got, f"request {i}")
    per_execution_us = (device_seconds(srv) - compute0) * 1e6 / 5
    if per_execution_us < 200:
        pytest.skip(f"a convnet execution takes {per_execution_us:.0f} us here, too close to "
                    "the 100 us the only gRPC thread runs itself")
    inline1, worker1, exec1 = device_plans(srv)
    assert (inline1 - inline0, worker1 - worker0) == (0, 5), \
        "the only gRPC thread ran a long execution itself"

    checked_from_threads(srv.grpc_url, case, 8, 20)
    inline2, worker2, exec2 = device_plans(srv)
    assert inline2 == inline1, "the only gRPC thread ran a long execution itself"
    # 160 requests from 8 clients: some executions carried several (one
    # request per execution is what running them on the gRPC thread gives)
    assert exec2 - exec1 < 160, "no execution carried more than one request"
    assert srv.stop_and_check() == []
