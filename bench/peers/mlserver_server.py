"""Serve the benchmark model with MLServer and a custom runtime
(mlserver_runtime.JaxRuntime, which calls the jax function).

    .venv-bench-mlserver/bin/python bench/peers/mlserver_server.py \
        --http-port 8080 --grpc-port 8081 --metrics-port 8082 [--parallel-workers N]

Writes settings.json and mlp/model-settings.json into a temporary directory
and runs what `mlserver start DIR` runs, in this process. --parallel-workers
0 (the default here) runs inference in the server process; MLServer's own
default, 1, hands every request to a worker process. Adaptive batching is
off (MLServer's default); SIGTERM/SIGINT stop the server.

perf_analyzer needs one thing MLServer lacks: Triton's model-configuration
extension (GET /v2/models/NAME/config, gRPC ModelConfig), which it reads once
at start-up for max_batch_size. Both are added here, answering
{"name": NAME} (max_batch_size 0: no server-side batching, so the client
sends whole [1,16] tensors, given with --shape x:1,16). Nothing on the
inference path changes.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent


def _model_config_json(name):
    return {"name": name, "max_batch_size": 0}


def _model_config_proto(name):
    # inference.ModelConfigResponse { ModelConfig config = 1; }
    # inference.ModelConfig { string name = 1; } (max_batch_size 0 is the default)
    def field(num, payload):
        assert len(payload) < 128
        return bytes([num << 3 | 2, len(payload)]) + payload
    return field(1, field(1, name.encode()))


def _add_model_config_extension():
    import grpc
    import mlserver.grpc.server as grpc_server
    import mlserver.rest.server as rest_server
    from starlette.responses import JSONResponse

    add_servicer = grpc_server.add_GRPCInferenceServiceServicer_to_server

    def add_servicer_and_config(servicer, server):
        add_servicer(servicer, server)

        async def model_config(request, context):
            # request: raw ModelConfigRequest { string name = 1; string version = 2; }
            name = common.MODEL_NAME
            if len(request) >= 2 and request[0] == 0x0a:
                name = request[2:2 + request[1]].decode()
            if name != common.MODEL_NAME:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {name!r}")
            return _model_config_proto(name)

        handler = grpc.unary_unary_rpc_method_handler(model_config)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService", {"ModelConfig": handler}),))

    grpc_server.add_GRPCInferenceServiceServicer_to_server = add_servicer_and_config

    create_app = rest_server.create_app

    def create_app_with_config(*args, **kwargs):
        app = create_app(*args, **kwargs)

        async def config(model_name: str, model_version: str = ""):
            if model_name != common.MODEL_NAME:
                return JSONResponse({"error": f"unknown model {model_name!r}"}, 404)
            return JSONResponse(_model_config_json(model_name))

        app.add_api_route("/v2/models/{model_name}/config", config, methods=["GET"])
        app.add_api_route("/v2/models/{model_name}/versions/{model_version}/config", config,
                          methods=["GET"])
        return app

    rest_server.create_app = create_app_with_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to write the configuration (default: a new temporary directory)")
    ap.add_argument("--max-batch-size", type=int, default=8,
                    help="largest batch the runtime is warmed up for")
    ap.add_argument("--parallel-workers", type=int, default=0)
    a = ap.parse_args()

    d = a.workdir or Path(tempfile.mkdtemp(prefix="pjs-bench-mlserver-"))
    d.mkdir(parents=True, exist_ok=True)
    (d / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": a.http_port, "grpc_port": a.grpc_port,
        "metrics_port": a.metrics_port, "parallel_workers": a.parallel_workers,
        "debug": False, "load_models_at_startup": True}))
    (d / common.MODEL_NAME).mkdir()
    (d / common.MODEL_NAME / "model-settings.json").write_text(json.dumps({
        "name": common.MODEL_NAME,
        "implementation": "mlserver_runtime.JaxRuntime",
        "inputs": [{"name": common.INPUT_NAME, "datatype": "FP32",
                    "shape": [-1, *common.INPUT_SHAPE]}],
        "outputs": [{"name": common.OUTPUT_NAME, "datatype": "FP32",
                     "shape": [-1, *common.OUTPUT_SHAPE]}],
        "parameters": {"version": "1", "extra": {"max_batch_size": a.max_batch_size}}}))
    # Worker processes (--parallel-workers > 0) import the runtime too.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

    _add_model_config_extension()
    from mlserver.cli.main import main as mlserver_main
    print(f"mlserver: serving from {d}", flush=True)
    sys.argv = ["mlserver", "start", str(d)]
    return mlserver_main()


if __name__ == "__main__":
    sys.exit(main())
