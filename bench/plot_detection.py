#!/usr/bin/env python3
"""Plot bench/results/detection.json (written by bench/detection.py).

    .venv-bench-plot/bin/python bench/plot_detection.py RESULTS.json OUT.png

One panel per architecture: p50 latency of eager PyTorch in-process, the
pjserve meta model (RoI Align in its C, and in stage 2's graph) and the
client orchestrating the in-graph stages, bars with a whisker up to p90,
and the meta's stage executions (the limit) as a dashed line.

matplotlib is in .venv-bench-plot (scripts/bootstrap-bench plot), not in .venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = (("eager", "eager PyTorch (in-process)", "#ee4c2c"),
           ("pjserve", "pjserve meta (RoI Align in C)", "#2b6cb0"),
           ("in_graph", "pjserve meta (RoI Align in stage 2)", "#4299e1"),
           ("client", "client-orchestrated (in-graph stages)", "#90cdf4"))


def main(src, dst):
    rows = json.load(open(src))["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.5), squeeze=False)
    for ax, row in zip(axes[0], rows):
        for i, (key, label, color) in enumerate(METHODS):
            m = row[key]
            ax.bar(i, m["p50_ms"], color=color, label=label,
                   yerr=[[0], [m["p90_ms"] - m["p50_ms"]]], capsize=4)
            ax.text(i, m["p50_ms"] / 2, f"{m['p50_ms']:.0f}", ha="center", color="white")
        ax.axhline(row["pjserve"]["stages_ms"], color="black", linestyle="--",
                   label="stage executions (the limit)")
        ax.set_xticks(range(len(METHODS)), [k for k, _, _ in METHODS])
        ax.set_ylabel("latency p50, whisker to p90 (ms)")
        ax.set_title(f"{row['architecture']}, {row['image'][0]}x{row['image'][1]}")
    axes[0][0].legend(loc="lower left", fontsize=8)
    fig.suptitle("Faster R-CNN at concurrency 1 (bench/detection.py)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
