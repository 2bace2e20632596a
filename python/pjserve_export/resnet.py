"""ResNet in plain JAX, with random weights: real architectures for benchmarks.

    resnet_model(depth=50)                    ResNet-50, x:[batch,224,224,3] f32 -> logits:[batch,1000]
    resnet_model(depth=18, width=16, image=64, classes=10)
                                              a small ResNet-18 for tests

The architecture is torchvision's ResNet v1.5 (He et al., "Deep Residual
Learning for Image Recognition", with the stride of a bottleneck on its 3x3
convolution): a 7x7/2 stem convolution, batch norm, ReLU and a 3x3/2 max pool;
four stages of basic blocks (depth 18, 34) or bottleneck blocks (50, 101,
152), each stage but the first starting at stride 2, with a 1x1 projection on
the shortcut wherever shape changes; global average pooling and one dense
layer. Images are NHWC; convolution kernels HWIO. Batch norm runs in
inference mode from stored statistics, as a served model does.

No package ships ResNet-50 for JAX, so this module is the definition; the
weights are drawn from fixed PRNG keys (He-normal convolutions, batch-norm
statistics near identity, a small last-block scale as torchvision's
zero_init_residual would make exactly zero), so every export writes the same
bytes and the logits are finite and varied. There is no pretrained checkpoint:
the model is for measuring serving, not for classifying.
"""

import zlib
from dataclasses import dataclass
from typing import Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .demo import DemoModel

BN_EPS = 1e-5
SEED = 0
# blocks per stage, and whether the blocks are bottlenecks
LAYOUTS: Dict[int, Tuple[Tuple[int, ...], bool]] = {
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True),
    152: ((3, 8, 36, 3), True),
}
EXPANSION = 4  # a bottleneck's output channels over its inner ones


@dataclass(frozen=True)
class ResNetSpec:
    depth: int = 50
    width: int = 64     # channels of the stem and the first stage (64 in the paper)
    image: int = 224    # input height and width
    classes: int = 1000

    def __post_init__(self):
        if self.depth not in LAYOUTS:
            raise ValueError(f"depth {self.depth}: choose one of {sorted(LAYOUTS)}")
        if self.width < 1 or self.image < 32 or self.classes < 1:
            raise ValueError("width >= 1, image >= 32 and classes >= 1 are required")

    @property
    def name(self) -> str:
        suffix = "" if (self.width, self.image, self.classes) == (64, 224, 1000) else \
            f"_w{self.width}_i{self.image}_c{self.classes}"
        return f"resnet{self.depth}{suffix}"


# ---- parameters ----------------------------------------------------------------

def _conv(key, kh, kw, cin, cout):
    fan_in = kh * kw * cin
    return (jax.random.normal(key, (kh, kw, cin, cout)) * np.sqrt(2.0 / fan_in)).astype(jnp.float32)


def _bn(key, c, scale=1.0):
    kg, kb, km, kv = jax.random.split(key, 4)
    return {"gamma": (scale * (1.0 + 0.1 * jax.random.normal(kg, (c,)))).astype(jnp.float32),
            "beta": (0.05 * jax.random.normal(kb, (c,))).astype(jnp.float32),
            "mean": (0.05 * jax.random.normal(km, (c,))).astype(jnp.float32),
            "var": jax.random.uniform(kv, (c,), minval=0.8, maxval=1.2).astype(jnp.float32)}


def _block_params(key, cin, inner, stride, bottleneck):
    cout = inner * EXPANSION if bottleneck else inner
    keys = iter(jax.random.split(key, 8))
    if bottleneck:
        p = {"conv1": _conv(next(keys), 1, 1, cin, inner), "bn1": _bn(next(keys), inner),
             "conv2": _conv(next(keys), 3, 3, inner, inner), "bn2": _bn(next(keys), inner),
             "conv3": _conv(next(keys), 1, 1, inner, cout), "bn3": _bn(next(keys), cout, 0.2)}
    else:
        p = {"conv1": _conv(next(keys), 3, 3, cin, inner), "bn1": _bn(next(keys), inner),
             "conv2": _conv(next(keys), 3, 3, inner, cout), "bn2": _bn(next(keys), cout, 0.2)}
    if stride != 1 or cin != cout:
        p["proj"] = _conv(next(keys), 1, 1, cin, cout)
        p["proj_bn"] = _bn(next(keys), cout)
    return p


def resnet_params(spec: ResNetSpec):
    """The parameter tree: {stem, stem_bn, stages: [[block, ...], ...], fc}."""
    blocks, bottleneck = LAYOUTS[spec.depth]
    key = jax.random.fold_in(jax.random.PRNGKey(SEED), zlib.crc32(spec.name.encode()))
    k_stem, k_bn, k_fc, k_stages = jax.random.split(key, 4)
    params = {"stem": _conv(k_stem, 7, 7, 3, spec.width), "stem_bn": _bn(k_bn, spec.width)}
    cin, stages = spec.width, []
    for s, n in enumerate(blocks):
        inner = spec.width * 2 ** s
        stage = []
        for b in range(n):
            stride = 2 if (s > 0 and b == 0) else 1
            k = jax.random.fold_in(k_stages, s * 64 + b)
            stage.append(_block_params(k, cin, inner, stride, bottleneck))
            cin = inner * EXPANSION if bottleneck else inner
        stages.append(stage)
    params["stages"] = stages
    kw, kb = jax.random.split(k_fc)
    params["fc"] = {"w": (jax.random.normal(kw, (cin, spec.classes)) / np.sqrt(cin)).astype(jnp.float32),
                    "b": (0.01 * jax.random.normal(kb, (spec.classes,))).astype(jnp.float32)}
    return params


# ---- the function ---------------------------------------------------------------

def _conv2d(x, w, stride):
    kh = w.shape[0]
    pad = ((kh // 2, kh // 2), (kh // 2, kh // 2))
    return jax.lax.conv_general_dilated(x, w, window_strides=(stride, stride), padding=pad,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _batch_norm(x, bn):
    return (x - bn["mean"]) * jax.lax.rsqrt(bn["var"] + BN_EPS) * bn["gamma"] + bn["beta"]


def _block(p, x, stride, bottleneck):
    if bottleneck:
        y = jax.nn.relu(_batch_norm(_conv2d(x, p["conv1"], 1), p["bn1"]))
        y = jax.nn.relu(_batch_norm(_conv2d(y, p["conv2"], stride), p["bn2"]))
        y = _batch_norm(_conv2d(y, p["conv3"], 1), p["bn3"])
    else:
        y = jax.nn.relu(_batch_norm(_conv2d(x, p["conv1"], stride), p["bn1"]))
        y = _batch_norm(_conv2d(y, p["conv2"], 1), p["bn2"])
    shortcut = _batch_norm(_conv2d(x, p["proj"], stride), p["proj_bn"]) if "proj" in p else x
    return jax.nn.relu(y + shortcut)


def resnet_fn(params, x):
    """Logits of a batch of NHWC images; the block kind follows from the parameters."""
    bottleneck = "conv3" in params["stages"][0][0]
    y = jax.nn.relu(_batch_norm(_conv2d(x, params["stem"], 2), params["stem_bn"]))
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                              ((0, 0), (1, 1), (1, 1), (0, 0)))
    for s, stage in enumerate(params["stages"]):
        for b, block in enumerate(stage):
            y = _block(block, y, 2 if (s > 0 and b == 0) else 1, bottleneck)
    y = jnp.mean(y, axis=(1, 2))
    return y @ params["fc"]["w"] + params["fc"]["b"]


def parameter_count(params) -> int:
    return sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(params))


def resnet_model(depth: int = 50, width: int = 64, image: int = 224,
                 classes: int = 1000) -> DemoModel:
    """A ResNet as a DemoModel: export() writes the bundle, reference() runs it
    in JAX. One input `x` f32 [batch,image,image,3] (NHWC), one output
    `logits` f32 [batch,classes]."""
    spec = ResNetSpec(depth, width, image, classes)
    params = resnet_params(spec)
    n = parameter_count(params)
    example: List[np.ndarray] = [np.zeros((1, image, image, 3), np.float32)]
    return DemoModel(
        spec.name, resnet_fn, params, example, ["x"], ["logits"],
        f"ResNet-{depth} (v1.5) in plain JAX with random weights: {n / 1e6:.1f} M parameters, "
        f"x [batch,{image},{image},3] f32 NHWC -> logits [batch,{classes}]",
        input_formats={"x": "NHWC"})
