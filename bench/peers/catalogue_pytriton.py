"""The Triton (PyTriton) peer of bench/catalogue.py: weight slots swapped by
a client-side LRU.

    .venv-bench-pytriton/bin/python bench/peers/catalogue_pytriton.py \
        --http-port 8000 --grpc-port 8001 --metrics-port 8002 \
        --repository DIR --slots 2000 [--max-batch-size 8]

PyTriton binds models at start and cannot unload one: Triton.bind after the
server started loads one more model (a Python-backend stub process of its
own, spawned and connected to this process, about a second and tens of MiB
each), and nothing unbinds it. Explicit load/unload of thousands of models
is therefore not possible with it; instead this binds two models once:

  dense  inputs x f32 [K] and slot int32 [1], output y f32 [K]: y = x @ W + b
         with the weights in that slot (jax arrays on the jax CPU device; one
         jitted function, as pjserve's bundles hold). Dynamic batching
         (max_batch_size --max-batch-size); rows of one batch are grouped by
         slot.
  load   inputs slot int32 [1] and model int32 [1], output ok int32 [1]: reads
         DIR/c{model:05d}/weights.safetensors (header and values, numpy) into
         that slot, replacing what it held. No batching.

The driver keeps the LRU (model -> slot, --slots entries, the capacity in
models given to the other servers): a request for a model in no slot first
calls load into the least recently used slot with no request in flight (or
a free one), then dense. Stops on SIGINT or SIGTERM.
"""

import argparse
import json
import logging
import signal
import struct
import sys
from pathlib import Path

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

K = 512


def read_weights(path):
    """(W, b) from a safetensors file (numpy f32, little-endian)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key in ("w", "b"):
        begin, end = header[key]["data_offsets"]
        out[key] = np.frombuffer(data, "<f4", (end - begin) // 4,
                                 8 + n + begin).reshape(header[key]["shape"])
    return out["w"], out["b"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--max-batch-size", type=int, default=8)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    repository = Path(a.repository)

    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    config = TritonConfig(http_address="127.0.0.1", http_port=a.http_port,
                          grpc_address="127.0.0.1", grpc_port=a.grpc_port,
                          metrics_port=a.metrics_port)
    with Triton(config=config,
                security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        # jax only now: PyTriton forks the Triton process on entry
        import jax
        fn = jax.jit(lambda w, b, x: x @ w + b)
        slots = [None] * a.slots
        zero = (jax.device_put(np.zeros((K, K), np.float32)),
                jax.device_put(np.zeros((K,), np.float32)))
        for n in range(1, a.max_batch_size + 1):
            fn(*zero, np.zeros((n, K), np.float32)).block_until_ready()

        @batch
        def dense(x, slot):
            y = np.empty_like(x)
            s = slot[:, 0]
            for v in np.unique(s):
                rows = np.flatnonzero(s == v)
                w, b = slots[int(v)]
                y[rows] = np.asarray(fn(w, b, x[rows]))
            return {"y": y}

        def load(requests):
            out = []
            for r in requests:
                s, m = int(r.data["slot"][0]), int(r.data["model"][0])
                w, b = read_weights(repository / f"c{m:05d}" / "weights.safetensors")
                slots[s] = (jax.device_put(w), jax.device_put(b))
                out.append({"ok": np.ones((1,), np.int32)})
            return out

        triton.bind(model_name="dense", infer_func=dense,
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(K,)),
                            Tensor(name="slot", dtype=np.int32, shape=(1,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(K,))],
                    config=ModelConfig(max_batch_size=a.max_batch_size))
        triton.bind(model_name="load", infer_func=load,
                    inputs=[Tensor(name="slot", dtype=np.int32, shape=(1,)),
                            Tensor(name="model", dtype=np.int32, shape=(1,))],
                    outputs=[Tensor(name="ok", dtype=np.int32, shape=(1,))],
                    config=ModelConfig(batching=False))
        print("pytriton: serving", flush=True)
        try:
            triton.serve()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
