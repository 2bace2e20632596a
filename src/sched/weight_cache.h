/*
 * weight_cache.h - which models' weights are on the device, under a byte
 * budget.
 *
 * Every model's weights live in host RAM (its host floor) and move to the
 * device when it runs. The cache keeps them there while there is room:
 * acquiring a model that is not resident evicts resident models until it
 * fits the budget, then loads it. Which ones go is the eviction policy's
 * choice:
 *
 *   lru   the least recently used first;
 *   lfu   the least valuable first, valuing an entry at how often it is
 *         used times what reloading it would cost per byte it holds:
 *         uses * load time / bytes. Uses count the requests each acquire
 *         serves and decay with a half-life of PJS_WCACHE_LFU_HALF_LIFE
 *         requests to the whole cache, so a model that stopped being asked
 *         for loses its place within a few half-lives. Ties go to the least
 *         recently used. (On synthetic Zipf traffic it keeps close to the
 *         most popular models resident, and a scan through every model does
 *         not flush them as it flushes LRU: tests/unit/test_weight_cache.c.)
 *
 * Device-pinned
 * models are loaded once and never evicted; their bytes are counted apart
 * and do not use the budget. A held entry (pjs_wcache_entry.holds) is
 * skipped when making room, so a model loads over the budget rather than
 * evict one a running meta still calls. A model larger than the whole budget loads
 * after everything else was evicted (the caller logs a warning). When the
 * cache is not autonomous (explicit control mode), acquiring a model that
 * is not resident fails instead: a control plane decides residency.
 *
 * Prefetch: the device owner may reserve room for an entry ahead of its
 * run (pjs_wcache_reserve: victims evicted now, the entry's bytes counted
 * as in flight, so the budget holds the transfer too), have its weights
 * copied by another thread while executions go on, and commit the entry
 * (pjs_wcache_commit) once the copy is done or failed. An entry in flight is
 * neither resident nor evictable; nothing executes with its weights before
 * the commit.
 *
 * The cache does bookkeeping only; loading and freeing device buffers are
 * callbacks, so the policy is unit-tested without a device. Only one thread
 * (the device owner) mutates residency, and it calls the callbacks with no
 * lock held; `lock` guards the bookkeeping against readers (metrics), taken
 * briefly to commit each change.
 */
#ifndef PJS_SCHED_WEIGHT_CACHE_H
#define PJS_SCHED_WEIGHT_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#define PJS_WCACHE_UNLIMITED UINT64_MAX

typedef enum pjs_eviction {
    PJS_EVICTION_LFU = 0,
    PJS_EVICTION_LRU = 1,
} pjs_eviction;

/* lfu: requests to the whole cache over which an entry's use count halves. */
#define PJS_WCACHE_LFU_HALF_LIFE 4096.0

const char *pjs_eviction_name(pjs_eviction p); /* "lfu", "lru" */
/* Parses "lfu" / "lru"; -1 for anything else. */
int pjs_eviction_parse(const char *s);

typedef struct pjs_wcache_entry {
    uint64_t bytes;
    bool pinned;     /* device-pinned: outside the budget, never evicted */
    bool resident;
    bool in_flight;  /* reserved for a prefetch, not committed yet */
    /* > 0: not evicted to make room for others (a meta whose run calls the
     * model is running); any thread changes it, atomically. */
    atomic_int holds;
    uint64_t loads;
    uint64_t evictions;
    double uses;     /* requests served, decayed as of uses_at */
    double uses_at;  /* the cache's clock when uses was last updated */
    double load_ns;  /* a load's measured time (set by the load callback);
                        0: estimated from bytes */
    struct pjs_wcache_entry *newer, *older; /* LRU list of resident unpinned entries */
} pjs_wcache_entry;

typedef struct pjs_wcache_ops {
    /* Copies e's weights to the device. */
    int (*load)(pjs_wcache_entry *e, void *ctx, pjs_error *err);
    /* Frees e's device weights; e is no longer in the cache's books. */
    void (*evict)(pjs_wcache_entry *e, void *ctx);
    /* Optional: whether requests for e are waiting. Victims are chosen
     * among entries without waiting requests first, by the policy, and
     * only then among the others: evicting a model that is about to run
     * costs a load for nothing. */
    bool (*wanted)(const pjs_wcache_entry *e, void *ctx);
    void *ctx;
} pjs_wcache_ops;

typedef struct pjs_wcache {
    pthread_mutex_t lock;
    uint64_t budget;          /* for unpinned entries; PJS_WCACHE_UNLIMITED */
    uint64_t used;            /* resident unpinned bytes, and those in flight */
    uint64_t pinned;          /* resident pinned bytes */
    uint64_t changes;         /* loads + evictions so far (readers compare it
                                 before and after reading several entries) */
    bool autonomous;          /* false: never load or evict on its own */
    pjs_eviction policy;
    double clock;             /* requests served through acquire so far */
    pjs_wcache_entry *newest, *oldest;
    pjs_wcache_ops ops;
} pjs_wcache;

void pjs_wcache_init(pjs_wcache *c, uint64_t budget, bool autonomous, pjs_eviction policy,
                     const pjs_wcache_ops *ops);
void pjs_wcache_destroy(pjs_wcache *c);

/* Makes e resident before it runs `uses` requests: a resident entry becomes
 * the most recently used; otherwise (autonomous) entries are evicted by the
 * policy until e fits and e is loaded. *over_budget is set when e alone
 * exceeds the budget. FAILED_PRECONDITION when not autonomous and e is not
 * resident; a load error otherwise. */
int pjs_wcache_acquire(pjs_wcache *c, pjs_wcache_entry *e, uint64_t uses, bool *over_budget,
                       pjs_error *err);

/* Prefetch, autonomous caches only: makes room for e under the budget by
 * the policy, never evicting `keep` (the model about to run) or a held
 * entry, and counts e's bytes as in flight. False, with nothing changed,
 * when e is resident, pinned, in flight, larger than the budget, or would
 * not fit without evicting `keep` or held entries. */
bool pjs_wcache_reserve(pjs_wcache *c, pjs_wcache_entry *e, const pjs_wcache_entry *keep);

/* Ends e's prefetch: loaded, it becomes resident (the most recently used);
 * otherwise its bytes are given back. */
void pjs_wcache_commit(pjs_wcache *c, pjs_wcache_entry *e, bool loaded);

/* Pins e on the device (loading it if needed, outside the budget) or unpins
 * it: it becomes the most recently used evictable entry (older entries are
 * evicted until the budget holds), or, when the cache is not autonomous, is
 * evicted at once. */
int pjs_wcache_set_pinned(pjs_wcache *c, pjs_wcache_entry *e, bool pinned, pjs_error *err);

/* Evicts e if resident, pinned or not (the model is going away). */
void pjs_wcache_release(pjs_wcache *c, pjs_wcache_entry *e);

/* Evicts every resident unpinned entry at once, then loads reload[0..n)
 * in order while they fit the budget (pinned ones are left as they are).
 * Returns how many were loaded; the first error (a load failure, or
 * RESOURCE_EXHAUSTED for an entry that no longer fits), if any, is in err. */
size_t pjs_wcache_compact(pjs_wcache *c, pjs_wcache_entry *const *reload, size_t n,
                          pjs_error *err);

/* A consistent reading of the totals; *changes (when not NULL) counts every
 * load and eviction so far, so a reader of several entries' residency can
 * tell whether the set changed while it read. */
void pjs_wcache_totals(pjs_wcache *c, uint64_t *budget, uint64_t *used, uint64_t *pinned,
                       uint64_t *changes);

/* The budget for on-demand weights from the device's memory (seed: the
 * arena holds pinned weights + on-demand weights + one execution's scratch
 * + a wiggle share of slack):
 *   scratch_ceiling  = (1 - wiggle) * arena
 *   weight_pool      = min(fraction * arena, scratch_ceiling - max_scratch)
 *   on_demand_budget = clamp(weight_pool - pinned_bytes, 0, weight_pool)
 * pinned_over_commit is set when the pinned weights alone exceed the pool. */
typedef struct pjs_weight_budget {
    uint64_t scratch_ceiling;
    uint64_t weight_pool;
    uint64_t on_demand_budget;
    bool pinned_over_commit;
} pjs_weight_budget;

pjs_weight_budget pjs_weight_budget_solve(uint64_t arena, double fraction, double wiggle,
                                          uint64_t max_scratch, uint64_t pinned_bytes);

#endif
