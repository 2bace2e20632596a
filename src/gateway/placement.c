/*
 * placement.c - longest processing time first packing of models onto
 * workers (see placement.h).
 */
#include "gateway/placement.h"

#include <stdlib.h>

typedef struct ranked {
    double cost;
    size_t model;
} ranked;

/* Decreasing cost; equal costs in model order, so results are stable. */
static int by_cost_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->model < y->model ? -1 : x->model > y->model;
}

void pjs_gw_lpt_place(const double *cost, size_t n_models, size_t n_workers, unsigned k,
                      uint64_t *masks)
{
    if (n_workers == 0 || n_workers > 64) {
        for (size_t m = 0; m < n_models; m++)
            masks[m] = 0;
        return;
    }
    if (k == 0)
        k = 1;
    if (k > n_workers)
        k = (unsigned)n_workers;
    ranked *order = malloc((n_models ? n_models : 1) * sizeof *order);
    double load[64] = {0};
    if (order == NULL) { /* no memory: every model everywhere (still correct) */
        uint64_t all = n_workers == 64 ? ~0ull : (1ull << n_workers) - 1;
        for (size_t m = 0; m < n_models; m++)
            masks[m] = all;
        return;
    }
    for (size_t m = 0; m < n_models; m++)
        order[m] = (ranked){.cost = cost[m] > 0 ? cost[m] : 0, .model = m};
    qsort(order, n_models, sizeof *order, by_cost_desc);
    for (size_t r = 0; r < n_models; r++) {
        uint64_t mask = 0;
        for (unsigned j = 0; j < k; j++) {
            size_t best = n_workers;
            for (size_t w = 0; w < n_workers; w++)
                if (!(mask & (1ull << w)) && (best == n_workers || load[w] < load[best]))
                    best = w;
            mask |= 1ull << best;
        }
        for (size_t w = 0; w < n_workers; w++)
            if (mask & (1ull << w))
                load[w] += order[r].cost / k;
        masks[order[r].model] = mask;
    }
    free(order);
}

double pjs_gw_makespan(const double *cost, const uint64_t *masks, size_t n_models,
                       size_t n_workers)
{
    double load[64] = {0}, worst = 0;
    for (size_t m = 0; m < n_models; m++) {
        int n = __builtin_popcountll(masks[m]);
        for (size_t w = 0; w < n_workers && w < 64 && n > 0; w++)
            if (masks[m] & (1ull << w))
                load[w] += (cost[m] > 0 ? cost[m] : 0) / n;
    }
    for (size_t w = 0; w < n_workers && w < 64; w++)
        if (load[w] > worst)
            worst = load[w];
    return worst;
}

int pjs_gw_placement_better(const double *cost, const uint64_t *current,
                            const uint64_t *proposed, size_t n_models, size_t n_workers)
{
    for (size_t m = 0; m < n_models; m++)
        if (current[m] == 0)
            return 1;
    double now = pjs_gw_makespan(cost, current, n_models, n_workers);
    double then = pjs_gw_makespan(cost, proposed, n_models, n_workers);
    return then < now * (1.0 - PJS_GW_PLACEMENT_HYSTERESIS);
}
