"""The demo models: small JAX models that exercise what bundles can express.

    mlp       two dense layers + relu           x:[batch,16] f32 -> y:[batch,4] f32
    convnet   conv 3x3 + relu + 2x2 max-pool + batch-norm (inference) + dense
              x:[batch,28,28,1] f32 (NHWC) -> logits:[batch,10] f32, probs:[batch,10] f32;
              both outputs name their classes ("zero" .. "nine") in labels.txt, so
              clients may ask for them classified (class_count)
    two_io    a:[batch,8] f32, b:[batch,3] i32 -> sum:[batch,8] f32, argmax:[batch] i32
    mlp_bf16  the mlp with bf16 weights, computing in bf16; f32 in and out
    mlp_f16   the mlp with f16 weights, f16 in and out
    gapnet    conv 3x3 + relu + global average pool + dense, at two input-shape
              variants: x:[batch,16,16,3] f32 (NHWC) and, variant "wide",
              x:[batch,16,32,3] -> logits:[batch,10] f32,
              heatmap:[batch,16,16] (wide: [batch,16,32]) f32
    image_convnet
              conv 3x3 (stride 2) + relu + global average pool + dense
              x:[batch,32,32,3] f32 (NHWC, RGB pixels 0..255) -> logits:[batch,10] f32;
              one input and one output vector, classes named in labels.txt: the
              shape an image classification client expects

Weights are drawn from fixed PRNG keys, so every export of a model writes the
same bytes. examples/make_demo_models.py exports them; the end-to-end tests
use the same definitions to compute reference outputs with jax.
"""

import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .jax_export import export_jax

BATCH_SIZES = (1, 4, 8)
SEED = 0
LABELS_FILE = "labels.txt"
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class DemoModel:
    name: str
    fn: Callable
    params: Any
    example_inputs: List[np.ndarray]   # batch of 1, only shape/dtype matter
    input_names: List[str]
    output_names: List[str]
    description: str
    # Input-shape variants: {name: example inputs}, as export_jax takes them.
    variants: Optional[Dict[str, List[np.ndarray]]] = None
    # The names of the classes of `labelled_outputs`, shipped as labels.txt:
    # clients asking for classification get "score:index:name".
    class_names: Sequence[str] = ()
    labelled_outputs: Sequence[str] = ()
    # {input name: "NHWC" | "NCHW"}: image layouts, reported by the model configuration.
    input_formats: Optional[Dict[str, str]] = None

    def export(self, out_dir, batch_sizes: Sequence[int] = BATCH_SIZES, **kwargs):
        if self.class_names:
            text = "".join(f"{c}\n" for c in self.class_names).encode()
            kwargs["extra_files"] = {**kwargs.get("extra_files", {}), LABELS_FILE: text}
            kwargs["output_labels"] = {o: LABELS_FILE for o in self.labelled_outputs}
        if self.input_formats:
            kwargs["input_formats"] = self.input_formats
        return export_jax(self.fn, self.params, self.example_inputs, out_dir, name=self.name,
                          batch_sizes=batch_sizes, input_names=self.input_names,
                          output_names=self.output_names, description=self.description,
                          variants=self.variants, **kwargs)

    def reference(self, *inputs):
        """fn(params, *inputs) computed by jax, as numpy arrays (always a tuple)."""
        out = jax.jit(self.fn)(self.params, *inputs)
        if not isinstance(out, (tuple, list)):
            out = (out,)
        return tuple(np.asarray(o) for o in out)


def _key(name: str):
    # Per-model keys independent of the order or number of models.
    return jax.random.fold_in(jax.random.PRNGKey(SEED), zlib.crc32(name.encode()))


def _dense(key, fan_in, fan_out, dtype=jnp.float32):
    kw, kb = jax.random.split(key)
    return {"w": (jax.random.normal(kw, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(dtype),
            "b": (0.1 * jax.random.normal(kb, (fan_out,))).astype(dtype)}


# ---- mlp and its reduced-precision variants ---------------------------------

def _mlp_params(dtype):
    k1, k2 = jax.random.split(_key("mlp"))
    return {"dense1": _dense(k1, 16, 32, dtype), "dense2": _dense(k2, 32, 4, dtype)}


def mlp_fn(p, x):
    h = jax.nn.relu(x @ p["dense1"]["w"] + p["dense1"]["b"])
    return h @ p["dense2"]["w"] + p["dense2"]["b"]


def mlp_bf16_fn(p, x):
    # Computes in bf16 (the weights' type); the interface stays f32.
    return mlp_fn(p, x.astype(jnp.bfloat16)).astype(jnp.float32)


# ---- convnet -----------------------------------------------------------------

CONV_CHANNELS = 8
BN_EPS = 1e-5


def _convnet_params():
    kc, kcb, kg, kb, km, kv, kd = jax.random.split(_key("convnet"), 7)
    c = CONV_CHANNELS
    return {
        "conv": {"w": jax.random.normal(kc, (3, 3, 1, c)) * np.sqrt(2.0 / 9),   # HWIO
                 "b": 0.1 * jax.random.normal(kcb, (c,))},
        "bn": {"gamma": 1.0 + 0.1 * jax.random.normal(kg, (c,)),
               "beta": 0.1 * jax.random.normal(kb, (c,)),
               "mean": 0.5 + 0.1 * jax.random.normal(km, (c,)),
               "var": jax.random.uniform(kv, (c,), minval=0.5, maxval=1.5)},
        "dense": _dense(kd, 14 * 14 * c, 10),
    }


def convnet_fn(p, x):
    y = jax.lax.conv_general_dilated(x, p["conv"]["w"], window_strides=(1, 1), padding="SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + p["conv"]["b"])
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    bn = p["bn"]
    y = (y - bn["mean"]) * jax.lax.rsqrt(bn["var"] + BN_EPS) * bn["gamma"] + bn["beta"]
    logits = y.reshape(y.shape[0], -1) @ p["dense"]["w"] + p["dense"]["b"]
    return logits, jax.nn.softmax(logits, axis=-1)


# ---- two_io ------------------------------------------------------------------

def _two_io_params():
    ks, kb, km = jax.random.split(_key("two_io"), 3)
    return {"scale": 1.0 + 0.5 * jax.random.normal(ks, (8,)),
            "bias": 0.1 * jax.random.normal(kb, (8,)),
            "mix": 0.5 * jax.random.normal(km, (3, 8))}


def two_io_fn(p, a, b):
    total = a * p["scale"] + p["bias"] + b.astype(jnp.float32) @ p["mix"]
    return total, jnp.argmax(total, axis=-1).astype(jnp.int32)


# ---- gapnet: one set of weights, two input shapes ----------------------------

GAP_CHANNELS = 8


def _gapnet_params():
    kc, kcb, kd = jax.random.split(_key("gapnet"), 3)
    c = GAP_CHANNELS
    return {"conv": {"w": jax.random.normal(kc, (3, 3, 3, c)) * np.sqrt(2.0 / 27),   # HWIO
                     "b": 0.1 * jax.random.normal(kcb, (c,))},
            "dense": _dense(kd, c, 10)}


def gapnet_fn(p, x):
    # Global average pooling makes the logits independent of the image size,
    # so the same weights serve every aspect ratio.
    y = jax.lax.conv_general_dilated(x, p["conv"]["w"], window_strides=(1, 1), padding="SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + p["conv"]["b"])
    logits = jnp.mean(y, axis=(1, 2)) @ p["dense"]["w"] + p["dense"]["b"]
    return logits, jnp.mean(y, axis=-1)


# ---- image_convnet: one image in, one labelled vector out ---------------------

IMAGE_CHANNELS = 8
IMAGE_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck")


def _image_convnet_params():
    kc, kcb, kd = jax.random.split(_key("image_convnet"), 3)
    c = IMAGE_CHANNELS
    return {"conv": {"w": jax.random.normal(kc, (3, 3, 3, c)) * np.sqrt(2.0 / 27),   # HWIO
                     "b": 0.1 * jax.random.normal(kcb, (c,))},
            "dense": _dense(kd, c, len(IMAGE_CLASSES))}


def image_convnet_fn(p, x):
    # Takes pixels as they come out of an image file (0..255, no scaling).
    y = jax.lax.conv_general_dilated(x / 255.0, p["conv"]["w"], window_strides=(2, 2),
                                     padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + p["conv"]["b"])
    return jnp.mean(y, axis=(1, 2)) @ p["dense"]["w"] + p["dense"]["b"]


# ---- the catalogue -----------------------------------------------------------

def demo_models(names: Optional[Sequence[str]] = None) -> List[DemoModel]:
    """The demo models (all, or those named), with their weights."""
    f32, bf16, f16, i32 = np.float32, jnp.bfloat16, np.float16, np.int32
    makers = {
        "mlp": lambda: DemoModel(
            "mlp", mlp_fn, _mlp_params(f32), [np.zeros((1, 16), f32)], ["x"], ["y"],
            "two dense layers with relu: x[16] -> y[4]"),
        "convnet": lambda: DemoModel(
            "convnet", convnet_fn, _convnet_params(), [np.zeros((1, 28, 28, 1), f32)], ["x"],
            ["logits", "probs"],
            "conv3x3(8) + relu + maxpool2x2 + batchnorm (inference) + dense: "
            "x[28,28,1] NHWC -> logits[10], probs[10] (classes: the digits, labels.txt)",
            class_names=DIGITS, labelled_outputs=("logits", "probs")),
        "two_io": lambda: DemoModel(
            "two_io", two_io_fn, _two_io_params(),
            [np.zeros((1, 8), f32), np.zeros((1, 3), i32)], ["a", "b"], ["sum", "argmax"],
            "two inputs, two outputs: sum = a*scale + bias + b@mix; argmax of sum"),
        "mlp_bf16": lambda: DemoModel(
            "mlp_bf16", mlp_bf16_fn, _mlp_params(bf16), [np.zeros((1, 16), f32)], ["x"], ["y"],
            "the mlp with bf16 weights and bf16 compute; f32 input and output"),
        "mlp_f16": lambda: DemoModel(
            "mlp_f16", mlp_fn, _mlp_params(f16), [np.zeros((1, 16), f16)], ["x"], ["y"],
            "the mlp with f16 weights, f16 input and output"),
        "gapnet": lambda: DemoModel(
            "gapnet", gapnet_fn, _gapnet_params(), [np.zeros((1, 16, 16, 3), f32)], ["x"],
            ["logits", "heatmap"],
            "conv3x3(8) + relu + global average pool + dense, for 16x16 and (variant wide) "
            "16x32 images: x[16,W,3] NHWC -> logits[10], heatmap[16,W]",
            variants={"wide": [np.zeros((1, 16, 32, 3), f32)]}),
        "image_convnet": lambda: DemoModel(
            "image_convnet", image_convnet_fn, _image_convnet_params(),
            [np.zeros((1, 32, 32, 3), f32)], ["x"], ["logits"],
            "conv3x3(8, stride 2) + relu + global average pool + dense: x[32,32,3] NHWC RGB "
            "pixels 0..255 -> logits[10] (classes: labels.txt)",
            class_names=IMAGE_CLASSES, labelled_outputs=("logits",),
            input_formats={"x": "NHWC"}),
    }
    if names is None:
        names = list(makers)
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown demo models {unknown}; known: {list(makers)}")
    return [makers[n]() for n in names]


DEMO_MODEL_NAMES = ("mlp", "convnet", "two_io", "mlp_bf16", "mlp_f16", "gapnet", "image_convnet")
