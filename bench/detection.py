#!/usr/bin/env python3
"""Detection benchmark: torchvision's Faster R-CNN served by pjserve as a meta
model (export_faster_rcnn), against eager PyTorch in-process and against a
client that orchestrates the two stages itself.

    .venv-torch/bin/python bench/detection.py      # or: make bench-detection

For each architecture (fasterrcnn_mobilenet_v3_large_320_fpn on 240x320
images, fasterrcnn_resnet50_fpn with min_size 320 / max_size 512 on 300x400
images; random weights made to detect by random_faster_rcnn, 100 detections
per image), one image after another (concurrency 1), --requests timed after
--warmup:

  eager     model([image]) in this process (torch's default threads: every
            CPU), the latency a PyTorch program has without a server
  pjserve   one gRPC request to the meta model exported with RoI Align in
            its C (roi_align="glue", the default); stage calls, NMS and the
            rest run inside the server
  in graph  the same with RoI Align in stage 2's graph (roi_align="stage2")
  client    the in-graph export's two stages public on a second pjserve (the
            same bundles, no meta calling them): the client calls stage 1
            over gRPC, runs torchvision's own code for the proposals (its box
            coder and RegionProposalNetwork.filter_proposals, anchors
            computed once), calls stage 2 over gRPC with them padded to a
            compiled size, and runs RoIHeads.postprocess_detections and the
            transform's rescale
  stages    the limit: the server's own execution time of stage 1 and
            stage 2 per pjserve request (nv_inference_compute_infer_duration_us
            of the stage models, which no request path can beat)

Every method's answers are first checked against eager torchvision's on the
benchmark's images (same detections, as tests/e2e/test_faster_rcnn.py
matches them). Reported: p50 and p90 latency in ms, and the server process's
CPU time per request. Writes bench/results/detection.json and .md, the
table into docs/detection.md (between its detection-bench markers; not with
--no-doc) and docs/img/detection.png (bench/plot_detection.py, with the
matplotlib of .venv-bench-plot, when there is one). Servers listen on free loopback ports; their logs go
to a temporary directory, kept with --keep.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchlib import (PJSERVE, ROOT, PjserveProcess, find_plotter, fmt, git_revision, log,
                      machine_info, metric, remove_workdir, replace_between_markers,
                      tree_cpu_seconds, write_report)

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import torch  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from pjserve_export import hooks_builder  # noqa: E402
from pjserve_export.detection import (export_faster_rcnn, proposal_sizes,  # noqa: E402
                                      random_faster_rcnn)
from test_faster_rcnn import ARCHITECTURES, assert_same_detections, images  # noqa: E402

RESULT = ROOT / "bench" / "results" / "detection.json"
DOC = ROOT / "docs" / "detection.md"
PLOT = ROOT / "bench" / "plot_detection.py"
FIGURE = ROOT / "docs" / "img" / "detection.png"
BEGIN, END = "<!-- detection-bench:begin -->", "<!-- detection-bench:end -->"
IN_GRAPH = "_in_graph"  # the name suffix of the export with RoI Align in stage 2


# The meta server's scratch pool, as docs/detection.md serves the detector:
# room for two metas' pooled features (ResNet-50: 1,000 x 7 x 7 x 256 floats,
# 50 MB each), reused from request to request.
META_SCRATCH = ["--meta-scratch-bytes", "128Mi"]


class Server(PjserveProcess):
    def __init__(self, repository, cache, work, name, extra=()):
        self.repository, self.cache, self.extra = repository, cache, list(extra)
        self.log_path = work / f"{name}.log"
        self.proc = None

    def start(self, models):
        self.serve_command()
        self.start_process()
        self.wait_models_ready(models, time.monotonic() + 600, 600, 0.2)
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc}")

    def infer(self, model, tensors, outputs):
        inputs = []
        for name, array in tensors.items():
            x = grpcclient.InferInput(name, list(array.shape), "FP32")
            x.set_data_from_numpy(np.ascontiguousarray(array))
            inputs.append(x)
        r = self.client.infer(model, inputs)
        return [r.as_numpy(o) for o in outputs]

    def compute_us(self, models):
        samples = self.scrape()
        return sum(metric(samples, "nv_inference_compute_infer_duration_us", m) for m in models)


class ClientGlue:
    """The client-side orchestration, with torchvision's own functions."""

    def __init__(self, model, key, size, server):
        self.model, self.key, self.server = model, key, server
        self.sizes = proposal_sizes(model.rpn.post_nms_top_n())
        with torch.no_grad():
            probe = torch.zeros((3,) + size)
            self.images, _ = model.transform([probe])
            features = model.backbone(self.images.tensors)
            self.anchors = model.rpn.anchor_generator(self.images, list(features.values()))
            objectness, _ = model.rpn.head(list(features.values()))
            self.per_level = [o[0].numel() for o in objectness]
            self.pooled = [k for k in features if k in model.roi_heads.box_roi_pool.featmap_names]
        self.original = [tuple(size)]

    def __call__(self, image):
        n_maps = len(self.pooled)
        names = [f"feature_{i}" for i in range(n_maps)] + ["objectness", "deltas"]
        out = self.server.infer(f"{self.key}_stage1", {"image": image[None]}, names)
        maps, objectness, deltas = out[:n_maps], torch.from_numpy(out[-2]), out[-1]
        rpn, heads, sizes = self.model.rpn, self.model.roi_heads, self.images.image_sizes
        with torch.no_grad():
            proposals = rpn.box_coder.decode(torch.from_numpy(deltas[0]), self.anchors)
            boxes, _ = rpn.filter_proposals(proposals.view(1, -1, 4), objectness, sizes,
                                            self.per_level)
            boxes = boxes[0]
            padded = next(n for n in self.sizes if n >= len(boxes))
            rows = np.zeros((1, padded, 4), np.float32)
            rows[0, :len(boxes)] = boxes.numpy()
            tensors = {f"feature_{i}": m for i, m in enumerate(maps)}
            tensors["proposals"] = rows
            logits, regression = self.server.infer(f"{self.key}_stage2", tensors,
                                                   ["class_logits", "box_regression"])
            n = len(boxes)
            found = heads.postprocess_detections(torch.from_numpy(logits[0, :n]),
                                                 torch.from_numpy(regression[0, :n]),
                                                 [boxes], sizes)
            b, s, lab = found[0][0], found[1][0], found[2][0]
            result = self.model.transform.postprocess([{"boxes": b, "scores": s, "labels": lab}],
                                                      sizes, self.original)[0]
        return result["boxes"].numpy(), result["scores"].numpy(), result["labels"].numpy()


def eager(model, image):
    with torch.no_grad():
        d = model([torch.from_numpy(image)])[0]
    return d["boxes"].numpy(), d["scores"].numpy(), d["labels"].numpy()


def timed(fn, inputs, warmup, requests):
    for k in range(warmup):
        fn(inputs[k % len(inputs)])
    ms = []
    for k in range(requests):
        t0 = time.perf_counter()
        fn(inputs[k % len(inputs)])
        ms.append(1e3 * (time.perf_counter() - t0))
    return ms


def measure(key, model, size, meta_server, public_server, args):
    inputs = images(size, args.images, seed=1)
    glue = ClientGlue(model, f"{key}{IN_GRAPH}", size, public_server)
    outputs = ["BOXES", "SCORES", "LABELS"]
    methods = {
        "eager": lambda img: eager(model, img),
        "pjserve": lambda img: meta_server.infer(key, {"IMAGE": img}, outputs),
        "in_graph": lambda img: meta_server.infer(f"{key}{IN_GRAPH}", {"IMAGE": img}, outputs),
        "client": glue,
    }
    for name, fn in methods.items():
        for k, img in enumerate(inputs):
            assert_same_detections(tuple(fn(img)), eager(model, img), f"{key} {name} image {k}")
    log(f"{key}: every method's detections are torchvision's on {len(inputs)} images")
    row = {"architecture": ARCHITECTURES[key][0], "image": list(size),
           "detections": [len(eager(model, img)[1]) for img in inputs]}
    for name, fn in methods.items():
        server = {"pjserve": meta_server, "in_graph": meta_server,
                  "client": public_server}.get(name)
        meta = key if name == "pjserve" else f"{key}{IN_GRAPH}"
        stages = [f"{meta}_stage1", f"{meta}_stage2"]
        before_cpu = tree_cpu_seconds(server.proc.pid) if server else None
        before_us = server.compute_us(stages) if server else None
        ms = sorted(timed(fn, inputs, args.warmup, args.requests))
        entry = {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90))}
        if server:
            entry["server_cpu_ms"] = 1e3 * (tree_cpu_seconds(server.proc.pid) - before_cpu) / \
                (args.requests + args.warmup)
            entry["stages_ms"] = (server.compute_us(stages) - before_us) / 1e3 / \
                (args.requests + args.warmup)
        row[name] = entry
        log(f"{key} {name}: p50 {entry['p50_ms']:.1f} ms, p90 {entry['p90_ms']:.1f} ms")
    return row


def markdown(result):
    lines = [f"Faster R-CNN at concurrency 1, {result['requests']} requests after "
             f"{result['warmup']} ({result['machine']['cpu']}, {result['machine']['cores']} "
             f"CPUs; pjserve {result['revision']}, torch {result['torch']}, torchvision "
             f"{result['torchvision']})", "",
             "| architecture | image | eager PyTorch p50 / p90 | pjserve meta p50 / p90 | "
             "its stage executions (the limit) | meta, RoI Align in stage 2 p50 / p90 | "
             "client-orchestrated p50 / p90 | server CPU per request: meta / in graph / "
             "client |",
             "|---|---|---|---|---|---|---|---|"]

    def p50_p90(m):
        return f"{m['p50_ms']:.1f} / {m['p90_ms']:.1f} ms"
    for r in result["rows"]:
        p, g, c = r["pjserve"], r["in_graph"], r["client"]
        lines.append(
            f"| {r['architecture']} | {r['image'][0]}x{r['image'][1]} | {p50_p90(r['eager'])} | "
            f"{p50_p90(p)} | {fmt(p['stages_ms'], '.1f')} ms | {p50_p90(g)} | {p50_p90(c)} | "
            f"{p['server_cpu_ms']:.0f} / {g['server_cpu_ms']:.0f} / "
            f"{c['server_cpu_ms']:.0f} ms |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=30, help="timed requests per method")
    ap.add_argument("--warmup", type=int, default=3, help="untimed requests first")
    ap.add_argument("--images", type=int, default=4, help="distinct images, sent in turn")
    ap.add_argument("--architectures", default=",".join(ARCHITECTURES),
                    help=f"which of {','.join(ARCHITECTURES)}")
    ap.add_argument("--keep", action="store_true", help="keep the servers' logs and bundles")
    ap.add_argument("--no-doc", action="store_true", help="leave docs/detection.md as it is")
    args = ap.parse_args(argv)
    if not PJSERVE.exists():
        sys.exit(f"bench/detection.py: {PJSERVE} is missing (make build)")
    keys = [k.strip() for k in args.architectures.split(",") if k.strip()]
    if not set(keys) <= set(ARCHITECTURES):
        ap.error(f"--architectures: unknown {sorted(set(keys) - set(ARCHITECTURES))}")
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="pjserve-bench-detection-"))
    meta_repo, public_repo = work / "meta", work / "public"
    servers = []
    try:
        models = {}
        for key in keys:
            arch, size, options = ARCHITECTURES[key]
            models[key] = (random_faster_rcnn(arch, image_size=size, **options), size)
            log(f"exporting {key}, RoI Align in the glue and in stage 2")
            for name, where in ((key, "glue"), (f"{key}{IN_GRAPH}", "stage2")):
                export_faster_rcnn(models[key][0], meta_repo, name=name, image_size=size,
                                   roi_align=where, build=hooks_builder(PJSERVE))
            public_repo.mkdir(exist_ok=True)
            for stage in ("stage1", "stage2"):
                stage = f"{key}{IN_GRAPH}_{stage}"
                (public_repo / stage).symlink_to(meta_repo / stage)
        meta = Server(meta_repo, work / "cache", work, "meta", META_SCRATCH)
        public = Server(public_repo, work / "cache", work, "public")
        for server, names in ((meta, keys + [f"{k}{IN_GRAPH}" for k in keys]),
                              (public, [f"{k}{IN_GRAPH}_{stage}" for k in keys
                                        for stage in ("stage1", "stage2")])):
            servers.append(server)
            server.start(names)
        rows = [measure(k, *models[k], meta, public, args) for k in keys]
        import torchvision
        result = {"machine": machine_info(), "revision": git_revision(),
                  "torch": torch.__version__, "torchvision": torchvision.__version__,
                  "torch_threads": torch.get_num_threads(), "requests": args.requests,
                  "warmup": args.warmup, "rows": rows}
        write_report(result, started, RESULT, markdown)
        if not args.no_doc and replace_between_markers(DOC, BEGIN, END, markdown(result)):
            log(f"the table is in {DOC.relative_to(ROOT)} too")
        plotter = find_plotter()
        if plotter is None:
            log("no plot: matplotlib lives in .venv-bench-plot (scripts/bootstrap-bench plot)")
        else:
            subprocess.run([str(plotter), str(PLOT), str(RESULT), str(FIGURE)], check=True)
            log(f"wrote {FIGURE.relative_to(ROOT)}")
    finally:
        for s in servers:
            s.stop()
        remove_workdir(work, args.keep)


if __name__ == "__main__":
    main()
