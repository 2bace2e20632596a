"""torchvision's Faster R-CNN as a pjserve meta model: two StableHLO stages
chained by C (docs/detection.md).

    export_faster_rcnn(model, out_dir, *, name, image_size, roi_align="glue",
                       build=None, description=None) -> Path   (the meta's bundle)

A Faster R-CNN's forward cannot be one traced graph: how many proposals
survive the region proposal network's non-maximum suppression, and how many
detections the final one keeps, depend on the image. So the model is cut
where its shapes start to depend on values:

  {name}_stage1  image f32 [1, 3, H, W] (0..1, as torchvision takes it)
                 -> the transform (normalize, resize, pad), the backbone with
                 its FPN and the RPN head: the feature maps the RoI pooler
                 reads, channels last (feature_0.., [1, h, w, C]), every
                 anchor's objectness logit [1, T] and box deltas [1, T, 4],
                 in torchvision's order (level, row, column, anchor).
  {name}_stage2  the proposals' pooled features f32 [1, P, ph, pw, C]
                 (roi_align="glue") or the feature maps and the proposals
                 f32 [1, P, 4] (roi_align="stage2") -> class_logits
                 [1, P, K] and box_regression [1, P, 4K]: the box head and
                 the predictor, after multi-scale RoI Align with "stage2".
                 P is the RPN's post_nms_top_n, and a variant p{N} for each
                 power of two from 64 below it (proposal_sizes): the glue
                 pads to the smallest that holds the proposals.
  {name}         the meta clients call: IMAGE f32 [3, H, W] -> BOXES f32
                 [n, 4] (x1, y1, x2, y2 in the image's pixels), SCORES f32
                 [n], LABELS i64 [n], best first. Its model.c
                 (faster_rcnn.c, shipped with this package) does the rest as
                 torchvision does: anchors, box decoding, per-level top-k,
                 clipping, small-box removal, the RPN's per-level NMS,
                 RoI Align with "glue", softmax, per-class score threshold
                 and NMS, the detection limit and the rescale to the
                 image's size.

The model's own settings (min_size/max_size, the RPN's top-n, thresholds,
box coder weights, detections_per_img, the pooler's levels and sampling) are
read from it and written into the meta's faster_rcnn_config.h, with the
anchors' cell shapes and strides for the one image size the bundles are
compiled for: clients send images of that size. The anchors the C computes
are checked at export against torchvision's anchor generator; the export
refuses a model whose parts it does not know (another pooler, head or anchor
generator) by name.

Where RoI Align runs is the one choice. It is a data-dependent gather: each
proposal reads 4 neighbours of each of its samples on the level
LevelMapper assigns it. XLA's CPU backend gathers element by element (about
2 ns each: 370 ms for ResNet-50's 1,000 proposals), while the C reads each
neighbour's channels as one contiguous run (~40 ms), so "glue", the default,
pools in the meta. "stage2" keeps it in the graph, with fixed shapes: every
proposal's level computed as LevelMapper does and its samples read from all
levels' maps laid end to end (through separable bilinear weights and a
matrix product when the maps are small, by one gather when they are large);
on a GPU that gather is cheap and the glue's host CPU is not.
"""

import copy
import math
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from .hooks import export_meta
from .torch_export import _modules, export_torch

GLUE_SOURCE = Path(__file__).with_name("faster_rcnn.c")
LOGIT_SPREAD = 1.5  # random_faster_rcnn's classifier: standard deviation of its logits
CONFIG_HEADER = "faster_rcnn_config.h"
ROI_ALIGN_PLACES = ("glue", "stage2")
# Stage 2's RoI Align (roi_align="stage2") reads maps of at most this many
# positions (all levels together) through a dense weight matrix rather than a
# gather (_roi_align_all_levels): XLA's CPU backend gathers element by
# element (~2 ns each, 60 ms for 150 proposals of 256 channels), while the
# matrix costs S multiply-adds per sampled channel value in one
# well-vectorized product.
SEPARABLE_MAX_POSITIONS = 1024


def _check_supported(model, roi_align):
    """Refuses what the glue or stage 2 does not implement, naming it."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign
    if type(model) is not FasterRCNN:
        raise TypeError(f"export_faster_rcnn takes a torchvision FasterRCNN, got "
                        f"{type(model).__name__} (Mask and Keypoint R-CNN add heads the "
                        f"glue does not run)")
    rh, rpn = model.roi_heads, model.rpn
    if type(rpn.anchor_generator) is not AnchorGenerator:
        raise NotImplementedError(f"anchor generator {type(rpn.anchor_generator).__name__}: "
                                  f"only torchvision's AnchorGenerator is supported")
    if type(rh.box_roi_pool) is not MultiScaleRoIAlign:
        raise NotImplementedError(f"box_roi_pool {type(rh.box_roi_pool).__name__}: only "
                                  f"MultiScaleRoIAlign is supported")
    if roi_align not in ROI_ALIGN_PLACES:
        raise ValueError(f"roi_align must be one of {', '.join(ROI_ALIGN_PLACES)}, got "
                         f"{roi_align!r}")
    if roi_align == "stage2" and rh.box_roi_pool.sampling_ratio <= 0:
        raise NotImplementedError("box_roi_pool.sampling_ratio <= 0 (adaptive sampling) "
                                  "depends on each proposal's size, which stage 2's fixed "
                                  "shapes cannot follow: give a fixed ratio, or "
                                  "roi_align=\"glue\"")
    if model.transform.fixed_size is not None:
        raise NotImplementedError("transform.fixed_size is not supported; use min_size and "
                                  "max_size")


def _stage1_module(model, pooled_names):
    """Stage 1 as a module of its own: transform, backbone, RPN head; the
    pooled maps channels last."""
    torch, _ = _modules()
    from torchvision.models.detection.rpn import concat_box_prediction_layers

    class Stage1(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transform = model.transform
            self.backbone = model.backbone
            self.head = model.rpn.head

        def forward(self, image):
            images, _ = self.transform(list(image))
            features = self.backbone(images.tensors)
            objectness, deltas = self.head(list(features.values()))
            objectness, deltas = concat_box_prediction_layers(objectness, deltas)
            n = image.shape[0]
            return tuple(features[k].permute(0, 2, 3, 1) for k in pooled_names) + (
                objectness.reshape(n, -1), deltas.reshape(n, -1, 4))

    return Stage1()


def _roi_align_all_levels(torch, features, boxes, levels, scales, output_size, sampling_ratio):
    """torchvision's roi_align (aligned=False) of each box on its own level,
    with fixed shapes: features [1, h_l, w_l, C] per level, boxes [R, 4],
    levels [R] -> [R, C, ph, pw]. The levels' maps are laid end to end,
    channels last ([S, C]), and read through a weight matrix when small,
    by a gather when large."""
    channels = features[0].shape[3]
    flat = torch.cat([f[0].reshape(-1, channels) for f in features], dim=0)  # [S, C]
    heights = [f.shape[1] for f in features]
    widths = [f.shape[2] for f in features]
    offsets = np.cumsum([0] + [h * w for h, w in zip(heights, widths)])[:-1]
    pick = torch.nn.functional.one_hot(levels, len(features)).to(boxes.dtype)  # [R, L]

    def const(values):  # on the boxes' device: under torchax, a JAX array
        return torch.tensor(values, dtype=boxes.dtype, device=boxes.device)

    def per_box(values):
        return pick @ const(values)

    scale, height, width = per_box(scales), per_box(heights), per_box(widths)
    base = per_box([float(o) for o in offsets]).to(torch.int32)
    ph, pw = output_size
    g = sampling_ratio

    def axis(start, end, bins, size):
        # sample coordinates along one axis [R, bins * g], as roi_align_kernel
        # places them, then clamped as its bilinear_interpolate does
        length = torch.clamp(end * scale - start * scale, min=1.0)
        bin_size = length / bins
        steps = const(range(bins))[:, None] * bin_size[:, None, None] + \
            (const(range(g))[None, :] + 0.5)[None] * (bin_size / g)[:, None, None]
        at = (start * scale)[:, None] + steps.reshape(len(start), bins * g)
        inside = (at >= -1.0) & (at <= size[:, None])
        at = torch.clamp(at, min=0.0)
        low = torch.floor(at)
        top = (size - 1)[:, None]
        at = torch.where(low >= top, top, at)
        low = torch.where(low >= top, top, low)
        high = torch.where(low >= top, top, low + 1)
        frac = at - low
        return inside, low.to(torch.int32), high.to(torch.int32), frac

    ys = axis(boxes[:, 1], boxes[:, 3], ph, height)
    xs = axis(boxes[:, 0], boxes[:, 2], pw, width)
    r = boxes.shape[0]
    if flat.shape[0] > SEPARABLE_MAX_POSITIONS:
        return _pool_gathered(torch, flat, ys, xs, base, width, output_size, g)
    # Small maps: for each level, the bilinear weights of a proposal's bin
    # are an outer product of a row weight over the map's rows and a column
    # weight over its columns (zero unless the proposal is on that level);
    # all levels' weights side by side [R * bins, S] times the maps.
    weights = []
    for level, (h, w) in enumerate(zip(heights, widths)):
        on_level = pick[:, level][:, None, None]
        rows = _axis_weights(torch, ys, h, ph, g, boxes) * on_level  # [R, ph, h]
        cols = _axis_weights(torch, xs, w, pw, g, boxes)  # [R, pw, w]
        weights.append((rows[:, :, None, :, None] * cols[:, None, :, None, :])
                       .reshape(r * ph * pw, h * w))
    pooled = torch.cat(weights, dim=1) @ flat  # [R * ph * pw, C]
    return pooled.reshape(r, ph, pw, channels).permute(0, 3, 1, 2)


def _axis_weights(torch, samples, size, bins, g, like):
    """[R, bins, size]: how much each bin's g samples along one axis weigh
    each position 0..size-1 (their two neighbours' bilinear weights, zero
    for a sample off the map, averaged over the g samples)."""
    inside, low, high, frac = samples
    r = low.shape[0]
    positions = torch.arange(size, dtype=torch.int32, device=like.device)
    weight = (torch.where(low[..., None] == positions, (1 - frac)[..., None], 0.0) +
              torch.where(high[..., None] == positions, frac[..., None], 0.0))
    weight = weight * inside[..., None].to(like.dtype)
    return weight.reshape(r, bins, g, size).sum(dim=2) / g


def _pool_gathered(torch, flat, ys, xs, base, width, output_size, g):
    """RoI Align over large maps: each bin's 4 corners of each of its g x g
    samples gathered from `flat` [S, C] with their bilinear weights, one
    gather and one batched product for all."""
    (y_in, y_lo, y_hi, ly), (x_in, x_lo, x_hi, lx) = ys, xs
    ph, pw = output_size
    r, channels = y_lo.shape[0], flat.shape[1]

    def per_bin(t):  # [R, bins * g] -> [R, bins, g]
        return t.reshape(r, -1, g)

    rows, cols = [per_bin(y_lo), per_bin(y_hi)], [per_bin(x_lo), per_bin(x_hi)]
    wy, wx = [per_bin(1 - ly), per_bin(ly)], [per_bin(1 - lx), per_bin(lx)]
    inside = per_bin(y_in)[:, :, None, :, None] & per_bin(x_in)[:, None, :, None, :]
    row_len = width.to(torch.int32)[:, None, None, None, None]
    index, weight = [], []
    for a in range(2):
        for b in range(2):
            index.append(base[:, None, None, None, None] + rows[a][:, :, None, :, None] * row_len
                         + cols[b][:, None, :, None, :])
            weight.append(wy[a][:, :, None, :, None] * wx[b][:, None, :, None, :])
    index = torch.stack(index, dim=-1).reshape(r, ph * pw, 4 * g * g)
    weight = (torch.stack(weight, dim=-1) * inside[..., None].to(flat.dtype) / (g * g)) \
        .reshape(r, ph * pw, 4 * g * g)
    samples = flat[index.reshape(-1)].reshape(r, ph * pw, 4 * g * g, channels)
    pooled = torch.einsum("rbk,rbkc->rbc", weight, samples)  # [R, ph * pw, C]
    return pooled.permute(0, 2, 1).reshape(r, channels, ph, pw)


def _stage2_module(model, scales, k_min, k_max, roi_align):
    """Stage 2 as a module of its own: box head and predictor, after
    multi-scale RoI Align when roi_align is "stage2"."""
    torch, _ = _modules()
    pool = model.roi_heads.box_roi_pool
    output_size = tuple(pool.output_size)
    canonical_scale, canonical_level = pool.canonical_scale, pool.canonical_level
    from torchvision.models.detection.faster_rcnn import TwoMLPHead
    # The C pools channels last ([P, ph, pw, C]). A TwoMLPHead flattens its
    # input into its first linear layer: that layer's columns are reordered
    # (in a copy) to read the channels-last order as it is. Another head gets
    # the input permuted back to [P, C, ph, pw] in the graph.
    head_reads_channels_last = roi_align == "glue" and \
        type(model.roi_heads.box_head) is TwoMLPHead

    class Stage2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.box_head = copy.deepcopy(model.roi_heads.box_head)
            self.box_predictor = model.roi_heads.box_predictor
            if head_reads_channels_last:
                fc6 = self.box_head.fc6
                channels = fc6.in_features // (output_size[0] * output_size[1])
                fc6.weight = torch.nn.Parameter(
                    fc6.weight.detach().reshape(fc6.out_features, channels, -1)
                    .transpose(1, 2).reshape(fc6.weight.shape).contiguous(),
                    requires_grad=False)

        def forward(self, *inputs):
            if roi_align == "glue":  # [1, P, ph, pw, C], pooled by the C
                pooled = inputs[0][0]
                return self.heads(pooled if head_reads_channels_last
                                  else pooled.permute(0, 3, 1, 2))
            features, proposals = inputs[:-1], inputs[-1]
            boxes = proposals[0]
            # torchvision's LevelMapper
            area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            level = torch.floor(canonical_level + torch.log2(torch.sqrt(area) / canonical_scale)
                                + 1e-6)
            level = torch.clamp(level, min=k_min, max=k_max).to(torch.int64) - k_min
            pooled = _roi_align_all_levels(torch, features, boxes, level, scales, output_size,
                                           pool.sampling_ratio)
            return self.heads(pooled)

        def heads(self, pooled):
            class_logits, box_regression = self.box_predictor(self.box_head(pooled))
            return class_logits[None], box_regression[None]

    return Stage2()


def _anchor_layout(model, image_list, features):
    """Per RPN level: (rows, columns, stride_y, stride_x, cell anchors [A, 4]),
    checked against torchvision's own anchors for this image size."""
    gen = model.rpn.anchor_generator
    sizes = [tuple(f.shape[-2:]) for f in features]
    padded = image_list.tensors.shape[-2:]
    cells = [c.to(features[0].dtype).numpy() for c in gen.cell_anchors] \
        if gen.cell_anchors else None
    if cells is None or len(cells) != len(sizes):
        raise NotImplementedError(f"the anchor generator has {len(gen.sizes)} size groups for "
                                  f"{len(sizes)} feature levels")
    layout, ours = [], []
    for (h, w), cell in zip(sizes, cells):
        sy, sx = padded[0] // h, padded[1] // w
        layout.append((h, w, sy, sx, cell))
        ys, xs = np.meshgrid(np.arange(h) * sy, np.arange(w) * sx, indexing="ij")
        shifts = np.stack([xs, ys, xs, ys], axis=-1).reshape(-1, 1, 4).astype(np.float32)
        ours.append((shifts + cell[None]).reshape(-1, 4))
    theirs = gen(image_list, list(features))[0].numpy()
    if not np.array_equal(np.concatenate(ours), theirs):
        raise NotImplementedError("the anchor generator's anchors are not cell anchors "
                                  "shifted by the stride over each map")
    return layout


def _c_floats(values) -> str:
    return ", ".join(f"{float(v)!r}f" if math.isfinite(v) else "NAN" for v in values)


def proposal_sizes(most: int):
    """The proposal counts stage 2 is compiled for: powers of two from 64 below
    the RPN's post_nms_top_n, and that. The glue pads the proposals to the
    smallest that holds them, so a quiet image does not pay for the most."""
    return [n for n in (64, 128, 256, 512, 1024, 2048) if n < most] + [most]


def _config_header(*, stage1, stage2, image_size, resized, layout, pooled, scales, mapper,
                   roi_align, sizes, model) -> str:
    rpn, rh = model.rpn, model.roi_heads
    pool = rh.box_roi_pool
    lines = [
        f"/* {CONFIG_HEADER}: written by pjserve_export.export_faster_rcnn for one",
        " * model and image size; faster_rcnn.c includes it. */",
        f'#define FRCNN_STAGE1 "{stage1}"',
        f'#define FRCNN_STAGE2 "{stage2}"',
        f"#define FRCNN_IMAGE_H {image_size[0]}",
        f"#define FRCNN_IMAGE_W {image_size[1]}",
        f"#define FRCNN_RESIZED_H {resized[0]}",
        f"#define FRCNN_RESIZED_W {resized[1]}",
        f"#define FRCNN_POOLED_MAPS {len(pooled)}",
        f"#define FRCNN_LEVELS {len(layout)}",
        f"#define FRCNN_PRE_NMS_TOP_N {rpn.pre_nms_top_n()}",
        f"#define FRCNN_POST_NMS_TOP_N {rpn.post_nms_top_n()}",
        f"#define FRCNN_PROPOSALS {sizes[-1]}",
        f"#define FRCNN_PROPOSAL_SIZES {len(sizes)}",
        f"static const int frcnn_proposal_sizes[FRCNN_PROPOSAL_SIZES] = "
        f"{{{', '.join(map(str, sizes))}}};",
        f"#define FRCNN_RPN_NMS_THRESH {float(rpn.nms_thresh)!r}",
        f"#define FRCNN_RPN_SCORE_THRESH {float(rpn.score_thresh)!r}f",
        f"#define FRCNN_RPN_MIN_SIZE {float(rpn.min_size)!r}f",
        f"#define FRCNN_CLASSES {rh.box_predictor.cls_score.out_features}",
        f"#define FRCNN_BOX_SCORE_THRESH {float(rh.score_thresh)!r}f",
        f"#define FRCNN_BOX_NMS_THRESH {float(rh.nms_thresh)!r}",
        f"#define FRCNN_DETECTIONS {rh.detections_per_img}",
        f"#define FRCNN_BOX_MIN_SIZE 1e-2f",
        f"#define FRCNN_RPN_XFORM_CLIP {float(rpn.box_coder.bbox_xform_clip)!r}f",
        f"#define FRCNN_BOX_XFORM_CLIP {float(rh.box_coder.bbox_xform_clip)!r}f",
        f"static const float frcnn_rpn_weights[4] = {{{_c_floats(rpn.box_coder.weights)}}};",
        f"static const float frcnn_box_weights[4] = {{{_c_floats(rh.box_coder.weights)}}};",
        "/* per RPN level: rows, columns, stride y, stride x, cell anchors */",
        f"static const int frcnn_level_rows[FRCNN_LEVELS] = "
        f"{{{', '.join(str(l[0]) for l in layout)}}};",
        f"static const int frcnn_level_cols[FRCNN_LEVELS] = "
        f"{{{', '.join(str(l[1]) for l in layout)}}};",
        f"static const int frcnn_level_stride_y[FRCNN_LEVELS] = "
        f"{{{', '.join(str(l[2]) for l in layout)}}};",
        f"static const int frcnn_level_stride_x[FRCNN_LEVELS] = "
        f"{{{', '.join(str(l[3]) for l in layout)}}};",
        f"static const int frcnn_level_anchors[FRCNN_LEVELS] = "
        f"{{{', '.join(str(len(l[4])) for l in layout)}}};",
        f"static const float frcnn_cell_anchors[] = "
        f"{{{_c_floats(np.concatenate([l[4].reshape(-1) for l in layout]))}}};",
        "/* RoI Align (MultiScaleRoIAlign, aligned=False): in the glue or in stage 2 */",
        f"#define FRCNN_ROI_ALIGN_IN_GLUE {int(roi_align == 'glue')}",
        f"#define FRCNN_CHANNELS {pooled[0].shape[1]}",
        f"#define FRCNN_POOLED_H {pool.output_size[0]}",
        f"#define FRCNN_POOLED_W {pool.output_size[1]}",
        f"#define FRCNN_SAMPLING_RATIO {pool.sampling_ratio}",
        f"#define FRCNN_CANONICAL_SCALE {float(mapper.s0)!r}f",
        f"#define FRCNN_CANONICAL_LEVEL {float(mapper.lvl0)!r}f",
        f"#define FRCNN_LEVEL_EPS {float(mapper.eps)!r}f",
        f"#define FRCNN_K_MIN {int(mapper.k_min)}",
        f"#define FRCNN_K_MAX {int(mapper.k_max)}",
        "/* per pooled map (level k_min..k_max): rows, columns, scale */",
        f"static const int frcnn_map_rows[FRCNN_POOLED_MAPS] = "
        f"{{{', '.join(str(f.shape[2]) for f in pooled)}}};",
        f"static const int frcnn_map_cols[FRCNN_POOLED_MAPS] = "
        f"{{{', '.join(str(f.shape[3]) for f in pooled)}}};",
        f"static const float frcnn_map_scale[FRCNN_POOLED_MAPS] = {{{_c_floats(scales)}}};",
    ]
    return "\n".join(lines) + "\n"


def export_faster_rcnn(model, out_dir, *, name: str, image_size: Tuple[int, int],
                       roi_align: str = "glue", build=None,
                       description: Optional[str] = None) -> Path:
    """Exports a torchvision FasterRCNN as three bundles in out_dir ({name}_stage1,
    {name}_stage2 and the meta {name}, which clients call); returns the meta's
    path. image_size (height, width) is the size of the images clients send.
    roi_align is where RoI Align runs: "glue" (the meta's C; the faster on
    the CPU plugin) or "stage2" (stage 2's graph). build builds the meta's
    model.so (hooks_builder), as for export_meta."""
    torch, _ = _modules()
    from torchvision.ops.poolers import _setup_scales
    _check_supported(model, roi_align)
    h, w = (int(v) for v in image_size)
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be two positive extents, got {image_size!r}")
    model.eval()
    out_dir = Path(out_dir)
    pool = model.roi_heads.box_roi_pool
    example = torch.zeros((1, 3, h, w), dtype=torch.float32)
    with torch.no_grad():
        image_list, _ = model.transform(list(example))
        all_features = model.backbone(image_list.tensors)
        pooled_names = [k for k in all_features if k in pool.featmap_names]
        pooled = [all_features[k] for k in pooled_names]
        scales, mapper = _setup_scales(pooled, image_list.image_sizes, pool.canonical_scale,
                                       pool.canonical_level)
        layout = _anchor_layout(model, image_list, list(all_features.values()))
    resized = tuple(int(v) for v in image_list.image_sizes[0])
    proposals = model.rpn.post_nms_top_n()
    stage1, stage2 = f"{name}_stage1", f"{name}_stage2"
    feature_names = [f"feature_{i}" for i in range(len(pooled))]
    what = type(model.backbone.body).__name__ if hasattr(model.backbone, "body") else "backbone"
    export_torch(_stage1_module(model, pooled_names), [example.numpy()], out_dir, name=stage1,
                 batch_sizes=[1], input_names=["image"],
                 output_names=feature_names + ["objectness", "deltas"],
                 description=f"Faster R-CNN stage 1 ({what} + FPN + RPN head), called by {name}")
    sizes = proposal_sizes(proposals)
    if roi_align == "glue":
        pooled_shape = tuple(pool.output_size) + (pooled[0].shape[1],)

        def stage2_inputs(n):
            return [np.zeros((1, n) + pooled_shape, np.float32)]
        stage2_names, what2 = ["rois"], "box head"
    else:
        maps = [np.ascontiguousarray(f.permute(0, 2, 3, 1).numpy()) for f in pooled]

        def stage2_inputs(n):
            return maps + [np.zeros((1, n, 4), np.float32)]
        stage2_names, what2 = feature_names + ["proposals"], "RoI Align + box head"
    export_torch(_stage2_module(model, scales, mapper.k_min, mapper.k_max, roi_align),
                 stage2_inputs(proposals), out_dir, name=stage2, batch_sizes=[1],
                 input_names=stage2_names, output_names=["class_logits", "box_regression"],
                 variants={f"p{n}": stage2_inputs(n) for n in sizes[:-1]},
                 description=f"Faster R-CNN stage 2 ({what2}), called by {name}")
    header = _config_header(stage1=stage1, stage2=stage2, image_size=(h, w), resized=resized,
                            layout=layout, pooled=pooled, scales=scales, mapper=mapper,
                            roi_align=roi_align, sizes=sizes, model=model)
    return export_meta(out_dir, name=name, calls=[stage1, stage2],
                       client_inputs=[("IMAGE", "f32", [3, h, w])],
                       client_outputs=[("BOXES", "f32", [-1, 4]), ("SCORES", "f32", [-1]),
                                       ("LABELS", "i64", [-1])],
                       source=GLUE_SOURCE, extra_files={CONFIG_HEADER: header.encode()},
                       description=description or
                       f"torchvision Faster R-CNN ({what}), {h}x{w} images",
                       build=build)


def random_faster_rcnn(architecture: str = "fasterrcnn_mobilenet_v3_large_320_fpn", *,
                       seed: int = 0, image_size: Tuple[int, int] = (240, 320), **options):
    """A torchvision Faster R-CNN with random weights that still detects, for
    trying the export without downloading trained weights: built by
    torchvision.models.detection.<architecture>(weights=None,
    weights_backbone=None, **options) from `seed`, its batch norms' running
    statistics set from one random image of image_size (else activations
    vanish through MobileNetV3's layers and every score is alike), and its
    classifier's weights scaled so that its logits on that image spread by
    LOGIT_SPREAD (else 91 near-equal class probabilities all fall below
    box_score_thresh, or saturate to equal ones)."""
    torch, _ = _modules()
    from torchvision.models import detection
    from torchvision.ops.misc import FrozenBatchNorm2d
    torch.manual_seed(seed)
    model = getattr(detection, architecture)(weights=None, weights_backbone=None, **options)
    model.eval()

    def calibrate(bn, args):
        x = args[0]
        bn.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        bn.running_var.copy_(x.var(dim=(0, 2, 3)) + 1e-3)

    norms = (FrozenBatchNorm2d, torch.nn.BatchNorm2d)
    hooks = [m.register_forward_pre_hook(calibrate) for m in model.modules()
             if isinstance(m, norms)]
    image = torch.rand((3,) + tuple(image_size), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model([image])
        for h in hooks:
            h.remove()
        images, _ = model.transform([image])
        features = model.backbone(images.tensors)
        proposals, _ = model.rpn(images, features)
        heads = model.roi_heads
        pooled = heads.box_roi_pool(features, proposals, images.image_sizes)
        logits, _ = heads.box_predictor(heads.box_head(pooled))
        heads.box_predictor.cls_score.weight.mul_(LOGIT_SPREAD / logits.std())
        heads.box_predictor.cls_score.bias.zero_()
    return model

