/*
 * test_work_pool.c - unit tests of the bounded job pool (src/core/work_pool.c)
 * and of the byte-stream checksum (src/core/checksum.c), both pure logic.
 *
 * The pool's jobs are fakes that record how they ran; a "gate" job blocks
 * the only thread until the test opens it, so the queue can be filled to its
 * bound deterministically: one more submit is refused RESOURCE_EXHAUSTED at
 * once, and stop runs every queued job with cancelled set.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/work_pool.h"

/* ---- the pool ------------------------------------------------------------- */

typedef struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool entered, open;
} gate;

static void gate_job(void *arg, bool cancelled)
{
    gate *g = arg;
    (void)cancelled;
    pthread_mutex_lock(&g->lock);
    g->entered = true;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void gate_wait_entered(gate *g)
{
    pthread_mutex_lock(&g->lock);
    while (!g->entered)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

/* What a recording job saw: ran (and how), in order. */
typedef struct record {
    pthread_mutex_t lock;
    int order[16];
    bool cancelled[16];
    int n;
} record;

typedef struct rec_job {
    record *r;
    int id;
} rec_job;

static void rec_job_run(void *arg, bool cancelled)
{
    rec_job *j = arg;
    pthread_mutex_lock(&j->r->lock);
    j->r->cancelled[j->r->n] = cancelled;
    j->r->order[j->r->n++] = j->id;
    pthread_mutex_unlock(&j->r->lock);
}

static void test_bounded_queue(void **state)
{
    (void)state;
    pjs_work_pool *p;
    pjs_error err;
    assert_int_equal(pjs_work_pool_create("test jobs", 1, 3, &p, &err), 0);
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    record r = {.lock = PTHREAD_MUTEX_INITIALIZER};
    rec_job jobs[4] = {{&r, 0}, {&r, 1}, {&r, 2}, {&r, 3}};
    assert_int_equal(pjs_work_pool_submit(p, gate_job, &g, &err), 0);
    gate_wait_entered(&g); /* the thread is busy; the queue is empty */
    for (int i = 0; i < 3; i++)
        assert_int_equal(pjs_work_pool_submit(p, rec_job_run, &jobs[i], &err), 0);
    assert_int_equal(pjs_work_pool_submit(p, rec_job_run, &jobs[3], &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "test jobs: 3 requests are already waiting"));
    gate_open(&g);
    pjs_work_pool_stop(p); /* waits for the queue to run */
    assert_int_equal(r.n, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r.order[i], i);
    assert_int_equal(pjs_work_pool_submit(p, rec_job_run, &jobs[3], &err), PJS_ERR_UNAVAILABLE);
    pjs_work_pool_destroy(p);
}

static void noop_job(void *arg, bool cancelled)
{
    (void)arg;
    (void)cancelled;
}

static void *stop_pool(void *p)
{
    pjs_work_pool_stop(p);
    return NULL;
}

static void test_stop_cancels_queued_jobs(void **state)
{
    (void)state;
    pjs_work_pool *p;
    pjs_error err;
    assert_int_equal(pjs_work_pool_create("test jobs", 1, 8, &p, &err), 0);
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    record r = {.lock = PTHREAD_MUTEX_INITIALIZER};
    rec_job jobs[2] = {{&r, 0}, {&r, 1}};
    assert_int_equal(pjs_work_pool_submit(p, gate_job, &g, &err), 0);
    gate_wait_entered(&g);
    assert_int_equal(pjs_work_pool_submit(p, rec_job_run, &jobs[0], &err), 0);
    assert_int_equal(pjs_work_pool_submit(p, rec_job_run, &jobs[1], &err), 0);

    /* Stop from another thread while the gate holds the worker; open the
     * gate once stop has begun refusing work. */
    pthread_t stopper;
    assert_int_equal(pthread_create(&stopper, NULL, stop_pool, p), 0);
    while (pjs_work_pool_submit(p, noop_job, NULL, &err) != PJS_ERR_UNAVAILABLE)
        sched_yield();
    gate_open(&g);
    pthread_join(stopper, NULL);
    assert_int_equal(r.n, 2); /* each queued job ran once, cancelled */
    assert_true(r.cancelled[0] && r.cancelled[1]);
    pjs_work_pool_destroy(p);
}

static void test_several_threads(void **state)
{
    (void)state;
    pjs_work_pool *p;
    pjs_error err;
    assert_int_equal(pjs_work_pool_create("test jobs", 2, 16, &p, &err), 0);
    gate a = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    gate b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
    assert_int_equal(pjs_work_pool_submit(p, gate_job, &a, &err), 0);
    assert_int_equal(pjs_work_pool_submit(p, gate_job, &b, &err), 0);
    gate_wait_entered(&a); /* both run at once on the two threads */
    gate_wait_entered(&b);
    gate_open(&a);
    gate_open(&b);
    pjs_work_pool_destroy(p);
    assert_int_equal(pjs_work_pool_create("test jobs", 0, 1, &p, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_null(p);
}

/* ---- the checksum ----------------------------------------------------------- */

static void test_checksum_pieces(void **state)
{
    (void)state;
    unsigned char buf[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 37 + 11);
    uint64_t whole = pjs_checksum_of(buf, sizeof buf);
    /* Any split into pieces gives the same sum. */
    static const size_t pieces[] = {1, 7, 31, 32, 33, 64, 999};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        pjs_checksum c;
        pjs_checksum_init(&c);
        for (size_t at = 0; at < sizeof buf; at += pieces[k])
            pjs_checksum_update(&c, buf + at,
                                sizeof buf - at < pieces[k] ? sizeof buf - at : pieces[k]);
        assert_true(pjs_checksum_final(&c) == whole);
    }
    /* One flipped bit anywhere, or a different length, changes it. */
    for (size_t i = 0; i < sizeof buf; i += 97) {
        buf[i] ^= 0x10;
        assert_true(pjs_checksum_of(buf, sizeof buf) != whole);
        buf[i] ^= 0x10;
    }
    assert_true(pjs_checksum_of(buf, sizeof buf - 1) != whole);
    unsigned char zeros[64] = {0};
    assert_true(pjs_checksum_of(zeros, 32) != pjs_checksum_of(zeros, 64));
    assert_true(pjs_checksum_of(zeros, 0) != pjs_checksum_of(zeros, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounded_queue),
        cmocka_unit_test(test_stop_cancels_queued_jobs),
        cmocka_unit_test(test_several_threads),
        cmocka_unit_test(test_checksum_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
