/*
 * work_pool.h - a fixed set of threads running jobs from a bounded queue.
 *
 * For work that blocks for a while (compiling a model, waiting for the
 * device owner) and must not run on a front end's threads, nor get a
 * thread of its own per request. Submitting never blocks: when `max_queued`
 * jobs are already waiting, it fails at once with RESOURCE_EXHAUSTED and the
 * caller answers the request with that. Jobs run in submission order.
 *
 * Any thread may submit. pjs_work_pool_stop refuses further jobs, waits for
 * the running ones, runs every job still queued with `cancelled` true (so
 * its owner can answer the request it carries) and joins the threads;
 * destroy frees the pool (stopping it first if needed).
 */
#ifndef PJS_CORE_WORK_POOL_H
#define PJS_CORE_WORK_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

typedef struct pjs_work_pool pjs_work_pool;

/* A job: fn(arg, cancelled) runs exactly once once submitted. */
typedef void (*pjs_work_fn)(void *arg, bool cancelled);

/* `name` labels the threads in logs and messages ("model loads"). */
int pjs_work_pool_create(const char *name, size_t threads, size_t max_queued,
                         pjs_work_pool **out, pjs_error *err);
/* Queues fn(arg). RESOURCE_EXHAUSTED when max_queued jobs are waiting,
 * UNAVAILABLE once stopping; fn is not called then. */
int pjs_work_pool_submit(pjs_work_pool *p, pjs_work_fn fn, void *arg, pjs_error *err);
void pjs_work_pool_stop(pjs_work_pool *p);
void pjs_work_pool_destroy(pjs_work_pool *p);

#endif
