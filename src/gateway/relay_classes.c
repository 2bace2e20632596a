/*
 * relay_classes.c - the gateway's route classes (relay_policy.h): which
 * workers a call goes to, whether it is tried elsewhere, how several
 * answers combine. Each is a few callbacks over the pool; a new class is a
 * file like this one and the operation rows that name it.
 */
#include "gateway/relay_policy.h"

/* A call that provably did not run on its worker goes to another: it
 * never reached it, the worker is going, or it does not have the model
 * (not loaded there yet, or any more). */
static bool retry_if_not_run(const pjs_gw_result *r)
{
    return pjs_gw_relay_outcome(r) == PJS_GW_NOT_SENT ||
           (r->delivery == PJS_GW_DELIVERED && r->mark == PJS_GW_MARK_NOT_RUN);
}

/* A call that went to several workers is answered as they answered. */
static bool never(const pjs_gw_result *r)
{
    (void)r;
    return false;
}

const pjs_gw_class pjs_gw_class_local = {.name = "local", .retry = never};

static int pick_holder(pjs_gw_pool *pool, const pjs_gw_route *route, uint64_t tried,
                       pjs_error *err)
{
    return pjs_gw_pool_pick(pool, route->model, route->sequence[0] ? route->sequence : NULL,
                            tried, err);
}

const pjs_gw_class pjs_gw_class_model = {
    .name = "model",
    .pick = pick_holder,
    .retry = retry_if_not_run,
};

static int pick_any(pjs_gw_pool *pool, const pjs_gw_route *route, uint64_t tried, pjs_error *err)
{
    (void)route;
    return pjs_gw_pool_pick_any(pool, tried, err);
}

const pjs_gw_class pjs_gw_class_any = {
    .name = "any",
    .pick = pick_any,
    .retry = retry_if_not_run,
};

/* Changes reach every worker not known to be down, whatever its breaker
 * says, so none is left behind; the pool remembers those a restarted
 * worker must get again. */
const pjs_gw_class pjs_gw_class_fan_out = {
    .name = "fan-out",
    .targets = pjs_gw_pool_take_not_down,
    .retry = never,
    .combine = pjs_gw_relay_first_error,
};

/* Reads go to the workers that are available, each taken like a pick. */
static uint64_t every_available(pjs_gw_pool *pool, const pjs_gw_change *change,
                                uint64_t *change_seq, pjs_error *err)
{
    (void)change;
    *change_seq = 0;
    uint64_t mask = 0;
    int w;
    while ((w = pjs_gw_pool_pick_any(pool, mask, err)) >= 0)
        mask |= 1ull << w;
    return mask;
}

/* The answers that succeeded, merged: a worker that failed has nothing to
 * add (a model it does not hold has no statistics there). */
static void merge_successes(const pjs_gw_result *results, size_t n, pjs_gw_verdict *out)
{
    pjs_gw_relay_first_error(results, n, out);
    if (!out->accepted)
        return;
    out->kind = PJS_GW_VERDICT_MERGE;
    out->merged = 0;
    for (size_t i = 0; i < n; i++)
        if (results[i].delivery == PJS_GW_DELIVERED && results[i].ok)
            out->merged |= 1ull << i;
}

const pjs_gw_class pjs_gw_class_merge = {
    .name = "merge",
    .targets = every_available,
    .retry = never,
    .combine = merge_successes,
};
