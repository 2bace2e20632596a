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
 * Everything but `stats` and the scheduler state is read-only after
 * creation. Statistics are updated by the dispatcher under stats_lock and
 * read by front ends through pjs_model_stats_snapshot.
 */
#ifndef PJS_REGISTRY_MODEL_H
#define PJS_REGISTRY_MODEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/infer.h"
#include "core/log.h"
#include "registry/bundle.h"
#include "registry/weight_store.h"
#include "sched/policy.h"
#include "sched/weight_cache.h"

/* Most compiled batch sizes a served model may have. */
#define PJS_MODEL_MAX_BATCH_SIZES 32

/* The one version of every model we serve (bundles have no versions). */
#define PJS_MODEL_VERSION "1"

/* Cumulative count and nanoseconds, as Triton's StatisticDuration. */
typedef struct pjs_duration_stat {
    uint64_t count;
    uint64_t ns;
} pjs_duration_stat;

/* Executions that served `batch_size` rows (the coalesced requests' rows,
 * before padding to a compiled size) and their phases, as Triton's
 * InferBatchStatistics. */
typedef struct pjs_batch_stat {
    int64_t batch_size;
    pjs_duration_stat compute_input;
    pjs_duration_stat compute_infer;
    pjs_duration_stat compute_output;
} pjs_batch_stat;

/* Queue waits are counted in buckets four to an octave of microseconds:
 * bucket 0 holds waits under 1 us, bucket i (i >= 1) waits in
 * [2^((i-1)/4), 2^(i/4)) us, the last bucket everything longer (~ 2^24 us). */
#define PJS_QUEUE_WAIT_BUCKETS 98

typedef struct pjs_model_stats {
    uint64_t last_inference_ms; /* wall clock of the last completed request, 0 never */
    uint64_t inference_count;   /* rows (batch elements) inferred successfully */
    uint64_t execution_count;   /* device executions (dispatches) */
    pjs_duration_stat success;  /* whole request, received to response ready */
    pjs_duration_stat fail;
    pjs_duration_stat queue;
    pjs_duration_stat compute_input;
    pjs_duration_stat compute_infer;
    pjs_duration_stat compute_output;
    uint64_t device_ns;         /* device time of every execution, upload to read-back */
    uint64_t expired;           /* requests dropped because their deadline passed */
    uint64_t shed;              /* requests dropped by edf as predicted to miss */
    uint64_t rejected_queue_full; /* requests refused: the model's queue was full */
    uint64_t queue_wait[PJS_QUEUE_WAIT_BUCKETS]; /* executed requests by queue wait */
    /* One entry per coalesced row count seen, ascending; owned. */
    size_t n_batch;
    pjs_batch_stat *batch;
} pjs_model_stats;

/* Executed requests by the tier their model's weights were in when each
 * was queued (core/residency.h), and their time from received
 * to executed: a sum and buckets of pjs_queue_wait_bucket. */
typedef struct pjs_tier_stats {
    uint64_t requests[PJS_N_TIERS];
    uint64_t ns[PJS_N_TIERS];
    uint64_t buckets[PJS_N_TIERS][PJS_QUEUE_WAIT_BUCKETS];
} pjs_tier_stats;

/* The bucket a queue wait of `ns` counts in, and the upper bound of bucket
 * i in microseconds (+inf for the last). */
size_t pjs_queue_wait_bucket(uint64_t ns);
double pjs_queue_wait_bucket_upper_us(size_t i);
/* The q-quantile (0 < q <= 1) of the queue waits counted, in microseconds,
 * as the upper bound of the bucket holding it; 0 when none was counted. */
double pjs_queue_wait_quantile_us(const uint64_t hist[PJS_QUEUE_WAIT_BUCKETS], double q);

typedef struct pjs_model {
    char name[256];
    pjs_bundle *bundle;           /* compiled: every module has an executable */
    /* Device copies of the weights, argument order; NULL entries while the
     * model is not resident. Loaded and freed by the device owner only,
     * through the device weight cache (sched/weight_cache.h). */
    pjrt_buffer **weights;
    /* The one device buffer that `weights` are views of, when the floor was
     * copied as one block (pjs_model_load_weights); NULL: each weight is a
     * buffer of its own. */
    pjrt_buffer *weight_block;
    /* Pipelined swap-in (the bundle's swap_in_stages): the floor copied as
     * one block per stage, the weights views of them. During a staged load
     * (staged_loading, pjs_model_start_staged_load) stage k's copy is in
     * stage_uploads[k] until staged_done > k; stage_blocks[k] then. */
    pjrt_buffer *stage_blocks[PJS_MANIFEST_MAX_STAGES];
    pjs_rt_block_upload stage_uploads[PJS_MANIFEST_MAX_STAGES];
    size_t staged_done;
    bool staged_loading;
    uint64_t staged_load_start; /* when its copies were issued */
    uint64_t staged_load_end;   /* when the last was seen on the device */
    /* The host floor: every weight in aligned host memory, argument order,
     * or NULL (residency unpinned: read from the mapped file when loaded). */
    void **host_weights;
    /* A private floor's memory, which host_weights point into: one block
     * from the runtime, page-locked for DMA where the plugin maps host
     * memory (pjs_rt_host_alloc). Zeroed for a shared floor or none. */
    pjs_rt_host_memory host_block;
    /* The node's shared weight store, or NULL (the floor is private memory).
     * With one, the floor is a read-only segment (host_segment) that
     * host_weights point into, or private memory when the store failed. */
    pjs_wstore *weight_store;
    pjs_wstore_segment *host_segment;
    pjs_residency residency;      /* the floor now (manifest's at load); the
                                     device owner changes it under the
                                     weight cache's lock */
    pjs_wcache_entry wentry;      /* the cache's books for this model */
    /* The host tier's books for its floor (server/dispatch.c, used when a
     * host weight budget is set): the floor is loaded from the file when
     * the model is next uploaded and evicted under the budget, by the
     * same policy as the device's. */
    pjs_wcache_entry hentry;
    atomic_uint_fast64_t host_load_ns; /* total time of the host tier's floor reads */
    atomic_uint_fast64_t load_ns; /* total time of weight loads */
    bool retired;                 /* left the repository (device owner) */
    pjs_rt_client *client;
    /* Rows a request may have: the largest compiled size, 0 when no input
     * is batched, or a load's configuration override (server/load_config.h:
     * a smaller compiled size). Set before the model is attached. */
    int64_t max_batch_size;
    /* Executions run at batch_sizes[0 .. n_served_sizes): every compiled
     * size, or those up to an override's max_batch_size. */
    size_t n_served_sizes;
    /* Its requests are coalesced: pjs_model_coalesces (sched/coalesce.h),
     * unless a load's override left dynamic_batching out. */
    bool coalesce;
    atomic_int refs;

    pthread_mutex_t stats_lock;
    pjs_model_stats stats;

    /* Deadline given to requests that carry none (0: none); set at load. */
    atomic_uint_fast64_t default_timeout_ns;

    /* The scheduler's state, set up by pjs_dispatcher_attach and guarded by
     * the dispatcher's lock: the model's share and one queue per variant. */
    pjs_sched_share share;
    uint64_t requests_in_flight; /* queued or running, not yet finished: the dispatcher's,
                                    under its lock */
    size_t n_queues;
    pjs_sched_queue *queues;

    /* A stateful model's live sequences and their state (manifest
     * `sequence:`; server/sequence.h), under sequences_lock; NULL for
     * other models. */
    struct pjs_sequence_table *sequences;
    pthread_mutex_t sequences_lock;
    uint64_t sequences_swept_ns; /* last idle sweep, under sequences_lock */

    /* Bounds on the lines this model's traffic can repeat at will (one a
     * second each, the rest counted; core/log.h). */
    pjs_log_limiter sequence_evictions_log; /* live sequences evicted for room */
    pjs_log_limiter sequence_idle_log;      /* idle sequences freed */
    pjs_log_limiter failed_requests_log;    /* requests whose run failed */
    pjs_log_limiter over_budget_log;        /* loaded over the device weight budget */
    pjs_log_limiter prefetch_log;           /* weight copies ahead of its turn failed */
} pjs_model;

/* Compiles every module of an opened bundle (taking ownership of it, also on
 * failure), materializes the host floor (unless the manifest says
 * `residency: unpinned`, or says `host` and floor_on_demand is set: a host
 * tier with a budget loads it when the model is next uploaded; in `store`
 * when not NULL) and returns a model with one reference and no weights on
 * the device.
 * Refuses models with more than PJS_INFER_MAX_TENSORS inputs or outputs or
 * more than PJS_MODEL_MAX_BATCH_SIZES batch sizes. */
int pjs_model_create(pjs_bundle *b, pjs_rt_client *c, pjs_exec_cache *cache, pjs_wstore *store,
                     bool floor_on_demand, pjs_model **out, pjs_error *err);
pjs_model *pjs_model_ref(pjs_model *m);

static inline pjs_model *pjs_model_of_wentry(pjs_wcache_entry *e)
{
    return (pjs_model *)((char *)e - offsetof(pjs_model, wentry));
}

static inline pjs_model *pjs_model_of_hentry(pjs_wcache_entry *e)
{
    return (pjs_model *)((char *)e - offsetof(pjs_model, hentry));
}

/* Copies the weights to the device (from the host floor, or the file); a
 * shared floor is checked first (pjs_wstore_segment_verify). */
int pjs_model_load_weights(pjs_model *m, pjs_error *err);
/* Pipelined swap-in: starts copying the weights as one block per swap-in
 * stage (floor order puts each stage's first-used weights together) and
 * returns without waiting; pjs_model_await_stage then waits for a stage's
 * block before the stage runs, so the device executes stage k while later
 * blocks travel. The floor must stay (held) until
 * pjs_model_finish_staged_load. UNSUPPORTED, nothing started, where the
 * bundle has no stages, there is no private floor, or floors are not
 * copied as blocks (pjs_rt_uploads_blocks): use pjs_model_load_weights. */
int pjs_model_start_staged_load(pjs_model *m, pjs_error *err);
/* Waits until swap-in stage k's weights (and the earlier stages') are on
 * the device and usable; at once outside a staged load. */
int pjs_model_await_stage(pjs_model *m, size_t k, pjs_error *err);
/* Waits for every stage's weights and ends the staged load: afterwards the
 * model's weights are resident as pjs_model_load_weights leaves them. On
 * error every device copy is freed (the model is not resident). */
int pjs_model_finish_staged_load(pjs_model *m, pjs_error *err);
/* Frees the device copies (a staged load in flight is waited for first). */
void pjs_model_free_weights(pjs_model *m);
/* Bytes the host floor takes in host memory. */
uint64_t pjs_model_floor_bytes(const pjs_model *m);
/* Materializes (present) or frees the host floor. */
int pjs_model_set_host_floor(pjs_model *m, bool present, pjs_error *err);
void pjs_model_unref(pjs_model *m);

static inline const pjs_manifest *pjs_model_manifest(const pjs_model *m)
{
    return &m->bundle->manifest;
}

/* A consistent copy of the statistics; release it with
 * pjs_model_stats_release. On allocation failure the copy has no batch
 * entries. */
void pjs_model_stats_snapshot(pjs_model *m, pjs_model_stats *out);
void pjs_model_stats_release(pjs_model_stats *s);
/* The entry of s->batch for `rows`, added in order when new; NULL when out
 * of memory (stats_lock held). */
pjs_batch_stat *pjs_model_stats_batch_entry(pjs_model_stats *s, int64_t rows);

#endif
