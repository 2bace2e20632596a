/*
 * test_scratch_pool.c - unit tests of the scratch pool
 * (src/server/scratch_pool.c) on real threads.
 *
 * A waiting acquire is observed through the pool's `waiting` counter (the
 * test waits for it to change, it never sleeps to let something happen);
 * deadlines are short and only their outcome is asserted, plus a generous
 * bound on how late the failure came. The concurrency test writes a
 * pattern over every buffer it holds and checks it before giving the
 * buffer back: two live buffers that overlapped would corrupt each other.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/infer.h"
#include "server/scratch_pool.h"

#define MS 1000000ULL
#define KI 1024u

static pjs_scratch_pool *pool_new(uint64_t budget)
{
    pjs_scratch_pool *p = NULL;
    pjs_error err;
    int rc = pjs_scratch_pool_create(budget, &p, &err);
    if (rc != 0)
        fail_msg("create: %s", err.msg);
    return p;
}

static void acquire_ok(pjs_scratch_pool *p, const size_t *sizes, size_t n, void **out)
{
    pjs_error err;
    int rc = pjs_scratch_pool_acquire(p, sizes, n, out, 0, &err);
    if (rc != 0)
        fail_msg("acquire: %s", err.msg);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(out[i]);
        assert_int_equal((uintptr_t)out[i] % PJS_SCRATCH_ALIGN, 0);
        memset(out[i], 0xab, sizes[i]); /* the memory is ours to write */
    }
}

static pjs_scratch_counters counters(pjs_scratch_pool *p)
{
    pjs_scratch_counters c;
    pjs_scratch_pool_get_counters(p, &c);
    return c;
}

/* Waits (yielding) until the pool has `n` acquires waiting. */
static void wait_waiting(pjs_scratch_pool *p, uint64_t n)
{
    uint64_t until = pjs_now_ns() + 20000 * MS;
    while (counters(p).waiting != n && pjs_now_ns() < until)
        sched_yield();
    assert_int_equal(counters(p).waiting, n);
}

/* ---- single-threaded behaviour ------------------------------------------------ */

static void test_create_checks_budget(void **state)
{
    (void)state;
    pjs_scratch_pool *p = NULL;
    pjs_error err;
    assert_int_equal(pjs_scratch_pool_create(PJS_SCRATCH_MAX_BYTES + 1, &p, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "--meta-scratch-bytes"));
    assert_int_equal(pjs_scratch_pool_create(10, &p, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(p);
    pjs_scratch_pool_destroy(NULL);
}

/* Asking more than the whole pool, alone or together, fails at once. */
static void test_too_large_refused_at_once(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(64 * KI);
    void *out[2] = {(void *)1, (void *)1};
    pjs_error err;
    size_t one[] = {64 * KI + 1};
    assert_int_equal(pjs_scratch_pool_acquire(p, one, 1, out, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "--meta-scratch-bytes"));
    assert_non_null(strstr(err.msg, "65536 bytes"));
    size_t two[] = {40 * KI, 30 * KI};
    assert_int_equal(pjs_scratch_pool_acquire(p, two, 2, out, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    size_t huge[] = {SIZE_MAX, 1};
    assert_int_equal(pjs_scratch_pool_acquire(p, huge, 2, out, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_ptr_equal(out[0], (void *)1);
    assert_int_equal(counters(p).too_large, 3);
    assert_int_equal(counters(p).used_bytes, 0);
    size_t exact[] = {32 * KI, 32 * KI}; /* the whole pool fits */
    acquire_ok(p, exact, 2, out);
    assert_int_equal(counters(p).used_bytes, 64 * KI);
    pjs_scratch_pool_release(p, out, 2);
    pjs_scratch_pool_destroy(p);
}

static void test_buffer_count_bounds(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(64 * KI);
    size_t sizes[PJS_SCRATCH_MAX_BUFFERS + 1] = {0};
    void *out[PJS_SCRATCH_MAX_BUFFERS + 1];
    pjs_error err;
    assert_int_equal(pjs_scratch_pool_acquire(p, sizes, 0, out, 0, &err), 0);
    assert_int_equal(pjs_scratch_pool_acquire(p, sizes, PJS_SCRATCH_MAX_BUFFERS + 1, out, 0,
                                              &err),
                     PJS_ERR_INVALID_ARGUMENT);
    /* Zero-byte buffers are distinct pointers. */
    acquire_ok(p, sizes, 3, out);
    assert_ptr_not_equal(out[0], out[1]);
    assert_ptr_not_equal(out[1], out[2]);
    pjs_scratch_pool_release(p, out, 3);
    assert_int_equal(counters(p).used_bytes, 0);
    pjs_scratch_pool_destroy(p);
}

/* A request that cannot have all its buffers takes none of them. */
static void test_all_or_nothing(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(64 * KI);
    size_t big[] = {40 * KI};
    void *held[1];
    acquire_ok(p, big, 1, held);
    void *out[2] = {NULL, NULL};
    size_t pair[] = {10 * KI, 20 * KI}; /* 30 KiB > the 24 KiB left; 10 KiB alone would fit */
    pjs_error err;
    uint64_t deadline = pjs_now_ns() + 30 * MS;
    assert_int_equal(pjs_scratch_pool_acquire(p, pair, 2, out, deadline, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    uint64_t failed_at = pjs_now_ns();
    assert_true(failed_at >= deadline);
    assert_true(failed_at <= deadline + 5000 * MS);
    assert_non_null(strstr(err.msg, "ms waiting for 2 buffers"));
    assert_non_null(strstr(err.msg, "--meta-scratch-bytes"));
    assert_null(out[0]);
    assert_null(out[1]);
    pjs_scratch_counters c = counters(p);
    assert_int_equal(c.used_bytes, 40 * KI);
    assert_int_equal(c.timed_out, 1);
    assert_int_equal(c.waiting, 0);
    size_t fits[] = {10 * KI, 14 * KI};
    acquire_ok(p, fits, 2, out);
    assert_int_equal(counters(p).used_bytes, 64 * KI);
    pjs_scratch_pool_release(p, out, 2);
    pjs_scratch_pool_release(p, held, 1);
    assert_int_equal(counters(p).used_bytes, 0);
    assert_int_equal(counters(p).peak_bytes, 64 * KI);
    pjs_scratch_pool_destroy(p);
}

/* A deadline already passed, with no room, fails without waiting. */
static void test_deadline_already_passed(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(4 * KI);
    size_t all[] = {4 * KI};
    void *held[1], *out[1];
    acquire_ok(p, all, 1, held);
    pjs_error err;
    assert_int_equal(pjs_scratch_pool_acquire(p, all, 1, out, 1, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    pjs_scratch_pool_release(p, held, 1);
    /* With room, the deadline does not matter: nothing to wait for. */
    assert_int_equal(pjs_scratch_pool_acquire(p, all, 1, out, pjs_now_ns() + 1000 * MS, &err), 0);
    pjs_scratch_pool_release(p, out, 1);
    pjs_scratch_pool_destroy(p);
}

/* Released memory is handed out again: the same addresses. */
static void test_reuse(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(1024 * KI);
    size_t sizes[] = {100 * KI, 3000, 200 * KI};
    void *first[3], *again[3];
    acquire_ok(p, sizes, 3, first);
    pjs_scratch_pool_release(p, first, 3);
    acquire_ok(p, sizes, 3, again);
    for (int i = 0; i < 3; i++)
        assert_ptr_equal(first[i], again[i]);
    pjs_scratch_pool_release(p, again, 3);
    /* A different size reuses the same memory too (first fit). */
    size_t other[] = {150 * KI};
    void *one[1];
    acquire_ok(p, other, 1, one);
    assert_ptr_equal(one[0], first[0]);
    pjs_scratch_pool_release(p, one, 1);
    assert_int_equal(counters(p).acquisitions, 3);
    pjs_scratch_pool_destroy(p);
}

/* Without a budget, buffers are plain aligned heap memory. */
static void test_no_pool_plain_memory(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(0);
    size_t sizes[] = {100, 0, 1 << 20};
    void *out[3];
    acquire_ok(p, sizes, 3, out);
    assert_ptr_not_equal(out[0], out[1]);
    assert_ptr_not_equal(out[0], out[2]);
    pjs_scratch_counters c = counters(p);
    assert_int_equal(c.budget_bytes, 0);
    assert_int_equal(c.acquisitions, 1);
    pjs_scratch_pool_release(p, out, 3);
    pjs_error err;
    size_t impossible[] = {SIZE_MAX - 8};
    assert_int_equal(pjs_scratch_pool_acquire(p, impossible, 1, out, 0, &err), PJS_ERR_NOMEM);
    pjs_scratch_pool_destroy(p);
}

/* ---- waiting ----------------------------------------------------------------------- */

typedef struct acquirer {
    pjs_scratch_pool *p;
    size_t size;
    uint64_t deadline_ns;
    int rc;
    void *buf;
    atomic_bool done;
} acquirer;

static void *acquire_thread(void *arg)
{
    acquirer *a = arg;
    pjs_error err;
    a->rc = pjs_scratch_pool_acquire(a->p, &a->size, 1, &a->buf, a->deadline_ns, &err);
    atomic_store(&a->done, true);
    return NULL;
}

/* An acquire without room waits, and a release wakes it. */
static void test_waits_and_wakes_on_release(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(64 * KI);
    size_t all[] = {64 * KI};
    void *held[1];
    acquire_ok(p, all, 1, held);
    acquirer a = {.p = p, .size = 48 * KI, .deadline_ns = pjs_now_ns() + 60000 * MS};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, acquire_thread, &a), 0);
    wait_waiting(p, 1);
    assert_false(atomic_load(&a.done));
    pjs_scratch_pool_release(p, held, 1);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, 0);
    assert_ptr_equal(a.buf, held[0]);
    pjs_scratch_counters c = counters(p);
    assert_int_equal(c.waited, 1);
    assert_int_equal(c.waiting, 0);
    pjs_scratch_pool_release(p, &a.buf, 1);
    pjs_scratch_pool_destroy(p);
}

/* Waiters are served in arrival order: a small request that would fit
 * waits behind an earlier large one instead of starving it. */
static void test_waiters_in_arrival_order(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(64 * KI);
    size_t half[] = {32 * KI};
    void *held[1];
    acquire_ok(p, half, 1, held);
    acquirer large = {.p = p, .size = 64 * KI, .deadline_ns = pjs_now_ns() + 60000 * MS};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, acquire_thread, &large), 0);
    wait_waiting(p, 1);
    size_t small[] = {4 * KI};
    void *out[1];
    pjs_error err;
    assert_int_equal(pjs_scratch_pool_acquire(p, small, 1, out, pjs_now_ns() + 20 * MS, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    assert_false(atomic_load(&large.done));
    pjs_scratch_pool_release(p, held, 1);
    pthread_join(t, NULL);
    assert_int_equal(large.rc, 0);
    pjs_scratch_pool_release(p, &large.buf, 1);
    pjs_scratch_pool_destroy(p);
}

/* ---- many threads -------------------------------------------------------------------- */

enum { HAMMER_THREADS = 4, HAMMER_ROUNDS = 1500 };

typedef struct hammer {
    pjs_scratch_pool *p;
    unsigned seed;
    int id;
    int corrupted;
} hammer;

static void fill(void *buf, size_t n, uint32_t tag)
{
    uint32_t *w = buf;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = tag ^ (uint32_t)i;
}

static bool intact(const void *buf, size_t n, uint32_t tag)
{
    const uint32_t *w = buf;
    for (size_t i = 0; i < n / 4; i++)
        if (w[i] != (tag ^ (uint32_t)i))
            return false;
    return true;
}

static void *hammer_thread(void *arg)
{
    hammer *h = arg;
    for (int r = 0; r < HAMMER_ROUNDS; r++) {
        size_t n = 1 + (size_t)(rand_r(&h->seed) % 4);
        size_t sizes[4];
        void *bufs[4];
        for (size_t i = 0; i < n; i++)
            sizes[i] = 4 * (1 + (size_t)(rand_r(&h->seed) % (16 * KI)));
        pjs_error err;
        if (pjs_scratch_pool_acquire(h->p, sizes, n, bufs, 0, &err) != 0) {
            h->corrupted++;
            continue;
        }
        uint32_t tag = ((uint32_t)h->id << 24) ^ ((uint32_t)r << 4);
        for (size_t i = 0; i < n; i++)
            fill(bufs[i], sizes[i], tag + (uint32_t)i);
        sched_yield();
        for (size_t i = 0; i < n; i++)
            h->corrupted += !intact(bufs[i], sizes[i], tag + (uint32_t)i);
        pjs_scratch_pool_release(h->p, bufs, n);
    }
    return NULL;
}

/* Threads hammer a pool smaller than what they want at once: no two live
 * buffers overlap, and the arena is whole again at the end. */
static void test_concurrent_no_overlap(void **state)
{
    (void)state;
    pjs_scratch_pool *p = pool_new(256 * KI);
    hammer h[HAMMER_THREADS];
    pthread_t t[HAMMER_THREADS];
    for (int i = 0; i < HAMMER_THREADS; i++) {
        h[i] = (hammer){.p = p, .seed = 1234u + (unsigned)i, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, hammer_thread, &h[i]), 0);
    }
    for (int i = 0; i < HAMMER_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(h[i].corrupted, 0);
    }
    pjs_scratch_counters c = counters(p);
    assert_int_equal(c.used_bytes, 0);
    assert_int_equal(c.acquisitions, HAMMER_THREADS * HAMMER_ROUNDS);
    assert_true(c.peak_bytes <= 256 * KI);
    /* Every block merged back: the whole pool is one buffer again. */
    size_t all[] = {256 * KI};
    void *out[1];
    acquire_ok(p, all, 1, out);
    pjs_scratch_pool_release(p, out, 1);
    pjs_scratch_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_checks_budget),
        cmocka_unit_test(test_too_large_refused_at_once),
        cmocka_unit_test(test_buffer_count_bounds),
        cmocka_unit_test(test_all_or_nothing),
        cmocka_unit_test(test_deadline_already_passed),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_no_pool_plain_memory),
        cmocka_unit_test(test_waits_and_wakes_on_release),
        cmocka_unit_test(test_waiters_in_arrival_order),
        cmocka_unit_test(test_concurrent_no_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
