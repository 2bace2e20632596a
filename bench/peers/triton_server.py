"""Serve the benchmark model with Triton server itself and its Python backend:
the tritonserver binary from the nvidia-pytriton wheel (Triton 2.51.0), a
model repository written here with config.pbtxt and a model.py that calls the
jax function inside Triton's Python-backend stub process. No PyTriton proxy
in between (compare pytriton_server.py, where the stub forwards every batch
over ZeroMQ to the user's Python process).

    .venv-bench-pytriton/bin/python bench/peers/triton_server.py \
        --http-port 8000 --grpc-port 8001 --metrics-port 8002 --max-batch-size 8

Dynamic batching on, one CPU instance, as PyTriton configures it. The
server is exec'ed, so SIGTERM/SIGINT reach tritonserver directly.
"""

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent

MODEL_PY = '''\
import sys

# The stub does not pass PYTHONPATH on: the benchmark's modules and this
# venv's packages are put on the path here.
for p in {paths!r}:
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

import common  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.run = common.load_model({max_batch_size})

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "{input}").as_numpy() for r in requests]
        y = self.run(xs[0] if len(xs) == 1 else np.concatenate(xs))
        responses, row = [], 0
        for x in xs:
            out = np.ascontiguousarray(y[row:row + len(x)])
            row += len(x)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("{output}", out)]))
        return responses
'''

CONFIG = '''\
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ {in_dim} ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ {out_dim} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to write the configuration (default: a new temporary directory)")
    ap.add_argument("--max-batch-size", type=int, default=8)
    a = ap.parse_args()

    import pytriton
    dist = Path(pytriton.__file__).parent / "tritonserver"
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"

    work = a.workdir or Path(tempfile.mkdtemp(prefix="pjs-bench-triton-"))
    work.mkdir(parents=True, exist_ok=True)
    server = work / "tritonserver"
    shutil.copytree(dist, server, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy(dist / "python_backend_stubs" / version / "triton_python_backend_stub",
                server / "backends" / "python" / "triton_python_backend_stub")
    model = work / "models" / common.MODEL_NAME
    (model / "1").mkdir(parents=True)
    fmt = dict(name=common.MODEL_NAME, max_batch_size=a.max_batch_size,
               input=common.INPUT_NAME, output=common.OUTPUT_NAME,
               in_dim=", ".join(map(str, common.INPUT_SHAPE)),
               out_dim=", ".join(map(str, common.OUTPUT_SHAPE)),
               paths=[sysconfig.get_path("purelib"), str(HERE)])
    (model / "config.pbtxt").write_text(CONFIG.format(**fmt))
    (model / "1" / "model.py").write_text(MODEL_PY.format(**fmt))

    env = dict(os.environ)
    # As PyTriton runs it: the wheel's libraries, and this venv's python first
    # on PATH so that the stub's embedded interpreter finds the venv.
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs),
                                                           env.get("LD_LIBRARY_PATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    exe = str(server / "bin" / "tritonserver")
    args = [exe, "--model-repository", str(work / "models"),
            "--backend-directory", str(server / "backends"),
            "--http-address", "127.0.0.1", "--http-port", str(a.http_port),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(a.grpc_port),
            "--metrics-port", str(a.metrics_port), "--log-verbose", "0"]
    print(f"triton: serving from {work}", flush=True)
    os.execve(exe, args, env)


if __name__ == "__main__":
    main()
