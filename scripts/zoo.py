#!/usr/bin/env python3
"""zoo - which public PyTorch architectures pjserve serves as eager PyTorch computes them.

    .venv-torch/bin/python scripts/zoo.py [--only NAME,..] [--work DIR] [--keep]   # or: make zoo

Each architecture of MODELS is built from its constructor or config with
random weights from a fixed seed (nothing is downloaded): torchvision's
classification, segmentation and video models, timm's, and transformers'
encoders and decoders. Each is exported with pjserve_export.export_torch at
batch sizes 1 and 2; a model whose export fails is recorded with the
exception's first line, which is what export_torch says to a user. The
exported ones are served by one `pjserve serve` (build/pjserve, the CPU
plugin) and each is asked over gRPC (2 rows) and HTTP (1 row) through
tritonclient; its outputs are compared with eager PyTorch's on the same
inputs. A model passes when every output's largest absolute difference is
within 1e-3 of that output's largest magnitude (relative error <= 1e-3) on
both protocols. Parameters a constructor leaves all zero (ViT's classifier
head) are drawn too, else every answer would be zero.

Inputs are small where the architecture allows it (images of 96x96 for the
convolutional networks, short token sequences), so the whole zoo runs in
minutes on two CPUs; models whose shapes are fixed (ViT, Swin, MaxViT) get
224x224.

Writes bench/results/zoo.json and zoo.md, and the table in docs/exporter.md
between its "zoo" markers; with --only, the architectures named replace
their rows of the last run's results. Exit status: 0 when at least 95 % of the
architectures pass, 1 otherwise, 3 on a usage error.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import replace_between_markers  # noqa: E402
from pjserve_export import export_torch, torch_reference  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "exporter.md"
BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"
BATCH_SIZES = (1, 2)
RTOL = 1e-3
GOAL = 0.95


class Arch:
    """One architecture: how to build it and its inputs (one row each, int32
    or f32), and which outputs to compare."""

    def __init__(self, name, family, build, inputs, input_names=("x",), output_names=("y",),
                 wrap=None):
        self.name, self.family, self.build = name, family, build
        self.inputs, self.input_names, self.output_names = inputs, input_names, output_names
        self.wrap = wrap  # module -> module whose forward takes the inputs positionally


def image(size):
    return lambda rows, seed: [np.random.default_rng(seed).standard_normal(
        (rows, 3, size, size)).astype(np.float32)]


def tokens(seq, vocab, mask=True):
    def make(rows, seed):
        rng = np.random.default_rng(seed)
        ids = rng.integers(3, vocab, (rows, seq), dtype=np.int32)
        if not mask:
            return [ids]
        lengths = seq - rng.integers(0, 4, rows)
        return [ids, (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)]
    return make


def pick(model, names, key):
    """A module whose forward(*inputs) is model(**{names: inputs})[key]: a
    keyword call, whatever the order of model.forward's parameters."""
    import torch

    class Picked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args)))[key]
    return Picked()


def torchvision_models():
    import torchvision.models as tv
    import torchvision.models.segmentation as seg
    import torchvision.models.video as video

    def cls(name, size=96, **kw):
        return Arch(name, "torchvision", lambda: getattr(tv, name)(weights=None, **kw),
                    image(size), ("x",), ("logits",))

    out = [cls(n) for n in (
        "alexnet", "resnet18", "resnet50", "resnext50_32x4d", "densenet121", "mobilenet_v2",
        "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_v2_s",
        "regnet_x_400mf", "regnet_y_400mf", "convnext_tiny", "squeezenet1_1",
        "shufflenet_v2_x1_0", "mnasnet1_0")]
    out += [cls("googlenet", aux_logits=False, init_weights=True),
            cls("inception_v3", size=96, aux_logits=False, init_weights=True),
            cls("vit_b_16", size=224), cls("swin_t", size=224), cls("maxvit_t", size=224)]
    for name in ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"):
        out.append(Arch(name, "torchvision", lambda n=name: getattr(seg, n)(
            weights=None, weights_backbone=None, num_classes=21), image(96), ("x",), ("out",)))
    out.append(Arch("r3d_18", "torchvision", lambda: video.r3d_18(weights=None),
                    lambda rows, seed: [np.random.default_rng(seed).standard_normal(
                        (rows, 3, 8, 64, 64)).astype(np.float32)], ("x",), ("logits",)))
    return out


def timm_models():
    try:
        import timm
    except ImportError:
        return []
    return [Arch(f"timm_{name}", "timm", lambda n=name: timm.create_model(n, pretrained=False),
                 image(size), ("x",), ("logits",))
            for name, size in (("resnet18d", 96), ("efficientnet_b0", 96), ("convnext_atto", 96),
                               ("vit_tiny_patch16_224", 224), ("deit_tiny_patch16_224", 224),
                               ("mobilevitv2_050", 96), ("regnety_002", 96))]


def transformers_models():
    import transformers as tf
    V, S = 1000, 16

    def encoder(name, model_cls, config, key="last_hidden_state", mask=True, seq=S):
        names = ("input_ids", "attention_mask") if mask else ("input_ids",)
        return Arch(name, "transformers", lambda: model_cls(config()), tokens(seq, V, mask), names,
                    (key,), wrap=lambda m: pick(m, names, key))

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128)
    out = [
        encoder("bert", tf.BertModel, lambda: tf.BertConfig(vocab_size=V, **small,
                                                            max_position_embeddings=64)),
        encoder("distilbert", tf.DistilBertModel, lambda: tf.DistilBertConfig(
            vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
            max_position_embeddings=64)),
        encoder("roberta", tf.RobertaModel, lambda: tf.RobertaConfig(
            vocab_size=V, **small, max_position_embeddings=S + 4)),
        encoder("albert", tf.AlbertModel, lambda: tf.AlbertConfig(
            vocab_size=V, embedding_size=32, **small, max_position_embeddings=64)),
        encoder("electra", tf.ElectraModel, lambda: tf.ElectraConfig(
            vocab_size=V, embedding_size=32, **small, max_position_embeddings=64)),
        encoder("gpt2", tf.GPT2Model, lambda: tf.GPT2Config(
            vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64)),
        encoder("t5_encoder", tf.T5EncoderModel, lambda: tf.T5Config(
            vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
        encoder("llama", tf.LlamaModel, lambda: tf.LlamaConfig(
            vocab_size=V, **small, num_key_value_heads=2, max_position_embeddings=64)),
        encoder("mistral", tf.MistralModel, lambda: tf.MistralConfig(
            vocab_size=V, **small, num_key_value_heads=2, max_position_embeddings=64,
            sliding_window=None)),
        encoder("opt", tf.OPTModel, lambda: tf.OPTConfig(
            vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            ffn_dim=128, max_position_embeddings=64, word_embed_proj_dim=64)),
    ]

    def vision(name, model_cls, config, key="last_hidden_state", size=32):
        return Arch(name, "transformers", lambda: model_cls(config()), image(size),
                    ("pixel_values",), (key,), wrap=lambda m: pick(m, ("pixel_values",), key))

    out += [
        vision("vit", tf.ViTModel, lambda: tf.ViTConfig(image_size=32, patch_size=4, **small)),
        vision("deit", tf.DeiTModel, lambda: tf.DeiTConfig(image_size=32, patch_size=4, **small)),
        vision("clip_vision", tf.CLIPVisionModel, lambda: tf.CLIPVisionConfig(
            image_size=32, patch_size=4, **small)),
        vision("hf_resnet", tf.ResNetModel, lambda: tf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]), key="pooler_output",
            size=64),
        vision("hf_convnext", tf.ConvNextModel, lambda: tf.ConvNextConfig(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]), key="pooler_output", size=64),
    ]

    def whisper():
        m = tf.WhisperModel(tf.WhisperConfig(
            vocab_size=V, d_model=64, encoder_layers=2, encoder_attention_heads=4,
            decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))
        return m.get_encoder()
    out.append(Arch("whisper_encoder", "transformers", whisper,
                    lambda rows, seed: [np.random.default_rng(seed).standard_normal(
                        (rows, 16, 100)).astype(np.float32)], ("input_features",),
                    ("last_hidden_state",),
                    wrap=lambda m: pick(m, ("input_features",), "last_hidden_state")))
    out.append(Arch("wav2vec2", "transformers", lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(
        **small, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
        lambda rows, seed: [np.random.default_rng(seed).standard_normal(
            (rows, 1600)).astype(np.float32)], ("input_values",), ("last_hidden_state",),
        wrap=lambda m: pick(m, ("input_values",), "last_hidden_state")))
    return out


def all_models():
    return torchvision_models() + timm_models() + transformers_models()


# ---- running -----------------------------------------------------------------------

def log(msg):
    print(f"zoo: {msg}", flush=True)


def first_line(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0] if text else type(e).__name__


def export_one(arch, repo):
    """(module, bundle path, seconds) or raises what export_torch raised."""
    import torch
    torch.manual_seed(0)
    module = arch.build()
    if arch.wrap is not None:
        module = arch.wrap(module)
    # Parameters a constructor zeroes (ViT's and GoogLeNet's classifier
    # heads) would make every answer zero, which any server matches: drawn.
    with torch.no_grad():
        for p in module.parameters():
            if p.numel() > 1 and not torch.any(p):
                p.normal_(0.0, 0.02)
    module.eval()
    t0 = time.monotonic()
    path = export_torch(module, arch.inputs(1, 0), repo, name=arch.name,
                        batch_sizes=BATCH_SIZES, input_names=list(arch.input_names),
                        output_names=list(arch.output_names))
    return module, path, time.monotonic() - t0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plugin_path():
    sys.path.insert(0, str(ROOT / "tests"))
    import common
    return common.cpu_plugin_path()


def serve(repo, work):
    grpc, http, metrics = free_port(), free_port(), free_port()
    log_file = open(work / "server.log", "wb")
    proc = subprocess.Popen(
        [str(ROOT / "build" / "pjserve"), "serve", "--model-repository", str(repo),
         "--pjrt-plugin", str(plugin_path()), "--cache-dir", str(work / "cache"),
         "--host", "127.0.0.1", "--grpc-port", str(grpc), "--http-port", str(http),
         "--metrics-port", str(metrics), "--model-control-mode", "static",
         "--strict-readiness", "false"], stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pjserve serve exited: see {work / 'server.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready",
                                        timeout=2) as r:
                if r.status == 200:
                    return proc, grpc, http
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("pjserve serve did not get ready in 30 minutes")


def rel_error(got, want):
    scale = max(float(np.max(np.abs(want))), 1e-6)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def ask(arch, module, grpc_url, http_url):
    """{protocol: worst relative error over the outputs} or raises."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    out = {}
    for protocol, rows in (("grpc", 2), ("http", 1)):
        xs = arch.inputs(rows, 7)
        want = torch_reference(module, xs, list(arch.output_names))
        lib = grpcclient if protocol == "grpc" else httpclient
        client = (grpcclient.InferenceServerClient(grpc_url) if protocol == "grpc"
                  else httpclient.InferenceServerClient(http_url, network_timeout=600))
        ins = []
        for name, x in zip(arch.input_names, xs):
            t = lib.InferInput(name, list(x.shape), "INT32" if x.dtype == np.int32 else "FP32")
            if protocol == "grpc":
                t.set_data_from_numpy(x)
            else:
                t.set_data_from_numpy(x, binary_data=True)
            ins.append(t)
        # (the HTTP client's per-request timeout is in microseconds and becomes a
        # deadline on the server: its network_timeout above is the bound)
        result = client.infer(arch.name, ins) if protocol == "http" else \
            client.infer(arch.name, ins, client_timeout=600)
        out[protocol] = max(rel_error(result.as_numpy(n), w)
                            for n, w in zip(arch.output_names, want))
        client.close()
    return out


def markdown(rows, summary):
    lines = [f"{summary['passed']} of {summary['total']} architectures serve within a relative "
             f"error of {RTOL:g} of eager PyTorch on both protocols "
             f"({100 * summary['passed'] / max(1, summary['total']):.0f} %; goal "
             f"{100 * GOAL:.0f} %). torch {summary['torch']}, torchax {summary['torchax']}, "
             f"transformers {summary['transformers']}, timm {summary['timm']}; "
             f"{summary['date']}, `make zoo`.", "",
             "| architecture | from | result | gRPC / HTTP relative error | export s |",
             "|---|---|---|---:|---:|"]
    for r in rows:
        err = (f"{r['errors']['grpc']:.1e} / {r['errors']['http']:.1e}"
               if r.get("errors") else "-")
        lines.append(f"| {r['name']} | {r['family']} | {r['result']} | {err} | "
                     f"{r.get('export_s', 0):.0f} |")
    return "\n".join(lines) + "\n"


def update_doc(table):
    if not replace_between_markers(DOC, BEGIN, END, table):
        log(f"{DOC} has no {BEGIN} ... {END} markers: the table is only in bench/results")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--only", default="", help="comma-separated architectures (default: all)")
    ap.add_argument("--work", default=None, help="bundles and logs (default: a temporary dir)")
    ap.add_argument("--keep", action="store_true", help="keep --work afterwards")
    ap.add_argument("--no-doc", action="store_true", help="leave docs/exporter.md as it is")
    a = ap.parse_args(argv)
    models = all_models()
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {m.name for m in models}
        if unknown:
            log(f"unknown architectures: {', '.join(sorted(unknown))}")
            return 3
        models = [m for m in models if m.name in want]
    work = Path(a.work or tempfile.mkdtemp(prefix="pjserve-zoo-"))
    repo = work / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    rows, modules = [], {}
    for arch in models:
        row = {"name": arch.name, "family": arch.family}
        try:
            module, _, seconds = export_one(arch, repo)
            modules[arch.name] = module
            row["export_s"] = seconds
            log(f"{arch.name}: exported in {seconds:.1f} s")
        except Exception as e:  # a refusal is a result: what export_torch told the user
            row["result"] = f"refused at export: {first_line(e)}"
            row["traceback"] = traceback.format_exc(limit=-3)
            shutil.rmtree(repo / arch.name, ignore_errors=True)
            log(f"{arch.name}: {row['result']}")
        rows.append(row)
    if modules:
        log(f"serving {len(modules)} bundles")
        proc, grpc, http = serve(repo, work)
        try:
            for row in rows:
                if row["name"] not in modules:
                    continue
                arch = next(m for m in models if m.name == row["name"])
                try:
                    row["errors"] = ask(arch, modules[arch.name], f"127.0.0.1:{grpc}",
                                        f"127.0.0.1:{http}")
                    worst = max(row["errors"].values())
                    row["result"] = "serves" if worst <= RTOL else \
                        f"differs: relative error {worst:.1e}"
                except Exception as e:
                    row["result"] = f"failed when served: {first_line(e)}"
                log(f"{row['name']}: {row['result']}")
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    import torch
    import torchax
    import transformers
    try:
        import timm
        timm_version = timm.__version__
    except ImportError:
        timm_version = "not installed"
    if a.only and (RESULTS / "zoo.json").exists():
        # one architecture run again: its row replaces the last full run's
        fresh = {r["name"]: r for r in rows}
        rows = [fresh.pop(r["name"], r)
                for r in json.loads((RESULTS / "zoo.json").read_text())["rows"]]
        rows += list(fresh.values())
    summary = {"total": len(rows), "passed": sum(r.get("result") == "serves" for r in rows),
               "torch": torch.__version__, "torchax": torchax.__version__,
               "transformers": transformers.__version__, "timm": timm_version,
               "date": time.strftime("%Y-%m-%d")}
    table = markdown(rows, summary)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "zoo.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1)
                                      + "\n")
    (RESULTS / "zoo.md").write_text(table)
    if not a.no_doc:
        update_doc(table)
    print(table)
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["passed"] >= GOAL * summary["total"] else 1


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
