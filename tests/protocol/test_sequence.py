"""Sequence batching (stateful models) against the real server with
tritonclient, on both protocols.

The model is an accumulator exported with JAX and sequence_state: it takes
x and its state (f32 [batch, 4]) and returns the running sum as both `sum`
and the next state. Clients send only x with sequence_id, sequence_start and
sequence_end; every answer must equal the running sum numpy computes for
that sequence. Covered: interleaved sequences with integer and string ids
(one protocol and both mixed on one sequence), a sequence_start on a live
sequence starting it over, steps of one sequence sent back to back without
waiting (answered in order; also several such streams at once, many steps
each), many sequences stepping at once coalescing into fewer executions
than requests, refusals naming the sequence id (a
request without sequence_start on an unknown id, after sequence_end, after
the idle timeout, no sequence_id at all, more than one row), one client
that fills a model's sequence table not keeping another client's new
sequence out once its sequences idle past the eviction floor (the least
recently used one is evicted, and its next step says so), one client (a
second loopback address) refused past its share of a table while another
starts sequences, with a `pjserve-client` header of its own changing
nothing (serve and behind a node's gateway), the state tensors absent from
metadata and refused as inputs, and sequence parameters on a model without
state accepted and ignored as Triton does.
"""

import concurrent.futures
import functools
import queue
import re
import shutil
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import pjserve_export as pe
from protocol_util import (NODE_WORKERS, ServerProcess, SourceRelay, finish_checked, grpc_code,
                           guard_alive, metric, parse_metrics, scrape, start_or_fail)

MODEL = "accumulator"
SHORT = "accumulator_short"  # idle_timeout_ms: 300
SHORT_IDLE_MS = 300
SMALL = "accumulator_small"  # max_sequences: SMALL_SLOTS, evict_after_idle_ms: EVICT_MS
SMALL_SLOTS = 4
EVICT_MS = 500
CAPPED = "accumulator_capped"  # max_sequences: CAPPED_SLOTS, no max_sequences_per_client
CAPPED_SLOTS = 8
CAP = CAPPED_SLOTS // 4  # the default sequence.max_sequences_per_client
WIDTH = 4


def accumulate(params, x, state):
    new = state + x * params["scale"]
    return new, new


def export_accumulator(repo, name, **kw):
    import jax.numpy as jnp
    x = np.zeros((1, WIDTH), np.float32)
    return pe.export_jax(accumulate, {"scale": jnp.ones(WIDTH, jnp.float32)}, [x, x], repo,
                         name=name, batch_sizes=(1, 4, 16), input_names=["x", "state_in"],
                         output_names=["sum", "state_out"],
                         sequence_state=[("state_in", "state_out")], **kw)


@pytest.fixture(scope="module")
def seq_server(pjserve_bin, plugin_path, exported, cache_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository-sequence")
    export_accumulator(repo, MODEL, idle_timeout_ms=60000, max_sequences=256)
    export_accumulator(repo, SHORT, idle_timeout_ms=SHORT_IDLE_MS)
    export_accumulator(repo, SMALL, idle_timeout_ms=60000, max_sequences=SMALL_SLOTS,
                       max_sequences_per_client=SMALL_SLOTS, evict_after_idle_ms=EVICT_MS)
    # No own sequence of a client at its cap idles past the floor during a test.
    export_accumulator(repo, CAPPED, idle_timeout_ms=60000, max_sequences=CAPPED_SLOTS,
                       evict_after_idle_ms=60000)
    shutil.copytree(exported["mlp"].path, repo / "mlp")
    # More gRPC threads than CPUs let a burst of steps queue behind an
    # execution, and so run batched, more often (test_steps_of_many_sequences_in_bursts).
    s = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir,
                      tmp_path_factory.mktemp("server-sequence"), ["--grpc-threads", "8"],
                      "sequence")
    start_or_fail(s)
    yield s
    finish_checked(s)


@pytest.fixture
def server(seq_server):
    yield from guard_alive(seq_server)


def step_inputs(proto, x):
    mod = grpcclient if proto == "grpc" else httpclient
    i = mod.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


class Clients:
    def __init__(self, server, grpc_url=None, http_url=None):
        self.grpc = grpcclient.InferenceServerClient(grpc_url or server.grpc_url)
        self.http = httpclient.InferenceServerClient(http_url or server.http_url,
                                                     network_timeout=60)

    def step(self, proto, model, seq, x, start=False, end=False, headers=None):
        client = self.grpc if proto == "grpc" else self.http
        r = client.infer(model, step_inputs(proto, x), sequence_id=seq, sequence_start=start,
                         sequence_end=end, headers=headers)
        return r.as_numpy("sum")

    def close(self):
        self.grpc.close()
        self.http.close()


@pytest.fixture
def clients(server):
    c = Clients(server)
    yield c
    c.close()


def row(rng):
    return rng.standard_normal((1, WIDTH)).astype(np.float32)


def refused(call, words):
    with pytest.raises(InferenceServerException) as e:
        call()
    text = str(e.value)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return e.value


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_interleaved_sequences_get_their_running_sums(clients, proto):
    rng = np.random.default_rng(1 if proto == "grpc" else 2)
    ids = [1001, 1002, "alpha", "beta-" + proto] if proto == "grpc" else [2001, "gamma", 2002]
    sums = {s: np.zeros((1, WIDTH), np.float32) for s in ids}
    steps = 5
    for k in range(steps):
        for s in ids:
            x = row(rng)
            sums[s] = sums[s] + x
            got = clients.step(proto, MODEL, s, x, start=k == 0, end=k == steps - 1)
            np.testing.assert_allclose(got, sums[s], rtol=1e-6, atol=1e-6,
                                       err_msg=f"sequence {s!r} step {k}")
    for s in ids:  # all ended
        refused(lambda: clients.step(proto, MODEL, s, row(rng)),
                [f"sequence {s!r}".replace("'", '"') if isinstance(s, str) else
                 f"sequence {s}", "ended"])


def test_one_sequence_across_both_protocols(clients):
    rng = np.random.default_rng(3)
    total = np.zeros((1, WIDTH), np.float32)
    for k, proto in enumerate(["grpc", "http", "grpc", "http"]):
        x = row(rng)
        total = total + x
        got = clients.step(proto, MODEL, "mixed", x, start=k == 0, end=k == 3)
        np.testing.assert_allclose(got, total, rtol=1e-6, atol=1e-6)


def test_start_on_a_live_sequence_starts_over(clients):
    rng = np.random.default_rng(4)
    clients.step("grpc", MODEL, 77, row(rng), start=True)
    x = row(rng)
    np.testing.assert_allclose(clients.step("http", MODEL, 77, x, start=True), x, atol=1e-6)
    clients.step("grpc", MODEL, 77, row(rng), end=True)


def test_steps_streamed_back_to_back_run_in_order(server):
    """Every step of a sequence in flight at once on one ModelStreamInfer
    stream (which submits in arrival order, as Triton's clients rely on):
    each answer is the running sum up to that step, so the server ran the
    waiting steps in order."""
    rng = np.random.default_rng(5)
    xs = [row(rng) for _ in range(12)]
    c = grpcclient.InferenceServerClient(server.grpc_url)
    results = {}
    done = queue.Queue()
    c.start_stream(callback=lambda result, error: done.put((result, error)))
    try:
        for k, x in enumerate(xs):
            c.async_stream_infer(MODEL, step_inputs("grpc", x), request_id=str(k),
                                 sequence_id="ordered", sequence_start=k == 0,
                                 sequence_end=k == len(xs) - 1)
        for _ in xs:
            r, e = done.get(timeout=120)
            assert e is None, f"a step failed: {e}"
            results[int(r.get_response().id)] = r.as_numpy("sum")
    finally:
        c.stop_stream()
        c.close()
    got = np.concatenate([results[k] for k in range(len(xs))])
    np.testing.assert_allclose(got, np.cumsum(np.concatenate(xs), axis=0), rtol=1e-5, atol=1e-5)


def exec_and_requests(server, model):
    samples, _ = parse_metrics(scrape(server.metrics_url))
    return (metric(samples, "nv_inference_exec_count", model=model, version="1"),
            metric(samples, "nv_inference_request_success", model=model, version="1"))


def run_rounds_of_steps(server, first_id: int, n_seq: int, steps: int, seed: int):
    """n_seq sequences step at once (each round's steps sent together, async
    over a connection each, then awaited), `steps` rounds: each answer is its
    sequence's running sum. Returns (requests, executions) the server counted."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n_seq, steps, 1, WIDTH)).astype(np.float32)
    totals = np.cumsum(xs, axis=1)
    exec0, req0 = exec_and_requests(server, MODEL)
    conns = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(n_seq)]
    done = queue.Queue()

    def finished(i, result, error):
        done.put((i, result, error))

    try:
        for k in range(steps):
            for i in range(n_seq):
                conns[i % len(conns)].async_infer(MODEL, step_inputs("grpc", xs[i, k]),
                              callback=functools.partial(finished, i),
                              sequence_id=first_id + i, sequence_start=k == 0,
                              sequence_end=k == steps - 1)
            for _ in range(n_seq):
                i, r, e = done.get(timeout=120)
                assert e is None, f"sequence {first_id + i} step {k}: {e}"
                np.testing.assert_allclose(r.as_numpy("sum"), totals[i, k], rtol=1e-5,
                                           atol=1e-5, err_msg=f"sequence {first_id + i} step {k}")
    finally:
        for c in conns:
            c.close()
    exec1, req1 = exec_and_requests(server, MODEL)
    return req1 - req0, exec1 - exec0


def test_steps_of_many_sequences_in_bursts(server):
    """48 sequences step at once, four rounds (run_rounds_of_steps): every
    answer is its own sequence's running sum, whether the step ran alone or
    batched with other sequences' steps (each with its own state row), and
    every step is counted once. Steps batch only when they queue behind an
    execution; a server that keeps up with the burst runs them one by one,
    so how many batched is not asserted (the scheduler's unit tests decide
    coalescing on a virtual clock)."""
    n_seq, steps = 48, 4
    requests, executions = run_rounds_of_steps(server, 50000, n_seq, steps, seed=6)
    assert requests == n_seq * steps
    assert executions <= requests


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_unknown_sequence_is_refused(clients, proto):
    e = refused(lambda: clients.step(proto, MODEL, 987654, row(np.random.default_rng(7))),
                ["sequence 987654 is not active", "sequence_start"])
    if proto == "grpc":
        assert grpc_code(e) == "INVALID_ARGUMENT"
    else:
        assert e.status() == "400"
    refused(lambda: clients.step(proto, MODEL, "nobody", row(np.random.default_rng(7))),
            ['sequence "nobody" is not active'])


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_idle_sequence_expires(clients, proto):
    rng = np.random.default_rng(8)
    seq = f"idle-{proto}"
    clients.step(proto, SHORT, seq, row(rng), start=True)
    time.sleep(4 * SHORT_IDLE_MS / 1000)  # idle well past the timeout
    clients.step(proto, SHORT, "sweeper-" + proto, row(rng), start=True, end=True)
    refused(lambda: clients.step(proto, SHORT, seq, row(rng)),
            [f'sequence "{seq}" is not active', "idle longer than the model's idle_timeout_ms"])


def assert_status(e, proto, grpc_status, http_status):
    if proto == "grpc":
        assert grpc_code(e) == grpc_status, str(e)
    else:
        assert e.status() == http_status, str(e)


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_full_table_evicts_the_least_recently_used_idle_sequence(server, proto):
    """A hog takes slots of SMALL's table until a start is refused (behind
    a node each worker has its own table and an id goes where it hashes, so
    it takes seats until the table of the refused seat's worker is full).
    Another client asking for that seat is refused UNAVAILABLE while every
    sequence there ran a step within the floor. Once they have idled past
    it, and the hog has used its first sequence again, the other client's
    start succeeds by evicting one of the others (serve: the second, the
    least recently used), whose next step is INVALID_ARGUMENT / 400 saying
    it was evicted and why; the other sequences keep their sums."""
    rng = np.random.default_rng(12)
    hog, other = Clients(server), Clients(server)
    held, sums, seat = [], {}, None
    try:
        for k in range(SMALL_SLOTS * int(NODE_WORKERS or 1) + 1):
            candidate = f"seat-{proto}-{k}"
            x = row(rng)
            try:
                hog.step(proto, SMALL, candidate, x, start=True)
            except InferenceServerException as e:
                assert_status(e, proto, "UNAVAILABLE", "503")
                seat = candidate
                break
            held.append(candidate)
            sums[candidate] = x
        assert seat is not None, "the table never filled"
        fresh = refused(lambda: other.step(proto, SMALL, seat, row(rng), start=True),
                        [f"model {SMALL}: all {SMALL_SLOTS} sequence slots are taken",
                         f"every sequence ran a step within the last {EVICT_MS} ms "
                         "(sequence.evict_after_idle_ms), so none can be evicted"])
        assert_status(fresh, proto, "UNAVAILABLE", "503")

        time.sleep(1.5 * EVICT_MS / 1000)
        x = row(rng)
        sums[held[0]] = sums[held[0]] + x
        hog.step(proto, SMALL, held[0], x)  # now the most recently used
        other.step(proto, SMALL, seat, row(rng), start=True)
        held.append(seat)

        evicted = []
        for seq in held[1:-1]:
            x = row(rng)
            try:
                got = hog.step(proto, SMALL, seq, x)
            except InferenceServerException as e:
                evicted.append((seq, e))
                continue
            np.testing.assert_allclose(got, sums[seq] + x, rtol=1e-6, atol=1e-6)
        assert len(evicted) == 1, [str(e) for _, e in evicted]
        victim, e = evicted[0]
        if not NODE_WORKERS:
            assert victim == held[1]
        held.remove(victim)
        text = str(e)
        for words in [f'model {SMALL}: sequence "{victim}" is not active (it was evicted after',
                      "ms idle to make room for a new sequence: the model's "
                      f"{SMALL_SLOTS}-slot sequence table was full)",
                      f"send a sequence's steps less than {EVICT_MS} ms apart "
                      "(sequence.evict_after_idle_ms) or raise the model's "
                      "sequence.max_sequences"]:
            assert words in text, f"{words!r} not in {text!r}"
        assert int(re.search(r"evicted after (\d+) ms idle", text).group(1)) > EVICT_MS
        assert_status(e, proto, "INVALID_ARGUMENT", "400")
    finally:
        for seq in held:  # leave the table empty for the other protocol
            try:
                hog.step(proto, SMALL, seq, row(rng), end=True)
            except InferenceServerException:
                pass  # evicted when the test failed before finding out
        hog.close()
        other.close()


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_one_client_cannot_take_more_than_its_share_of_sequences(server, proto):
    """A client connecting from 127.0.0.2 (through a SourceRelay) starts
    sequences of CAPPED until one is refused: RESOURCE_EXHAUSTED / 429
    naming that client, the default cap (a quarter of the table) and what
    to do. Behind a node each worker counts its own and an id goes where it
    hashes, so between CAP and CAP * workers starts succeed; the message
    naming 127.0.0.2 rather than the gateway shows the client survived the
    hop. The refused start retried with a `pjserve-client` header naming
    another address is refused the same (serve ignores the header from a
    TCP peer; the gateway replaces it). Meanwhile a client from 127.0.0.1
    starts that very id, on the same worker; and once the first client ends
    its sequences it may start again."""
    rng = np.random.default_rng(21)
    relay = SourceRelay(server.grpc_port if proto == "grpc" else server.http_port, "127.0.0.2")
    hog = Clients(server, **{f"{proto}_url": relay.url})
    other = Clients(server)
    held, others, seat, refusal = [], [], None, None
    try:
        for k in range(CAP * int(NODE_WORKERS or 1) + 1):
            candidate = f"share-{proto}-{k}"
            try:
                hog.step(proto, CAPPED, candidate, row(rng), start=True)
            except InferenceServerException as e:
                seat, refusal = candidate, e
                break
            held.append(candidate)
        assert seat is not None, f"one client started {len(held)} sequences, none refused"
        assert CAP <= len(held), [str(refusal)]
        words = [f"model {CAPPED}: client 127.0.0.2 holds {CAP} live sequences, the most one "
                 "client may (sequence.max_sequences_per_client)",
                 "end sequences with sequence_end before starting more, or raise the model's "
                 "sequence.max_sequences_per_client"]
        for w in words:
            assert w in str(refusal), f"{w!r} not in {str(refusal)!r}"
        assert_status(refusal, proto, "RESOURCE_EXHAUSTED", "429")
        impostor = refused(lambda: hog.step(proto, CAPPED, seat, row(rng), start=True,
                                            headers={"pjserve-client": "127.0.0.3"}), words)
        assert_status(impostor, proto, "RESOURCE_EXHAUSTED", "429")

        x = row(rng)
        other.step(proto, CAPPED, seat, x, start=True)
        others.append(seat)
        y = row(rng)
        np.testing.assert_allclose(other.step(proto, CAPPED, seat, y), x + y, rtol=1e-6,
                                   atol=1e-6)
        while held:
            hog.step(proto, CAPPED, held.pop(), row(rng), end=True)
        again = f"share-{proto}-again"
        hog.step(proto, CAPPED, again, row(rng), start=True)
        held.append(again)
    finally:
        for c, seqs in ((hog, held), (other, others)):  # leave the table empty
            for seq in seqs:
                try:
                    c.step(proto, CAPPED, seq, row(rng), end=True)
                except InferenceServerException:
                    pass
        hog.close()
        other.close()
        relay.close()


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_request_without_sequence_id_is_refused(server, proto):
    x = row(np.random.default_rng(9))
    if proto == "grpc":
        c = grpcclient.InferenceServerClient(server.grpc_url)
    else:
        c = httpclient.InferenceServerClient(server.http_url)
    try:
        refused(lambda: c.infer(MODEL, step_inputs(proto, x)),
                [f"model {MODEL} keeps state per sequence", "sequence_id"])
        two = np.zeros((2, WIDTH), np.float32)
        refused(lambda: c.infer(MODEL, step_inputs(proto, two), sequence_id=5,
                                sequence_start=True),
                ["one row (batch size 1), got 2"])
    finally:
        c.close()


def test_state_tensors_are_not_client_tensors(server, clients):
    meta = clients.grpc.get_model_metadata(MODEL, as_json=True)
    assert [t["name"] for t in meta["inputs"]] == ["x"]
    assert [t["name"] for t in meta["outputs"]] == ["sum"]
    hmeta = clients.http.get_model_metadata(MODEL)
    assert [t["name"] for t in hmeta["inputs"]] == ["x"]
    assert [t["name"] for t in hmeta["outputs"]] == ["sum"]
    x = row(np.random.default_rng(10))
    state = grpcclient.InferInput("state_in", [1, WIDTH], "FP32")
    state.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        clients.grpc.infer(MODEL, step_inputs("grpc", x) + [state], sequence_id=3,
                           sequence_start=True)
    assert 'unexpected input "state_in"' in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        clients.grpc.infer(MODEL, step_inputs("grpc", x), sequence_id=3, sequence_start=True,
                           outputs=[grpcclient.InferRequestedOutput("state_out")])
    assert 'unknown output "state_out"' in str(e.value)


def test_model_config_reports_sequence_batching(clients):
    cfg = clients.grpc.get_model_config(MODEL, as_json=True)["config"]
    seq = cfg["sequence_batching"]
    assert int(seq["max_sequence_idle_microseconds"]) == 60000 * 1000
    assert seq["state"][0]["input_name"] == "state_in"
    assert seq["state"][0]["output_name"] == "state_out"
    assert [int(d) for d in seq["state"][0]["dims"]] == [WIDTH]
    assert [t["name"] for t in cfg["input"]] == ["x"]
    hcfg = clients.http.get_model_config(MODEL)
    assert hcfg["sequence_batching"]["state"][0]["input_name"] == "state_in"
    assert int(hcfg["sequence_batching"]["max_sequence_idle_microseconds"]) == 60000 * 1000
    assert "sequence_batching" not in clients.grpc.get_model_config("mlp", as_json=True)["config"]


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_sequence_parameters_on_a_stateless_model_are_ignored(clients, proto):
    """As Triton: a model without sequence state answers as if they were
    not there."""
    x = np.random.default_rng(11).standard_normal((1, 16)).astype(np.float32)
    client = clients.grpc if proto == "grpc" else clients.http
    plain = client.infer("mlp", step_inputs(proto, x)).as_numpy("y")
    with_seq = client.infer("mlp", step_inputs(proto, x), sequence_id=12, sequence_start=True,
                            sequence_end=True).as_numpy("y")
    np.testing.assert_array_equal(plain, with_seq)


def test_exporter_refuses_what_the_server_would(tmp_path):
    import jax.numpy as jnp
    x = np.zeros((1, WIDTH), np.float32)
    kw = dict(name="bad", batch_sizes=(1,), input_names=["x", "state_in"],
              output_names=["sum", "state_out"])
    with pytest.raises(ValueError, match="not one of the inputs"):
        pe.export_jax(accumulate, {"scale": jnp.ones(WIDTH)}, [x, x], tmp_path,
                      sequence_state=[("nope", "state_out")], **kw)
    with pytest.raises(ValueError, match="must match"):
        pe.export_jax(lambda p, a, b: (a, b[:, :2]), {"scale": jnp.ones(WIDTH)}, [x, x],
                      tmp_path, sequence_state=[("state_in", "state_out")], **kw)
    with pytest.raises(ValueError, match="need sequence_state"):
        pe.export_jax(accumulate, {"scale": jnp.ones(WIDTH)}, [x, x], tmp_path,
                      idle_timeout_ms=5, **kw)
    path = export_accumulator(tmp_path, "good", idle_timeout_ms=1234)
    m = pe.read_manifest(path)
    assert m.sequence_state == [("state_in", "state_out")]
    assert m.idle_timeout_ms == 1234


def test_many_streams_of_back_to_back_steps_run_in_order(server):
    """As above, with several streams at once and many steps each: while
    one stream's reader submits a step, other requests' completions
    advance that stream, and none of them may start the next read before
    the submit is done, or the next step could overtake it."""
    n_streams, n_steps = 4, 150

    def run_stream(s):
        rng = np.random.default_rng(100 + s)
        xs = [row(rng) for _ in range(n_steps)]
        c = grpcclient.InferenceServerClient(server.grpc_url)
        results, errors = {}, []
        done = queue.Queue()
        c.start_stream(callback=lambda result, error: done.put((result, error)))
        try:
            for k, x in enumerate(xs):
                c.async_stream_infer(MODEL, step_inputs("grpc", x), request_id=str(k),
                                     sequence_id=f"stream-{s}", sequence_start=k == 0,
                                     sequence_end=k == n_steps - 1)
            for _ in xs:
                r, e = done.get(timeout=120)
                if e is not None:
                    errors.append(str(e))
                else:
                    results[int(r.get_response().id)] = r.as_numpy("sum")
        finally:
            c.stop_stream()
            c.close()
        return xs, results, errors

    with concurrent.futures.ThreadPoolExecutor(n_streams) as pool:
        outcomes = list(pool.map(run_stream, range(n_streams)))
    for xs, results, errors in outcomes:
        assert errors == [], f"{len(errors)} steps failed, the first: {errors[0]}"
        got = np.concatenate([results[k] for k in range(len(xs))])
        np.testing.assert_allclose(got, np.cumsum(np.concatenate(xs), axis=0), rtol=1e-4,
                                   atol=1e-4)
