#!/usr/bin/env python3
"""Plot bench/results/residency.json (written by bench/residency.py).

    .venv-bench-plot/bin/python bench/plot_residency.py RESULTS.json OUT.png
    .venv-bench-plot/bin/python bench/plot_residency.py --curve RESULTS.json OUT.png

Without --curve, the parts load and zipf. Top left: bandwidth of a cold
weight load against model size (from the server's load counters, and from
the client's miss minus hit latency) with the host copies of the same size
(numpy, into a used and into a fresh buffer). Top right: time per load.
Bottom left: p50 and p99 client latency against the number of models under
Zipf traffic, with the budget (20 % of the weights) and without. Bottom
right: the measured hit rate (per request and per execution) against an LRU
simulation and keeping the most popular models resident, and requests/s on
the right axis.

With --curve, the part curve: one column per budget; against the number of
models, one line per configuration: requests/s and p99 (with the
all-resident reference of each binary, and the goal drawn from it: 0.8 of
its throughput, 2x its p99), the hit rate per request and per execution
(with an LRU simulation and keeping the most popular models resident), and
the share of the time spent loading weights.

matplotlib is in .venv-bench-plot (scripts/bootstrap-bench plot), not in .venv.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERVER = "#2b6cb0"
CLIENT = "#63b3ed"
COPY = "#718096"
FRESH = "#c05621"
BUDGET = "#2b6cb0"
UNLIMITED = "#d69e2e"


def subtitle(r):
    m = r["machine"]
    where = (f"{m['accelerator']}" if m.get("accelerator") else
             "CPU only: the XLA CPU PJRT plugin's \"device\" is host memory")
    return (f"{m.get('cores')} cores ({m.get('cpu')}), {where}; "
            f"load average {r['loadavg_start'][0]:.1f} at start, "
            f"{r['loadavg_end'][0]:.1f} at end; {r['date']}")


def plot_load(r, ax_bw, ax_t):
    rows = r.get("load")
    if not rows:
        for ax in (ax_bw, ax_t):
            ax.set_visible(False)
        return
    x = [row["weight_bytes"] / 2**20 for row in rows]
    series = (("load_gb_per_s", "load_ms", "o-", SERVER, "pjserve load (metrics)"),
              ("miss_minus_hit_gb_per_s", "miss_minus_hit_ms", "s--", CLIENT,
               "client: miss p50 - hit p50"),
              ("memcpy_warm_gb_per_s", "memcpy_warm_ms", "^:", COPY,
               "numpy copy into a used buffer"),
              ("memcpy_fresh_gb_per_s", "memcpy_fresh_ms", "v:", FRESH,
               "numpy copy into a fresh buffer"))
    for bw, ms, style, color, label in series:
        pts = [(xi, row[bw]) for xi, row in zip(x, rows) if row.get(bw)]
        if pts:
            ax_bw.plot(*zip(*pts), style, color=color, label=label)
        pts = [(xi, row[ms]) for xi, row in zip(x, rows) if row.get(ms) and row[ms] > 0]
        if pts:
            ax_t.plot(*zip(*pts), style, color=color, label=label)
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{v:.0f}" for v in x])
        ax.set_xlabel("model weights, MiB")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=7.5)
    ax_bw.set_ylabel("GB/s (10^9 bytes per second)")
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_title("cold-load bandwidth against model size", fontsize=9.5)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("ms per load / copy")
    ax_t.set_title("time per load (a budget of 1.5 models, requests alternating)", fontsize=9.5)


def plot_zipf(r, ax_lat, ax_hit):
    zipf = r.get("zipf")
    if not zipf:
        for ax in (ax_lat, ax_hit):
            ax.set_visible(False)
        return
    ns = [e["models"] for e in zipf]
    frac = r["settings"]["budget_fraction"]
    for key, color, label in (("budget", BUDGET, f"budget {100 * frac:.0f}% of the weights"),
                              ("unlimited", UNLIMITED, "no budget (all resident)")):
        ax_lat.plot(ns, [e[key]["p50_ms"] for e in zipf], "o-", color=color,
                    label=f"{label}: p50")
        ax_lat.plot(ns, [e[key]["p99_ms"] for e in zipf], "^:", color=color,
                    label=f"{label}: p99")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("client latency, ms")
    ax_lat.set_title(f"latency, Zipf s={r['settings']['zipf_s']}, "
                     f"{r['settings']['threads']} client threads", fontsize=9.5)

    ax_hit.plot(ns, [e["budget"]["hit_rate"] for e in zipf], "o-", color=BUDGET,
                label="hit rate per request (1 - loads / requests)")
    ax_hit.plot(ns, [e["budget"]["hit_rate_per_execution"] for e in zipf], "s--",
                color=CLIENT, label="per execution (1 - loads / executions)")
    ax_hit.plot(ns, [e["lru_simulated_hit_rate"] for e in zipf], "x:", color=COPY,
                label="LRU, simulated sequential stream")
    ax_hit.plot(ns, [e["top_models_hit_rate"] for e in zipf], "+:", color="#2f855a",
                label="most popular models resident")
    ax_hit.set_ylim(0, 1)
    ax_hit.set_ylabel("hit rate")
    ax_tp = ax_hit.twinx()
    ax_tp.plot(ns, [e["budget"]["requests_per_s"] for e in zipf], "d-", color=FRESH,
               alpha=0.7, label="requests/s, budget")
    ax_tp.plot(ns, [e["unlimited"]["requests_per_s"] for e in zipf], "d:", color=UNLIMITED,
               alpha=0.9, label="requests/s, no budget")
    ax_tp.set_ylim(bottom=0)
    ax_tp.set_ylabel("requests/s")
    ax_hit.set_title("hit rate and throughput (budget runs)", fontsize=9.5)
    h1, l1 = ax_hit.get_legend_handles_labels()
    h2, l2 = ax_tp.get_legend_handles_labels()
    ax_hit.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.13), ncol=2)
    for ax in (ax_lat, ax_hit):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel(f"models (each {zipf[0]['model_bytes'] / 2**20:.0f} MiB of weights)")
        ax.grid(which="both", alpha=0.3)
    ax_lat.legend(fontsize=7.5)


# Lines of the curve: known configurations keep their colours from run to run.
CONFIG_COLORS = {"lru": "#2b6cb0", "lfu": "#2f855a", "lfu+defer": "#9b2c2c",
                 "no-prefetch": "#d53f8c", "default": "#319795", "baseline": "#718096"}
OTHER_COLORS = ("#805ad5", "#dd6b20", "#4a5568", "#38a169", "#00b5d8")
REFERENCE_COLOR = "#d69e2e"


def config_colors(names):
    others = iter(OTHER_COLORS)
    return {n: CONFIG_COLORS.get(n) or next(others, None) for n in names}


def plot_curve(r, dst):
    curve, s = r["curve"], r["settings"]
    budgets = s["curve_budgets"]
    configs = list(curve[0]["budgets"][0]["runs"])
    refs = list(curve[0]["reference"])
    colors = config_colors(configs)
    ns = [e["models"] for e in curve]
    fig, axes = plt.subplots(4, len(budgets), figsize=(6.5 * len(budgets), 19), squeeze=False)
    for col, fraction in enumerate(budgets):
        ax_tp, ax_p99, ax_hit, ax_load = axes[:, col]
        for ref in refs:
            style = "-" if ref == refs[0] else "--"
            ax_tp.plot(ns, [e["reference"][ref]["requests_per_s"] for e in curve], style,
                       color=REFERENCE_COLOR, lw=2, label=ref)
            ax_p99.plot(ns, [e["reference"][ref]["p99_ms"] for e in curve], style,
                        color=REFERENCE_COLOR, lw=2, label=ref)
        ax_tp.plot(ns, [0.8 * e["reference"][refs[0]]["requests_per_s"] for e in curve], ":",
                   color=REFERENCE_COLOR, label=f"goal: 0.8 x {refs[0]}")
        ax_p99.plot(ns, [2 * e["reference"][refs[0]]["p99_ms"] for e in curve], ":",
                    color=REFERENCE_COLOR, label=f"goal: 2 x {refs[0]} p99")
        for name in configs:
            runs = [e["budgets"][col]["runs"][name] for e in curve]
            c = colors[name]
            ax_tp.plot(ns, [x["requests_per_s"] for x in runs], "o-", color=c, label=name)
            ax_p99.plot(ns, [x["p99_ms"] for x in runs], "o-", color=c, label=name)
            ax_hit.plot(ns, [x["hit_rate"] for x in runs], "o-", color=c,
                        label=f"{name}: per request")
            ax_hit.plot(ns, [x["hit_rate_per_execution"] for x in runs], "s:", color=c,
                        label=f"{name}: per execution")
            ax_load.plot(ns, [100 * x["load_busy"] for x in runs], "o-", color=c, label=name)
        ax_hit.plot(ns, [e["budgets"][col]["lru_simulated_hit_rate"] for e in curve], "x--",
                    color="#a0aec0", label="LRU, simulated sequential stream")
        ax_hit.plot(ns, [e["budgets"][col]["top_models_hit_rate"] for e in curve], "+--",
                    color="#68d391", label="most popular models resident")
        what = f"budget {100 * fraction:g} % of the weights"
        ax_tp.set_title(f"{what}: throughput", fontsize=10)
        ax_tp.set_ylabel("requests/s")
        ax_tp.set_ylim(bottom=0)
        ax_p99.set_title(f"{what}: p99 client latency", fontsize=10)
        ax_p99.set_ylabel("p99, ms")
        ax_p99.set_ylim(bottom=0)
        ax_hit.set_title(f"{what}: hit rate (1 - loads / requests or / executions)",
                         fontsize=10)
        ax_hit.set_ylabel("hit rate")
        ax_hit.set_ylim(0, 1)
        ax_load.set_title(f"{what}: time spent loading weights", fontsize=10)
        ax_load.set_ylabel("% of wall time")
        ax_load.set_ylim(bottom=0)
        for ax in (ax_tp, ax_p99, ax_hit, ax_load):
            ax.set_xscale("log")
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
            ax.minorticks_off()
            ax.set_xlabel(f"models (each {curve[0]['model_bytes'] / 2**20:.2f} MiB of weights)")
            ax.grid(alpha=0.3)
            if ax is not ax_hit:
                ax.legend(fontsize=7)
        # two lines per configuration: the legend goes below, out of their way
        ax_hit.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(f"pjserve: models per device, Zipf s={s['zipf_s']} traffic from "
                 f"{s['threads']} client threads, {s['curve_seconds']:g} s per run\n"
                 + subtitle(r), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    fig.savefig(dst, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv):
    curve = argv[:1] == ["--curve"]
    if curve:
        argv = argv[1:]
    if len(argv) != 2:
        sys.exit("usage: plot_residency.py [--curve] RESULTS.json OUT.png")
    src, dst = argv
    r = json.load(open(src))
    if curve:
        plot_curve(r, dst)
        return
    fig, ((a, b), (c, d)) = plt.subplots(2, 2, figsize=(13, 9.5))
    plot_load(r, a, b)
    plot_zipf(r, c, d)
    fig.suptitle("pjserve device weight cache; " + subtitle(r), fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
