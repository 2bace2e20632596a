/*
 * test_weight_cache.c - unit tests of the device weight cache's books
 * (src/sched/weight_cache.c) with a fake device.
 *
 * The fake device is the pair of callbacks: load marks an entry's weights as
 * on the device, evict takes them off, and both append to a log ("L2 E0 L3")
 * that the tests compare with what LRU order demands. The callbacks also
 * check the cache's contract from the device's side: they run with the
 * cache's lock free, load is never asked for weights already on the device
 * nor evict for weights that are not, and by the time evict runs the entry
 * is out of the books. After every step check_books() compares the books
 * with the fake device and with a recount of the entries: used and pinned
 * bytes, the LRU list holding exactly the resident unpinned entries (links
 * consistent both ways), and the budget kept.
 *
 * A randomized test runs long random sequences of acquire, pin, unpin,
 * release, compaction, prefetches and failing loads in both modes (autonomous and not)
 * and both eviction policies, and checks the same invariants after every
 * operation. The lfu tests check its choices on small cases, then its hit
 * rate on synthetic traces (Zipf draws, with and without scans) against LRU
 * and against keeping the most popular models resident.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sched/weight_cache.h"

#define MAX_ENTRIES 16
#define LOG_MAX 8192

typedef struct tentry {
    pjs_wcache_entry e; /* first: an entry pointer is a tentry pointer */
    int id;
    bool on_device;     /* what the fake device holds */
} tentry;

/* The fake device and what it saw. */
typedef struct fake {
    pjs_wcache c;
    tentry t[MAX_ENTRIES];
    size_t n;
    uint64_t device_bytes; /* bytes of the entries on the device */
    int fail_id;           /* load of this entry fails (-1: none) */
    int loads, evicts;     /* callback calls */
    bool wanted[MAX_ENTRIES]; /* requests wait for the entry */
    char log[LOG_MAX];
} fake;

static void log_append(fake *f, char op, int id)
{
    size_t len = strlen(f->log);
    if (len + 16 >= sizeof f->log) { /* long random runs: start over */
        len = 0;
        f->log[0] = '\0';
    }
    snprintf(f->log + len, sizeof f->log - len, "%s%c%d", len ? " " : "", op, id);
}

/* The callbacks run with the cache's lock free. */
static void assert_unlocked(pjs_wcache *c)
{
    assert_int_equal(pthread_mutex_trylock(&c->lock), 0);
    pthread_mutex_unlock(&c->lock);
}

static int fake_load(pjs_wcache_entry *e, void *ctx, pjs_error *err)
{
    fake *f = ctx;
    tentry *t = (tentry *)e;
    assert_unlocked(&f->c);
    assert_false(e->resident);
    assert_false(t->on_device);
    /* not yet in the books */
    assert_int_equal(f->c.used + f->c.pinned, f->device_bytes);
    f->loads++;
    if (t->id == f->fail_id) {
        log_append(f, 'X', t->id);
        return pjs_error_set(err, PJS_ERR_RUNTIME, "fake device: cannot load entry %d", t->id);
    }
    t->on_device = true;
    f->device_bytes += e->bytes;
    log_append(f, 'L', t->id);
    return 0;
}

static void fake_evict(pjs_wcache_entry *e, void *ctx)
{
    fake *f = ctx;
    tentry *t = (tentry *)e;
    assert_unlocked(&f->c);
    assert_true(t->on_device);
    /* already out of the books */
    assert_false(e->resident);
    assert_null(e->newer);
    assert_null(e->older);
    assert_int_equal(f->c.used + f->c.pinned, f->device_bytes - e->bytes);
    f->evicts++;
    t->on_device = false;
    f->device_bytes -= e->bytes;
    log_append(f, 'E', t->id);
}

static bool fake_wanted(const pjs_wcache_entry *e, void *ctx)
{
    fake *f = ctx;
    return f->wanted[((const tentry *)e)->id];
}

static void fake_init_policy(fake *f, uint64_t budget, bool autonomous, pjs_eviction policy,
                             const uint64_t *sizes, size_t n)
{
    assert_true(n <= MAX_ENTRIES);
    memset(f, 0, sizeof *f);
    f->fail_id = -1;
    pjs_wcache_ops ops = {
        .load = fake_load, .evict = fake_evict, .wanted = fake_wanted, .ctx = f};
    pjs_wcache_init(&f->c, budget, autonomous, policy, &ops);
    f->n = n;
    for (size_t i = 0; i < n; i++) {
        f->t[i].id = (int)i;
        f->t[i].e.bytes = sizes[i];
    }
}

/* The tests of the books and of LRU order. */
static void fake_init(fake *f, uint64_t budget, bool autonomous, const uint64_t *sizes,
                      size_t n)
{
    fake_init_policy(f, budget, autonomous, PJS_EVICTION_LRU, sizes, n);
}

static void fake_destroy(fake *f)
{
    pjs_wcache_destroy(&f->c);
}

static pjs_wcache_entry *E(fake *f, int id)
{
    return &f->t[id].e;
}

static void clear_log(fake *f)
{
    f->log[0] = '\0';
}

/* The LRU list, newest first, as "3 1 0". */
static const char *lru(fake *f)
{
    static char buf[256];
    buf[0] = '\0';
    size_t len = 0;
    for (pjs_wcache_entry *e = f->c.newest; e != NULL && len < sizeof buf - 8; e = e->older)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%d", len ? " " : "",
                                ((tentry *)e)->id);
    return buf;
}

/* Everything the books must agree on; returns NULL or what is wrong. */
static const char *books_problem(fake *f)
{
    static char why[256];
    uint64_t used = 0, pinned = 0, in_flight = 0;
    size_t lru_expected = 0;
    for (size_t i = 0; i < f->n; i++) {
        pjs_wcache_entry *e = &f->t[i].e;
        if (e->in_flight) {
            if (e->resident || e->pinned || f->t[i].on_device)
                return "an entry in flight is resident, pinned or on the device";
            in_flight += e->bytes;
            continue;
        }
        if (e->resident != f->t[i].on_device) {
            snprintf(why, sizeof why, "entry %zu: resident %d, on the device %d", i,
                     e->resident, f->t[i].on_device);
            return why;
        }
        if (!e->resident)
            continue;
        if (e->pinned) {
            pinned += e->bytes;
        } else {
            used += e->bytes;
            lru_expected++;
        }
    }
    if (used + in_flight != f->c.used || pinned != f->c.pinned) {
        snprintf(why, sizeof why, "books used %llu pinned %llu, recount %llu (%llu in flight) / %llu",
                 (unsigned long long)f->c.used, (unsigned long long)f->c.pinned,
                 (unsigned long long)(used + in_flight), (unsigned long long)in_flight,
                 (unsigned long long)pinned);
        return why;
    }
    if (used + pinned != f->device_bytes)
        return "the device holds other bytes than the books";
    size_t count = 0;
    const pjs_wcache_entry *newer = NULL;
    for (const pjs_wcache_entry *e = f->c.newest; e != NULL; e = e->older) {
        if (++count > f->n)
            return "the LRU list has a cycle";
        if (!e->resident || e->pinned)
            return "the LRU list holds an entry that is not resident and unpinned";
        if (e->newer != newer)
            return "an LRU link is one-way";
        newer = e;
    }
    if (newer != f->c.oldest)
        return "the LRU list's oldest is not its last entry";
    if (count != lru_expected)
        return "the LRU list misses a resident unpinned entry";
    /* The budget: only an entry alone larger than it, or one loaded when
     * every other resident entry was held, may overshoot it. */
    size_t unheld = 0;
    for (pjs_wcache_entry *e = f->c.newest; e != NULL; e = e->older)
        unheld += e != f->c.newest && atomic_load(&e->holds) == 0;
    if (f->c.budget != PJS_WCACHE_UNLIMITED && f->c.used > f->c.budget &&
        !(count == 1 && f->c.newest->bytes > f->c.budget) && unheld > 0) {
        snprintf(why, sizeof why, "used %llu > budget %llu with %zu entries in the LRU",
                 (unsigned long long)f->c.used, (unsigned long long)f->c.budget, count);
        return why;
    }
    uint64_t b, u, p, changes, flips = 0;
    pjs_wcache_totals(&f->c, &b, &u, &p, &changes);
    if (b != f->c.budget || u != used + in_flight || p != pinned)
        return "pjs_wcache_totals disagrees with the books";
    for (size_t i = 0; i < f->n; i++)
        flips += f->t[i].e.loads + f->t[i].e.evictions;
    if (changes != flips)
        return "the change count is not every entry's loads plus evictions";
    return NULL;
}

static void check_books(fake *f)
{
    const char *why = books_problem(f);
    if (why != NULL)
        fail_msg("%s (LRU: %s; log: %s)", why, lru(f), f->log);
}

/* Acquires id (must succeed) and returns its over_budget flag. */
static bool acquire_ok(fake *f, int id)
{
    bool over = true;
    pjs_error err;
    int rc = pjs_wcache_acquire(&f->c, E(f, id), 1, &over, &err);
    if (rc != 0)
        fail_msg("acquire %d: %s", id, err.msg);
    assert_true(E(f, id)->resident);
    check_books(f);
    return over;
}

static void pin_ok(fake *f, int id, bool pinned)
{
    pjs_error err;
    int rc = pjs_wcache_set_pinned(&f->c, E(f, id), pinned, &err);
    if (rc != 0)
        fail_msg("set_pinned %d %d: %s", id, pinned, err.msg);
    assert_int_equal(E(f, id)->pinned, pinned);
    check_books(f);
}

/* ---- LRU ------------------------------------------------------------------------ */

static void test_lru_order_bump_and_eviction(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 40, 40, 30, 90};
    fake_init(&f, 100, true, sizes, 5);

    assert_false(acquire_ok(&f, 0));
    assert_false(acquire_ok(&f, 1));
    assert_string_equal(f.log, "L0 L1");
    assert_string_equal(lru(&f), "1 0");
    assert_int_equal(f.c.used, 80);

    /* a hit loads nothing and makes the entry the newest */
    clear_log(&f);
    assert_false(acquire_ok(&f, 0));
    assert_string_equal(f.log, "");
    assert_string_equal(lru(&f), "0 1");
    assert_false(acquire_ok(&f, 0)); /* already newest: nothing changes */
    assert_string_equal(lru(&f), "0 1");

    /* a miss evicts the least recently used (1, not 0) until it fits */
    assert_false(acquire_ok(&f, 2));
    assert_string_equal(f.log, "E1 L2");
    assert_string_equal(lru(&f), "2 0");
    assert_int_equal(f.c.used, 80);

    clear_log(&f);
    assert_false(acquire_ok(&f, 3)); /* 80 + 30 > 100: evicts 0 only */
    assert_string_equal(f.log, "E0 L3");
    assert_string_equal(lru(&f), "3 2");
    assert_int_equal(f.c.used, 70);

    /* several evictions, oldest first, stopping as soon as it fits */
    clear_log(&f);
    assert_false(acquire_ok(&f, 4));
    assert_string_equal(f.log, "E2 E3 L4");
    assert_string_equal(lru(&f), "4");
    assert_int_equal(f.c.used, 90);

    /* the counters per entry */
    assert_int_equal(E(&f, 0)->loads, 1);
    assert_int_equal(E(&f, 0)->evictions, 1);
    assert_int_equal(E(&f, 4)->loads, 1);
    assert_int_equal(E(&f, 4)->evictions, 0);
    clear_log(&f);
    assert_false(acquire_ok(&f, 0));
    assert_string_equal(f.log, "E4 L0");
    assert_int_equal(E(&f, 0)->loads, 2);
    assert_int_equal(f.loads, 6);
    assert_int_equal(f.evicts, 5);
    fake_destroy(&f);
}

/* A held entry is passed over when making room: the next oldest goes, and
 * with nothing else to evict the newcomer loads over the budget. */
static void test_held_entries_not_evicted(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 40, 40};
    fake_init(&f, 100, true, sizes, 3);
    assert_false(acquire_ok(&f, 0));
    assert_false(acquire_ok(&f, 1));
    atomic_fetch_add(&E(&f, 0)->holds, 1); /* 0 is the oldest, but held */
    clear_log(&f);
    assert_false(acquire_ok(&f, 2));
    assert_string_equal(f.log, "E1 L2");
    atomic_fetch_add(&E(&f, 2)->holds, 1);
    clear_log(&f);
    assert_true(acquire_ok(&f, 1)); /* 0 and 2 held: 1 loads over the budget */
    assert_string_equal(f.log, "L1");
    assert_int_equal(f.c.used, 120);
    atomic_fetch_sub(&E(&f, 0)->holds, 1);
    atomic_fetch_sub(&E(&f, 2)->holds, 1);
    fake_destroy(&f);
}

/* Sequential pattern A B A C with room for two: C evicts B (least recently
 * used), not A. */
static void test_lru_abac(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {10, 10, 10};
    fake_init(&f, 20, true, sizes, 3);
    const int seq[] = {0, 1, 0, 2, 0, 2};
    for (size_t i = 0; i < sizeof seq / sizeof *seq; i++)
        acquire_ok(&f, seq[i]);
    assert_string_equal(f.log, "L0 L1 E1 L2");
    assert_string_equal(lru(&f), "2 0");
    fake_destroy(&f);
}

static void test_exact_budget_boundary(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {60, 40, 1, 100, 101};
    fake_init(&f, 100, true, sizes, 5);

    /* 60 + 40 == budget: both fit, nothing evicted */
    acquire_ok(&f, 0);
    assert_false(acquire_ok(&f, 1));
    assert_string_equal(f.log, "L0 L1");
    assert_int_equal(f.c.used, 100);

    /* one byte more does not fit: the oldest goes */
    clear_log(&f);
    assert_false(acquire_ok(&f, 2));
    assert_string_equal(f.log, "E0 L2");
    assert_int_equal(f.c.used, 41);

    /* an entry of exactly the budget fits alone and is not over budget */
    clear_log(&f);
    assert_false(acquire_ok(&f, 3));
    assert_string_equal(f.log, "E1 E2 L3");
    assert_int_equal(f.c.used, 100);

    /* one byte more than the budget is */
    clear_log(&f);
    assert_true(acquire_ok(&f, 4));
    assert_string_equal(f.log, "E3 L4");
    fake_destroy(&f);
}

static void test_unlimited_budget_never_evicts(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {UINT64_MAX / 4, UINT64_MAX / 4, 1};
    fake_init(&f, PJS_WCACHE_UNLIMITED, true, sizes, 3);
    for (int i = 0; i < 3; i++)
        assert_false(acquire_ok(&f, i));
    assert_string_equal(f.log, "L0 L1 L2");
    assert_string_equal(lru(&f), "2 1 0");
    uint64_t b, u, p;
    pjs_wcache_totals(&f.c, &b, &u, &p, NULL);
    assert_true(b == PJS_WCACHE_UNLIMITED);
    assert_true(u == UINT64_MAX / 4 * 2 + 1);
    assert_int_equal(p, 0);
    fake_destroy(&f);
}

/* ---- a model larger than the budget --------------------------------------------- */

static void test_larger_than_budget(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {30, 30, 500, 20, 40};
    fake_init(&f, 100, true, sizes, 5);
    pin_ok(&f, 4, true);
    acquire_ok(&f, 0);
    acquire_ok(&f, 1);
    clear_log(&f);

    /* evicts every unpinned entry, then loads it anyway */
    assert_true(acquire_ok(&f, 2));
    assert_string_equal(f.log, "E0 E1 L2");
    assert_string_equal(lru(&f), "2");
    assert_int_equal(f.c.used, 500);
    assert_int_equal(f.c.pinned, 40); /* the pinned entry stays */
    assert_true(E(&f, 4)->resident);

    /* a hit on it is not reported over budget again */
    assert_false(acquire_ok(&f, 2));

    /* the next miss evicts it */
    clear_log(&f);
    assert_false(acquire_ok(&f, 3));
    assert_string_equal(f.log, "E2 L3");
    assert_int_equal(f.c.used, 20);

    /* with a budget of 0 every unpinned entry is over budget */
    fake g;
    fake_init(&g, 0, true, sizes, 2);
    assert_true(acquire_ok(&g, 0));
    assert_true(acquire_ok(&g, 1));
    assert_string_equal(g.log, "L0 E0 L1");
    fake_destroy(&g);
    fake_destroy(&f);
}

/* ---- pinned entries ------------------------------------------------------------- */

static void test_pinned_outside_budget_never_evicted(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {80, 60, 50, 70};
    fake_init(&f, 100, true, sizes, 4);

    pin_ok(&f, 0, true);
    assert_string_equal(f.log, "L0");
    assert_int_equal(f.c.pinned, 80);
    assert_int_equal(f.c.used, 0);
    assert_string_equal(lru(&f), "");

    /* unpinned entries use the whole budget beside it */
    acquire_ok(&f, 1);
    clear_log(&f);
    acquire_ok(&f, 2);
    assert_string_equal(f.log, "E1 L2"); /* 1 goes, never 0 */
    assert_true(E(&f, 0)->resident);

    /* a hit on a pinned entry loads nothing and leaves the LRU alone */
    clear_log(&f);
    assert_false(acquire_ok(&f, 0));
    assert_string_equal(f.log, "");
    assert_string_equal(lru(&f), "2");

    /* pinning again is a no-op */
    pin_ok(&f, 0, true);
    assert_string_equal(f.log, "");
    assert_int_equal(E(&f, 0)->loads, 1);

    /* pinning a resident unpinned entry moves it out of the LRU, no copy */
    pin_ok(&f, 2, true);
    assert_string_equal(f.log, "");
    assert_string_equal(lru(&f), "");
    assert_int_equal(f.c.used, 0);
    assert_int_equal(f.c.pinned, 130);

    /* now the whole budget is free for unpinned entries */
    acquire_ok(&f, 3);
    acquire_ok(&f, 1);
    assert_string_equal(f.log, "L3 E3 L1");
    assert_int_equal(f.c.pinned, 130);
    fake_destroy(&f);
}

static void test_set_pinned_moves_between_pinned_and_lru(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {30, 30, 30, 30};
    fake_init(&f, 100, true, sizes, 4);
    acquire_ok(&f, 0);
    acquire_ok(&f, 1);
    acquire_ok(&f, 2);
    assert_string_equal(lru(&f), "2 1 0");

    /* pin the middle one: out of the LRU, its bytes move to pinned */
    pin_ok(&f, 1, true);
    assert_string_equal(lru(&f), "2 0");
    assert_int_equal(f.c.used, 60);
    assert_int_equal(f.c.pinned, 30);

    /* unpin it (autonomous): back in the LRU as the newest, still resident */
    clear_log(&f);
    pin_ok(&f, 1, false);
    assert_string_equal(f.log, "");
    assert_string_equal(lru(&f), "1 2 0");
    assert_int_equal(f.c.used, 90);
    assert_int_equal(f.c.pinned, 0);

    /* and it is evictable again, in LRU order */
    acquire_ok(&f, 3);
    assert_string_equal(f.log, "E0 L3");
    assert_string_equal(lru(&f), "3 1 2");

    /* pinning a non-resident entry loads it outside the budget */
    clear_log(&f);
    pin_ok(&f, 0, true);
    assert_string_equal(f.log, "L0");
    assert_int_equal(f.c.used, 90);
    assert_int_equal(f.c.pinned, 30);

    /* unpinning a non-resident entry only changes its flag */
    fake g;
    const uint64_t big[] = {150, 30};
    fake_init(&g, 100, true, big, 2);
    pin_ok(&g, 1, false);
    g.t[1].e.pinned = true; /* pinned, weights not loaded yet (a manifest's `device`) */
    pin_ok(&g, 1, false);
    assert_string_equal(g.log, "");
    /* acquiring a pinned entry that is not resident loads it pinned: outside
     * the budget, evicting nothing, never over budget */
    acquire_ok(&g, 0); /* 150 > 100: alone in the LRU */
    g.t[1].e.pinned = true;
    clear_log(&g);
    assert_false(acquire_ok(&g, 1));
    assert_string_equal(g.log, "L1");
    assert_int_equal(g.c.pinned, 30);
    assert_int_equal(g.c.used, 150);
    assert_string_equal(lru(&g), "0");
    fake_destroy(&g);
    fake_destroy(&f);
}

/* Unpinning in autonomous mode must keep the budget: the entry joins the LRU
 * and older entries make room for it. */
static void test_unpin_keeps_budget(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {60, 30, 30};
    fake_init(&f, 100, true, sizes, 3);
    pin_ok(&f, 0, true);
    acquire_ok(&f, 1);
    acquire_ok(&f, 2);
    assert_int_equal(f.c.used, 60);
    clear_log(&f);
    pin_ok(&f, 0, false); /* 60 + 60 > 100: check_books fails if nothing is evicted */
    assert_true(E(&f, 0)->resident);
    assert_string_equal(f.log, "E1");
    assert_string_equal(lru(&f), "0 2");
    fake_destroy(&f);
}

static void test_pin_load_failure(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 30};
    fake_init(&f, 100, true, sizes, 2);
    acquire_ok(&f, 1);
    f.fail_id = 0;
    pjs_error err;
    assert_int_equal(pjs_wcache_set_pinned(&f.c, E(&f, 0), true, &err), PJS_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "cannot load entry 0"));
    assert_false(E(&f, 0)->resident);
    assert_int_equal(E(&f, 0)->loads, 0);
    assert_int_equal(f.c.pinned, 0);
    assert_int_equal(f.c.used, 30);
    assert_string_equal(lru(&f), "1");
    check_books(&f);
    /* a retry loads it */
    f.fail_id = -1;
    pin_ok(&f, 0, true);
    assert_true(E(&f, 0)->resident);
    assert_int_equal(f.c.pinned, 40);
    fake_destroy(&f);
}

/* ---- explicit control (not autonomous) ------------------------------------------ */

static void test_not_autonomous(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 30, 20};
    fake_init(&f, 100, false, sizes, 3);

    /* acquiring a non-resident entry fails and touches nothing */
    bool over = true;
    pjs_error err;
    assert_int_equal(pjs_wcache_acquire(&f.c, E(&f, 0), 1, &over, &err),
                     PJS_ERR_FAILED_PRECONDITION);
    assert_false(over);
    assert_non_null(strstr(err.msg, "not on the device"));
    assert_int_equal(f.loads + f.evicts, 0);
    check_books(&f);

    /* a control plane pins; then acquire succeeds without loading */
    pin_ok(&f, 0, true);
    pin_ok(&f, 1, true);
    assert_string_equal(f.log, "L0 L1");
    assert_false(acquire_ok(&f, 0));
    assert_string_equal(f.log, "L0 L1");

    /* unpinning evicts at once */
    clear_log(&f);
    pin_ok(&f, 0, false);
    assert_string_equal(f.log, "E0");
    assert_false(E(&f, 0)->resident);
    assert_int_equal(E(&f, 0)->evictions, 1);
    assert_int_equal(f.c.pinned, 30);
    assert_int_equal(f.c.used, 0);
    assert_string_equal(lru(&f), "");
    assert_int_equal(pjs_wcache_acquire(&f.c, E(&f, 0), 1, &over, &err),
                     PJS_ERR_FAILED_PRECONDITION);

    /* entries that compaction reloaded are resident unpinned: hits bump them */
    pjs_wcache_entry *reload[] = {E(&f, 0), E(&f, 2)};
    clear_log(&f);
    pjs_error_clear(&err);
    assert_int_equal(pjs_wcache_compact(&f.c, reload, 2, &err), 2);
    assert_string_equal(f.log, "L0 L2");
    assert_string_equal(lru(&f), "2 0");
    check_books(&f);
    acquire_ok(&f, 0);
    assert_string_equal(lru(&f), "0 2");
    fake_destroy(&f);
}

/* ---- load failures and release -------------------------------------------------- */

static void test_load_failure_leaves_books(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 30, 50};
    fake_init(&f, 100, true, sizes, 3);
    acquire_ok(&f, 0);
    acquire_ok(&f, 1);
    uint64_t b0, u0, p0;
    pjs_wcache_totals(&f.c, &b0, &u0, &p0, NULL);

    /* with room: nothing changes at all */
    fake g;
    const uint64_t small[] = {10, 10};
    fake_init(&g, 100, true, small, 2);
    acquire_ok(&g, 0);
    g.fail_id = 1;
    bool over = true;
    pjs_error err;
    assert_int_equal(pjs_wcache_acquire(&g.c, E(&g, 1), 1, &over, &err), PJS_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "cannot load entry 1"));
    assert_false(E(&g, 1)->resident);
    assert_int_equal(E(&g, 1)->loads, 0);
    assert_int_equal(g.c.used, 10);
    assert_string_equal(lru(&g), "0");
    check_books(&g);
    fake_destroy(&g);

    /* without room: the entries evicted to make room stay evicted, the
     * failed one is not counted anywhere */
    f.fail_id = 2;
    clear_log(&f);
    assert_int_equal(pjs_wcache_acquire(&f.c, E(&f, 2), 1, &over, &err), PJS_ERR_RUNTIME);
    assert_string_equal(f.log, "E0 X2");
    assert_false(E(&f, 2)->resident);
    assert_int_equal(E(&f, 2)->loads, 0);
    assert_int_equal(f.c.used, 30);
    assert_string_equal(lru(&f), "1");
    check_books(&f);

    /* the next try loads it */
    f.fail_id = -1;
    clear_log(&f);
    acquire_ok(&f, 2);
    assert_string_equal(f.log, "L2");
    assert_int_equal(E(&f, 2)->loads, 1);
    fake_destroy(&f);
}

static void test_release(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {40, 30, 20};
    fake_init(&f, 100, true, sizes, 3);
    acquire_ok(&f, 0);
    acquire_ok(&f, 1);
    pin_ok(&f, 2, true);
    clear_log(&f);

    /* an unpinned entry: out of the LRU */
    pjs_wcache_release(&f.c, E(&f, 0));
    check_books(&f);
    assert_string_equal(f.log, "E0");
    assert_string_equal(lru(&f), "1");
    assert_int_equal(f.c.used, 30);
    assert_int_equal(E(&f, 0)->evictions, 1);

    /* a pinned entry: its pinned bytes go */
    pjs_wcache_release(&f.c, E(&f, 2));
    check_books(&f);
    assert_string_equal(f.log, "E0 E2");
    assert_int_equal(f.c.pinned, 0);
    assert_false(E(&f, 2)->resident);

    /* a non-resident entry: nothing */
    pjs_wcache_release(&f.c, E(&f, 0));
    check_books(&f);
    assert_string_equal(f.log, "E0 E2");
    assert_int_equal(E(&f, 0)->evictions, 1);
    fake_destroy(&f);
}

/* ---- compaction ----------------------------------------------------------------- */

static void test_compact(void **state)
{
    (void)state;
    fake f;
    const uint64_t sizes[] = {20, 20, 20, 50, 10};
    fake_init(&f, 100, true, sizes, 5);
    pin_ok(&f, 3, true);
    acquire_ok(&f, 0);
    acquire_ok(&f, 1);
    acquire_ok(&f, 2);
    assert_string_equal(lru(&f), "2 1 0");
    clear_log(&f);

    /* evicts every unpinned entry (oldest first), then reloads the list in
     * its order; the pinned entry is untouched and not counted */
    pjs_wcache_entry *reload[] = {E(&f, 2), E(&f, 0), E(&f, 3)};
    pjs_error err;
    pjs_error_clear(&err);
    assert_int_equal(pjs_wcache_compact(&f.c, reload, 3, &err), 2);
    assert_int_equal(err.code, PJS_OK);
    assert_string_equal(f.log, "E0 E1 E2 L2 L0");
    assert_string_equal(lru(&f), "0 2");
    assert_int_equal(f.c.used, 40);
    assert_int_equal(f.c.pinned, 50);
    assert_true(E(&f, 3)->resident);
    assert_int_equal(E(&f, 3)->loads, 1);
    assert_int_equal(E(&f, 3)->evictions, 0);
    check_books(&f);

    /* nothing to reload: everything unpinned goes */
    clear_log(&f);
    assert_int_equal(pjs_wcache_compact(&f.c, NULL, 0, &err), 0);
    assert_string_equal(f.log, "E2 E0");
    assert_int_equal(f.c.used, 0);
    assert_int_equal(f.c.pinned, 50);
    check_books(&f);

    /* a failing reload: the others load, the first error is reported, the
     * count says how many loaded; a pinned entry not resident loads pinned */
    acquire_ok(&f, 1);
    pjs_wcache_release(&f.c, E(&f, 3));
    f.fail_id = 0;
    clear_log(&f);
    pjs_wcache_entry *reload2[] = {E(&f, 0), E(&f, 1), E(&f, 3), E(&f, 1)};
    assert_int_equal(pjs_wcache_compact(&f.c, reload2, 4, &err), 2);
    assert_int_equal(err.code, PJS_ERR_RUNTIME);
    assert_non_null(strstr(err.msg, "cannot load entry 0"));
    assert_string_equal(f.log, "E1 X0 L1 L3");
    assert_false(E(&f, 0)->resident);
    assert_int_equal(f.c.used, 20);
    assert_int_equal(f.c.pinned, 50);
    check_books(&f);
    fake_destroy(&f);

    /* a reload list larger than the budget: loads stop short of it
     * (regression: compaction used to overfill the cache) */
    const uint64_t big[] = {60, 60, 30};
    fake_init(&f, 100, true, big, 3);
    clear_log(&f);
    pjs_wcache_entry *reload3[] = {E(&f, 0), E(&f, 1), E(&f, 2)};
    assert_int_equal(pjs_wcache_compact(&f.c, reload3, 3, &err), 2);
    assert_int_equal(err.code, PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "entry 1 of the reload list does not fit"));
    assert_string_equal(f.log, "L0 L2");
    assert_int_equal(f.c.used, 90);
    check_books(&f);
    fake_destroy(&f);
}

/* ---- the budget from device memory ---------------------------------------------- */

#define GIB (1024ull * 1024 * 1024)

static void test_budget_solve(void **state)
{
    (void)state;
    pjs_weight_budget b;
    /* 16 GiB arena, wiggle 1/16: scratch ceiling 15 GiB. Fraction 0.75 gives
     * 12 GiB; with 2 GiB of scratch the ceiling allows 13: fraction-limited. */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 2 * GIB, 0);
    assert_true(b.scratch_ceiling == 15 * GIB);
    assert_true(b.weight_pool == 12 * GIB);
    assert_true(b.on_demand_budget == 12 * GIB);
    assert_false(b.pinned_over_commit);

    /* 4 GiB of scratch: 15 - 4 = 11 GiB < 12: scratch-limited */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 4 * GIB, 0);
    assert_true(b.weight_pool == 11 * GIB);
    assert_true(b.on_demand_budget == 11 * GIB);

    /* pinned weights are reserved out of the pool */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 4 * GIB, 3 * GIB);
    assert_true(b.weight_pool == 11 * GIB);
    assert_true(b.on_demand_budget == 8 * GIB);
    assert_false(b.pinned_over_commit);

    /* pinned exactly the pool: nothing on demand, not over-committed */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 4 * GIB, 11 * GIB);
    assert_true(b.on_demand_budget == 0);
    assert_false(b.pinned_over_commit);

    /* pinned over the pool: over-committed, nothing on demand */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 4 * GIB, 11 * GIB + 1);
    assert_true(b.on_demand_budget == 0);
    assert_true(b.pinned_over_commit);

    /* scratch over the ceiling: no pool at all */
    b = pjs_weight_budget_solve(16 * GIB, 0.75, 0.0625, 20 * GIB, 0);
    assert_true(b.scratch_ceiling == 15 * GIB);
    assert_true(b.weight_pool == 0);
    assert_true(b.on_demand_budget == 0);
    assert_false(b.pinned_over_commit);

    /* a zero arena: zeros, and any pinned byte over-commits */
    b = pjs_weight_budget_solve(0, 0.8, 0.1, 0, 0);
    assert_true(b.scratch_ceiling == 0 && b.weight_pool == 0 && b.on_demand_budget == 0);
    assert_false(b.pinned_over_commit);
    b = pjs_weight_budget_solve(0, 0.8, 0.1, 0, 1);
    assert_true(b.on_demand_budget == 0);
    assert_true(b.pinned_over_commit);

    /* decimal fractions (80 GB device, 0.8, 10 % wiggle, 1 GB scratch, 8 GB
     * pinned): pool min(64, 72 - 1) = 64 GB, 56 GB on demand, to a byte */
    const uint64_t GB = 1000ull * 1000 * 1000;
    b = pjs_weight_budget_solve(80 * GB, 0.8, 0.1, 1 * GB, 8 * GB);
    assert_true(b.scratch_ceiling >= 72 * GB - 1 && b.scratch_ceiling <= 72 * GB);
    assert_true(b.weight_pool >= 64 * GB - 1 && b.weight_pool <= 64 * GB);
    assert_true(b.on_demand_budget >= 56 * GB - 1 && b.on_demand_budget <= 56 * GB);
    assert_false(b.pinned_over_commit);
}

/* ---- randomized ----------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

/* One random run: `ops` operations on `n` entries, the books checked after
 * each. Entry sizes are up to 60 % of the budget, one in eight larger than
 * the whole budget. */
static void random_run(uint64_t seed, bool autonomous, pjs_eviction policy, int ops)
{
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + 1;
    const uint64_t budget = 1000;
    size_t n = 4 + (size_t)rng_below(&rs, MAX_ENTRIES - 4);
    uint64_t sizes[MAX_ENTRIES];
    for (size_t i = 0; i < n; i++)
        sizes[i] = rng_below(&rs, 8) == 0 ? budget + 1 + rng_below(&rs, budget)
                                          : 1 + rng_below(&rs, budget * 6 / 10);
    fake f;
    fake_init_policy(&f, budget, autonomous, policy, sizes, n);
    uint64_t loads_ok = 0, evicts = 0;
    for (int op = 0; op < ops; op++) {
        int id = (int)rng_below(&rs, n);
        pjs_wcache_entry *e = E(&f, id);
        f.fail_id = rng_below(&rs, 20) == 0 ? id : -1;
        uint64_t r = rng_below(&rs, 100);
        pjs_error err;
        int rc = 0;
        const char *what;
        bool was_resident = e->resident;
        if (r < 60) {
            what = "acquire";
            bool over = false;
            rc = pjs_wcache_acquire(&f.c, e, 1, &over, &err);
            if (rc == 0) {
                if (!was_resident && !e->pinned && e->bytes > budget && !over)
                    fail_msg("seed %llu op %d: acquire %d of %llu bytes not over budget",
                             (unsigned long long)seed, op, id,
                             (unsigned long long)e->bytes);
                if (over && (was_resident || e->pinned || e->bytes <= budget))
                    fail_msg("seed %llu op %d: acquire %d wrongly over budget",
                             (unsigned long long)seed, op, id);
            } else if (!autonomous && !was_resident) {
                assert_int_equal(rc, PJS_ERR_FAILED_PRECONDITION);
            } else {
                assert_int_equal(rc, PJS_ERR_RUNTIME);
                assert_int_equal(f.fail_id, id);
            }
        } else if (r < 72) {
            what = "pin";
            rc = pjs_wcache_set_pinned(&f.c, e, true, &err);
            assert_true(rc == 0 || (rc == PJS_ERR_RUNTIME && f.fail_id == id));
            assert_true(e->pinned);
        } else if (r < 86) {
            what = "unpin";
            rc = pjs_wcache_set_pinned(&f.c, e, false, &err);
            assert_int_equal(rc, 0);
            assert_false(e->pinned);
            if (!autonomous)
                assert_false(e->resident);
        } else if (r < 95) {
            what = "release";
            pjs_wcache_release(&f.c, e);
            assert_false(e->resident);
        } else if (r < 97 && autonomous) {
            what = "prefetch";
            pjs_wcache_entry *keep = E(&f, (int)rng_below(&rs, n));
            bool was_pinned = e->pinned, keep_resident = keep->resident && keep != e;
            if (pjs_wcache_reserve(&f.c, e, keep)) {
                assert_false(was_resident || was_pinned);
                assert_true(e->in_flight);
                assert_true(f.c.used <= f.c.budget);
                if (keep_resident)
                    assert_true(keep->resident);
                const char *why = books_problem(&f);
                if (why != NULL)
                    fail_msg("seed %llu op %d: after reserving %d: %s", (unsigned long long)seed,
                             op, id, why);
                bool copied = f.fail_id != id;
                if (copied) { /* the copy another thread makes */
                    f.t[id].on_device = true;
                    f.device_bytes += e->bytes;
                }
                pjs_wcache_commit(&f.c, e, copied);
                assert_false(e->in_flight);
                assert_int_equal(e->resident, copied);
            }
        } else {
            /* reload a random subset of what is resident and unpinned now (what
             * a caller compacting the device reloads: it fit before) */
            what = "compact";
            pjs_wcache_entry *reload[MAX_ENTRIES];
            size_t k = 0;
            for (pjs_wcache_entry *x = f.c.newest; x != NULL; x = x->older)
                if (rng_below(&rs, 2) == 0)
                    reload[k++] = x;
            pjs_error_clear(&err);
            size_t before_pinned = 0;
            for (size_t i = 0; i < n; i++)
                before_pinned += f.t[i].e.resident && f.t[i].e.pinned;
            size_t loaded = pjs_wcache_compact(&f.c, reload, k, &err);
            size_t resident_unpinned = 0, after_pinned = 0;
            for (size_t i = 0; i < n; i++) {
                resident_unpinned += f.t[i].e.resident && !f.t[i].e.pinned;
                after_pinned += f.t[i].e.resident && f.t[i].e.pinned;
            }
            assert_int_equal(loaded, resident_unpinned);
            assert_int_equal(before_pinned, after_pinned);
        }
        const char *why = books_problem(&f);
        if (why != NULL)
            fail_msg("seed %llu (%s, %s), op %d (%s %d%s): %s (LRU: %s; log tail: %s)",
                     (unsigned long long)seed, autonomous ? "autonomous" : "explicit",
                     pjs_eviction_name(policy), op,
                     what, id, f.fail_id == id ? ", its load failing" : "", why, lru(&f),
                     f.log);
    }
    for (size_t i = 0; i < n; i++) {
        loads_ok += f.t[i].e.loads;
        evicts += f.t[i].e.evictions;
    }
    /* every successful load either was evicted since or is resident now */
    uint64_t resident = 0;
    for (size_t i = 0; i < n; i++)
        resident += f.t[i].e.resident;
    assert_true(loads_ok == evicts + resident);
    fake_destroy(&f);
}

static void test_randomized(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        random_run(seed, true, PJS_EVICTION_LRU, 2000);
        random_run(seed, false, PJS_EVICTION_LRU, 500);
        random_run(seed, true, PJS_EVICTION_LFU, 2000);
    }
}

/* ---- lfu ----------------------------------------------------------------------- */

static void test_eviction_names(void **state)
{
    (void)state;
    assert_int_equal(pjs_eviction_parse("lfu"), PJS_EVICTION_LFU);
    assert_int_equal(pjs_eviction_parse("lru"), PJS_EVICTION_LRU);
    assert_int_equal(pjs_eviction_parse("LRU"), -1);
    assert_int_equal(pjs_eviction_parse(""), -1);
    assert_string_equal(pjs_eviction_name(PJS_EVICTION_LFU), "lfu");
    assert_string_equal(pjs_eviction_name(PJS_EVICTION_LRU), "lru");
}

/* Acquires id for `uses` requests (must succeed). */
static void use(fake *f, int id, uint64_t uses)
{
    bool over;
    pjs_error err;
    if (pjs_wcache_acquire(&f->c, E(f, id), uses, &over, &err) != 0)
        fail_msg("acquire %d: %s", id, err.msg);
    const char *why = books_problem(f);
    if (why != NULL)
        fail_msg("after acquiring %d: %s", id, why);
}

/* Room for two: 0 is asked for three times in a row, then 1, then 2, over
 * and over. LRU evicts 0 for 2 each round (0 is then the older), so 0
 * misses every round; lfu keeps 0 and lets 1 and 2 evict each other. */
static void test_lfu_keeps_the_frequently_used(void **state)
{
    (void)state;
    const uint64_t sizes[] = {100, 100, 100};
    for (int p = 0; p < 2; p++) {
        fake f;
        fake_init_policy(&f, 200, true, p == 0 ? PJS_EVICTION_LFU : PJS_EVICTION_LRU, sizes, 3);
        for (int round = 0; round < 10; round++) {
            use(&f, 0, 1);
            use(&f, 0, 1);
            use(&f, 0, 1);
            use(&f, 1, 1);
            use(&f, 2, 1);
        }
        assert_int_equal(E(&f, 0)->loads, p == 0 ? 1 : 10);
        fake_destroy(&f);
    }
}

/* Aging: an entry used heavily once loses its place to steadily used ones
 * as its uses decay: 10000 uses against three entries sharing one request
 * in three (each settling near half-life / ln 2 / 3, about 1970 uses) cross
 * after about 2.6 half-lives. */
static void test_lfu_ages_out_what_is_no_longer_used(void **state)
{
    (void)state;
    const uint64_t sizes[] = {100, 100, 100, 100};
    fake f;
    fake_init_policy(&f, 200, true, PJS_EVICTION_LFU, sizes, 4);
    use(&f, 0, 10000);
    int round = 0;
    while (E(&f, 0)->resident && round < 100000) {
        use(&f, 1 + round % 3, 1);
        round++;
    }
    assert_false(E(&f, 0)->resident);
    assert_true(round > 2 * PJS_WCACHE_LFU_HALF_LIFE);
    assert_true(round < 4 * PJS_WCACHE_LFU_HALF_LIFE);
    fake_destroy(&f);
}

/* Equal use: the entry whose reload costs less per byte goes first. */
static void test_lfu_weighs_load_cost_per_byte(void **state)
{
    (void)state;
    const uint64_t sizes[] = {100, 100, 100};
    for (int cheap = 0; cheap < 2; cheap++) {
        fake f;
        fake_init_policy(&f, 200, true, PJS_EVICTION_LFU, sizes, 3);
        E(&f, 0)->load_ns = cheap == 0 ? 1000 : 50000;
        E(&f, 1)->load_ns = cheap == 0 ? 50000 : 1000;
        E(&f, 2)->load_ns = 1000;
        use(&f, 0, 1);
        use(&f, 1, 1);
        use(&f, 2, 1);
        assert_int_equal(E(&f, cheap)->resident, false);
        assert_int_equal(E(&f, 1 - cheap)->resident, true);
        fake_destroy(&f);
    }
}

/* Prefetch: room is made by the policy but never from `keep`; the bytes in
 * flight count against the budget; the entry is neither resident nor
 * evictable nor acquirable until committed; a failed copy gives its bytes
 * back. */
static void test_prefetch_books(void **state)
{
    (void)state;
    const uint64_t sizes[] = {100, 100, 100, 100, 300};
    fake f;
    fake_init_policy(&f, 200, true, PJS_EVICTION_LRU, sizes, 5);
    use(&f, 0, 1);
    use(&f, 1, 1);
    /* 0 is the least recently used, but it is about to run: 1 goes */
    assert_true(pjs_wcache_reserve(&f.c, E(&f, 2), E(&f, 0)));
    assert_true(E(&f, 0)->resident);
    assert_false(E(&f, 1)->resident);
    assert_true(E(&f, 2)->in_flight);
    assert_false(E(&f, 2)->resident);
    assert_int_equal(f.c.used, 200);
    assert_null(books_problem(&f));
    /* nothing more fits beside the one in flight without evicting 0 */
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 3), E(&f, 0)));
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 2), NULL)); /* already in flight */
    bool over;
    pjs_error err;
    assert_int_equal(pjs_wcache_acquire(&f.c, E(&f, 2), 1, &over, &err), PJS_ERR_INTERNAL);
    /* the copy is done: resident, the most recently used, counted once */
    f.t[2].on_device = true;
    f.device_bytes += 100;
    pjs_wcache_commit(&f.c, E(&f, 2), true);
    assert_true(E(&f, 2)->resident);
    assert_int_equal(E(&f, 2)->loads, 1);
    assert_ptr_equal(f.c.newest, E(&f, 2));
    assert_null(books_problem(&f));
    int loads = f.loads;
    use(&f, 2, 1); /* a hit */
    assert_int_equal(f.loads, loads);
    /* a failed copy: the bytes come back, nothing is resident */
    assert_true(pjs_wcache_reserve(&f.c, E(&f, 3), E(&f, 2)));
    assert_false(E(&f, 0)->resident);
    pjs_wcache_commit(&f.c, E(&f, 3), false);
    assert_false(E(&f, 3)->resident);
    assert_false(E(&f, 3)->in_flight);
    assert_int_equal(f.c.used, 100);
    assert_null(books_problem(&f));
    /* never: larger than the budget, resident, pinned */
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 4), NULL));
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 2), NULL));
    assert_int_equal(pjs_wcache_set_pinned(&f.c, E(&f, 1), true, &err), 0);
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 1), NULL));
    fake_destroy(&f);

    /* not autonomous (explicit control) or unlimited: never */
    fake_init(&f, 200, false, sizes, 5);
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 0), NULL));
    fake_destroy(&f);
    fake_init(&f, PJS_WCACHE_UNLIMITED, true, sizes, 5);
    assert_false(pjs_wcache_reserve(&f.c, E(&f, 0), NULL));
    fake_destroy(&f);
}

/* A model with requests waiting is evicted only when nothing else can go,
 * under either policy. */
static void test_waiting_requests_protect(void **state)
{
    (void)state;
    const uint64_t sizes[] = {100, 100, 100, 100};
    for (int p = 0; p < 2; p++) {
        fake f;
        fake_init_policy(&f, 200, true, p == 0 ? PJS_EVICTION_LRU : PJS_EVICTION_LFU, sizes, 4);
        use(&f, 0, 1);
        use(&f, 1, 5); /* lfu and lru would both evict 0 */
        f.wanted[0] = true;
        use(&f, 2, 1);
        assert_true(E(&f, 0)->resident);
        assert_false(E(&f, 1)->resident);
        f.wanted[2] = true; /* all wanted: the policy's choice */
        use(&f, 3, 1);
        assert_false(E(&f, 0)->resident); /* the older, and less used of late */
        fake_destroy(&f);
    }
}

/* ---- hit rates on synthetic traces ---------------------------------------------- */

#define SIM_MODELS 40
#define SIM_ROOM 4 /* a budget of 10 % of the weights */

typedef struct sim {
    pjs_wcache c;
    pjs_wcache_entry e[SIM_MODELS];
    uint64_t loads;
} sim;

static int sim_load(pjs_wcache_entry *e, void *ctx, pjs_error *err)
{
    (void)e;
    (void)err;
    ((sim *)ctx)->loads++;
    return 0;
}

static void sim_evict(pjs_wcache_entry *e, void *ctx)
{
    (void)e;
    (void)ctx;
}

/* A Zipf(s) draw over n ranks (0 most popular) by inverting the CDF. */
static int zipf_draw(uint64_t *rs, const double *cdf, int n)
{
    double u = (double)(rng_next(rs) >> 11) / 9007199254740992.0;
    for (int i = 0; i < n; i++)
        if (u < cdf[i])
            return i;
    return n - 1;
}

static void zipf_cdf(double s, double *cdf, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++)
        total += 1.0 / pow(i + 1, s);
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += 1.0 / pow(i + 1, s) / total;
        cdf[i] = acc;
    }
}

/* The hit rate of `policy` on a trace of `length` requests: Zipf(1.1)
 * draws, and, when scan_every > 0, a scan touching every model once in
 * order after every scan_every draws. Only the draws are counted. */
static double sim_hit_rate(pjs_eviction policy, int length, int scan_every)
{
    double cdf[SIM_MODELS];
    zipf_cdf(1.1, cdf, SIM_MODELS);
    sim sm;
    memset(&sm, 0, sizeof sm);
    pjs_wcache_ops ops = {.load = sim_load, .evict = sim_evict, .ctx = &sm};
    pjs_wcache_init(&sm.c, SIM_ROOM * 100, true, policy, &ops);
    for (int i = 0; i < SIM_MODELS; i++)
        sm.e[i].bytes = 100;
    uint64_t rs = 42;
    uint64_t hits = 0;
    bool over;
    pjs_error err;
    for (int r = 0; r < length; r++) {
        pjs_wcache_entry *e = &sm.e[zipf_draw(&rs, cdf, SIM_MODELS)];
        hits += e->resident;
        assert_int_equal(pjs_wcache_acquire(&sm.c, e, 1, &over, &err), 0);
        if (scan_every > 0 && r % scan_every == scan_every - 1)
            for (int i = 0; i < SIM_MODELS; i++)
                assert_int_equal(pjs_wcache_acquire(&sm.c, &sm.e[i], 1, &over, &err), 0);
        assert_true(sm.c.used <= sm.c.budget);
    }
    pjs_wcache_destroy(&sm.c);
    return (double)hits / length;
}

/* The share of Zipf(1.1) requests that go to the k most popular models:
 * the hit rate of keeping them resident. */
static double most_popular_share(int k)
{
    double cdf[SIM_MODELS];
    zipf_cdf(1.1, cdf, SIM_MODELS);
    return cdf[k - 1];
}

static void test_lfu_hit_rate_on_zipf(void **state)
{
    (void)state;
    double lru = sim_hit_rate(PJS_EVICTION_LRU, 200000, 0);
    double lfu = sim_hit_rate(PJS_EVICTION_LFU, 200000, 0);
    double best = most_popular_share(SIM_ROOM);
    /* A miss must load its model, so one place goes to whatever came last:
     * the most a policy can keep is the SIM_ROOM - 1 most popular. */
    double reachable = most_popular_share(SIM_ROOM - 1);
    print_message("zipf 1.1, %d models, room for %d: lru %.3f, lfu %.3f, the %d most popular "
                  "%.3f, the %d most popular %.3f\n",
                  SIM_MODELS, SIM_ROOM, lru, lfu, SIM_ROOM, best, SIM_ROOM - 1, reachable);
    assert_true(lfu > lru + 0.1);
    assert_true(lfu > reachable);
    assert_true(lfu < best); /* nothing beats knowing the law */
}

/* A scan through every model (a batch job, a health check touching each
 * model) flushes LRU's resident set; lfu keeps the popular models. */
static void test_lfu_hit_rate_with_scans(void **state)
{
    (void)state;
    double lru = sim_hit_rate(PJS_EVICTION_LRU, 100000, 50);
    double lfu = sim_hit_rate(PJS_EVICTION_LFU, 100000, 50);
    print_message("zipf 1.1 with a scan every 50 requests: lru %.3f, lfu %.3f\n", lru, lfu);
    assert_true(lfu > lru + 0.1);
    assert_true(lfu > most_popular_share(SIM_ROOM - 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_order_bump_and_eviction),
        cmocka_unit_test(test_lru_abac),
        cmocka_unit_test(test_held_entries_not_evicted),
        cmocka_unit_test(test_exact_budget_boundary),
        cmocka_unit_test(test_unlimited_budget_never_evicts),
        cmocka_unit_test(test_larger_than_budget),
        cmocka_unit_test(test_pinned_outside_budget_never_evicted),
        cmocka_unit_test(test_set_pinned_moves_between_pinned_and_lru),
        cmocka_unit_test(test_unpin_keeps_budget),
        cmocka_unit_test(test_pin_load_failure),
        cmocka_unit_test(test_not_autonomous),
        cmocka_unit_test(test_load_failure_leaves_books),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_budget_solve),
        cmocka_unit_test(test_randomized),
        cmocka_unit_test(test_eviction_names),
        cmocka_unit_test(test_lfu_keeps_the_frequently_used),
        cmocka_unit_test(test_lfu_ages_out_what_is_no_longer_used),
        cmocka_unit_test(test_lfu_weighs_load_cost_per_byte),
        cmocka_unit_test(test_prefetch_books),
        cmocka_unit_test(test_waiting_requests_protect),
        cmocka_unit_test(test_lfu_hit_rate_on_zipf),
        cmocka_unit_test(test_lfu_hit_rate_with_scans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
