"""catalogue_trace - the multi-model request trace of bench/catalogue.py.

A Zipf popularity over the models and bursty on/off arrivals per model, as
bench/catalogue.py's docstring (Trace) describes; pure numpy, so that
scripts/gpu-catalogue can carry this file to a GPU machine and replay the
same kind of trace there.
"""

from collections import OrderedDict

import numpy as np


def zipf_weights(n, s):
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def make_trace(n, rate, seconds, seed, zipf_s=1.1, on_median_s=1.0, on_sigma=1.0,
               off_alpha=1.5, duty_rate=1.0, duty_min=0.05, duty_max=0.9, burn_in_s=60.0):
    """(times in seconds, model indices), sorted by time, over [0, seconds):
    the generator of the module's docstring (Trace), numpy's default_rng(seed)."""
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(n)                  # ranks[r] = the model of rank r + 1
    lam = rate * zipf_weights(n, zipf_s)        # mean requests/s of rank r + 1
    duty = np.clip(lam / (lam + duty_rate), duty_min, duty_max)
    on_mean = on_median_s * np.exp(on_sigma ** 2 / 2)
    times, models = [], []
    for r in range(n):
        d = duty[r]
        off_mean = on_mean * (1 - d) / d
        off_scale = off_mean * (off_alpha - 1) / off_alpha   # Pareto x_m
        burst = lam[r] / d                                   # requests/s while on
        t = -burn_in_s
        on = rng.random() < d
        while t < seconds:
            if on:
                length = rng.lognormal(np.log(on_median_s), on_sigma)
                k = rng.poisson(burst * length)
                if k:
                    ts = t + length * rng.random(k)
                    ts = ts[(ts >= 0) & (ts < seconds)]
                    if ts.size:
                        times.append(ts)
                        models.append(np.full(ts.size, ranks[r], np.int32))
            else:
                length = off_scale * (1 + rng.pareto(off_alpha))
            t += length
            on = not on
    t = np.concatenate(times) if times else np.zeros(0)
    m = np.concatenate(models) if models else np.zeros(0, np.int32)
    order = np.argsort(t, kind="stable")
    return t[order], m[order]


def trace_stats(t, m, n, seconds, capacity):
    """What the trace is like: requests, rate per second (mean, max), models
    requested, the share of requests to the top 1 %/10 % of models by count,
    the coefficient of variation of the inter-arrival times per model (over
    models with at least 10 requests; Poisson would be 1), and the hit rates
    an LRU cache of `capacity` models would have on the sequence (the first
    request of each model a miss)."""
    counts = np.bincount(m, minlength=n)
    per_s = np.bincount(np.minimum(t.astype(np.int64), int(seconds) - 1),
                        minlength=int(seconds))
    top = np.sort(counts)[::-1]
    cvs = []
    for i in np.flatnonzero(counts >= 10):
        iat = np.diff(t[m == i])
        if iat.mean() > 0:
            cvs.append(iat.std() / iat.mean())
    out = {"requests": int(len(t)), "rate_mean": len(t) / seconds,
           "rate_max_1s": int(per_s.max()), "rate_min_1s": int(per_s.min()),
           "models_requested": int((counts > 0).sum()),
           "share_top_1pct": float(top[:max(1, n // 100)].sum() / max(1, len(t))),
           "share_top_10pct": float(top[:max(1, n // 10)].sum() / max(1, len(t))),
           "models_with_10_requests": len(cvs),
           "iat_cv_median": float(np.median(cvs)) if cvs else None,
           "iat_cv_p90": float(np.percentile(cvs, 90)) if cvs else None}
    for name, cap in capacity.items():
        out[f"lru_hit_rate_{name}"] = simulate_lru(m, cap)
    return out


def simulate_lru(m, capacity):
    lru, hits = OrderedDict(), 0
    for x in m.tolist():
        if x in lru:
            hits += 1
            lru.move_to_end(x)
        else:
            lru[x] = None
            if len(lru) > capacity:
                lru.popitem(last=False)
    return hits / max(1, len(m))
