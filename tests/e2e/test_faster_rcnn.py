"""torchvision's Faster R-CNN exported by export_faster_rcnn and served as a
meta model: the detections are torchvision's own.

Runs in .venv-torch (`make e2e-torch`). Two architectures with random
weights (nothing is downloaded; random_faster_rcnn calibrates their batch
norms and classifier so that they detect):
fasterrcnn_mobilenet_v3_large_320_fpn on 240x320 images and
fasterrcnn_resnet50_fpn (min_size 320, max_size 512) on 300x400 images,
with RoI Align in the glue; and MobileNetV3 again with RoI Align in stage 2
(through its weight matrix, and through the gather large maps take) and with
adaptive sampling in the glue (VARIANTS). Each served answer is matched with eager torchvision's for the same image:
the same number of detections, each served one paired with a torchvision
one of the same label by IoU, boxes within BOX_ATOL pixels and scores within
SCORE_ATOL. Also: an image with no detection above the threshold, the wrong
image size, and the models the exporter refuses.
"""

import sys
from pathlib import Path

from unittest import mock

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (puts python/ on sys.path)
from e2e_util import serving  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch lives in .venv-torch: make e2e-torch")
import torchvision  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from pjserve_export import detection, hooks_builder  # noqa: E402
from pjserve_export.detection import export_faster_rcnn, random_faster_rcnn  # noqa: E402
from torchvision.ops import MultiScaleRoIAlign  # noqa: E402

# Boxes come out of XLA's convolutions and PyTorch's, decoded in float32 at
# coordinates up to a few hundred pixels.
BOX_ATOL = 0.05
SCORE_ATOL = 1e-3
IMAGES = 3

ARCHITECTURES = {
    "mobilenet": ("fasterrcnn_mobilenet_v3_large_320_fpn", (240, 320), {}),
    "resnet50": ("fasterrcnn_resnet50_fpn", (300, 400), dict(min_size=320, max_size=512)),
}
# MobileNetV3 exported otherwise: {key: (model options, export options, the
# largest maps stage 2 reads through a weight matrix)}
VARIANTS = {
    "in_graph": ({}, dict(roi_align="stage2"), detection.SEPARABLE_MAX_POSITIONS),
    "gathered": ({}, dict(roi_align="stage2"), 0),
    "adaptive": (dict(box_roi_pool=MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 0)), {},
                 detection.SEPARABLE_MAX_POSITIONS),
}


def images(size, count, seed):
    """Uniform noise (what random_faster_rcnn calibrated on), every other one
    with a few flat rectangles blended in. (Far from that, on a dark image
    say, a random network's activations grow until its boxes hang on
    rounding, in PyTorch as in XLA.)"""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        img = rng.random((3,) + size, dtype=np.float32)
        if k % 2:
            for _ in range(4):
                y, x = rng.integers(0, size[0] - 40), rng.integers(0, size[1] - 40)
                h, w = rng.integers(20, 40, 2)
                patch = img[:, y:y + h, x:x + w]
                patch[:] = 0.5 * patch + 0.5 * rng.random((3, 1, 1), dtype=np.float32)
        out.append(img)
    return out


@pytest.fixture(scope="module")
def detectors(tmp_path_factory, pjserve_bin):
    """{key: (model, image size)} and the exported repository: every
    architecture, every variant, and "strict" (mobilenet keeping no detection
    below 0.9999)."""
    out = tmp_path_factory.mktemp("detection")
    build = hooks_builder(pjserve_bin)
    models = {}
    for key, (arch, size, options) in ARCHITECTURES.items():
        models[key] = (random_faster_rcnn(arch, image_size=size, **options), size)
        export_faster_rcnn(models[key][0], out, name=key, image_size=size, build=build)
    arch, size, _ = ARCHITECTURES["mobilenet"]
    for key, (options, export_options, separable_max) in VARIANTS.items():
        models[key] = (random_faster_rcnn(arch, image_size=size, **options), size)
        with mock.patch.object(detection, "SEPARABLE_MAX_POSITIONS", separable_max):
            export_faster_rcnn(models[key][0], out, name=key, image_size=size, build=build,
                               **export_options)
    strict = random_faster_rcnn(ARCHITECTURES["mobilenet"][0], image_size=(240, 320),
                                box_score_thresh=0.9999)
    models["strict"] = (strict, (240, 320))
    export_faster_rcnn(strict, out, name="strict", image_size=(240, 320), build=build)
    return models, out


@pytest.fixture(scope="module")
def server(detectors, pjserve_bin, plugin_path, tmp_path_factory):
    _, repo = detectors
    with serving(pjserve_bin, plugin_path, sorted(repo.iterdir()),
                 tmp_path_factory.mktemp("detection-server")) as s:
        yield s


def torchvision_detections(model, image):
    with torch.no_grad():
        d = model([torch.from_numpy(image)])[0]
    return d["boxes"].numpy(), d["scores"].numpy(), d["labels"].numpy()


def served_detections(server, proto, name, image):
    mod = grpcclient if proto == "grpc" else httpclient
    client = (grpcclient.InferenceServerClient(server.grpc_url) if proto == "grpc"
              else httpclient.InferenceServerClient(server.http_url, network_timeout=120))
    try:
        x = mod.InferInput("IMAGE", list(image.shape), "FP32")
        x.set_data_from_numpy(image)
        r = client.infer(name, [x])
        return r.as_numpy("BOXES"), r.as_numpy("SCORES"), r.as_numpy("LABELS")
    finally:
        client.close()


def iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def assert_same_detections(got, want, what):
    """Each served detection paired with the unpaired torchvision detection of
    its label that overlaps it most; every pair within the tolerances."""
    boxes, scores, labels = got
    w_boxes, w_scores, w_labels = want
    assert boxes.shape == (len(scores), 4) and labels.dtype == np.int64, what
    assert len(scores) == len(w_scores), \
        f"{what}: {len(scores)} detections served, torchvision found {len(w_scores)}"
    unpaired = set(range(len(w_scores)))
    for i in range(len(scores)):
        same_label = [j for j in unpaired if w_labels[j] == labels[i]]
        assert same_label, f"{what}: detection {i} (label {labels[i]}) has no torchvision match"
        j = max(same_label, key=lambda j: iou(boxes[i], w_boxes[j]))
        unpaired.remove(j)
        assert iou(boxes[i], w_boxes[j]) > 0.5, (what, i, boxes[i], w_boxes[j])
        np.testing.assert_allclose(boxes[i], w_boxes[j], atol=BOX_ATOL, rtol=0,
                                   err_msg=f"{what}: detection {i}")
        assert abs(scores[i] - w_scores[j]) <= SCORE_ATOL, (what, i, scores[i], w_scores[j])
    assert np.all(np.diff(scores) <= 0), f"{what}: not best first"


@pytest.mark.parametrize("key", list(ARCHITECTURES) + list(VARIANTS))
def test_detections_are_torchvisions(server, detectors, key):
    models, _ = detectors
    model, size = models[key]
    counts = []
    for k, image in enumerate(images(size, IMAGES, seed=1)):
        want = torchvision_detections(model, image)
        for proto in ("grpc", "http"):
            got = served_detections(server, proto, key, image)
            assert_same_detections(got, want, f"{key} image {k} over {proto}")
        counts.append(len(want[1]))
    print(f"{key}: detections per image {counts}, all matched")
    assert max(counts) > 10, counts  # the check compared something


def test_no_detection_is_an_empty_answer(server, detectors):
    models, _ = detectors
    model, size = models["strict"]
    image = images(size, 1, seed=7)[0]
    assert len(torchvision_detections(model, image)[1]) == 0
    for proto in ("grpc", "http"):
        boxes, scores, labels = served_detections(server, proto, "strict", image)
        assert boxes.shape == (0, 4) and scores.shape == (0,) and labels.shape == (0,), proto


def test_stages_are_internal(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        names = {m["name"] for m in client.get_model_repository_index()}
        assert {"mobilenet", "resnet50", "strict"} <= names
        assert not any(n.endswith(("_stage1", "_stage2")) for n in names), names
    finally:
        client.close()


def test_an_image_of_another_size_is_refused(server):
    image = np.zeros((3, 200, 200), np.float32)
    with pytest.raises(InferenceServerException) as e:
        served_detections(server, "grpc", "mobilenet", image)
    assert "IMAGE" in str(e.value) and "240" in str(e.value), str(e.value)


def test_a_non_finite_pixel_is_refused(server):
    image = np.full((3, 240, 320), 0.5, np.float32)
    image[1, 7, 9] = np.nan
    for proto in ("grpc", "http"):
        with pytest.raises(InferenceServerException) as e:
            served_detections(server, proto, "mobilenet", image)
        assert "IMAGE[79049] is nan" in str(e.value), str(e.value)


def test_what_the_exporter_refuses(tmp_path):
    from torchvision.models.detection import maskrcnn_resnet50_fpn
    mask = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)
    with pytest.raises(TypeError, match="Mask and Keypoint R-CNN"):
        export_faster_rcnn(mask, tmp_path, name="m", image_size=(64, 64))
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None)
    model.roi_heads.box_roi_pool.sampling_ratio = 0
    with pytest.raises(NotImplementedError, match="sampling_ratio .* roi_align=\"glue\""):
        export_faster_rcnn(model, tmp_path, name="m", image_size=(64, 64), roi_align="stage2")
    with pytest.raises(ValueError, match="roi_align must be one of glue, stage2, got 'xla'"):
        export_faster_rcnn(model, tmp_path, name="m", image_size=(64, 64), roi_align="xla")
    model.roi_heads.box_roi_pool.sampling_ratio = 2
    with pytest.raises(ValueError, match="image_size"):
        export_faster_rcnn(model, tmp_path, name="m", image_size=(0, 64))
    assert not list(tmp_path.iterdir())
