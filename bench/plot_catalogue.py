#!/usr/bin/env python3
"""Plot bench/results/catalogue.json (written by bench/catalogue.py).

    .venv-bench-plot/bin/python bench/plot_catalogue.py RESULTS.json OUT.png

Left: the client's latency CDF of each system over the measured requests
(log latency; the fraction of requests on a logit axis, so p50, p99 and
p99.9 are spread out). Right: where each system found the model of each
request: pjserve's tiers (device, host memory, file; from
pjserve_request_tier_seconds) and the peers' hits and loads (the client's
LRU for PyTriton, the x-tier header for Ray), as shares of the measured
requests, with the throughput and p99 under each bar.

matplotlib is in .venv-bench-plot (scripts/bootstrap-bench plot), not in .venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

COLORS = {"tiered": "#2b6cb0", "host": "#63b3ed", "ray": "#c05621", "pytriton": "#2f855a"}
SHORT = {"tiered": "pjserve tiered", "host": "pjserve all-in-host", "ray": "Ray Serve",
         "pytriton": "PyTriton"}
TIER_COLORS = {"device": "#2b6cb0", "host": "#90cdf4", "file": "#e53e3e",
               "hit": "#68d391", "load": "#e53e3e"}


def subtitle(r):
    m, s = r["machine"], r["settings"]
    return (f"{s['models']:,} models of {s['weight_bytes'] / 2**20:.1f} MiB, "
            f"{s['rate']:g} req/s for {s['seconds']:g} s (first {s['warmup']:g} s not measured); "
            f"{m.get('cores')} CPUs ({m.get('cpu')}), CPU PJRT plugin; {r['date']}")


def plot_cdf(r, ax):
    for key, run in r["runs"].items():
        pts = [(ms, q / 100) for q, ms in run.get("cdf_ms", []) if 0 < q < 100 and ms > 0]
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, "-", color=COLORS.get(key), label=SHORT.get(key, key))
    ax.set_xscale("log")
    ax.set_yscale("logit")
    ax.set_ylim(0.01, 0.9999)
    ticks = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
    ax.set_yticks(ticks)
    ax.set_yticklabels(["p1", "p10", "p50", "p90", "p99", "p99.9", "p99.99"])
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("client latency, ms")
    ax.set_ylabel("fraction of requests at or below")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("latency CDF of the measured requests", fontsize=9.5)


def shares(run):
    if "pjserve" in run:
        return [(t, h["share"] or 0.0) for t, h in run["pjserve"]["tiers"].items()]
    return [(t, h["share"]) for t, h in run.get("client_tiers", {}).items()]


def plot_tiers(r, ax):
    keys = list(r["runs"])
    seen = set()
    for i, key in enumerate(keys):
        run = r["runs"][key]
        bottom = 0.0
        for tier, share in shares(run):
            label = None if tier in seen else {"device": "pjserve: device",
                                               "host": "pjserve: host memory",
                                               "file": "pjserve: file",
                                               "hit": "peer: in its cache",
                                               "load": "peer: loaded from the file"}.get(tier, tier)
            seen.add(tier)
            ax.bar(i, share, bottom=bottom, color=TIER_COLORS.get(tier, "#a0aec0"),
                   edgecolor="white", label=label)
            if share >= 0.04:
                ax.text(i, bottom + share / 2, f"{100 * share:.0f}%", ha="center",
                        va="center", fontsize=8)
            bottom += share
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{SHORT.get(k, k)}\n{r['runs'][k]['completed_per_s']:.0f}/s, "
                        f"p99 {r['runs'][k]['p99'] or 0:.1f} ms" for k in keys], fontsize=7.5)
    ax.set_ylim(0, 1.22)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("share of the measured requests")
    ax.legend(fontsize=7.5, loc="upper center", ncol=3)
    ax.set_title("where each request found its model's weights", fontsize=9.5)


def main():
    r = json.load(open(sys.argv[1]))
    fig, (ax_cdf, ax_tiers) = plt.subplots(1, 2, figsize=(12, 4.8))
    plot_cdf(r, ax_cdf)
    plot_tiers(r, ax_tiers)
    fig.suptitle("Catalogue: many models under a bursty Zipf trace", fontsize=11)
    fig.text(0.5, 0.005, subtitle(r), ha="center", fontsize=7.5, color="#4a5568")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
