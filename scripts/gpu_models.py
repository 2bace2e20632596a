"""gpu_models - ResNet-50 in plain JAX, for scripts/gpu-bench and gpu-catalogue.

The same function is exported here as a pjserve bundle and jitted there, on
the GPU machine, as the in-process peer pjserve is measured against; so it
needs nothing but jax.numpy and lax (no Flax, whose versions differ between
the two machines). ResNet-50 v1.5 for inference, NHWC: batch normalization is
folded into a per-channel scale and bias after each convolution, the stride
of a stage's first block sits in its 3x3 convolution. Weights are random:
``init_weight`` draws each from its name and shape, here for the bundle and
there for the weights file written from the bundle's safetensors header, so
nothing of their 98 MiB travels. The demo mlp is here too, read from its
bundle's weights, for the same comparison.

The same code builds a smaller network of the same shape (fewer and narrower
stages, TINY_STAGES) for tests on the CPU, and runs in bfloat16 (resnet_bf16:
weights and activations bf16, images in and logits out f32).
"""

import json

import numpy as np

STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (width, blocks); output width x4
IMAGE = (224, 224, 3)
CLASSES = 1000
TINY_STAGES, TINY_IMAGE, TINY_CLASSES = ((8, 1), (16, 1)), (32, 32, 3), 10


def param_shapes(stages=STAGES, classes=CLASSES):
    """{weight name: shape}, names as export_jax flattens the params pytree."""
    shapes = {}

    def conv(name, kh, kw, cin, cout):
        shapes[f"{name}.w"] = (kh, kw, cin, cout)
        shapes[f"{name}.scale"] = (cout,)
        shapes[f"{name}.bias"] = (cout,)

    conv("stem", 7, 7, 3, 64)
    cin = 64
    for s, (width, blocks) in enumerate(stages):
        for b in range(blocks):
            p = f"s{s}b{b}"
            conv(f"{p}.c1", 1, 1, cin, width)
            conv(f"{p}.c2", 3, 3, width, width)
            conv(f"{p}.c3", 1, 1, width, 4 * width)
            if b == 0:
                conv(f"{p}.proj", 1, 1, cin, 4 * width)
            cin = 4 * width
    shapes["fc.w"] = (cin, classes)
    shapes["fc.bias"] = (classes,)
    return shapes


def init_weight(name, shape, seed=0):
    """A weight drawn from its name: He-normal kernels, unit scales (a block's
    last scale 0.2, so that the residual sum stays of order one), small biases."""
    rng = np.random.default_rng([seed] + [ord(c) for c in name])
    if name.endswith(".w"):
        fan_in = int(np.prod(shape[:-1]))
        return (rng.standard_normal(shape, dtype=np.float32) * np.sqrt(2.0 / fan_in)).astype(
            np.float32)
    if name.endswith(".scale"):
        return np.full(shape, 0.2 if ".c3." in name + "." else 1.0, np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.01).astype(np.float32)


def init_params(seed=0, stages=STAGES, classes=CLASSES, dtype=np.float32):
    """The nested params pytree resnet50 takes, every weight from init_weight
    (rounded to `dtype`, a numpy or ml_dtypes type)."""
    params = {}
    for name, shape in param_shapes(stages, classes).items():
        node = params
        *path, leaf = name.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = init_weight(name, shape, seed).astype(dtype)
    return params


def resnet50(params, x):
    """Logits [N, classes] of images x [N, H, W, 3], in the params' dtype; the
    stages are those the params hold (s0b0, s0b1, .., s1b0, ..)."""
    from jax import lax
    import jax.numpy as jnp

    def conv(p, v, stride=1, relu=True):
        k = p["w"].shape[0]
        v = lax.conv_general_dilated(v, p["w"], (stride, stride), [(k // 2, k // 2)] * 2,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        v = v * p["scale"] + p["bias"]
        return jnp.maximum(v, 0.0) if relu else v

    v = conv(params["stem"], x, stride=2)
    v = lax.reduce_window(v, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                          [(0, 0), (1, 1), (1, 1), (0, 0)])
    s = 0
    while f"s{s}b0" in params:
        b = 0
        while f"s{s}b{b}" in params:
            p = params[f"s{s}b{b}"]
            stride = 2 if b == 0 and s > 0 else 1
            h = conv(p["c1"], v)
            h = conv(p["c2"], h, stride=stride)
            h = conv(p["c3"], h, relu=False)
            short = conv(p["proj"], v, stride=stride, relu=False) if b == 0 else v
            v = jnp.maximum(h + short, 0.0)
            b += 1
        s += 1
    v = jnp.mean(v, axis=(1, 2))
    return v @ params["fc"]["w"] + params["fc"]["bias"]


def resnet_bf16(params, x):
    """resnet50 on bfloat16 params: images x f32 in, computed in bf16, logits
    f32 out."""
    import jax.numpy as jnp
    return resnet50(params, x.astype(jnp.bfloat16)).astype(jnp.float32)


def read_weights(path):
    """{name: array} of an F32 safetensors file (the mlp bundle's weights)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {e['dtype']}, not F32")
        lo, hi = e["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], np.float32).reshape(e["shape"])
    return out


def mlp(weights, x):
    """The demo mlp (python/pjserve_export/demo.py) on its bundle's weights."""
    import jax.numpy as jnp
    h = jnp.maximum(x @ weights["dense1.w"] + weights["dense1.b"], 0.0)
    return h @ weights["dense2.w"] + weights["dense2.b"]
