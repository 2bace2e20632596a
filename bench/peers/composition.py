"""What the composition benchmark (bench/meta_pipeline.py) runs outside pjserve:
the detector's glue in numpy, and the JAX stages with the weights of the
exported bundles.

The glue is the detector meta's C code (examples/bundles/detector/model.c)
written again with numpy, vectorized as a Python author would write it:

    select   the anchors scoring above the threshold, best first (ties: the
             lower anchor first), then greedy NMS at IoU 0.5, at most
             DET_MAX_BOXES boxes (one IoU matrix of the candidates, one pass)
    pool     one bilinear sample of the feature map at the center of each
             cell of a [4, 4] grid over each kept box
    finish   label = argmax of stage 2's logits, score = its softmax
             probability times the box's objectness, box moved by the deltas
             and clipped to the image

and `detect` strings them between two stage calls that the caller supplies:
the client over gRPC in the client-orchestrated pipeline, Triton's BLS
(pb_utils.InferenceRequest) in the Python backend. The constants are those of
python/pjserve_export/pipelines.py, which the C code uses too.

`load_stage` returns a jitted JAX stage (pipelines.stage1_fn, stage2_fn, the
demo mlp_fn) with the weights read from the bundle pjserve serves, so every
server computes the same function with the same numbers; Triton's stage
models call it inside their Python-backend stubs.
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))

from pjserve_export import pipelines as P  # noqa: E402

STAGE1 = "detector_stage1"
STAGE2 = "detector_stage2"
STAGE1_OUTPUTS = ("features", "scores", "boxes")
STAGE2_OUTPUTS = ("class_logits", "box_deltas")
# The most boxes one stage-2 request carries: stage 2's largest compiled batch.
STAGE2_MAX_BATCH = P.DET_STAGE2_BATCH_SIZES[-1]


# ---- the glue ---------------------------------------------------------------------

def select(scores, boxes, threshold):
    """Anchor numbers kept: above `threshold`, best first, greedy NMS."""
    cand = np.flatnonzero(scores > threshold)
    cand = cand[np.lexsort((cand, -scores[cand]))]
    if len(cand) == 0:
        return cand
    b = boxes[cand].astype(np.float64)
    iw = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    ih = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area[:, None] + area[None, :] - inter
    overlaps = inter > P.DET_NMS_IOU * np.where(union > 0, union, np.inf)
    suppressed = np.zeros(len(cand), bool)
    keep = []
    for i in range(len(cand)):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) == P.DET_MAX_BOXES:
            break
        suppressed |= overlaps[i]
    return cand[keep]


def pool(features, kept_boxes):
    """features [C, 16, 16], kept_boxes [n, 4] -> rois f32 [n, C, 4, 4]."""
    s, n_cells, last = P.DET_STRIDE, P.DET_POOL, P.DET_FEAT - 1
    b = kept_boxes.astype(np.float64)
    cells = np.arange(n_cells) + 0.5

    def axis(lo, hi):
        at = (lo / s - 0.5)[:, None] + cells[None, :] * ((hi - lo) / s)[:, None] / n_cells
        at = np.clip(at, 0, last)
        i0 = at.astype(np.int64)
        return i0, np.minimum(i0 + 1, last), at - i0

    y0, y1, fy = axis(b[:, 1], b[:, 3])          # [n, 4] each
    x0, x1, fx = axis(b[:, 0], b[:, 2])
    f = features.astype(np.float64)
    ya, yb = y0[:, :, None], y1[:, :, None]
    xa, xb = x0[:, None, :], x1[:, None, :]
    fy, fx = fy[:, :, None], fx[:, None, :]
    v = ((1 - fy) * ((1 - fx) * f[:, ya, xa] + fx * f[:, ya, xb])
         + fy * ((1 - fx) * f[:, yb, xa] + fx * f[:, yb, xb]))   # [C, n, 4, 4]
    return np.ascontiguousarray(v.transpose(1, 0, 2, 3), dtype=np.float32)


def finish(logits, deltas, kept_scores, kept_boxes):
    """(BOXES f32 [n, 4], SCORES f32 [n], LABELS i32 [n]) from stage 2's outputs."""
    n = len(logits)
    labels = np.argmax(logits, axis=1)
    z = logits.astype(np.float64)
    total = np.exp(z - z[np.arange(n), labels][:, None]).sum(axis=1)
    b = kept_boxes.astype(np.float64)
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    moved = b + P.DET_REFINE * deltas.astype(np.float64) * np.stack([w, h, w, h], axis=1)
    return (np.clip(moved, 0, P.DET_SIZE).astype(np.float32),
            (kept_scores.astype(np.float64) / total).astype(np.float32),
            labels.astype(np.int32))


def detect(stage1, stage2, image, threshold):
    """The whole pipeline for one IMAGE f32 [3, 64, 64] and a threshold.

    stage1(image [1, 3, 64, 64]) -> (features [1, 16, 16, 16], scores [1, 512],
    boxes [1, 512, 4]); stage2(rois [m, 16, 4, 4]) -> (class_logits [m, 4],
    box_deltas [m, 4]), called once per STAGE2_MAX_BATCH boxes (not at all
    when no box is kept). Returns (BOXES, SCORES, LABELS)."""
    features, scores, boxes = stage1(image[None])
    keep = select(scores[0], boxes[0], np.float32(threshold))
    if len(keep) == 0:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)
    rois = pool(features[0], boxes[0][keep])
    logits, deltas = [], []
    for first in range(0, len(rois), STAGE2_MAX_BATCH):
        l, d = stage2(rois[first:first + STAGE2_MAX_BATCH])
        logits.append(l)
        deltas.append(d)
    return finish(np.concatenate(logits), np.concatenate(deltas), scores[0][keep],
                  boxes[0][keep])


# ---- the JAX stages -----------------------------------------------------------------

def stage_function(name):
    """The JAX function of bundle `name`: fn(params, *inputs) -> outputs."""
    if name == STAGE1:
        return P.stage1_fn
    if name == STAGE2:
        return P.stage2_fn
    if name == "mlp":
        from pjserve_export.demo import mlp_fn
        return mlp_fn
    raise ValueError(f"no JAX stage named {name!r}")


def bundle_params(bundle_dir):
    """The weights of an exported bundle as the nested dict its function takes
    ("conv1.w" -> {"conv1": {"w": ...}})."""
    from pjserve_export.bundle import WEIGHTS_FILE
    from pjserve_export.safetensors_io import read_safetensors
    tensors, _ = read_safetensors(Path(bundle_dir) / WEIGHTS_FILE)
    params = {}
    for key, value in tensors.items():
        *path, leaf = key.split(".")
        node = params
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = np.asarray(value)
    return params


def load_stage(name, bundle_dir, example_inputs, max_batch_size):
    """run(*inputs) -> tuple of numpy outputs: the jitted stage `name` with
    the weights of `bundle_dir`, compiled for every batch size 1 to
    max_batch_size (example_inputs: one row of each input)."""
    import jax
    fn = jax.jit(stage_function(name))
    params = jax.device_put(bundle_params(bundle_dir))

    def run(*inputs):
        out = fn(params, *inputs)
        return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))

    for n in range(1, max_batch_size + 1):
        run(*(np.zeros((n,) + x.shape, x.dtype) for x in example_inputs))
    return run
