/*
 * policy.c - the scheduler's decisions (see policy.h).
 */
#include "sched/policy.h"

#include <math.h>
#include <string.h>

const char *pjs_discipline_name(pjs_discipline d)
{
    switch (d) {
    case PJS_DISCIPLINE_FIFO: return "fifo";
    case PJS_DISCIPLINE_EDF: return "edf";
    default: return "fair";
    }
}

int pjs_discipline_parse(const char *s)
{
    if (strcmp(s, "fair") == 0)
        return PJS_DISCIPLINE_FAIR;
    if (strcmp(s, "fifo") == 0)
        return PJS_DISCIPLINE_FIFO;
    if (strcmp(s, "edf") == 0)
        return PJS_DISCIPLINE_EDF;
    return -1;
}

void pjs_sched_config_defaults(pjs_sched_config *c)
{
    *c = (pjs_sched_config){
        .discipline = PJS_DISCIPLINE_FAIR,
        .half_life_s = 1.0,
        .coalesce_discount = 0.5,
        .fair_clamp = 4.0,
        .cost_smoothing = 0.2,
        .edf_laxity_margin_us = 0,
        .max_queue_depth = 1024,
        .default_timeout_us = 0,
        .warmup_runs = 2,
    };
}

int pjs_sched_config_check(const pjs_sched_config *c, pjs_error *err)
{
    if (c->discipline != PJS_DISCIPLINE_FAIR && c->discipline != PJS_DISCIPLINE_FIFO &&
        c->discipline != PJS_DISCIPLINE_EDF)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.discipline: expected fair, fifo or edf");
    if (!(c->half_life_s > 0) || !isfinite(c->half_life_s))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.half_life_ms: must be a positive number of milliseconds");
    if (!(c->coalesce_discount >= 0 && c->coalesce_discount <= 1))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.coalesce_discount: must be between 0 and 1");
    if (!(c->fair_clamp >= 1) || !isfinite(c->fair_clamp))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.fair_clamp: must be a finite number >= 1");
    if (!(c->cost_smoothing > 0 && c->cost_smoothing <= 1))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.cost_smoothing: must be in (0, 1]");
    if (c->max_queue_depth < 1)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.max_queue_depth: must be at least 1");
    if (c->warmup_runs < 0 || c->warmup_runs > 100)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scheduler.warmup_runs: must be between 0 and 100");
    return 0;
}
