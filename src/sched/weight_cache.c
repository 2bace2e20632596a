/*
 * weight_cache.c - residency of model weights under a byte budget, evicting
 * by LRU or by use and load cost (see weight_cache.h).
 *
 * The LRU list holds resident unpinned entries, newest first, under either
 * policy: lfu scans it for the least valuable entry (a handful to a few hundred
 * models; a scan per eviction costs nothing next to the load it makes room
 * for) and compaction and shutdown walk it. Every change
 * is done in the same order: the device work (a callback) with no lock held,
 * then the books under `lock`; an eviction commits the books first and frees
 * afterwards, so a reader never counts bytes as free that are not, for longer
 * than the free takes, and the entry is out of the books before the callback
 * may release its owner.
 */
#include "sched/weight_cache.h"

#include <math.h>
#include <string.h>

const char *pjs_eviction_name(pjs_eviction p)
{
    return p == PJS_EVICTION_LRU ? "lru" : "lfu";
}

int pjs_eviction_parse(const char *s)
{
    if (strcmp(s, "lfu") == 0)
        return PJS_EVICTION_LFU;
    if (strcmp(s, "lru") == 0)
        return PJS_EVICTION_LRU;
    return -1;
}

void pjs_wcache_init(pjs_wcache *c, uint64_t budget, bool autonomous, pjs_eviction policy,
                     const pjs_wcache_ops *ops)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->budget = budget;
    c->autonomous = autonomous;
    c->policy = policy;
    c->ops = *ops;
}

void pjs_wcache_destroy(pjs_wcache *c)
{
    pthread_mutex_destroy(&c->lock);
}

static void unlink_lru(pjs_wcache *c, pjs_wcache_entry *e)
{
    if (e->newer != NULL)
        e->newer->older = e->older;
    else
        c->newest = e->older;
    if (e->older != NULL)
        e->older->newer = e->newer;
    else
        c->oldest = e->newer;
    e->newer = e->older = NULL;
}

static void push_newest(pjs_wcache *c, pjs_wcache_entry *e)
{
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest != NULL)
        c->newest->newer = e;
    else
        c->oldest = e;
    c->newest = e;
}

/* Takes resident e out of the books, then frees its device weights. */
static void evict(pjs_wcache *c, pjs_wcache_entry *e)
{
    pthread_mutex_lock(&c->lock);
    if (e->pinned) {
        c->pinned -= e->bytes;
    } else {
        unlink_lru(c, e);
        c->used -= e->bytes;
    }
    e->resident = false;
    e->evictions++;
    c->changes++;
    pthread_mutex_unlock(&c->lock);
    c->ops.evict(e, c->ops.ctx);
}

/* lfu: e's uses decayed to the cache's clock. */
static double decayed_uses(const pjs_wcache *c, const pjs_wcache_entry *e)
{
    return e->uses * exp2(-(c->clock - e->uses_at) / PJS_WCACHE_LFU_HALF_LIFE);
}

/* lfu: what keeping e saves: its uses times what a reload of it costs per
 * byte it holds. Before its first load is measured, a load is estimated at
 * 20 us plus the bytes at 10 GB/s. */
static double value(const pjs_wcache *c, const pjs_wcache_entry *e)
{
    double bytes = e->bytes > 0 ? (double)e->bytes : 1.0;
    double ns = e->load_ns > 0 ? e->load_ns : 20e3 + bytes / 10.0;
    return decayed_uses(c, e) * ns / bytes;
}

/* Loads e, then puts it in the books (pinned or newest). */
static int load(pjs_wcache *c, pjs_wcache_entry *e, pjs_error *err)
{
    int rc = c->ops.load(e, c->ops.ctx, err);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&c->lock);
    e->resident = true;
    e->loads++;
    c->changes++;
    if (e->pinned) {
        c->pinned += e->bytes;
    } else {
        push_newest(c, e);
        c->used += e->bytes;
    }
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* The resident unpinned entry the policy evicts first, among those not
 * held and other than `except`, without waiting requests if any; NULL when
 * none. */
static pjs_wcache_entry *victim(const pjs_wcache *c, const pjs_wcache_entry *except)
{
    for (int pass = c->ops.wanted != NULL ? 0 : 1; pass < 2; pass++) {
        pjs_wcache_entry *best = NULL;
        double best_value = 0;
        for (pjs_wcache_entry *e = c->oldest; e != NULL; e = e->newer) {
            if (e == except || atomic_load(&e->holds) != 0 ||
                (pass == 0 && c->ops.wanted(e, c->ops.ctx)))
                continue;
            if (c->policy == PJS_EVICTION_LRU)
                return e;
            double v = value(c, e);
            if (best == NULL || v < best_value) {
                best = e;
                best_value = v;
            }
        }
        if (best != NULL)
            return best;
    }
    return NULL;
}

static bool fits(const pjs_wcache *c, uint64_t bytes)
{
    return c->budget == PJS_WCACHE_UNLIMITED ||
           (bytes <= c->budget && c->used <= c->budget - bytes);
}

int pjs_wcache_acquire(pjs_wcache *c, pjs_wcache_entry *e, uint64_t uses, bool *over_budget,
                       pjs_error *err)
{
    *over_budget = false;
    if (e->in_flight)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "its weights are still being copied (a prefetch not committed)");
    c->clock += (double)uses;
    e->uses = decayed_uses(c, e) + (double)uses;
    e->uses_at = c->clock;
    if (e->resident) {
        if (!e->pinned && c->newest != e) {
            pthread_mutex_lock(&c->lock);
            unlink_lru(c, e);
            push_newest(c, e);
            pthread_mutex_unlock(&c->lock);
        }
        return 0;
    }
    if (!c->autonomous)
        return pjs_error_set(err, PJS_ERR_FAILED_PRECONDITION,
                             "its weights are not on the device (explicit model control: pin it "
                             "with SetModelResidency or POST /v2/pjserve/models/NAME/residency)");
    if (!e->pinned) {
        pjs_wcache_entry *v;
        while (!fits(c, e->bytes) && (v = victim(c, NULL)) != NULL)
            evict(c, v);
        *over_budget = !fits(c, e->bytes);
    }
    return load(c, e, err);
}

bool pjs_wcache_reserve(pjs_wcache *c, pjs_wcache_entry *e, const pjs_wcache_entry *keep)
{
    if (!c->autonomous || e->resident || e->pinned || e->in_flight ||
        c->budget == PJS_WCACHE_UNLIMITED || e->bytes > c->budget)
        return false;
    /* What could go: every resident unpinned entry but keep and held ones. */
    uint64_t evictable = 0;
    for (pjs_wcache_entry *x = c->oldest; x != NULL; x = x->newer)
        if (x != keep && atomic_load(&x->holds) == 0)
            evictable += x->bytes;
    if (c->used - evictable > c->budget - e->bytes)
        return false;
    pjs_wcache_entry *v;
    while (!fits(c, e->bytes) && (v = victim(c, keep)) != NULL)
        evict(c, v);
    pthread_mutex_lock(&c->lock);
    e->in_flight = true;
    c->used += e->bytes;
    pthread_mutex_unlock(&c->lock);
    return true;
}

void pjs_wcache_commit(pjs_wcache *c, pjs_wcache_entry *e, bool loaded)
{
    pthread_mutex_lock(&c->lock);
    e->in_flight = false;
    if (loaded) {
        e->resident = true;
        e->loads++;
        c->changes++;
        push_newest(c, e);
    } else {
        c->used -= e->bytes;
    }
    pthread_mutex_unlock(&c->lock);
}

int pjs_wcache_set_pinned(pjs_wcache *c, pjs_wcache_entry *e, bool pinned, pjs_error *err)
{
    if (e->pinned == pinned)
        return pinned && !e->resident ? load(c, e, err) : 0;
    pthread_mutex_lock(&c->lock);
    if (e->resident) {
        if (pinned) {
            unlink_lru(c, e);
            c->used -= e->bytes;
            c->pinned += e->bytes;
        } else {
            c->pinned -= e->bytes;
            c->used += e->bytes;
            push_newest(c, e);
        }
    }
    e->pinned = pinned;
    pthread_mutex_unlock(&c->lock);
    if (pinned && !e->resident)
        return load(c, e, err);
    if (!pinned && e->resident && !c->autonomous)
        evict(c, e);
    /* e joined the budget as its newest entry: older ones make room. */
    pjs_wcache_entry *v;
    while (!pinned && c->budget != PJS_WCACHE_UNLIMITED && c->used > c->budget &&
           (v = victim(c, e)) != NULL)
        evict(c, v);
    return 0;
}

void pjs_wcache_release(pjs_wcache *c, pjs_wcache_entry *e)
{
    if (e->resident)
        evict(c, e);
}

size_t pjs_wcache_compact(pjs_wcache *c, pjs_wcache_entry *const *reload, size_t n,
                          pjs_error *err)
{
    while (c->oldest != NULL)
        evict(c, c->oldest);
    size_t loaded = 0;
    int first_rc = 0;
    for (size_t i = 0; i < n; i++) {
        pjs_wcache_entry *e = reload[i];
        if (e->resident)
            continue;
        pjs_error load_err;
        if (!e->pinned && !fits(c, e->bytes))
            pjs_error_set(&load_err, PJS_ERR_RESOURCE_EXHAUSTED,
                          "entry %zu of the reload list does not fit the budget after the ones "
                          "before it; not reloaded",
                          i);
        else if (load(c, e, &load_err) == 0) {
            loaded++;
            continue;
        }
        if (first_rc == 0) {
            first_rc = load_err.code;
            *err = load_err;
        }
    }
    return loaded;
}

void pjs_wcache_totals(pjs_wcache *c, uint64_t *budget, uint64_t *used, uint64_t *pinned,
                       uint64_t *changes)
{
    pthread_mutex_lock(&c->lock);
    *budget = c->budget;
    *used = c->used;
    *pinned = c->pinned;
    if (changes != NULL)
        *changes = c->changes;
    pthread_mutex_unlock(&c->lock);
}

pjs_weight_budget pjs_weight_budget_solve(uint64_t arena, double fraction, double wiggle,
                                          uint64_t max_scratch, uint64_t pinned_bytes)
{
    pjs_weight_budget b = {0};
    double ceiling = (1.0 - wiggle) * (double)arena;
    double pool = fmin(fraction * (double)arena, ceiling - (double)max_scratch);
    if (pool < 0)
        pool = 0;
    b.scratch_ceiling = (uint64_t)ceiling;
    b.weight_pool = (uint64_t)pool;
    b.pinned_over_commit = pinned_bytes > b.weight_pool;
    b.on_demand_budget = b.pinned_over_commit ? 0 : b.weight_pool - pinned_bytes;
    return b;
}
