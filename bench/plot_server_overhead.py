#!/usr/bin/env python3
"""Plot bench/results/server_overhead.json (written by bench/server_overhead.py).

    .venv-bench-mlserver/bin/python bench/plot_server_overhead.py RESULTS.json OUT.png

Left: p50 latency per server and configuration (bars; the whisker reaches
p99), with the raw PJRT round trip as a dashed line. Right: throughput.
Both on log scales. matplotlib lives in .venv-bench-mlserver, not in .venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"pjserve": "pjserve", "triton": "Triton (Python backend)",
          "pytriton": "Triton via PyTriton", "mlserver": "MLServer"}
COLORS = {"pjserve": "#2b6cb0", "triton": "#76b900", "pytriton": "#3d6b00",
          "mlserver": "#d69e2e"}


def main(src, dst):
    r = json.load(open(src))
    summary = r["summary"]
    configs = []
    for s in summary:
        c = (s["protocol"], s["concurrency"])
        if c not in configs:
            configs.append(c)
    servers = [k for k in LABELS if any(s["server"] == k for s in summary)]
    by = {(s["server"], s["protocol"], s["concurrency"]): s for s in summary}
    width = 0.8 / len(servers)
    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, key in enumerate(servers):
        xs, p50, p99, tp = [], [], [], []
        for j, c in enumerate(configs):
            s = by.get((key,) + c)
            if s is None:
                continue
            xs.append(j + (i - (len(servers) - 1) / 2) * width)
            p50.append(s["p50_us"])
            p99.append(s["p99_us"])
            tp.append(s["throughput"])
        err = [[0] * len(p50), [b - a for a, b in zip(p50, p99)]]
        ax_lat.bar(xs, p50, width, color=COLORS[key], label=LABELS[key], yerr=err,
                   capsize=3, ecolor="#555555")
        ax_tp.bar(xs, tp, width, color=COLORS[key], label=LABELS[key])
    raw = r["raw"]["pjrt"]["round_trip_us"]["p50"]
    ax_lat.axhline(raw, color="black", linestyle="--", linewidth=1)
    ax_lat.text(len(configs) - 0.5, raw * 1.15, f"raw PJRT round trip p50 {raw:.0f} us",
                ha="right", va="bottom", fontsize=8)
    ticks = [f"{p} c={c}" for p, c in configs]
    for ax in (ax_lat, ax_tp):
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(ticks)
        ax.grid(axis="y", which="both", alpha=0.3)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency, microseconds (bar p50, whisker p99)")
    ax_tp.set_ylabel("throughput, inferences/s")
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_lat.set_title("latency (lower is better)")
    ax_tp.set_title("throughput (higher is better)")
    m = r["machine"]
    fig.suptitle(f"mlp x[1,16] -> y[1,4], batch-1 requests from perf_analyzer; "
                 f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('accelerator') or 'CPU only'}; "
                 f"load average "
                 f"{r['loadavg_start'][0]:.1f} at start, {r['loadavg_end'][0]:.1f} at end",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
