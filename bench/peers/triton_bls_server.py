"""Serve the composition benchmark's models with Triton server's Python backend
and its BLS (business logic scripting) API: the tritonserver binary of the
nvidia-pytriton wheel (Triton 2.51.0), as bench/peers/triton_server.py runs it.

    .venv-bench-pytriton/bin/python bench/peers/triton_bls_server.py \
        --bundles REPO --http-port 8000 --grpc-port 8001 --metrics-port 8002

REPO is the pjserve repository bench/meta_pipeline.py exported; the JAX stages
take their weights from its bundles (bench/peers/composition.py). Models:

    detector_stage1   jitted JAX in the stub, max_batch_size 4 (pjserve's
                      largest compiled batch), dynamic batching, 1 instance
    detector_stage2   the same, max_batch_size 16
    detector          BLS: IMAGE f32 [3, 64, 64], SCORE_THRESHOLD f32 [1] ->
                      BOXES f32 [-1, 4], SCORES f32 [-1], LABELS i32 [-1].
                      Calls detector_stage1 with pb_utils.InferenceRequest
                      .exec(), runs composition.detect's numpy glue in its own
                      stub, calls detector_stage2. --bls-instances stubs
    mlp               the demo mlp (jitted JAX), max_batch_size 8
    mlp_bls           BLS: x f32 [1, 16] -> y f32 [1, 4] by one exec() of mlp

Every model runs in its own Python-backend stub process; BLS requests go
through the server's scheduler to the called model's stub, tensors through
the backend's shared memory. The server is exec'ed, so SIGTERM/SIGINT reach
tritonserver directly.
"""

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

PRELUDE = '''\
import sys

# The stub does not pass PYTHONPATH on: the benchmark's modules and this
# venv's packages are put on the path here.
for p in {paths!r}:
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

import composition  # noqa: E402
'''

STAGE_PY = PRELUDE + '''

INPUTS = {inputs!r}
OUTPUTS = {outputs!r}


class TritonPythonModel:
    def initialize(self, args):
        self.run = composition.load_stage({name!r}, {bundle!r}, [
            np.zeros(shape, np.float32) for shape in {input_shapes!r}], {max_batch_size})

    def execute(self, requests):
        per_request = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in INPUTS]
                       for r in requests]
        batch = per_request[0] if len(requests) == 1 else [
            np.concatenate(parts) for parts in zip(*per_request)]
        outs = self.run(*batch)
        responses, row = [], 0
        for ins in per_request:
            rows = len(ins[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor(n, np.ascontiguousarray(o[row:row + rows]))
                for n, o in zip(OUTPUTS, outs)]))
            row += rows
        return responses
'''

BLS_HELPERS = PRELUDE + '''

def call(model, inputs, outputs):
    """One BLS request: {{name: array}} to `model`, its outputs in order."""
    request = pb_utils.InferenceRequest(
        model_name=model, requested_output_names=list(outputs),
        inputs=[pb_utils.Tensor(n, np.ascontiguousarray(a)) for n, a in inputs.items()])
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(f"{{model}}: {{response.error().message()}}")
    return [pb_utils.get_output_tensor_by_name(response, n).as_numpy() for n in outputs]


def respond(compute, request):
    try:
        return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in compute(request)])
    except pb_utils.TritonModelException as e:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
'''

DETECTOR_PY = BLS_HELPERS + '''

def stage1(image):
    return call(composition.STAGE1, {{"image": image}}, composition.STAGE1_OUTPUTS)


def stage2(rois):
    return call(composition.STAGE2, {{"rois": rois}}, composition.STAGE2_OUTPUTS)


def detect(request):
    image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
    threshold = pb_utils.get_input_tensor_by_name(request, "SCORE_THRESHOLD").as_numpy()[0]
    boxes, scores, labels = composition.detect(stage1, stage2, image, threshold)
    return [("BOXES", boxes), ("SCORES", scores), ("LABELS", labels)]


class TritonPythonModel:
    def execute(self, requests):
        return [respond(detect, r) for r in requests]
'''

MLP_BLS_PY = BLS_HELPERS + '''

def forward(request):
    x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
    return [("y", call("mlp", {{"x": x}}, ["y"])[0])]


class TritonPythonModel:
    def execute(self, requests):
        return [respond(forward, r) for r in requests]
'''


def tensor(name, dtype, dims):
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }}'


def config(name, max_batch_size, inputs, outputs, instances=1):
    """config.pbtxt; inputs/outputs: (name, TYPE_*, dims without the batch axis)."""
    batching = "dynamic_batching { }\n" if max_batch_size else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {", ".join(tensor(*t) for t in inputs)} ]\n'
            f'output [ {", ".join(tensor(*t) for t in outputs)} ]\n'
            f'{batching}instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n')


def write_repository(models, bundles, paths, bls_instances):
    f32, i32 = "TYPE_FP32", "TYPE_INT32"
    stages = {
        "detector_stage1": (4, [("image", f32, [3, 64, 64])],
                            [("features", f32, [16, 16, 16]), ("scores", f32, [512]),
                             ("boxes", f32, [512, 4])]),
        "detector_stage2": (16, [("rois", f32, [16, 4, 4])],
                            [("class_logits", f32, [4]), ("box_deltas", f32, [4])]),
        "mlp": (8, [("x", f32, [16])], [("y", f32, [4])]),
    }
    sources = {}
    for name, (mbs, ins, outs) in stages.items():
        sources[name] = (config(name, mbs, ins, outs), STAGE_PY.format(
            paths=paths, name=name, bundle=str(bundles / name), max_batch_size=mbs,
            inputs=[t[0] for t in ins], outputs=[t[0] for t in outs],
            input_shapes=[tuple(t[2]) for t in ins]))
    sources["detector"] = (config(
        "detector", 0, [("IMAGE", f32, [3, 64, 64]), ("SCORE_THRESHOLD", f32, [1])],
        [("BOXES", f32, [-1, 4]), ("SCORES", f32, [-1]), ("LABELS", i32, [-1])],
        bls_instances), DETECTOR_PY.format(paths=paths))
    sources["mlp_bls"] = (config("mlp_bls", 0, [("x", f32, [1, 16])], [("y", f32, [1, 4])],
                                 bls_instances), MLP_BLS_PY.format(paths=paths))
    for name, (cfg, source) in sources.items():
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(cfg)
        (models / name / "1" / "model.py").write_text(source)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundles", type=Path, required=True,
                    help="the pjserve repository with detector_stage1, detector_stage2 and mlp")
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to write the configuration (default: a new temporary directory)")
    ap.add_argument("--bls-instances", type=int, default=2,
                    help="stub processes of each BLS model (default 2, as pjserve's "
                         "meta concurrency)")
    a = ap.parse_args()

    import pytriton
    dist = Path(pytriton.__file__).parent / "tritonserver"
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"

    work = a.workdir or Path(tempfile.mkdtemp(prefix="pjs-bench-triton-bls-"))
    work.mkdir(parents=True, exist_ok=True)
    server = work / "tritonserver"
    shutil.copytree(dist, server, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy(dist / "python_backend_stubs" / version / "triton_python_backend_stub",
                server / "backends" / "python" / "triton_python_backend_stub")
    write_repository(work / "models", a.bundles.resolve(),
                     [sysconfig.get_path("purelib"), str(HERE)], a.bls_instances)

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
