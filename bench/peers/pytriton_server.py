"""Serve the benchmark model with PyTriton (a real Triton server, 2.51.0 in
nvidia-pytriton 0.7.0, with its Python backend proxying to this process).

    .venv-bench-pytriton/bin/python bench/peers/pytriton_server.py \
        --http-port 8000 --grpc-port 8001 --metrics-port 8002 --max-batch-size 8

Triton's dynamic batcher is on (PyTriton's default) with max_batch_size as
given. The access-token restriction PyTriton puts on the statistics and
repository endpoints by default is lifted (restricted_endpoints=[]) because
perf_analyzer reads the server-side statistics; the server listens on
localhost only for the benchmark. Stops on SIGINT or SIGTERM.
"""

import argparse
import logging
import signal
import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

import common


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--max-batch-size", type=int, default=8)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    # SIGTERM -> the same clean shutdown as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port,
                          grpc_address="127.0.0.1", grpc_port=a.grpc_port,
                          metrics_port=a.metrics_port)
    with Triton(config=config,
                security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        # jax is loaded only now: PyTriton forks the Triton process on entry,
        # and forking after jax has started its threads can deadlock.
        run = common.load_model(a.max_batch_size)

        @batch
        def infer(x):
            return {common.OUTPUT_NAME: run(x)}

        triton.bind(model_name=common.MODEL_NAME, infer_func=infer,
                    inputs=[Tensor(name=common.INPUT_NAME, dtype=np.float32,
                                   shape=common.INPUT_SHAPE)],
                    outputs=[Tensor(name=common.OUTPUT_NAME, dtype=np.float32,
                                    shape=common.OUTPUT_SHAPE)],
                    config=ModelConfig(max_batch_size=a.max_batch_size))
        print("pytriton: serving", flush=True)
        try:
            triton.serve()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
