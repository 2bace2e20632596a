/*
 * test_meta_gate.c - unit tests of the meta gate (src/server/meta_gate.c) on
 * real threads.
 *
 * Timing is never asserted by sleeping: a "latch" job holds its thread until
 * the test opens it, so "all permits held" is a state the test builds, and
 * the test waits for events (a job entered, an expire callback came) on
 * condition variables. The only time bound asserted is a generous one: an
 * expired job is reported no later than a few seconds after its deadline
 * (while the latch that holds the permit is still closed, so the expiry
 * came from the deadline, not from reaching the head of the queue).
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
#include <time.h>

#include "core/infer.h"
#include "server/meta_gate.h"

#define MS 1000000ULL
/* How long a test waits for an event before failing (never reached when
 * the gate works). */
#define EVENT_TIMEOUT_NS (20000 * MS)

/* ---- shared state of a test's jobs ------------------------------------------- */

typedef struct world {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool open;             /* latches may return */
    int inside_latch;      /* latch jobs inside run now */
    atomic_int inside;     /* gated jobs inside run now */
    atomic_int max_inside; /* most seen at once */
    int runs, expiries;
    int order[64];         /* ids in run order */
    int n_order;
    pjs_error last_err;
    uint64_t last_expire_ns;
} world;

typedef struct test_job {
    pjs_meta_job job; /* first: the gate hands this back */
    world *w;
    int id;
    bool latch;       /* hold the thread until w->open */
    bool counted;     /* count in inside / max_inside (gated jobs) */
    bool ran, expired;
} test_job;

static void world_init(world *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
}

static void world_free(world *w)
{
    pthread_cond_destroy(&w->changed);
    pthread_mutex_destroy(&w->lock);
}

static void job_run(pjs_meta_job *job)
{
    test_job *t = (test_job *)job;
    world *w = t->w;
    if (t->counted) {
        int now = atomic_fetch_add(&w->inside, 1) + 1;
        int max = atomic_load(&w->max_inside);
        while (now > max && !atomic_compare_exchange_weak(&w->max_inside, &max, now))
            ;
    }
    pthread_mutex_lock(&w->lock);
    t->ran = true;
    w->runs++;
    if (w->n_order < 64)
        w->order[w->n_order++] = t->id;
    if (t->latch) {
        w->inside_latch++;
        pthread_cond_broadcast(&w->changed);
        while (!w->open)
            pthread_cond_wait(&w->changed, &w->lock);
        w->inside_latch--;
    }
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
    sched_yield(); /* let other runners overlap with this one */
    if (t->counted)
        atomic_fetch_sub(&w->inside, 1);
}

static void job_expire(pjs_meta_job *job, pjs_error *err)
{
    test_job *t = (test_job *)job;
    world *w = t->w;
    pthread_mutex_lock(&w->lock);
    t->expired = true;
    w->expiries++;
    w->last_err = *err;
    w->last_expire_ns = pjs_now_ns();
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

static void job_init(test_job *t, world *w, int id, bool latch, bool counted)
{
    memset(t, 0, sizeof *t);
    t->job.run = job_run;
    t->job.expire = job_expire;
    t->w = w;
    t->id = id;
    t->latch = latch;
    t->counted = counted;
}

/* Waits until *value (read under the lock) reaches at least target. */
static void wait_at_least(world *w, const int *value, int target)
{
    uint64_t until = pjs_now_ns() + EVENT_TIMEOUT_NS;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(EVENT_TIMEOUT_NS / 1000000000ULL);
    pthread_mutex_lock(&w->lock);
    while (*value < target && pjs_now_ns() < until)
        pthread_cond_timedwait(&w->changed, &w->lock, &ts);
    int got = *value;
    pthread_mutex_unlock(&w->lock);
    assert_true(got >= target);
}

static void world_open(world *w)
{
    pthread_mutex_lock(&w->lock);
    w->open = true;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

static pjs_meta_gate *gate_new(int permits, int compute, size_t max_waiting)
{
    pjs_meta_gate *g = NULL;
    pjs_error err;
    assert_int_equal(pjs_meta_gate_create("meta gate", permits, compute, max_waiting, &g, &err),
                     0);
    return g;
}

static void submit_ok(pjs_meta_gate *g, test_job *t, bool gated, uint64_t deadline_ns)
{
    pjs_error err = {0};
    int rc = pjs_meta_gate_submit(g, &t->job, gated, deadline_ns, &err);
    if (rc != 0)
        fail_msg("submit: %s", err.msg);
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_create_checks_counts(void **state)
{
    (void)state;
    pjs_meta_gate *g = NULL;
    pjs_error err;
    assert_int_equal(pjs_meta_gate_create("meta gate", -1, 1, 0, &g, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "-1 permits"));
    assert_int_equal(pjs_meta_gate_create("meta gate", 1, 0, 0, &g, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_meta_gate_create("meta gate", PJS_META_GATE_MAX_THREADS + 1, 1, 0, &g,
                                          &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_null(g);
    pjs_meta_gate_destroy(NULL);
}

/* 3 permits, 40 gated jobs: the first three hold their permits until the
 * test saw three inside; never more than three run at once. */
static void test_at_most_n_gated_at_once(void **state)
{
    (void)state;
    enum { PERMITS = 3, JOBS = 40 };
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(PERMITS, 1, 0);
    test_job jobs[JOBS];
    for (int i = 0; i < JOBS; i++) {
        job_init(&jobs[i], &w, i, i < PERMITS, true);
        submit_ok(g, &jobs[i], true, 0);
    }
    wait_at_least(&w, &w.inside_latch, PERMITS); /* N is reached */
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.running_gated, PERMITS);
    assert_int_equal(c.waiting_gated, JOBS - PERMITS);
    assert_int_equal(atomic_load(&w.inside), PERMITS);
    world_open(&w);
    pjs_meta_gate_drain(g);
    assert_int_equal(w.runs, JOBS);
    assert_int_equal(atomic_load(&w.max_inside), PERMITS);
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.peak_gated, PERMITS);
    assert_int_equal(c.completed, JOBS);
    assert_int_equal(c.running_gated, 0);
    assert_int_equal(c.waiting_gated, 0);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

/* With every permit held, compute-only jobs still run; a gated one waits. */
/* A gate of compute threads alone (the server's for decoupled compute-only
 * metas): its compute jobs run, a gated job is refused at submit. */
static void test_gate_without_permits(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(0, 2, 0);
    test_job jobs[3], gated;
    for (int i = 0; i < 3; i++) {
        job_init(&jobs[i], &w, i, false, false);
        submit_ok(g, &jobs[i], false, 0);
    }
    job_init(&gated, &w, 9, false, true);
    pjs_error err = {0};
    assert_int_equal(pjs_meta_gate_submit(g, &gated.job, true, 0, &err), PJS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "no permits"));
    pjs_meta_gate_drain(g);
    for (int i = 0; i < 3; i++)
        assert_true(jobs[i].ran);
    assert_false(gated.ran);
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.permits, 0);
    assert_int_equal(c.completed, 3);
    assert_int_equal(c.refused, 1);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

static void test_compute_only_bypasses_permits(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 2, 0);
    test_job holder, gated, compute[4];
    job_init(&holder, &w, 0, true, true);
    submit_ok(g, &holder, true, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    job_init(&gated, &w, 1, false, true);
    submit_ok(g, &gated, true, 0);
    for (int i = 0; i < 4; i++) {
        job_init(&compute[i], &w, 2 + i, false, false);
        submit_ok(g, &compute[i], false, 0);
    }
    wait_at_least(&w, &w.runs, 5); /* the holder and the four compute-only jobs */
    pthread_mutex_lock(&w.lock);
    assert_false(w.open);
    assert_false(gated.ran);
    for (int i = 0; i < 4; i++)
        assert_true(compute[i].ran);
    pthread_mutex_unlock(&w.lock);
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.running_gated, 1);
    assert_int_equal(c.waiting_gated, 1);
    assert_int_equal(c.peak_gated, 1);
    world_open(&w);
    pjs_meta_gate_drain(g);
    assert_true(gated.ran);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

/* One permit: gated jobs run in submission order. */
static void test_gated_fifo(void **state)
{
    (void)state;
    enum { JOBS = 12 };
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 1, 0);
    test_job holder, jobs[JOBS];
    job_init(&holder, &w, 100, true, true);
    submit_ok(g, &holder, true, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    for (int i = 0; i < JOBS; i++) {
        job_init(&jobs[i], &w, i, false, true);
        submit_ok(g, &jobs[i], true, 0);
    }
    world_open(&w);
    pjs_meta_gate_drain(g);
    assert_int_equal(w.n_order, JOBS + 1);
    assert_int_equal(w.order[0], 100);
    for (int i = 0; i < JOBS; i++)
        assert_int_equal(w.order[i + 1], i);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

/* A job waiting behind a held permit expires at its deadline, without
 * running, while the permit is still held; the others behind it still run. */
static void test_expires_at_deadline_while_waiting(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 1, 0);
    test_job holder, doomed, patient;
    job_init(&holder, &w, 0, true, true);
    submit_ok(g, &holder, true, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    job_init(&patient, &w, 1, false, true);
    submit_ok(g, &patient, true, 0); /* ahead of the doomed one in the queue */
    job_init(&doomed, &w, 2, false, true);
    uint64_t deadline = pjs_now_ns() + 50 * MS;
    submit_ok(g, &doomed, true, deadline);
    wait_at_least(&w, &w.expiries, 1);
    pthread_mutex_lock(&w.lock);
    assert_false(w.open); /* expired at its deadline, not on reaching the head */
    assert_true(doomed.expired);
    assert_false(doomed.ran);
    assert_int_equal(w.last_err.code, PJS_ERR_DEADLINE_EXCEEDED);
    assert_non_null(strstr(w.last_err.msg, "permit"));
    assert_non_null(strstr(w.last_err.msg, "all 1 (--meta-concurrency)"));
    assert_non_null(strstr(w.last_err.msg, " ms waiting"));
    assert_true(w.last_expire_ns >= deadline);
    assert_true(w.last_expire_ns <= deadline + 5000 * MS);
    pthread_mutex_unlock(&w.lock);
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.expired, 1);
    assert_int_equal(c.waiting_gated, 1);
    world_open(&w);
    pjs_meta_gate_drain(g);
    assert_true(patient.ran);
    assert_false(doomed.ran);
    assert_int_equal(w.runs, 2);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

/* The same for a compute-only job waiting for a busy compute thread. */
static void test_compute_only_expires_too(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 1, 0);
    test_job holder, doomed;
    job_init(&holder, &w, 0, true, false);
    submit_ok(g, &holder, false, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    job_init(&doomed, &w, 1, false, false);
    submit_ok(g, &doomed, false, pjs_now_ns() + 20 * MS);
    wait_at_least(&w, &w.expiries, 1);
    pthread_mutex_lock(&w.lock);
    assert_false(w.open);
    assert_false(doomed.ran);
    assert_int_equal(w.last_err.code, PJS_ERR_DEADLINE_EXCEEDED);
    assert_non_null(strstr(w.last_err.msg, "compute-only"));
    pthread_mutex_unlock(&w.lock);
    world_open(&w);
    pjs_meta_gate_destroy(g); /* drains */
    assert_int_equal(w.runs, 1);
    world_free(&w);
}

/* A deadline already passed is refused by submit, with no callback; a
 * deadline in the future with a free permit runs. */
static void test_refused_when_already_expired(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(2, 1, 0);
    test_job late, fine;
    job_init(&late, &w, 0, false, true);
    pjs_error err;
    assert_int_equal(pjs_meta_gate_submit(g, &late.job, true, pjs_now_ns() - 5 * MS, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    assert_non_null(strstr(err.msg, "deadline passed before"));
    assert_int_equal(pjs_meta_gate_submit(g, &late.job, false, 1, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    job_init(&fine, &w, 1, false, true);
    submit_ok(g, &fine, true, pjs_now_ns() + 60000 * MS);
    pjs_meta_gate_drain(g);
    assert_false(late.ran);
    assert_false(late.expired);
    assert_true(fine.ran);
    assert_int_equal(w.expiries, 0);
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.refused, 2);
    assert_int_equal(c.completed, 1);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

/* Each queue holds max_waiting jobs; one more is refused at once, and a
 * full gated queue leaves the compute-only queue open. */
static void test_queue_full(void **state)
{
    (void)state;
    enum { DEPTH = 3 };
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 1, DEPTH);
    test_job holder, queued[DEPTH], extra, compute;
    job_init(&holder, &w, 0, true, true);
    submit_ok(g, &holder, true, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    for (int i = 0; i < DEPTH; i++) {
        job_init(&queued[i], &w, 1 + i, false, true);
        submit_ok(g, &queued[i], true, 0);
    }
    job_init(&extra, &w, 9, false, true);
    pjs_error err;
    assert_int_equal(pjs_meta_gate_submit(g, &extra.job, true, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "3 gated meta model runs are already waiting"));
    job_init(&compute, &w, 10, false, false);
    submit_ok(g, &compute, false, 0);
    world_open(&w);
    pjs_meta_gate_drain(g);
    assert_int_equal(w.runs, DEPTH + 2);
    assert_false(extra.ran);
    pjs_meta_gate_destroy(g);
    world_free(&w);
}

typedef struct drain_arg {
    pjs_meta_gate *g;
    atomic_bool done;
} drain_arg;

static void *drain_thread(void *arg)
{
    drain_arg *d = arg;
    pjs_meta_gate_drain(d->g);
    atomic_store(&d->done, true);
    return NULL;
}

/* Drain refuses new jobs at once but runs every queued one before it
 * returns. */
static void test_drain_runs_queued_work(void **state)
{
    (void)state;
    enum { QUEUED = 5, PROBES = 4096 };
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(1, 1, PROBES + QUEUED);
    test_job holder, queued[QUEUED];
    test_job *probes = calloc(PROBES, sizeof *probes);
    assert_non_null(probes);
    job_init(&holder, &w, 0, true, true);
    submit_ok(g, &holder, true, 0);
    wait_at_least(&w, &w.inside_latch, 1);
    for (int i = 0; i < QUEUED; i++) {
        job_init(&queued[i], &w, 1 + i, false, true);
        submit_ok(g, &queued[i], true, 0);
    }
    drain_arg d = {.g = g};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, drain_thread, &d), 0);
    /* Jobs submitted before the drain thread took the lock are accepted (and
     * must run); once draining, submit answers UNAVAILABLE. */
    int accepted = 0, rc = 0;
    pjs_error err;
    for (int i = 0; i < PROBES; i++) {
        job_init(&probes[i], &w, 10 + i, false, true);
        rc = pjs_meta_gate_submit(g, &probes[i].job, true, 0, &err);
        if (rc != 0)
            break;
        accepted++;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL); /* pacing only */
    }
    assert_int_equal(rc, PJS_ERR_UNAVAILABLE);
    assert_non_null(strstr(err.msg, "shutting down"));
    assert_false(atomic_load(&d.done)); /* the holder still runs */
    world_open(&w);
    pthread_join(t, NULL);
    assert_int_equal(w.runs, 1 + QUEUED + accepted);
    pjs_meta_gate_counters c;
    pjs_meta_gate_get_counters(g, &c);
    assert_int_equal(c.waiting_gated, 0);
    assert_int_equal(c.running_gated, 0);
    pjs_meta_gate_drain(g); /* idempotent */
    pjs_meta_gate_destroy(g);
    free(probes);
    world_free(&w);
}

/* Shared compute threads: client A's latched jobs beyond its share of 2
 * wait, and past 2 waiting are refused; client B's job runs at once on a
 * thread started for it (the gate began with 1), ahead of A's older ones;
 * once A's runs return, its waiting jobs run. */
static void test_compute_threads_shared_between_clients(void **state)
{
    (void)state;
    world w;
    world_init(&w);
    pjs_meta_gate *g = gate_new(0, 1, 0);
    pjs_error err = {0};
    assert_int_equal(pjs_meta_gate_share(g, 8, 2, 2, &err), 0);
    static const char a_key, b_key;
    test_job a[5], b;
    for (int i = 0; i < 5; i++) {
        job_init(&a[i], &w, i, true, false);
        a[i].job.client = &a_key;
    }
    for (int i = 0; i < 4; i++)
        submit_ok(g, &a[i], false, 0);
    wait_at_least(&w, &w.inside_latch, 2);
    assert_int_equal(pjs_meta_gate_submit(g, &a[4].job, false, 0, &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "2 waiting"));
    job_init(&b, &w, 9, false, false);
    b.job.client = &b_key;
    submit_ok(g, &b, false, 0);
    wait_at_least(&w, &w.runs, 3);
    pthread_mutex_lock(&w.lock);
    assert_true(b.ran);
    assert_int_equal(w.inside_latch, 2);
    pthread_mutex_unlock(&w.lock);
    pjs_meta_gate_counters c;
    uint64_t until = pjs_now_ns() + EVENT_TIMEOUT_NS;
    do { /* b's run returns just after it counted itself */
        sched_yield();
        pjs_meta_gate_get_counters(g, &c);
    } while (c.completed < 1 && pjs_now_ns() < until);
    assert_int_equal(c.completed, 1);
    assert_int_equal(c.running_compute, 2);
    assert_int_equal(c.waiting_compute, 2);
    assert_true(c.compute_threads >= 2 && c.compute_threads <= 8);
    world_open(&w);
    wait_at_least(&w, &w.runs, 5);
    pjs_meta_gate_destroy(g);
    for (int i = 0; i < 4; i++)
        assert_true(a[i].ran);
    world_free(&w);
}

static void test_share_refuses_bounds_out_of_range(void **state)
{
    (void)state;
    pjs_meta_gate *g = gate_new(0, 4, 0);
    pjs_error err = {0};
    assert_int_equal(pjs_meta_gate_share(g, 3, 1, 0, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_meta_gate_share(g, PJS_META_GATE_MAX_THREADS + 1, 1, 0, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_int_equal(pjs_meta_gate_share(g, 4, -1, 0, &err), PJS_ERR_INVALID_ARGUMENT);
    pjs_meta_gate_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_checks_counts),
        cmocka_unit_test(test_at_most_n_gated_at_once),
        cmocka_unit_test(test_compute_only_bypasses_permits),
        cmocka_unit_test(test_gate_without_permits),
        cmocka_unit_test(test_gated_fifo),
        cmocka_unit_test(test_expires_at_deadline_while_waiting),
        cmocka_unit_test(test_compute_only_expires_too),
        cmocka_unit_test(test_refused_when_already_expired),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_drain_runs_queued_work),
        cmocka_unit_test(test_compute_threads_shared_between_clients),
        cmocka_unit_test(test_share_refuses_bounds_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
