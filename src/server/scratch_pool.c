/*
 * scratch_pool.c - the scratch pool: one arena, first fit (see scratch_pool.h).
 *
 * The budget is one anonymous mapping carved into blocks by first fit over
 * an address-ordered list, with free neighbours merged on release. Chosen
 * over size-classed free lists because:
 *   - the budget is the exact memory bound: no rounding to classes to
 *     account for, no cached blocks of the wrong class to evict;
 *   - requests of varying size (a data-dependent number of boxes) reuse the
 *     same memory instead of each filling a class of its own, and a
 *     released buffer is handed out again at the same address, its pages
 *     already committed;
 *   - blocks are few (a handful per meta in flight), so a linear first-fit
 *     walk costs less than the request it serves.
 * Fragmentation cannot wedge the pool: once everything is released the
 * arena is one free block again, so any request within the budget fits
 * eventually; waiters are served in arrival order (only the oldest tries),
 * so a large request is not starved by a stream of small ones.
 *
 * The block list lives outside the arena (nodes from malloc, recycled
 * through a spare list), so bundle code writing past its buffer cannot
 * corrupt the pool's books. One mutex guards everything; `room` is
 * broadcast on every release and whenever the oldest waiter leaves.
 */
#include "server/scratch_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/infer.h"
#include "core/log.h"

/* A run of the arena: [offset, offset + size), in use or free. */
typedef struct block {
    size_t offset, size;
    bool free;
    struct block *prev, *next;
} block;

/* An acquire waiting for room, on its caller's stack. */
typedef struct waiter {
    struct waiter *next;
} waiter;

struct pjs_scratch_pool {
    uint64_t budget;          /* as configured; 0: plain memory */
    unsigned char *base;      /* the arena (NULL without a pool) */
    size_t arena_size;        /* budget rounded down to PJS_SCRATCH_ALIGN */
    size_t map_size;          /* arena_size rounded up to pages */
    pthread_mutex_t lock;
    pthread_cond_t room;      /* CLOCK_MONOTONIC */
    block *blocks;            /* address order, covering the arena */
    block *spare;             /* unused nodes, linked through next */
    waiter *waiters_head, *waiters_tail;
    pjs_scratch_counters counters;
};

static size_t round_up(size_t n)
{
    return (n + (PJS_SCRATCH_ALIGN - 1)) & ~(size_t)(PJS_SCRATCH_ALIGN - 1);
}

/* ---- the block list ------------------------------------------------------------- */

static block *node_take(pjs_scratch_pool *p)
{
    block *b = p->spare;
    p->spare = b->next;
    return b;
}

static void node_put(pjs_scratch_pool *p, block *b)
{
    b->next = p->spare;
    p->spare = b;
}

/* Makes sure `n` spare nodes exist (one per block split), so carving never
 * fails half-way. */
static bool nodes_reserve(pjs_scratch_pool *p, size_t n)
{
    size_t have = 0;
    for (block *b = p->spare; b != NULL && have < n; b = b->next)
        have++;
    for (; have < n; have++) {
        block *b = malloc(sizeof *b);
        if (b == NULL)
            return false;
        node_put(p, b);
    }
    return true;
}

/* Merges free block b with its free successor, if any. */
static void merge_next(pjs_scratch_pool *p, block *b)
{
    block *n = b->next;
    if (n == NULL || !n->free)
        return;
    b->size += n->size;
    b->next = n->next;
    if (n->next != NULL)
        n->next->prev = b;
    node_put(p, n);
}

static void block_free(pjs_scratch_pool *p, block *b)
{
    b->free = true;
    p->counters.used_bytes -= b->size;
    merge_next(p, b);
    if (b->prev != NULL && b->prev->free)
        merge_next(p, b->prev);
}

/* The first free block of at least `size` bytes, split so its front is in
 * use; NULL when none is large enough. Needs one spare node. */
static block *block_alloc(pjs_scratch_pool *p, size_t size)
{
    block *b = p->blocks;
    while (b != NULL && !(b->free && b->size >= size))
        b = b->next;
    if (b == NULL)
        return NULL;
    if (b->size > size) {
        block *rest = node_take(p);
        *rest = (block){.offset = b->offset + size, .size = b->size - size, .free = true,
                        .prev = b, .next = b->next};
        if (b->next != NULL)
            b->next->prev = rest;
        b->next = rest;
        b->size = size;
    }
    b->free = false;
    p->counters.used_bytes += size;
    if (p->counters.used_bytes > p->counters.peak_bytes)
        p->counters.peak_bytes = p->counters.used_bytes;
    return b;
}

/* Carves all n buffers or none. */
static bool alloc_all(pjs_scratch_pool *p, const size_t *rounded, size_t n, void **out)
{
    block *taken[PJS_SCRATCH_MAX_BUFFERS];
    size_t i = 0;
    for (; i < n; i++) {
        taken[i] = block_alloc(p, rounded[i]);
        if (taken[i] == NULL)
            break;
    }
    if (i < n) {
        while (i-- > 0)
            block_free(p, taken[i]);
        return false;
    }
    for (i = 0; i < n; i++)
        out[i] = p->base + taken[i]->offset;
    return true;
}

/* ---- the pool ---------------------------------------------------------------------- */

int pjs_scratch_pool_create(uint64_t budget_bytes, pjs_scratch_pool **out, pjs_error *err)
{
    *out = NULL;
    if (budget_bytes > PJS_SCRATCH_MAX_BYTES)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--meta-scratch-bytes %llu: at most %llu (1Ti)",
                             (unsigned long long)budget_bytes,
                             (unsigned long long)PJS_SCRATCH_MAX_BYTES);
    if (budget_bytes != 0 && budget_bytes < PJS_SCRATCH_ALIGN)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "--meta-scratch-bytes %llu: a pool needs at least %d bytes (0: "
                             "no pool)",
                             (unsigned long long)budget_bytes, PJS_SCRATCH_ALIGN);
    pjs_scratch_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "scratch pool: out of memory");
    p->budget = budget_bytes;
    p->counters.budget_bytes = budget_bytes;
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&p->room, &monotonic);
    pthread_condattr_destroy(&monotonic);
    if (budget_bytes == 0) {
        *out = p;
        return 0;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    p->arena_size = (size_t)budget_bytes & ~(size_t)(PJS_SCRATCH_ALIGN - 1);
    p->map_size = (p->arena_size + page - 1) / page * page;
    void *base = mmap(NULL, p->map_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    p->blocks = malloc(sizeof *p->blocks);
    if (base == MAP_FAILED || p->blocks == NULL) {
        if (base != MAP_FAILED)
            munmap(base, p->map_size);
        pjs_scratch_pool_destroy(p);
        return pjs_error_set(err, PJS_ERR_NOMEM,
                             "--meta-scratch-bytes %llu: cannot reserve the pool's memory; "
                             "give a smaller size",
                             (unsigned long long)budget_bytes);
    }
    p->base = base;
    *p->blocks = (block){.offset = 0, .size = p->arena_size, .free = true};
    *out = p;
    return 0;
}

void pjs_scratch_pool_destroy(pjs_scratch_pool *p)
{
    if (p == NULL)
        return;
    while (p->blocks != NULL) {
        block *b = p->blocks;
        p->blocks = b->next;
        free(b);
    }
    while (p->spare != NULL)
        free(node_take(p));
    if (p->base != NULL)
        munmap(p->base, p->map_size);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Plain memory, for a pool without a budget. */
static int plain_acquire(pjs_scratch_pool *p, const size_t *sizes, size_t n, void **out,
                         pjs_error *err)
{
    void *got[PJS_SCRATCH_MAX_BUFFERS];
    size_t i = 0;
    for (; i < n; i++) {
        size_t size = sizes[i] == 0 ? PJS_SCRATCH_ALIGN : round_up(sizes[i]);
        got[i] = sizes[i] > SIZE_MAX - PJS_SCRATCH_ALIGN ? NULL
                                                          : aligned_alloc(PJS_SCRATCH_ALIGN, size);
        if (got[i] == NULL)
            break;
    }
    if (i < n) {
        size_t failed = sizes[i];
        while (i-- > 0)
            free(got[i]);
        return pjs_error_set(err, PJS_ERR_NOMEM,
                             "scratch: cannot allocate a buffer of %zu bytes (out of memory)",
                             failed);
    }
    memcpy(out, got, n * sizeof *out);
    pthread_mutex_lock(&p->lock);
    p->counters.acquisitions++;
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* The sizes rounded up into rounded[]; RESOURCE_EXHAUSTED when they do not
 * fit the whole arena. */
static int check_fits(pjs_scratch_pool *p, const size_t *sizes, size_t n, size_t *rounded,
                      pjs_error *err)
{
    size_t total = 0;
    bool fits = true;
    for (size_t i = 0; i < n; i++) {
        fits = fits && sizes[i] <= p->arena_size;
        rounded[i] = fits ? (sizes[i] == 0 ? PJS_SCRATCH_ALIGN : round_up(sizes[i])) : 0;
        fits = fits && rounded[i] <= p->arena_size - total;
        total += fits ? rounded[i] : 0;
    }
    if (fits)
        return 0;
    unsigned long long asked = 0;
    for (size_t i = 0; i < n; i++)
        asked += sizes[i];
    pthread_mutex_lock(&p->lock);
    p->counters.too_large++;
    pthread_mutex_unlock(&p->lock);
    return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                         "scratch: %zu buffers of %llu bytes in all do not fit the whole "
                         "scratch pool of %llu bytes; start the server with a larger "
                         "--meta-scratch-bytes",
                         n, asked, (unsigned long long)p->budget);
}

static void waiter_remove(pjs_scratch_pool *p, waiter *w)
{
    waiter **link = &p->waiters_head;
    waiter *prev = NULL;
    while (*link != w) {
        prev = *link;
        link = &(*link)->next;
    }
    *link = w->next;
    if (p->waiters_tail == w)
        p->waiters_tail = prev;
}

int pjs_scratch_pool_acquire(pjs_scratch_pool *p, const size_t *sizes, size_t n, void **out,
                             uint64_t deadline_ns, pjs_error *err)
{
    if (n == 0)
        return 0;
    if (n > PJS_SCRATCH_MAX_BUFFERS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "scratch: %zu buffers asked at once, at most %d", n,
                             PJS_SCRATCH_MAX_BUFFERS);
    if (p->base == NULL)
        return plain_acquire(p, sizes, n, out, err);
    size_t rounded[PJS_SCRATCH_MAX_BUFFERS];
    int rc = check_fits(p, sizes, n, rounded, err);
    if (rc != 0)
        return rc;

    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += rounded[i];
    uint64_t start = pjs_now_ns();
    waiter w = {NULL};
    bool waited = false;
    pthread_mutex_lock(&p->lock);
    if (p->waiters_tail != NULL)
        p->waiters_tail->next = &w;
    else
        p->waiters_head = &w;
    p->waiters_tail = &w;
    p->counters.waiting++;
    for (;;) {
        if (p->waiters_head == &w) {
            if (!nodes_reserve(p, n)) {
                rc = pjs_error_set(err, PJS_ERR_NOMEM, "scratch: out of memory");
                break;
            }
            if (alloc_all(p, rounded, n, out))
                break;
        }
        uint64_t now = pjs_now_ns();
        if (deadline_ns != 0 && now >= deadline_ns) {
            p->counters.timed_out++;
            rc = pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                               "scratch: the deadline passed after %.1f ms waiting for %zu "
                               "buffers of %zu bytes in all: the scratch pool's %llu bytes "
                               "were held by other requests (%llu in use); raise "
                               "--meta-scratch-bytes or the request's timeout",
                               (double)(now - start) / 1e6, n, total,
                               (unsigned long long)p->budget,
                               (unsigned long long)p->counters.used_bytes);
            break;
        }
        waited = true;
        if (deadline_ns == 0) {
            pthread_cond_wait(&p->room, &p->lock);
        } else {
            struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
                                  .tv_nsec = (long)(deadline_ns % 1000000000u)};
            pthread_cond_timedwait(&p->room, &p->lock, &ts);
        }
    }
    bool was_head = p->waiters_head == &w;
    waiter_remove(p, &w);
    p->counters.waiting--;
    if (rc == 0) {
        p->counters.acquisitions++;
        p->counters.waited += waited;
    }
    if (was_head && p->waiters_head != NULL)
        pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* The block in use that starts at ptr, or NULL. */
static block *block_at(pjs_scratch_pool *p, const void *ptr)
{
    const unsigned char *c = ptr;
    if (c < p->base || c >= p->base + p->arena_size)
        return NULL;
    size_t offset = (size_t)(c - p->base);
    for (block *b = p->blocks; b != NULL && b->offset <= offset; b = b->next)
        if (b->offset == offset)
            return b->free ? NULL : b;
    return NULL;
}

void pjs_scratch_pool_release(pjs_scratch_pool *p, void *const *bufs, size_t n)
{
    if (p->base == NULL) {
        for (size_t i = 0; i < n; i++)
            free(bufs[i]);
        return;
    }
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < n; i++) {
        if (bufs[i] == NULL)
            continue;
        block *b = block_at(p, bufs[i]);
        if (b != NULL)
            block_free(p, b);
        else
            pjs_error("scratch pool: release of %p, which is not a buffer in use from this "
                      "pool (ignored)",
                      bufs[i]);
    }
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->lock);
}

void pjs_scratch_pool_get_counters(pjs_scratch_pool *p, pjs_scratch_counters *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->counters;
    pthread_mutex_unlock(&p->lock);
}
