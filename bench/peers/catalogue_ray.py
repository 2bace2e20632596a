"""The Ray Serve peer of bench/catalogue.py: many models through
@serve.multiplexed, each loaded on demand from its bundle's weights file.

    .venv-bench-ray/bin/python bench/peers/catalogue_ray.py --port 8000 \
        --repository DIR --models-per-replica 2000 [--replicas 1] [--max-ongoing 256]

One deployment of --replicas replicas (num_cpus 0 each, so that they fit on
a machine of 2 CPUs beside the proxy and the controller); a request is an
HTTP POST of one example's raw little-endian f32 bytes (x, [1, K]) with the
header serve_multiplexed_model_id: NAME; the answer is y's raw bytes. The
replica's multiplexed loader (LRU by count, --models-per-replica per
replica) reads DIR/NAME/weights.safetensors (header and values, numpy) and
puts W and b on the jax CPU device; every model runs the same jitted
function, x @ W + b, the function pjserve's bundles hold. The answer carries
x-tier: "load" when this request waited for its model to be loaded (it ran
the loader, or joined one in flight), else "hit", and x-load-ms: the
loader's time. Ray runs locally (ray.init: 2 CPUs, no dashboard, a small
object store, its session under --temp-dir). Prints "ray: serving" once the
application is up; stops on SIGTERM or SIGINT (serve.shutdown, ray.shutdown).
"""

import argparse
import json
import signal
import struct
import sys
import threading
import time
from pathlib import Path


def read_weights(path):
    """(W, b) from a safetensors file (numpy f32, little-endian)."""
    import numpy as np
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key in ("w", "b"):
        begin, end = header[key]["data_offsets"]
        if header[key]["dtype"] != "F32":
            raise ValueError(f"{path}: {key} is {header[key]['dtype']}, not F32")
        out[key] = np.frombuffer(data, "<f4", (end - begin) // 4,
                                 8 + n + begin).reshape(header[key]["shape"])
    return out["w"], out["b"]


def build_app(repository, per_replica, replicas, max_ongoing):
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(num_replicas=replicas, max_ongoing_requests=max_ongoing,
                      ray_actor_options={"num_cpus": 0})
    class Catalogue:
        def __init__(self):
            import jax
            import numpy as np
            self.np, self.jax = np, jax
            self.fn = jax.jit(lambda w, b, x: x @ w + b)
            self.loads = {}          # model -> loads so far on this replica

        @serve.multiplexed(max_num_models_per_replica=per_replica)
        async def get_model(self, model_id):
            t0 = time.perf_counter()
            w, b = read_weights(Path(repository) / model_id / "weights.safetensors")
            model = (self.jax.device_put(w), self.jax.device_put(b))
            self.loads[model_id] = self.loads.get(model_id, 0) + 1
            self.last_load_ms = (time.perf_counter() - t0) * 1e3
            return model

        async def __call__(self, request: Request):
            model_id = serve.get_multiplexed_model_id()
            before = self.loads.get(model_id, 0)
            w, b = await self.get_model(model_id)
            loaded = self.loads.get(model_id, 0) != before
            body = await request.body()
            x = self.np.frombuffer(body, "<f4").reshape(1, -1)
            y = self.np.asarray(self.fn(w, b, x))
            headers = {"x-tier": "load" if loaded else "hit"}
            if loaded:
                headers["x-load-ms"] = f"{self.last_load_ms:.3f}"
            return Response(y.astype("<f4").tobytes(), media_type="application/octet-stream",
                            headers=headers)

    return Catalogue.bind()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--models-per-replica", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--max-ongoing", type=int, default=256)
    ap.add_argument("--object-store-mib", type=int, default=256)
    ap.add_argument("--temp-dir", help="Ray's session directory (logs, sockets); default "
                                       "Ray's own (/tmp/ray)")
    a = ap.parse_args()

    import ray
    from ray import serve
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=a.object_store_mib << 20,
             **({"_temp_dir": a.temp_dir} if a.temp_dir else {}))
    # after ray.init, which installs handlers of its own
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(build_app(a.repository, a.models_per_replica, a.replicas, a.max_ongoing),
                  name="catalogue", route_prefix="/", blocking=False)
        print("ray: serving", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
