#!/usr/bin/env python3
"""Plot bench/results/meta_pipeline.json (written by bench/meta_pipeline.py).

    .venv-bench-plot/bin/python bench/plot_meta_pipeline.py RESULTS.json OUT.png

Left: p50 latency of the two-stage detector per pipeline (pjserve meta,
client-orchestrated over gRPC, Triton BLS) at each concurrency, bars with a
whisker up to p99, log scale. Middle: requests/s. Right: one sub-call's
added cost, p50 (whisker to p99) of the mlp called directly and through a
meta (pjserve) or a BLS model (Triton) at concurrency 1, the difference
written above.

matplotlib is in .venv-bench-plot (scripts/bootstrap-bench plot), not in .venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PIPELINES = {"meta": ("pjserve meta", "#2b6cb0"),
             "client": ("client-orchestrated (pjserve stages)", "#63b3ed"),
             "bls": ("Triton BLS", "#76b900")}
SUBCALL_BARS = (("pjserve_direct", "pjserve_meta", "pjserve", "#2b6cb0"),
                ("triton_direct", "triton_bls", "Triton", "#76b900"))


def main(src, dst):
    r = json.load(open(src))
    by = {(s["key"], s["concurrency"]): s for s in r["summary"]}
    concurrencies = sorted({c for k, c in by if k in PIPELINES})
    keys = [k for k in PIPELINES if any((k, c) in by for c in concurrencies)]
    width = 0.8 / len(keys)
    fig, (ax_lat, ax_tp, ax_sub) = plt.subplots(1, 3, figsize=(15, 4.8),
                                                gridspec_kw={"width_ratios": [3, 3, 2]})
    for i, key in enumerate(keys):
        label, color = PIPELINES[key]
        xs, p50, p99, tp = [], [], [], []
        for j, c in enumerate(concurrencies):
            s = by.get((key, c))
            if s is None:
                continue
            xs.append(j + (i - (len(keys) - 1) / 2) * width)
            p50.append(s["p50_us"] / 1000)
            p99.append(s["p99_us"] / 1000)
            tp.append(s["throughput"])
        ax_lat.bar(xs, p50, width, color=color, label=label,
                   yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99)]], capsize=3,
                   ecolor="#555555")
        ax_tp.bar(xs, tp, width, color=color, label=label)
        for x, v in zip(xs, tp):
            ax_tp.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    for ax in (ax_lat, ax_tp):
        ax.set_xticks(range(len(concurrencies)))
        ax.set_xticklabels([f"concurrency {c}" for c in concurrencies])
        ax.grid(axis="y", which="both", alpha=0.3)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency, ms (bar p50, whisker p99)")
    ax_lat.set_title(f"two-stage detector, {r['settings']['boxes']} boxes")
    ax_lat.legend(fontsize=8, loc="upper left")
    ax_tp.set_ylabel("requests/s")
    ax_tp.set_title("throughput (closed loop, gRPC)")

    ticks = []
    for j, (direct, via, server, color) in enumerate(SUBCALL_BARS):
        d, v = by.get((direct, 1)), by.get((via, 1))
        if d is None or v is None:
            continue
        for k, (s, hatch) in enumerate(((d, None), (v, "//"))):
            ax_sub.bar(j + (k - 0.5) * 0.4, s["p50_us"], 0.4, color=color, hatch=hatch,
                       edgecolor="white", yerr=[[0], [s["p99_us"] - s["p50_us"]]], capsize=3,
                       ecolor="#555555")
        added = next(a["added_p50_us"] for a in r["subcalls"] if a["server"] == server)
        ticks.append((j, f"{server}\ndirect | one sub-call\nadded p50 {added:+.0f} us"))
    ax_sub.set_xticks([t[0] for t in ticks])
    ax_sub.set_xticklabels([t[1] for t in ticks], fontsize=8)
    ax_sub.set_ylabel("mlp latency at concurrency 1, us (p50, whisker p99)")
    ax_sub.set_title("added cost of one sub-call")
    ax_sub.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
