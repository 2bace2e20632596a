/*
 * placement.h - lpt_packing: which workers each model's requests go to.
 *
 * Longest processing time first: models in decreasing cost, each placed on
 * the k workers with the least cost so far, its cost split evenly among
 * them. A model's cost is the device time its traffic asks for (requests
 * per second times the mean time a request took, measured by the
 * gateway): with coalescing a busy model's requests share executions, and
 * the measured time per request already reflects that, so keeping a model
 * on few workers (a small k) keeps its batches large.
 *
 * Rebalancing has hysteresis: a new placement replaces the current one only
 * when it lowers the most loaded worker's cost by more than a tenth, so
 * caches are not thrown away for noise. Pure functions: unit-tested on
 * synthetic costs.
 */
#ifndef PJS_GATEWAY_PLACEMENT_H
#define PJS_GATEWAY_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

/* Fraction by which a new placement must lower the makespan to be taken. */
#define PJS_GW_PLACEMENT_HYSTERESIS 0.10

/* masks[m] = the workers (bit i: worker i) model m is placed on, k of them
 * (all n_workers when k >= n_workers). Ties go to the lower worker index,
 * so equal inputs give equal placements. n_workers <= 64. */
void pjs_gw_lpt_place(const double *cost, size_t n_models, size_t n_workers, unsigned k,
                      uint64_t *masks);

/* The most loaded worker's cost under `masks` (each model's cost split
 * evenly among its workers). */
double pjs_gw_makespan(const double *cost, const uint64_t *masks, size_t n_models,
                       size_t n_workers);

/* Whether `proposed` should replace `current` (hysteresis above). A
 * current placement that leaves a model with no worker is always replaced. */
int pjs_gw_placement_better(const double *cost, const uint64_t *current,
                            const uint64_t *proposed, size_t n_models, size_t n_workers);

#endif
