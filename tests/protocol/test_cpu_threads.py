"""--cpu-intra-op-threads: the XLA CPU plugin's thread count.

The setting reaches the plugin (its intra-op pool has that many threads,
counted in /proc as the server's threads named tf_XLAEigen) and the server
answers correctly over both protocols with each setting; `auto` gives a
repository of small models one thread and one holding a large model one per
CPU; a bad value is refused before anything starts.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import pjserve_export as pe
from protocol_util import ServerFailure, ServerProcess, grpc_infer_case, http_infer_case, serve_only

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("PJRT_NPROC") or os.environ.get("NPROC")),
    reason="PJRT_NPROC / NPROC in the environment decide the count under auto")


def intra_op_threads(pid: int) -> int:
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        n += name.startswith("tf_XLAEigen")
    return n


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def check_serves_mlp(srv, cases):
    case = cases.get("mlp", 3)
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    h = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
    try:
        case.check(grpc_infer_case(g, case)[0], "grpc")
        case.check(http_infer_case(h, case)[0], "http")
    finally:
        g.close()
        h.close()


def stop(srv):
    problems = srv.stop_and_check()
    assert not problems, "\n".join(problems) + "\n" + srv.describe()


@serve_only("the node sizes each worker's plugin pool")
@pytest.mark.parametrize("setting,threads", [("1", 1), ("2", 2), ("3", 3), ("auto", 1)])
def test_setting_sizes_the_plugin_pool_and_serves(server_factory, cases, setting, threads):
    srv = server_factory(extra_args=["--cpu-intra-op-threads", setting])
    assert intra_op_threads(srv.proc.pid) == threads
    check_serves_mlp(srv, cases)
    reason = "--cpu-intra-op-threads" if setting != "auto" else "auto: largest model"
    assert f"CPU plugin threads: {threads} ({reason}" in srv.stderr_text()
    stop(srv)


def big_conv_model():
    """A 3x3 convolution from 3 to 32 channels over 256x256 images: about 113
    MFLOP per image by pjserve's estimate, above the one-thread limit."""
    import jax
    import jax.numpy as jnp

    params = {"w": np.asarray(jax.random.normal(jax.random.PRNGKey(3), (3, 3, 3, 32)) * 0.2)}

    def fn(p, x):
        y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean(jax.nn.relu(y), axis=(1, 2))

    return fn, params


@serve_only("the node sizes each worker's plugin pool")
def test_auto_gives_a_large_model_every_cpu(pjserve_bin, plugin_path, cache_dir, exported, cases,
                                            tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    fn, params = big_conv_model()
    pe.export_jax(fn, params, [np.zeros((1, 256, 256, 3), np.float32)], repo, name="bigconv",
                  batch_sizes=(1, 2), input_names=["x"], output_names=["y"])
    srv = ServerProcess(pjserve_bin, plugin_path, repo, cache_dir, tmp_path / "srv", [], "bigconv")
    try:
        srv.start()
    except ServerFailure as e:
        srv.kill()
        pytest.fail(str(e), pytrace=False)
    try:
        assert intra_op_threads(srv.proc.pid) == max(cpus(), 1)
        assert f"CPU plugin threads: {cpus()} (auto: largest model" in srv.stderr_text()
        x = np.random.default_rng(5).standard_normal((2, 256, 256, 3)).astype(np.float32)
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = c.infer("bigconv", [inp]).as_numpy("y")
        c.close()
        np.testing.assert_allclose(got, np.asarray(fn(params, x)), rtol=1e-4, atol=1e-5)
    finally:
        stop(srv)


@pytest.mark.parametrize("value", ["0", "-2", "257", "many", ""])
def test_bad_value_is_a_usage_error(pjserve_bin, repository, value):
    r = subprocess.run([str(pjserve_bin), "serve", "--model-repository", str(repository),
                        "--cpu-intra-op-threads", value], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--cpu-intra-op-threads" in r.stderr
