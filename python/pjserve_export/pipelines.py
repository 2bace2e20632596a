"""The composition examples: models with C hooks and meta models.

    image_classifier   hooked model. Client: IMAGE u8 [-1, -1, 3] (HWC, any
                       size, one image per request) -> CLASSES bytes [3],
                       SCORES f32 [3]. preprocess (C) resizes to 32x32
                       (bilinear, half-pixel centers), normalizes and writes
                       x f32 [1, 3, 32, 32]; the executable, a small convnet,
                       gives logits [batch, 10]; postprocess keeps the top 3
                       (softmax) with their labels from labels.txt.
    image_bytes_classifier
                       hooked model, preprocess only. Client: IMAGE bytes
                       [batch, 1], each row a JPEG file's bytes -> SCORES f32
                       [batch, 10] (softmax probabilities, labelled by
                       labels.txt for classification). preprocess (C, with
                       libjpeg-turbo's libjpeg) decodes each file to RGB, then resizes
                       and normalizes as image_classifier does into x f32
                       [batch, 3, 32, 32]; the executable is
                       image_classifier's convnet (same weights) with a
                       softmax. Triton's ensemble_image_client.py calls it.
    detector_stage1    backbone + proposal head: image f32 [batch, 3, 64, 64]
                       -> features [batch, 16, 16, 16], scores [batch, 512]
                       (objectness of 2 anchors per cell), boxes
                       [batch, 512, 4] (x1, y1, x2, y2 in pixels)
    detector_stage2    head over pooled box features: rois f32
                       [batch, 16, 4, 4] -> class_logits [batch, 4],
                       box_deltas [batch, 4]; batch sizes up to 16
    detector           meta calling both: IMAGE f32 [3, 64, 64],
                       SCORE_THRESHOLD f32 [1] -> BOXES f32 [-1, 4],
                       SCORES f32 [-1], LABELS i32 [-1]. The C glue keeps the
                       boxes above the threshold (NMS, at most 64), pools
                       their features into a scratch buffer and runs stage 2
                       over them in chunks of 32, pooling the next chunk while
                       the previous one executes.
    decoder_step       one step of a tiny decoder: tokens i32 [batch, 16]
                       (padded with 0), length i32 [batch] -> logits
                       [batch, 32] for the next token
    greedy_decoder     meta calling decoder_step until the end token (1) or a
                       length limit: PROMPT i32 [-1], MAX_TOKENS i32 [1] ->
                       TOKENS i32 [-1] (the generated tokens, without the end
                       token)
    greedy_decoder_stream
                       the same loop as a decoupled meta: one response TOKENS
                       i32 [1] per generated token over ModelStreamInfer, then
                       the final response

The C code is examples/bundles/<name>/model.c; the pure numpy references of
each whole pipeline are in pipeline_reference.py (the constants below are the
ones the C code uses too: change both together). Weights are drawn from fixed
PRNG keys, so every export writes the same bytes.
"""

import zlib
from pathlib import Path
from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import hooks as H
from .jax_export import export_jax

SEED = 0
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "bundles"

# image_classifier
CLS_SIZE = 32            # the executable's image side
CLS_CLASSES = 10
CLS_TOP_K = 3
CLS_MEAN = (0.485, 0.456, 0.406)
CLS_STD = (0.229, 0.224, 0.225)
CLS_MAX_SIDE = 8192      # larger images are refused by preprocess
CLS_BATCH_SIZES = (1, 4, 8)

# detector
DET_SIZE = 64            # image side
DET_STRIDE = 4           # pixels per feature cell
DET_FEAT = DET_SIZE // DET_STRIDE   # 16x16 feature map
DET_CHANNELS = 16
DET_ANCHOR_SIZES = (8.0, 16.0)
DET_ANCHORS = DET_FEAT * DET_FEAT * len(DET_ANCHOR_SIZES)   # 512
DET_POOL = 4             # pooled features per box: [DET_CHANNELS, 4, 4]
DET_CLASSES = 4
DET_PRE_NMS = 128        # best-scoring candidates NMS looks at
DET_NMS_IOU = 0.5        # a box overlapping a kept one by more is dropped
DET_MAX_BOXES = 64
DET_CHUNK = 32           # boxes per stage-2 call
DET_REFINE = 0.1         # box_deltas scale (fraction of the box's width/height)
DET_STAGE1_BATCH_SIZES = (1, 4)
DET_STAGE2_BATCH_SIZES = (1, 4, 8, 16)

# greedy decoder
DEC_CONTEXT = 16         # tokens the step model sees (prompt + generated)
DEC_VOCAB = 32
DEC_DIM = 32
DEC_PAD = 0
DEC_END = 1
DEC_BATCH_SIZES = (1, 4)

PIPELINE_NAMES = ("image_classifier", "image_bytes_classifier", "detector", "greedy_decoder")
# The bundles each example consists of, the serving one last.
PIPELINE_BUNDLES = {
    "image_classifier": ("image_classifier",),
    "image_bytes_classifier": ("image_bytes_classifier",),
    "detector": ("detector_stage1", "detector_stage2", "detector"),
    "greedy_decoder": ("decoder_step", "greedy_decoder_stream", "greedy_decoder"),
}


def _key(name: str):
    return jax.random.fold_in(jax.random.PRNGKey(SEED), zlib.crc32(name.encode()))


def _conv_params(key, c_out, c_in, k):
    kw, kb = jax.random.split(key)
    return {"w": jax.random.normal(kw, (c_out, c_in, k, k)) * np.sqrt(2.0 / (c_in * k * k)),
            "b": 0.1 * jax.random.normal(kb, (c_out,))}


def _dense_params(key, fan_in, fan_out, scale=None):
    kw, kb = jax.random.split(key)
    s = np.sqrt(2.0 / fan_in) if scale is None else scale
    return {"w": jax.random.normal(kw, (fan_in, fan_out)) * s,
            "b": 0.1 * jax.random.normal(kb, (fan_out,))}


def conv_nchw(x, p, stride=1, pad=1):
    """Cross-correlation, NCHW input, OIHW weights, zero padding `pad` on each side."""
    y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), ((pad, pad), (pad, pad)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + p["b"][None, :, None, None]


# ---- image_classifier ----------------------------------------------------------

def classifier_params():
    k1, k2, k3 = jax.random.split(_key("image_classifier"), 3)
    return {"conv1": _conv_params(k1, 8, 3, 3), "conv2": _conv_params(k2, 16, 8, 3),
            "dense": _dense_params(k3, 16, CLS_CLASSES, scale=1.0)}


def classifier_fn(p, x):
    y = jax.nn.relu(conv_nchw(x, p["conv1"]))
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    y = jax.nn.relu(conv_nchw(y, p["conv2"]))
    return jnp.mean(y, axis=(2, 3)) @ p["dense"]["w"] + p["dense"]["b"]


def classifier_probabilities_fn(p, x):
    """image_bytes_classifier's executable: classifier_fn's softmax."""
    return jax.nn.softmax(classifier_fn(p, x), axis=-1)


CLS_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
              "ship", "piñata")


# ---- detector ------------------------------------------------------------------

def stage1_params():
    k1, k2, k3, k4 = jax.random.split(_key("detector_stage1"), 4)
    a = len(DET_ANCHOR_SIZES)
    return {"conv1": _conv_params(k1, 8, 3, 3), "conv2": _conv_params(k2, DET_CHANNELS, 8, 3),
            "objectness": _conv_params(k3, a, DET_CHANNELS, 1),
            "deltas": {"w": 0.1 * jax.random.normal(k4, (4 * a, DET_CHANNELS, 1, 1)),
                       "b": jnp.zeros((4 * a,))}}


def anchors():
    """[DET_ANCHORS, 3]: center x, center y, size, in anchor order (row, column, size)."""
    c = (np.arange(DET_FEAT, dtype=np.float32) + 0.5) * DET_STRIDE
    cy, cx, s = np.meshgrid(c, c, np.asarray(DET_ANCHOR_SIZES, np.float32), indexing="ij")
    return np.stack([cx.ravel(), cy.ravel(), s.ravel()], axis=1)


def stage1_fn(p, image):
    f = jax.nn.relu(conv_nchw(image, p["conv1"], stride=2))
    f = jax.nn.relu(conv_nchw(f, p["conv2"], stride=2))          # [n, C, 16, 16]
    n, a = f.shape[0], len(DET_ANCHOR_SIZES)
    obj = conv_nchw(f, p["objectness"], pad=0)                    # [n, A, 16, 16]
    scores = jax.nn.sigmoid(obj.transpose(0, 2, 3, 1).reshape(n, DET_ANCHORS))
    d = conv_nchw(f, p["deltas"], pad=0)                          # [n, 4A, 16, 16]
    d = d.transpose(0, 2, 3, 1).reshape(n, DET_ANCHORS, 4)
    anc = jnp.asarray(anchors())
    cx = anc[:, 0] + 0.25 * d[..., 0] * anc[:, 2]
    cy = anc[:, 1] + 0.25 * d[..., 1] * anc[:, 2]
    w = anc[:, 2] * jnp.exp(jnp.clip(d[..., 2], -1.0, 1.0))
    h = anc[:, 2] * jnp.exp(jnp.clip(d[..., 3], -1.0, 1.0))
    boxes = jnp.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    return f, scores, jnp.clip(boxes, 0.0, float(DET_SIZE))


def stage2_params():
    k1, k2, k3 = jax.random.split(_key("detector_stage2"), 3)
    return {"hidden": _dense_params(k1, DET_CHANNELS * DET_POOL * DET_POOL, 32),
            "classes": _dense_params(k2, 32, DET_CLASSES, scale=0.5),
            "deltas": _dense_params(k3, 32, 4, scale=0.1)}


def stage2_fn(p, rois):
    h = jax.nn.relu(rois.reshape(rois.shape[0], -1) @ p["hidden"]["w"] + p["hidden"]["b"])
    return (h @ p["classes"]["w"] + p["classes"]["b"],
            h @ p["deltas"]["w"] + p["deltas"]["b"])


# ---- greedy decoder ------------------------------------------------------------

def decoder_params():
    k1, k2, k3, k4 = jax.random.split(_key("decoder_step"), 4)
    return {"embed": jax.random.normal(k1, (DEC_VOCAB, DEC_DIM)),
            "position": 0.5 * jax.random.normal(k2, (DEC_CONTEXT, DEC_DIM)),
            "hidden": _dense_params(k3, 2 * DEC_DIM, DEC_DIM, scale=1.0 / np.sqrt(DEC_DIM)),
            "out": _dense_params(k4, DEC_DIM, DEC_VOCAB, scale=2.0 / np.sqrt(DEC_DIM))}


def decoder_step_fn(p, tokens, length):
    """Next-token logits from the first `length` tokens of each row (the rest
    is padding and ignored): the mean of the embedded context and the last
    token's embedding, through a tanh layer."""
    h = p["embed"][tokens] + p["position"][None]                         # [n, T, D]
    pos = jnp.arange(DEC_CONTEXT)[None, :]
    mask = (pos < length[:, None]).astype(h.dtype)
    ctx = jnp.sum(h * mask[..., None], axis=1) / jnp.maximum(length, 1)[:, None]
    last = jnp.sum(h * (pos == length[:, None] - 1).astype(h.dtype)[..., None], axis=1)
    z = jnp.tanh(jnp.concatenate([ctx, last], axis=-1) @ p["hidden"]["w"] + p["hidden"]["b"])
    return z @ p["out"]["w"] + p["out"]["b"]


# ---- export --------------------------------------------------------------------

def _source(name: str) -> Path:
    return EXAMPLES_DIR / name / H.HOOKS_SOURCE


def export_pipeline(name: str, out_dir, build: Optional[H.Builder] = None,
                    target_stablehlo_version: Optional[str] = None) -> Dict[str, Path]:
    """Exports the bundles of example `name` (PIPELINE_NAMES) into out_dir;
    returns {bundle name: path}. `build` builds each model.so
    (`hooks.hooks_builder`); None leaves them to `pjserve build-hooks`."""
    f32, i32 = np.float32, np.int32
    kw = dict(target_stablehlo_version=target_stablehlo_version)
    out = {}
    if name == "image_classifier":
        out[name] = export_jax(
            classifier_fn, classifier_params(), [np.zeros((1, 3, CLS_SIZE, CLS_SIZE), f32)],
            out_dir, name=name, batch_sizes=CLS_BATCH_SIZES, input_names=["x"],
            output_names=["logits"], input_formats={"x": "NCHW"},
            description="a convnet behind C hooks: any HWC u8 image -> top-3 labels and "
                        "their probabilities",
            client_inputs=[("IMAGE", "u8", [-1, -1, 3], "NHWC")],
            client_outputs=[("CLASSES", "bytes", [CLS_TOP_K]),
                            ("SCORES", "f32", [CLS_TOP_K])],
            hooks_source=_source(name), extra_files={"labels.txt": _source(name).parent /
                                                     "labels.txt"},
            build_hooks=build, **kw)
    elif name == "image_bytes_classifier":
        labels = _source(name).parent / "labels.txt"
        out[name] = export_jax(
            classifier_probabilities_fn, classifier_params(),
            [np.zeros((1, 3, CLS_SIZE, CLS_SIZE), f32)], out_dir, name=name,
            batch_sizes=CLS_BATCH_SIZES, input_names=["x"], output_names=["SCORES"],
            input_formats={"x": "NCHW"}, output_labels={"SCORES": "labels.txt"},
            description="JPEG files in (one per row, decoded by a C hook with libjpeg) "
                        "-> class probabilities of a small convnet, labelled",
            client_inputs=[("IMAGE", "bytes", ["batch", 1])],
            hooks_source=_source(name), extra_files={"labels.txt": labels},
            hooks_libraries=["jpeg"], build_hooks=build, **kw)
    elif name == "detector":
        out["detector_stage1"] = export_jax(
            stage1_fn, stage1_params(), [np.zeros((1, 3, DET_SIZE, DET_SIZE), f32)], out_dir,
            name="detector_stage1", batch_sizes=DET_STAGE1_BATCH_SIZES, input_names=["image"],
            output_names=["features", "scores", "boxes"], input_formats={"image": "NCHW"},
            description="detector backbone and proposal head (called by the detector meta)",
            **kw)
        out["detector_stage2"] = export_jax(
            stage2_fn, stage2_params(), [np.zeros((1, DET_CHANNELS, DET_POOL, DET_POOL), f32)],
            out_dir, name="detector_stage2", batch_sizes=DET_STAGE2_BATCH_SIZES,
            input_names=["rois"], output_names=["class_logits", "box_deltas"],
            description="detector head over pooled box features (called by the detector meta)",
            **kw)
        out[name] = H.export_meta(
            out_dir, name=name, calls=["detector_stage1", "detector_stage2"],
            client_inputs=[("IMAGE", "f32", [3, DET_SIZE, DET_SIZE]),
                           ("SCORE_THRESHOLD", "f32", [1])],
            client_outputs=[("BOXES", "f32", [-1, 4]), ("SCORES", "f32", [-1]),
                            ("LABELS", "i32", [-1])],
            source=_source(name), build=build,
            description="two-stage detector: proposals, threshold + NMS and box pooling in C, "
                        "then a head over the kept boxes")
    elif name == "greedy_decoder":
        out["decoder_step"] = export_jax(
            decoder_step_fn, decoder_params(),
            [np.zeros((1, DEC_CONTEXT), i32), np.zeros((1,), i32)], out_dir,
            name="decoder_step", batch_sizes=DEC_BATCH_SIZES, input_names=["tokens", "length"],
            output_names=["logits"],
            description="one decoder step: tokens so far (padded) and their count -> "
                        "next-token logits (called by greedy_decoder)", **kw)
        out[name] = H.export_meta(
            out_dir, name=name, calls=["decoder_step"],
            client_inputs=[("PROMPT", "i32", [-1]), ("MAX_TOKENS", "i32", [1])],
            client_outputs=[("TOKENS", "i32", [-1])], source=_source(name), build=build,
            description=f"greedy decoding with decoder_step until token {DEC_END} or a length "
                        "limit")
        out["greedy_decoder_stream"] = H.export_meta(
            out_dir, name="greedy_decoder_stream", calls=["decoder_step"],
            client_inputs=[("PROMPT", "i32", [-1]), ("MAX_TOKENS", "i32", [1])],
            client_outputs=[("TOKENS", "i32", [-1])], source=_source("greedy_decoder_stream"),
            build=build, decoupled=True,
            description="greedy_decoder streaming one token per response (decoupled; "
                        "ModelStreamInfer)")
    else:
        raise ValueError(f"unknown example {name!r}; known: {list(PIPELINE_NAMES)}")
    return out


def export_pipelines(out_dir, names: Optional[Sequence[str]] = None,
                     build: Optional[H.Builder] = None, **kwargs) -> Dict[str, Path]:
    """Every example (or those named), as export_pipeline."""
    out = {}
    for name in names or PIPELINE_NAMES:
        out.update(export_pipeline(name, out_dir, build=build, **kwargs))
    return out
