#!/usr/bin/env python3
"""Plot bench/results/scheduler.json (written by bench/scheduler.py).

    .venv-bench-plot/bin/python bench/plot_scheduler.py RESULTS.json OUT_DIR

OUT_DIR/scheduler_throughput.png (scheduler_throughput_MODEL.png for a run of
another --model): left, images/s against perf_analyzer
concurrency for pjserve with coalescing (each point labelled with the mean
rows per execution) and without (the batch-size-1 bundle), under dashed lines
at the raw PJRT limit of each compiled batch size; right, p50 and p99 latency.

OUT_DIR/scheduler_fair_share.png: per fair run and concurrency, three stacked
bars: the configured weight shares, the achieved shares of device time and
the shares of requests served.

matplotlib is in .venv-bench-plot (scripts/bootstrap-bench plot), not in .venv.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COALESCED = "#2b6cb0"
UNBATCHED = "#c05621"
MODEL_COLORS = ("#2b6cb0", "#d69e2e")


def subtitle(r):
    m = r["machine"]
    return (f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('accelerator') or 'CPU only'}; load "
            f"average {r['loadavg_start'][0]:.1f} at start, {r['loadavg_end'][0]:.1f} at end; "
            f"{r['date']}")


def plot_throughput(r, dst):
    sweep, unbatched, raw = r.get("sweep"), r.get("unbatched"), r.get("raw")
    if not sweep and not unbatched:
        return False
    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(13, 5.2))
    concs = sorted({s["concurrency"] for s in (sweep or []) + (unbatched or [])})

    top = 1.12 * max([s["throughput"] for s in (sweep or []) + (unbatched or [])]
                     + [rr["images_per_s_mean"] for rr in raw or []])
    if raw:
        cmap = plt.get_cmap("Greys")
        label_y = -1e30
        for i, rr in enumerate(sorted(raw, key=lambda rr: rr["images_per_s_mean"])):
            y = rr["images_per_s_mean"]
            color = cmap(0.45 + 0.5 * rr["batch_size"].bit_length() / 7)
            ax_tp.axhline(y, color=color, linestyle="--", linewidth=1,
                          label="raw PJRT limit per batch size b (b / mean round trip)"
                          if i == 0 else None)
            label_y = max(y, label_y + 0.04 * top)   # keep the labels apart
            ax_tp.annotate(f"raw b={rr['batch_size']}: {y:.0f}/s", xy=(1.0, label_y),
                           xycoords=("axes fraction", "data"), xytext=(4, 0),
                           textcoords="offset points", va="center", ha="left", fontsize=7.5,
                           color="#333333")

    sizes = ",".join(map(str, r["settings"]["batch_sizes"]))
    for steps, color, label in ((sweep, COALESCED, f"pjserve, batch sizes {sizes}"),
                                (unbatched, UNBATCHED, "pjserve, batch size 1 only")):
        if not steps:
            continue
        xs = [s["concurrency"] for s in steps]
        ax_tp.plot(xs, [s["throughput"] for s in steps], "o-", color=color, label=label)
        if steps is sweep:
            for s in steps:
                rows = s["server"]["rows_per_execution"]
                if rows is not None:
                    ax_tp.annotate(f"{rows:.1f}", (s["concurrency"], s["throughput"]),
                                   textcoords="offset points", xytext=(0, 7), ha="center",
                                   fontsize=7.5, color=color)
        ax_lat.plot(xs, [s["p50_us"] / 1e3 for s in steps], "o-", color=color,
                    label=f"{label}: p50")
        ax_lat.plot(xs, [s["p99_us"] / 1e3 for s in steps], "^:", color=color, alpha=0.8,
                    label=f"{label}: p99")

    for ax in (ax_tp, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs)
        ax.set_xticklabels([str(c) for c in concs])
        ax.set_xlabel("perf_analyzer concurrency (batch-1 requests in flight)")
        ax.grid(which="both", alpha=0.3)
    ax_tp.set_xlim(concs[0] / 1.3, concs[-1] * 1.3)
    ax_tp.set_ylim(0, top)
    ax_tp.set_ylabel("images/s")
    ax_tp.set_title("throughput; point labels: mean rows (requests) per execution",
                    fontsize=9.5)
    ax_tp.legend(loc="upper left", fontsize=8)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency, ms")
    ax_lat.set_title("latency per request (perf_analyzer)", fontsize=9.5)
    ax_lat.legend(loc="upper left", fontsize=8)
    name = r["settings"].get("main_model", "convnet")
    model = r.get("models", {}).get(name, {}).get("input", name)
    fig.suptitle(f"{name}, {model}, batch-1 requests over gRPC; " + subtitle(r), fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_fair(r, dst):
    fair = r.get("fair")
    if not fair:
        return False
    fig, ax = plt.subplots(figsize=(12, 5.2))
    width = 0.26
    kinds = (("configured_share", "configured"), ("device_share", "device time"),
             ("request_share", "requests"))
    ticks, labels = [], []
    for g, run in enumerate(fair):
        models = run["models"]
        for k, (key, kind) in enumerate(kinds):
            x = g + (k - 1) * (width + 0.02)
            bottom = 0.0
            for i, m in enumerate(models):
                v = m[key] or 0.0
                configured = key == "configured_share"
                ax.bar(x, v, width, bottom=bottom, color=MODEL_COLORS[i % 2],
                       alpha=0.45 if configured else 0.9, hatch="//" if configured else None,
                       edgecolor="white")
                if v > 0.06:
                    ax.text(x, bottom + v / 2, f"{v:.2f}", ha="center", va="center",
                            fontsize=7.5, color="black" if configured else "white")
                bottom += v
            ax.text(x, 1.01, kind, ha="center", va="bottom", fontsize=7, rotation=0)
        ticks.append(g)
        names = " / ".join(f"{m['model']} (w={m['weight']:g})" for m in models)
        labels.append(f"{run['name']}, concurrency {run['concurrency_each']} each\n{names}")
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=7.5)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("share (first model bottom, second top)")
    ax.set_title("configured weight shares vs achieved shares of device time "
                 "(pjserve_model_device_seconds_total) and of requests served", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(subtitle(r), fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    return True


def main(src, out_dir):
    r = json.load(open(src))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = r["settings"].get("model", "convnet")
    suffix = "" if model == "convnet" else f"_{model}"
    plot_throughput(r, out / f"scheduler_throughput{suffix}.png")
    plot_fair(r, out / "scheduler_fair_share.png")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
