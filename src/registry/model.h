/*
 * model.h - a served model: a compiled bundle, its device weights, its
 * statistics.
 *
 * A pjs_model is created by the repository when a bundle loads and is
 * reference counted: the repository holds one reference while the model is
 * listed, every request holds one from lookup to completion. The last
 * reference frees the executables and device weights, so unloading a model
 * never pulls buffers from under an execution.
 *
 * Everything but `stats` is read-only after creation. Statistics are
 * updated by the dispatcher under stats_lock and read by front ends through
 * pjs_model_stats_snapshot.
 */
#ifndef PJS_REGISTRY_MODEL_H
#define PJS_REGISTRY_MODEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/infer.h"
#include "registry/bundle.h"

/* Most compiled batch sizes a served model may have. */
#define PJS_MODEL_MAX_BATCH_SIZES 32

/* The one version of every model we serve (bundles have no versions). */
#define PJS_MODEL_VERSION "1"

/* Cumulative count and nanoseconds, as Triton's StatisticDuration. */
typedef struct pjs_duration_stat {
    uint64_t count;
    uint64_t ns;
} pjs_duration_stat;

/* Per compiled batch size: executions and their phases. */
typedef struct pjs_batch_stat {
    int64_t batch_size;
    pjs_duration_stat compute_input;
    pjs_duration_stat compute_infer;
    pjs_duration_stat compute_output;
} pjs_batch_stat;

typedef struct pjs_model_stats {
    uint64_t last_inference_ms; /* wall clock of the last completed request, 0 never */
    uint64_t inference_count;   /* rows (batch elements) inferred successfully */
    uint64_t execution_count;   /* device executions */
    pjs_duration_stat success;  /* whole request, received to response ready */
    pjs_duration_stat fail;
    pjs_duration_stat queue;
    pjs_duration_stat compute_input;
    pjs_duration_stat compute_infer;
    pjs_duration_stat compute_output;
    size_t n_batch;
    pjs_batch_stat batch[PJS_MODEL_MAX_BATCH_SIZES]; /* one per compiled batch size */
} pjs_model_stats;

typedef struct pjs_model {
    char name[256];
    pjs_bundle *bundle;           /* compiled: every module has an executable */
    pjrt_buffer **weights;        /* device copies, argument order */
    pjs_rt_client *client;
    int64_t max_batch_size;       /* largest compiled size; 0 when no input is batched */
    atomic_int refs;

    pthread_mutex_t stats_lock;
    pjs_model_stats stats;
} pjs_model;

/* Compiles every module of an opened bundle (taking ownership of it, also on
 * failure), uploads the weights and returns a model with one reference.
 * Refuses models with more than PJS_INFER_MAX_TENSORS inputs or outputs or
 * more than PJS_MODEL_MAX_BATCH_SIZES batch sizes. */
int pjs_model_create(pjs_bundle *b, pjs_rt_client *c, pjs_exec_cache *cache, pjs_model **out,
                     pjs_error *err);
pjs_model *pjs_model_ref(pjs_model *m);
void pjs_model_unref(pjs_model *m);

static inline const pjs_manifest *pjs_model_manifest(const pjs_model *m)
{
    return &m->bundle->manifest;
}

/* A consistent copy of the statistics. */
void pjs_model_stats_snapshot(pjs_model *m, pjs_model_stats *out);

#endif
