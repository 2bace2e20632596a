/*
 * scratch_pool.h - reuse buffers for meta models' large intermediates.
 *
 * A meta model's glue often builds a large tensor per request (pooled
 * features for a second stage) and hands it to a sub-call by reference.
 * The pool keeps that memory off the per-request allocation path: a fixed
 * budget of bytes (--meta-scratch-bytes), taken and given back whole.
 *
 * A request takes every buffer it needs in one acquire, all or none, so two
 * metas each holding half of what they need can never wait on each other.
 * When the pool lacks room, acquire waits (in arrival order) until releases
 * make room or the request's deadline passes. A request larger than the
 * whole pool is refused at once. Every buffer is 64-byte aligned and its
 * contents are unspecified (whatever the last user left).
 *
 * A budget of 0 makes a pool without memory of its own: acquire allocates
 * plain heap memory and release frees it, so callers use one code path
 * whether or not a pool was configured.
 *
 * Any thread may acquire and release. Destroy only once every buffer has
 * been released and no acquire is waiting.
 */
#ifndef PJS_SERVER_SCRATCH_POOL_H
#define PJS_SERVER_SCRATCH_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct pjs_scratch_pool pjs_scratch_pool;

/* Alignment of every buffer. */
#define PJS_SCRATCH_ALIGN 64
/* Most buffers one acquire may ask for. */
#define PJS_SCRATCH_MAX_BUFFERS 64
/* Largest budget (1 TiB): the pool reserves address space for all of it. */
#define PJS_SCRATCH_MAX_BYTES (1ULL << 40)

typedef struct pjs_scratch_counters {
    uint64_t budget_bytes;   /* 0: no pool, plain memory */
    uint64_t used_bytes;     /* pool bytes held by requests now (sizes rounded
                                up to 64); 0 without a pool */
    uint64_t peak_bytes;     /* most pool bytes ever held at once */
    uint64_t waiting;        /* acquires waiting for room now */
    uint64_t acquisitions;   /* acquires that succeeded */
    uint64_t waited;         /* ... of which had to wait for room */
    uint64_t timed_out;      /* acquires whose deadline passed while waiting */
    uint64_t too_large;      /* acquires refused for asking more than the pool */
} pjs_scratch_counters;

/* A pool of budget_bytes (0 .. PJS_SCRATCH_MAX_BYTES; 0: plain memory).
 * The pool's address space is reserved at once; pages are committed as
 * buffers are first written and then kept for reuse. */
int pjs_scratch_pool_create(uint64_t budget_bytes, pjs_scratch_pool **out, pjs_error *err);
/* Frees the pool and its memory; NULL is a no-op. */
void pjs_scratch_pool_destroy(pjs_scratch_pool *p);

/* Takes n buffers (1..PJS_SCRATCH_MAX_BUFFERS; n = 0 takes nothing) of
 * sizes[i] bytes into out[i], all or none. Waits while the pool lacks room,
 * at most until deadline_ns (pjs_now_ns() time; 0: no bound). Fails with:
 * RESOURCE_EXHAUSTED when the buffers together (each rounded up to 64
 * bytes) exceed the whole pool, DEADLINE_EXCEEDED when the deadline passed
 * first, INVALID_ARGUMENT when n is too large, NOMEM; out is untouched
 * then. A buffer of size 0 is a valid, distinct pointer. */
int pjs_scratch_pool_acquire(pjs_scratch_pool *p, const size_t *sizes, size_t n, void **out,
                             uint64_t deadline_ns, pjs_error *err);
/* Gives back n buffers from acquires on p (any subset, in any order; NULL
 * entries are skipped) and wakes the waiters. */
void pjs_scratch_pool_release(pjs_scratch_pool *p, void *const *bufs, size_t n);

void pjs_scratch_pool_get_counters(pjs_scratch_pool *p, pjs_scratch_counters *out);

#endif
