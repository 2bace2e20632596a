/*
 * dispatch.h - device execution: the queues, the device token, coalesced
 * execution and completion.
 *
 * Accepted requests wait in their model's queues (one per input-shape
 * variant, see policy.h). Whoever holds the device token executes: it asks
 * the scheduler for the next plan under the queue lock, releases the lock,
 * and runs the plan: the chosen requests' inputs are concatenated along the
 * batch axis and padded to a compiled batch size, executed once, and the
 * outputs sliced back per request. The submitting thread takes the token
 * itself when the device is free; otherwise a worker of the dispatcher
 * does when it frees up. Exactly one execution runs at a time; the lock is
 * never held while executing; on_done runs after the token was given back.
 *
 * Device tasks (a model's warm-up at load, residency changes) run under the
 * token too, between executions, so nothing else ever touches the device
 * concurrently.
 */
#ifndef PJS_SERVER_DISPATCH_H
#define PJS_SERVER_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/infer.h"
#include "core/status.h"
#include "registry/model.h"
#include "sched/policy.h"
#include "sched/weight_cache.h"

typedef struct pjs_dispatcher pjs_dispatcher;

/* workers >= 1; cfg checked by pjs_sched_config_check. The device weight
 * cache gets weight_budget bytes (PJS_WCACHE_UNLIMITED) and loads and
 * evicts on its own when autonomous (not in explicit control). With a
 * host_budget (not PJS_WCACHE_UNLIMITED) the host floors of `host` models
 * are a cache too: read from their files when uploaded, evicted under
 * that many bytes. */
int pjs_dispatcher_create(int workers, const pjs_sched_config *cfg,
                          uint64_t weight_budget, bool autonomous, uint64_t host_budget,
                          pjs_dispatcher **out, pjs_error *err);
/* Whether a host budget manages the host floors (models then create
 * theirs on demand: pjs_model_create's floor_on_demand). */
bool pjs_dispatcher_host_tier(const pjs_dispatcher *d);
/* Drains, then stops and joins every thread. */
void pjs_dispatcher_destroy(pjs_dispatcher *d);

/* Sets up a newly created model's queues (one per variant) and share,
 * before any request for it is submitted. */
int pjs_dispatcher_attach(pjs_dispatcher *d, pjs_model *m, double weight, size_t max_queue_depth,
                          pjs_error *err);

/* Runs the warm-up pass of an attached model under the device token: its
 * weights are acquired (a device-pinned model's are loaded for good), then
 * every (variant, batch size) executes `runs` times on zero inputs and the
 * fastest run's device time seeds the cost estimate. Without autonomous
 * residency a model that is not pinned is left alone. Blocks until done.
 * A model that is not pinned and whose executables another model warmed
 * up already (identical modules share them) takes their costs and runs
 * nothing; *reused (when not NULL) says so.
 * Fills costs_ns[variant * n_batch_sizes + k] when costs_ns is not NULL. */
int pjs_dispatcher_warm_up(pjs_dispatcher *d, pjs_model *m, int runs, uint64_t *costs_ns,
                           bool *reused, pjs_error *err);

/* Queues a validated request (r->model set, holding a reference; r->batch,
 * r->variant and r->deadline_ns set). Errors: UNAVAILABLE once draining,
 * RESOURCE_EXHAUSTED when the model's queue is full, DEADLINE_EXCEEDED when
 * the deadline already passed. On success r->on_done is called exactly once,
 * on a worker or on the calling thread, possibly before this returns (the
 * caller must not touch r after a successful submit, nor hold a lock its
 * on_done takes). A committed request is dispatched ahead of the
 * discipline and exempt from the queue depth and from predictive shedding. */
int pjs_dispatcher_submit(pjs_dispatcher *d, pjs_infer_request *r, bool committed,
                          pjs_error *err);

/* Makes r, submitted as an ordinary request and still queued, committed,
 * with `slot` as its committed caller's in-flight flag (cleared before its
 * on_done, as for a committed submit). False when r is no longer queued or
 * is committed already. r must not have completed (the caller knows). */
bool pjs_dispatcher_promote(pjs_dispatcher *d, pjs_infer_request *r, atomic_bool *slot);

/* Moves m to a residency floor under the device token (see
 * pjs_server_set_residency); blocks until done. */
int pjs_dispatcher_set_residency(pjs_dispatcher *d, pjs_model *m, pjs_residency target,
                                 pjs_error *err);
/* m left the repository: its device weights are freed once its queued
 * requests ran (now, when none is queued). */
void pjs_dispatcher_retire(pjs_dispatcher *d, pjs_model *m);
/* Frees every unpinned resident model's weights, then loads reload[0..n). */
int pjs_dispatcher_compact(pjs_dispatcher *d, pjs_model *const *reload, size_t n,
                           size_t *reloaded, pjs_error *err);
/* Residency readings for metrics and the control surface. */
void pjs_dispatcher_residency(pjs_dispatcher *d, pjs_model *m, pjs_residency *residency,
                              bool *resident, uint64_t *loads, uint64_t *evictions);
void pjs_dispatcher_cache_totals(pjs_dispatcher *d, uint64_t *budget, uint64_t *used,
                                 uint64_t *pinned, uint64_t *changes);
/* Whether m's host floor is in host memory, and the host tier's counts
 * of its floor read from the file and dropped (0 without a host tier). */
void pjs_dispatcher_host_residency(pjs_dispatcher *d, pjs_model *m, bool *in_host,
                                   uint64_t *loads, uint64_t *evictions);
/* The host tier's: budget (PJS_WCACHE_UNLIMITED without one), floors of
 * `host` models in memory, of `device` models (pinned), floors read and
 * dropped so far. */
void pjs_dispatcher_host_totals(pjs_dispatcher *d, uint64_t *budget, uint64_t *used,
                                uint64_t *pinned, uint64_t *changes);

/* Refuses new requests from now on and waits until every accepted one has
 * completed (its on_done returned). */
void pjs_dispatcher_drain(pjs_dispatcher *d);

/* Requests queued and in flight now; plans run so far by the thread that
 * submitted a request (the device was free) and by workers; weight copies
 * started beside executions (prefetches). */
void pjs_dispatcher_counters(pjs_dispatcher *d, uint64_t *queue_depth, uint64_t *in_flight,
                             uint64_t *plans_inline, uint64_t *plans_worker,
                             uint64_t *prefetches);
/* Executed requests by the tier their model was in (pjs_tier_stats). */
void pjs_dispatcher_tier_stats(pjs_dispatcher *d, pjs_tier_stats *out);

/* Bytes of CUDA shared memory that executions read in place (inputs) and
 * wrote device to device (outputs), so far. */
void pjs_dispatcher_shm_device_bytes(pjs_dispatcher *d, uint64_t *in, uint64_t *out);
/* A model's share and queues now. */
typedef struct pjs_sched_model_view {
    double weight;
    size_t max_queue_depth;
    uint64_t queue_depth;        /* requests queued, all variants */
    uint64_t in_flight;          /* queued or running, not yet finished */
    double recent_utilization;   /* share of device time recently, 0..1 */
} pjs_sched_model_view;
void pjs_dispatcher_model_view(pjs_dispatcher *d, pjs_model *m, pjs_sched_model_view *out);
/* Changes a model's weight and queue bound (values <= 0 / 0 keep them). */
void pjs_dispatcher_set_policy(pjs_dispatcher *d, pjs_model *m, double weight,
                               size_t max_queue_depth);

#endif
