"""Pure numpy references of the composition examples (pipelines.py), whole
pipelines included: what each served model must answer, computed in float64
from the weights the exporter wrote into the bundles.

Nothing here imports jax or shares code with the exported stages or the C
glue: the convolutions, the resize, NMS, pooling and the decoding loop are
written again from their descriptions, so a test comparing the server with
these checks the whole path.

The pipelines make discrete decisions (a threshold, NMS, a top-k, an argmax).
Each reference also reports `margin`: how far its closest decision was from
going the other way (a score minus the threshold, an IoU minus 0.5, the gap
between two ranked values). The server computes in float32, so a test uses
inputs whose margin is well above float32 rounding (see MIN_MARGIN); there
the server and the reference must take the same decisions.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from . import pipelines as P
from .bundle import WEIGHTS_FILE
from .safetensors_io import read_safetensors

# Decisions closer than this to their boundary could go either way between
# float32 (the server) and float64 (here).
MIN_MARGIN = 1e-4


def load_weights(bundle_dir) -> Dict[str, np.ndarray]:
    tensors, _ = read_safetensors(Path(bundle_dir) / WEIGHTS_FILE)
    return {k: np.asarray(v, np.float64) for k, v in tensors.items()}


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1,
           pad: int = 1) -> np.ndarray:
    """x [C, H, W] cross-correlated with w [O, C, k, k] (zero padding `pad` on
    each side), plus b [O]."""
    c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    y = np.zeros((w.shape[0], oh, ow))
    for i in range(k):
        for j in range(k):
            patch = xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("oc,chw->ohw", w[:, :, i, j], patch)
    return y + b[:, None, None]


def relu(x):
    return np.maximum(x, 0)


def softmax(z):
    e = np.exp(z - np.max(z))
    return e / e.sum()


def ranking_margin(values: np.ndarray, k: int) -> float:
    """The smallest gap between the k best values, and between the k-th and
    the next (what decides a top-k and its order)."""
    v = np.sort(np.asarray(values, np.float64))[::-1]
    v = v[:min(k + 1, len(v))]
    return float(np.min(-np.diff(v))) if len(v) > 1 else np.inf


# ---- image_classifier ----------------------------------------------------------

def resize_bilinear(image: np.ndarray, size: int) -> np.ndarray:
    """u8 [H, W, C] -> float64 [size, size, C]: bilinear, half-pixel centers,
    sample positions clamped to the edges."""
    def axis(n):
        src = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
        lo = np.floor(src).astype(np.int64)
        return lo, np.minimum(lo + 1, n - 1), src - lo

    y0, y1, fy = axis(image.shape[0])
    x0, x1, fx = axis(image.shape[1])
    img = image.astype(np.float64)
    fy, fx = fy[:, None, None], fx[None, :, None]
    top = (1 - fx) * img[y0][:, x0] + fx * img[y0][:, x1]
    bottom = (1 - fx) * img[y1][:, x0] + fx * img[y1][:, x1]
    return (1 - fy) * top + fy * bottom


@dataclass
class Classification:
    classes: List[bytes]      # CLASSES, best first
    scores: np.ndarray        # SCORES f32 [k]
    logits: np.ndarray        # the executable's output, [classes]
    margin: float


class ImageClassifierReference:
    def __init__(self, bundle_dir):
        self.w = load_weights(bundle_dir)
        self.labels = (Path(bundle_dir) / "labels.txt").read_bytes().splitlines()

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """u8 [H, W, 3] -> x [3, 32, 32], what the executable gets."""
        x = resize_bilinear(image, P.CLS_SIZE) / 255.0
        x = (x - np.asarray(P.CLS_MEAN)) / np.asarray(P.CLS_STD)
        return x.transpose(2, 0, 1)

    def logits(self, x: np.ndarray) -> np.ndarray:
        w = self.w
        y = relu(conv2d(x, w["conv1.w"], w["conv1.b"]))
        c, h, wd = y.shape
        y = y.reshape(c, h // 2, 2, wd // 2, 2).max(axis=(2, 4))
        y = relu(conv2d(y, w["conv2.w"], w["conv2.b"]))
        return y.mean(axis=(1, 2)) @ w["dense.w"] + w["dense.b"]

    def __call__(self, image: np.ndarray) -> Classification:
        logits = self.logits(self.preprocess(image))
        p = softmax(logits)
        top = np.argsort(-p, kind="stable")[:P.CLS_TOP_K]
        return Classification([self.labels[i] for i in top], p[top].astype(np.float32),
                              logits, ranking_margin(p, P.CLS_TOP_K))


# ---- detector ------------------------------------------------------------------

@dataclass
class Detections:
    boxes: np.ndarray         # BOXES f32 [n, 4]
    scores: np.ndarray        # SCORES f32 [n]
    labels: np.ndarray        # LABELS i32 [n]
    candidates: int           # anchors above the threshold
    margin: float


def iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def bilinear(plane: np.ndarray, y: float, x: float) -> np.ndarray:
    """plane [..., H, W] at (y, x), clamped to the plane."""
    h, w = plane.shape[-2:]
    y, x = min(max(y, 0.0), h - 1), min(max(x, 0.0), w - 1)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    fy, fx = y - y0, x - x0
    return ((1 - fy) * ((1 - fx) * plane[..., y0, x0] + fx * plane[..., y0, x1])
            + fy * ((1 - fx) * plane[..., y1, x0] + fx * plane[..., y1, x1]))


class DetectorReference:
    def __init__(self, stage1_dir, stage2_dir):
        self.w1 = load_weights(stage1_dir)
        self.w2 = load_weights(stage2_dir)

    def stage1(self, image: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """image [3, 64, 64] -> features [16, 16, 16], scores [512], boxes [512, 4]."""
        w = self.w1
        f = relu(conv2d(image.astype(np.float64), w["conv1.w"], w["conv1.b"], stride=2))
        f = relu(conv2d(f, w["conv2.w"], w["conv2.b"], stride=2))
        obj = conv2d(f, w["objectness.w"], w["objectness.b"], pad=0)
        scores = 1 / (1 + np.exp(-obj.transpose(1, 2, 0).reshape(-1)))
        d = conv2d(f, w["deltas.w"], w["deltas.b"], pad=0).transpose(1, 2, 0).reshape(-1, 4)
        c = (np.arange(P.DET_FEAT) + 0.5) * P.DET_STRIDE
        acy, acx, size = [a.ravel() for a in
                          np.meshgrid(c, c, np.asarray(P.DET_ANCHOR_SIZES), indexing="ij")]
        cx, cy = acx + 0.25 * d[:, 0] * size, acy + 0.25 * d[:, 1] * size
        bw = size * np.exp(np.clip(d[:, 2], -1, 1))
        bh = size * np.exp(np.clip(d[:, 3], -1, 1))
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
        return f, scores, np.clip(boxes, 0, P.DET_SIZE)

    def select(self, scores, boxes, threshold) -> Tuple[List[int], int, float]:
        """(kept anchors best first, candidates, margin): threshold, then greedy NMS."""
        margin = float(np.min(np.abs(scores - threshold)))
        cand = [a for a in np.argsort(-scores, kind="stable") if scores[a] > threshold]
        keep: List[int] = []
        for pos, a in enumerate(cand):
            if len(keep) == P.DET_MAX_BOXES:
                margin = min(margin, scores[keep[-1]] - scores[a])
                break
            suppressed = False
            for k in keep:
                o = iou(boxes[a], boxes[k])
                margin = min(margin, abs(o - P.DET_NMS_IOU))
                if o > P.DET_NMS_IOU:
                    # Which of the two is kept depends on their order.
                    margin = min(margin, scores[k] - scores[a])
                    suppressed = True
                    break
            if not suppressed:
                keep.append(a)
        return keep, len(cand), float(margin)

    def pool(self, features: np.ndarray, box: np.ndarray) -> np.ndarray:
        """[16, 4, 4]: one bilinear sample at the center of each cell of the box."""
        s, n = P.DET_STRIDE, P.DET_POOL
        x1, y1 = box[0] / s - 0.5, box[1] / s - 0.5
        bw, bh = (box[2] - box[0]) / s, (box[3] - box[1]) / s
        out = np.zeros((features.shape[0], n, n))
        for py in range(n):
            for px in range(n):
                out[:, py, px] = bilinear(features, y1 + (py + 0.5) * bh / n,
                                          x1 + (px + 0.5) * bw / n)
        return out

    def stage2(self, rois: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """rois [n, 16, 4, 4] -> class_logits [n, 4], box_deltas [n, 4]."""
        w = self.w2
        h = relu(rois.reshape(len(rois), -1) @ w["hidden.w"] + w["hidden.b"])
        return h @ w["classes.w"] + w["classes.b"], h @ w["deltas.w"] + w["deltas.b"]

    def __call__(self, image: np.ndarray, threshold: float) -> Detections:
        features, scores, boxes = self.stage1(image)
        keep, n_cand, margin = self.select(scores, boxes, float(np.float32(threshold)))
        n = len(keep)
        if n == 0:
            return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32),
                              np.zeros(0, np.int32), n_cand, margin)
        logits, deltas = self.stage2(np.stack([self.pool(features, boxes[a]) for a in keep]))
        labels = np.argmax(logits, axis=1)
        for row in logits:
            margin = min(margin, ranking_margin(row, 1))
        probs = np.stack([softmax(row) for row in logits])
        kept = boxes[keep]
        wh = np.stack([kept[:, 2] - kept[:, 0], kept[:, 3] - kept[:, 1]] * 2, axis=1)
        refined = np.clip(kept + P.DET_REFINE * deltas * wh, 0, P.DET_SIZE)
        return Detections(refined.astype(np.float32),
                          (scores[keep] * probs[np.arange(n), labels]).astype(np.float32),
                          labels.astype(np.int32), n_cand, margin)


# ---- greedy decoder ------------------------------------------------------------

@dataclass
class Decoding:
    tokens: np.ndarray        # TOKENS i32 [m]
    steps: int                # decoder_step calls made
    ended: bool               # stopped at the end token (else at the length limit)
    margin: float


class GreedyDecoderReference:
    def __init__(self, step_dir):
        self.w = load_weights(step_dir)

    def step(self, sequence: List[int]) -> np.ndarray:
        """Next-token logits [32] after `sequence` (1 to 16 tokens)."""
        w, n = self.w, len(sequence)
        h = w["embed"][np.asarray(sequence)] + w["position"][:n]
        z = np.tanh(np.concatenate([h.mean(axis=0), h[-1]]) @ w["hidden.w"] + w["hidden.b"])
        return z @ w["out.w"] + w["out.b"]

    def __call__(self, prompt, max_tokens: int) -> Decoding:
        seq = [int(t) for t in prompt]
        limit = min(int(max_tokens), P.DEC_CONTEXT - len(seq))
        out: List[int] = []
        margin, steps = np.inf, 0
        while len(out) < limit:
            logits = self.step(seq)
            steps += 1
            margin = min(margin, ranking_margin(logits, 1))
            nxt = int(np.argmax(logits))
            if nxt == P.DEC_END:
                return Decoding(np.asarray(out, np.int32), steps, True, margin)
            out.append(nxt)
            seq.append(nxt)
        return Decoding(np.asarray(out, np.int32), steps, False, margin)


# ---- inputs that reach every data-dependent edge -------------------------------

def classifier_cases(ref: ImageClassifierReference) -> List[np.ndarray]:
    """Images smaller, larger and as large as the executable's 32x32, of odd
    aspect ratios, down to one pixel; only those whose top 3 is clear of
    float32 rounding."""
    rng = np.random.default_rng(11)
    sizes = [(32, 32), (1, 1), (7, 50), (64, 48), (33, 31), (200, 3), (5, 5), (90, 90)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    cases = [img for img in images if ref(img).margin > MIN_MARGIN]
    if len(cases) < len(sizes) - 2:
        raise ValueError("too few classifier images clear of float32 rounding")
    return cases


def threshold_for(scores: np.ndarray, candidates: int) -> float:
    """A threshold with exactly `candidates` anchors above it, midway between
    two scores (0 for all of them)."""
    s = np.sort(scores)[::-1]
    if candidates >= len(s):
        return 0.0
    if candidates == 0:
        return float(s[0]) + 1e-3
    return float((s[candidates - 1] + s[candidates]) / 2)


# What the detector cases cover: (fewest, most) boxes kept.
DETECTOR_EDGES = {
    "zero boxes": (0, 0),                     # no stage-2 call, empty outputs
    "a few boxes": (1, 8),
    "over stage 2's largest batch": (P.DET_STAGE2_BATCH_SIZES[-1] + 1, P.DET_CHUNK),
    "two chunks": (P.DET_CHUNK + 1, P.DET_MAX_BOXES - 1),
    "the most boxes": (P.DET_MAX_BOXES, P.DET_MAX_BOXES),
}


def detector_cases(ref: DetectorReference) -> List[Tuple[np.ndarray, np.float32, str]]:
    """(IMAGE, SCORE_THRESHOLD, edge) for each of DETECTOR_EDGES, with every
    decision clear of float32 rounding."""
    rng = np.random.default_rng(5)
    found: Dict[str, Tuple[np.ndarray, np.float32, str]] = {}
    for _ in range(40):
        image = rng.standard_normal((3, P.DET_SIZE, P.DET_SIZE)).astype(np.float32)
        _, scores, _ = ref.stage1(image)
        for cand in (0, 3, 6, 20, 24, 40, 48, 60, 80, 120, 200, P.DET_ANCHORS):
            t = np.float32(threshold_for(scores, cand))
            d = ref(image, t)
            for edge, (lo, hi) in DETECTOR_EDGES.items():
                if edge not in found and lo <= len(d.boxes) <= hi and d.margin > MIN_MARGIN:
                    found[edge] = (image, t, edge)
        if len(found) == len(DETECTOR_EDGES):
            return [found[e] for e in DETECTOR_EDGES]
    raise ValueError(f"no detector inputs clear of rounding for "
                     f"{sorted(set(DETECTOR_EDGES) - set(found))}")


def decoder_cases(ref: GreedyDecoderReference) -> List[Tuple[List[int], int, str]]:
    """(PROMPT, MAX_TOKENS, edge): the end token at step one (empty output),
    the end token later, MAX_TOKENS reached, the context filled, MAX_TOKENS 0;
    every argmax clear of float32 rounding."""
    cases: Dict[str, Tuple[List[int], int, str]] = {}
    for p in range(P.DEC_VOCAB):
        for q in range(P.DEC_VOCAB):
            for prompt in ([p], [p, q], [q, p, 3, 4, 5]):
                d = ref(prompt, P.DEC_CONTEXT)
                if d.margin <= MIN_MARGIN:
                    continue
                edge = ("end at step one" if d.ended and d.steps == 1 else
                        "end later" if d.ended else "context filled")
                cases.setdefault(edge, (prompt, P.DEC_CONTEXT, edge))
                if edge == "context filled":
                    cases.setdefault("max tokens", (prompt, 3, "max tokens"))
    cases["max tokens 0"] = ([5, 6], 0, "max tokens 0")
    if len(cases) != 5:
        raise ValueError(f"decoder edges not all reachable: found only {sorted(cases)}")
    return list(cases.values())
