/*
 * test_sched.c - unit tests of the scheduler's decisions (src/sched/policy.c)
 * on a fake device with a virtual clock.
 *
 * A "device" here is a cost function: executing a queue at a compiled size
 * advances the virtual clock by that size's cost, and the measured time is
 * fed back with pjs_sched_record exactly as the dispatcher does. Jobs are
 * plain pjs_sched_job structs tagged with an id through a wrapper, so the
 * tests can check who was served, in what order and with what padding.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/policy.h"

#define MS 1000000ull

typedef struct tjob {
    pjs_sched_job job; /* first: a job pointer is a tjob pointer */
    int id;
    int model;
} tjob;

static int id_of(const pjs_sched_job *j)
{
    return ((const tjob *)j)->id;
}

/* A model with up to two variant queues and its share. */
typedef struct tmodel {
    pjs_sched_share share;
    pjs_sched_queue q[2];
    double cost_ns[PJS_SCHED_MAX_SIZES]; /* fake device cost per size index */
} tmodel;

static const int64_t sizes_148[] = {1, 4, 8};

static void model_init(tmodel *m, double weight, size_t depth, const int64_t *sizes, size_t n,
                       bool coalesce, double ns_per_row, double ns_fixed)
{
    memset(m, 0, sizeof *m);
    pjs_sched_share_init(&m->share, weight, depth);
    for (size_t v = 0; v < 2; v++)
        pjs_sched_queue_init(&m->q[v], &m->share, m, v, sizes, n, coalesce);
    for (size_t k = 0; k < n; k++)
        m->cost_ns[k] = ns_fixed + ns_per_row * (double)sizes[k];
}

static pjs_sched_config config(pjs_discipline d)
{
    pjs_sched_config c;
    pjs_sched_config_defaults(&c);
    c.discipline = d;
    return c;
}

static tjob *job(int id, uint64_t arrival, uint64_t deadline, int64_t rows)
{
    tjob *t = calloc(1, sizeof *t);
    t->id = id;
    t->job.arrival_ns = arrival;
    t->job.deadline_ns = deadline;
    t->job.rows = rows;
    return t;
}

static void enqueue_ok(pjs_sched *s, pjs_sched_queue *q, tjob *t, uint64_t now)
{
    pjs_error err;
    assert_int_equal(pjs_sched_enqueue(s, q, &t->job, now, &err), 0);
}

static void free_list(pjs_sched_job *j)
{
    while (j != NULL) {
        pjs_sched_job *next = j->next;
        free(j);
        j = next;
    }
}

static void free_plan(pjs_sched_plan *p)
{
    free_list(p->jobs);
    free_list(p->expired);
    free_list(p->shed);
}

/* Runs one plan on the fake device: advances *now by its cost and records. */
static void execute(pjs_sched *s, pjs_sched_plan *p, uint64_t *now)
{
    if (p->queue == NULL)
        return;
    tmodel *m = p->queue->owner;
    uint64_t cost = (uint64_t)m->cost_ns[p->size_index];
    *now += cost;
    pjs_sched_record(s, p->queue, p->size_index, *now, cost);
}

/* Empties every queue without executing. */
static void drain(pjs_sched *s)
{
    pjs_sched_plan p;
    while (pjs_sched_next(s, 1000, &p))
        free_plan(&p);
}

/* ---- configuration -------------------------------------------------------------- */

static void test_config_defaults_and_checks(void **state)
{
    (void)state;
    pjs_sched_config c;
    pjs_sched_config_defaults(&c);
    pjs_error err;
    assert_int_equal(pjs_sched_config_check(&c, &err), 0);
    assert_int_equal(c.discipline, PJS_DISCIPLINE_FAIR);
    assert_string_equal(pjs_discipline_name(PJS_DISCIPLINE_EDF), "edf");
    assert_int_equal(pjs_discipline_parse("fifo"), PJS_DISCIPLINE_FIFO);
    assert_int_equal(pjs_discipline_parse("FIFO"), -1);
    c.half_life_s = 0;
    assert_int_equal(pjs_sched_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "half_life_ms"));
    pjs_sched_config_defaults(&c);
    c.coalesce_discount = 1.5;
    assert_int_equal(pjs_sched_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "coalesce_discount"));
    pjs_sched_config_defaults(&c);
    c.max_queue_depth = 0;
    assert_int_equal(pjs_sched_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "max_queue_depth"));
    pjs_sched_config_defaults(&c);
    assert_true(c.cold_model_defer_ms == 10.0);
    assert_int_equal(c.eviction, PJS_EVICTION_LFU);
    c.cold_model_defer_ms = -1;
    assert_int_equal(pjs_sched_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "cold_model_defer_ms"));
}

/* ---- fifo ----------------------------------------------------------------------- */

/* Three models without a batch axis (one job per execution), jobs arriving
 * interleaved: fifo serves them in global arrival order. */
static void test_fifo_global_arrival_order(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FIFO);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m[3];
    for (int i = 0; i < 3; i++)
        model_init(&m[i], 1.0 + 10 * i, 100, sizes_148, 3, false, 1 * MS, 0);
    uint64_t now = 0;
    const int owner[12] = {2, 0, 1, 1, 2, 0, 0, 0, 2, 1, 2, 0};
    for (int i = 0; i < 12; i++)
        {
            now++;
            enqueue_ok(&s, &m[owner[i]].q[0], job(i, now, 0, 1), now);
        }
    for (int i = 0; i < 12; i++) {
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&s, now, &p));
        assert_int_equal(p.n_jobs, 1);
        assert_int_equal(id_of(p.jobs), i);
        assert_ptr_equal(p.queue, &m[owner[i]].q[0]);
        execute(&s, &p, &now);
        free_plan(&p);
    }
    pjs_sched_plan p;
    assert_false(pjs_sched_next(&s, now, &p));
}

/* With coalescing, every execution still starts with the globally oldest job. */
static void test_fifo_coalesced_batches_start_with_oldest(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FIFO);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel a, b;
    model_init(&a, 1, 100, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    model_init(&b, 1, 100, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    uint64_t now = 0;
    int next_id = 0;
    for (int i = 0; i < 20; i++)
        {
            now++;
            enqueue_ok(&s, i % 3 ? &a.q[0] : &b.q[0], job(next_id++, now, 0, 1), now);
        }
    int served = 0, last_first = -1;
    pjs_sched_plan p;
    while (pjs_sched_next(&s, now, &p)) {
        int first = id_of(p.jobs);
        assert_true(first > last_first);
        /* first must be the smallest id still queued */
        for (const pjs_sched_queue *q = s.active; q != NULL; q = q->next_active)
            assert_true(id_of(q->head) > first);
        last_first = first;
        served += (int)p.n_jobs;
        execute(&s, &p, &now);
        free_plan(&p);
    }
    assert_int_equal(served, 20);
}

/* ---- edf -------------------------------------------------------------------------- */

/* edf picks the queue whose most urgent job is due first (jobs without a
 * deadline last, ties in arrival order); within a queue, jobs go FIFO. */
static void test_edf_orders_by_deadline(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_EDF);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m[8];
    for (int i = 0; i < 8; i++)
        model_init(&m[i], 1, 100, sizes_148, 3, false, 0.01 * MS, 0);
    uint64_t now = 1000 * MS;
    const int deadline_ms[8] = {0, 900, 300, 500, 300, 0, 100, 700};
    for (int i = 0; i < 8; i++)
        enqueue_ok(&s, &m[i].q[0],
                   job(i, now + (uint64_t)i, deadline_ms[i] ? now + deadline_ms[i] * MS : 0, 1),
                   now);
    now += 10;
    const int expect[8] = {6, 2, 4, 3, 7, 1, 0, 5};
    for (int i = 0; i < 8; i++) {
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&s, now, &p));
        assert_null(p.shed);
        assert_null(p.expired);
        assert_int_equal(id_of(p.jobs), expect[i]);
        execute(&s, &p, &now);
        free_plan(&p);
    }
    /* one queue: its urgent job selects it, the oldest goes first */
    enqueue_ok(&s, &m[0].q[0], job(10, now, 0, 1), now);
    enqueue_ok(&s, &m[1].q[0], job(11, now + 1, now + 50 * MS, 1), now);
    enqueue_ok(&s, &m[0].q[0], job(12, now + 2, now + 20 * MS, 1), now);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_int_equal(id_of(p.jobs), 10);
    free_plan(&p);
    assert_true(pjs_sched_next(&s, now, &p));
    assert_int_equal(id_of(p.jobs), 12);
    free_plan(&p);
    drain(&s);
}

/* A job that would finish after its deadline even in the cheapest execution
 * holding it is shed; the margin sheds earlier; committed jobs are not shed. */
static void test_edf_sheds_predicted_misses(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_EDF);
    c.edf_laxity_margin_us = 0;
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m;
    model_init(&m, 1, 100, sizes_148, 3, true, 0, 10 * MS);
    for (size_t k = 0; k < 3; k++)
        pjs_sched_seed_cost(&m.q[0], k, 10 * MS);
    uint64_t now = 1000 * MS;
    enqueue_ok(&s, &m.q[0], job(1, now, now + 5 * MS, 1), now);  /* misses */
    enqueue_ok(&s, &m.q[0], job(2, now, now + 12 * MS, 1), now); /* makes it */
    enqueue_ok(&s, &m.q[0], job(3, now, now + 30 * MS, 1), now);
    tjob *committed = job(4, now, now + 5 * MS, 1);
    committed->job.committed = true;
    enqueue_ok(&s, &m.q[0], committed, now);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_non_null(p.shed);
    assert_int_equal(id_of(p.shed), 1);
    assert_null(p.shed->next);
    assert_int_equal(p.n_jobs, 3);
    assert_int_equal(id_of(p.jobs), 4); /* committed first */
    assert_int_equal(id_of(p.jobs->next), 2);
    assert_int_equal(id_of(p.jobs->next->next), 3);
    free_plan(&p);

    /* with a 5 ms margin, 10 ms of work is predicted to miss a 12 ms deadline */
    c.edf_laxity_margin_us = 5000;
    pjs_sched_init(&s, &c);
    enqueue_ok(&s, &m.q[0], job(5, now, now + 12 * MS, 1), now);
    enqueue_ok(&s, &m.q[0], job(6, now, now + 16 * MS, 1), now);
    assert_true(pjs_sched_next(&s, now, &p));
    assert_int_equal(id_of(p.shed), 5);
    assert_int_equal(p.n_jobs, 1);
    assert_int_equal(id_of(p.jobs), 6);
    free_plan(&p);
}

/* Unmeasured costs never shed; a streak of sheds lets one job through to
 * re-measure an inflated estimate. */
static void test_edf_sheds_only_on_measured_costs(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_EDF);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m;
    model_init(&m, 1, 100, sizes_148, 3, false, 0, 50000);
    uint64_t now = 1000 * MS;
    /* the 1 ms/row prior would predict a miss of this 0.9 ms deadline */
    enqueue_ok(&s, &m.q[0], job(1, now, now + 900000, 1), now);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_null(p.shed);
    assert_int_equal(id_of(p.jobs), 1);
    execute(&s, &p, &now); /* measured: 50 us */
    free_plan(&p);
    /* one slow execution inflates the estimate to 20 ms */
    for (size_t k = 0; k < 3; k++)
        pjs_sched_seed_cost(&m.q[0], k, 20 * MS);
    /* every (PROBE + 1)-th job runs; each run pulls the moving average down */
    int shed = 0, ran = 0;
    double before = pjs_sched_estimate(&m.q[0], 0);
    for (int i = 0; i < 2 * (PJS_SCHED_SHED_PROBE + 1); i++) {
        enqueue_ok(&s, &m.q[0], job(10 + i, now, now + 1 * MS, 1), now);
        assert_true(pjs_sched_next(&s, now, &p));
        shed += p.shed != NULL;
        if (p.queue != NULL) {
            ran++;
            execute(&s, &p, &now); /* the probe: re-measured at 50 us */
        }
        free_plan(&p);
    }
    assert_int_equal(shed, 2 * PJS_SCHED_SHED_PROBE);
    assert_int_equal(ran, 2);
    assert_true(pjs_sched_estimate(&m.q[0], 0) < 0.7 * before);
}

/* ---- deadlines and limits ---------------------------------------------------- */

static void test_expired_dropped_at_admission_and_selection(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m;
    model_init(&m, 1, 100, sizes_148, 3, true, 1 * MS, 0);
    for (size_t k = 0; k < 3; k++)
        pjs_sched_seed_cost(&m.q[0], k, 1 * MS);
    uint64_t now = 100 * MS;
    pjs_error err;
    tjob *late = job(1, now, now, 1);
    assert_int_equal(pjs_sched_enqueue(&s, &m.q[0], &late->job, now, &err),
                     PJS_ERR_DEADLINE_EXCEEDED);
    free(late);
    assert_null(s.active);
    enqueue_ok(&s, &m.q[0], job(2, now, now + 5 * MS, 1), now);
    enqueue_ok(&s, &m.q[0], job(3, now, now + 50 * MS, 1), now);
    enqueue_ok(&s, &m.q[0], job(4, now, 0, 1), now);
    now += 10 * MS; /* job 2 expires while queued */
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_int_equal(id_of(p.expired), 2);
    assert_null(p.expired->next);
    assert_int_equal(p.n_jobs, 2);
    assert_int_equal(m.share.queued, 0);
    free_plan(&p);

    /* every job expired: a plan with nothing to execute */
    enqueue_ok(&s, &m.q[0], job(5, now, now + 1 * MS, 1), now);
    now += 2 * MS;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_null(p.queue);
    assert_int_equal(id_of(p.expired), 5);
    free_plan(&p);
    assert_false(pjs_sched_next(&s, now, &p));
}

static void test_queue_depth_per_model(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m, other;
    model_init(&m, 1, 3, sizes_148, 3, true, 1 * MS, 0);
    model_init(&other, 1, 3, sizes_148, 3, true, 1 * MS, 0);
    pjs_error err;
    enqueue_ok(&s, &m.q[0], job(1, 1, 0, 1), 1);
    enqueue_ok(&s, &m.q[1], job(2, 2, 0, 1), 2); /* the depth counts every variant */
    enqueue_ok(&s, &m.q[0], job(3, 3, 0, 1), 3);
    tjob *t = job(4, 4, 0, 1);
    assert_int_equal(pjs_sched_enqueue(&s, &m.q[0], &t->job, 4, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "queue is full (3 requests waiting)"));
    assert_int_equal(pjs_sched_enqueue(&s, &m.q[1], &t->job, 4, &err), PJS_ERR_RESOURCE_EXHAUSTED);
    enqueue_ok(&s, &other.q[0], job(5, 5, 0, 1), 5); /* other models are not affected */
    t->job.committed = true; /* committed jobs are exempt */
    enqueue_ok(&s, &m.q[0], t, 6);
    uint64_t now = 10;
    pjs_sched_plan p;
    while (pjs_sched_next(&s, now, &p)) {
        execute(&s, &p, &now);
        free_plan(&p);
    }
    enqueue_ok(&s, &m.q[0], job(6, now, 0, 1), now); /* room again */
    assert_true(pjs_sched_next(&s, now, &p));
    free_plan(&p);
}

/* ---- coalescing --------------------------------------------------------------- */

/* Queues `n` jobs of the given rows into q and returns the plan. */
static pjs_sched_plan plan_for(pjs_sched *s, pjs_sched_queue *q, const int64_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        enqueue_ok(s, q, job((int)i, i + 1, 0, rows[i]), i + 1);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(s, 100, &p));
    return p;
}

static void test_coalescing_sizes(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FIFO);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel flat, linear;
    /* a GPU-like cost: nearly flat in the batch size */
    model_init(&flat, 1, 100, sizes_148, 3, true, 0, 0);
    pjs_sched_seed_cost(&flat.q[0], 0, 1000);
    pjs_sched_seed_cost(&flat.q[0], 1, 1100);
    pjs_sched_seed_cost(&flat.q[0], 2, 1200);
    /* a CPU-like cost: proportional to the batch size */
    model_init(&linear, 1, 100, sizes_148, 3, true, 0, 0);
    for (size_t k = 0; k < 3; k++)
        pjs_sched_seed_cost(&linear.q[0], k, (uint64_t)(1000 * sizes_148[k]));

    const int64_t ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    /* 9 rows queued: the largest size is filled, the 9th waits */
    pjs_sched_plan p = plan_for(&s, &flat.q[0], ones, 9);
    assert_int_equal(p.batch_size, 8);
    assert_int_equal(p.rows, 8);
    assert_int_equal(p.n_jobs, 8);
    assert_int_equal(id_of(p.jobs), 0);
    assert_int_equal(flat.q[0].length, 1);
    free_plan(&p);
    drain(&s);
    /* 5 rows, flat cost: all five padded to 8 */
    p = plan_for(&s, &flat.q[0], ones, 5);
    assert_int_equal(p.batch_size, 8);
    assert_int_equal(p.rows, 5);
    free_plan(&p);
    drain(&s);
    /* 5 rows, linear cost: 4 exactly (same rate as 1, more rows), 1 waits */
    p = plan_for(&s, &linear.q[0], ones, 5);
    assert_int_equal(p.batch_size, 4);
    assert_int_equal(p.rows, 4);
    free_plan(&p);
    assert_true(pjs_sched_next(&s, 200, &p));
    assert_int_equal(p.batch_size, 1);
    assert_int_equal(id_of(p.jobs), 4);
    free_plan(&p);
    /* requests carrying several rows: the prefix stops at the first that
     * does not fit (FIFO), padding covers the rest */
    const int64_t threes[3] = {3, 3, 3};
    p = plan_for(&s, &flat.q[0], threes, 3);
    assert_int_equal(p.batch_size, 8);
    assert_int_equal(p.rows, 6);
    assert_int_equal(p.n_jobs, 2);
    free_plan(&p);
    drain(&s);
    /* the oldest is always served, even when it alone fills the largest size */
    const int64_t big_first[3] = {8, 1, 1};
    p = plan_for(&s, &linear.q[0], big_first, 3);
    assert_int_equal(p.batch_size, 8);
    assert_int_equal(p.n_jobs, 1);
    assert_int_equal(id_of(p.jobs), 0);
    free_plan(&p);
    drain(&s);
    /* one row against sizes {4, 8}: padded up to 4 */
    const int64_t sizes_48[] = {4, 8};
    tmodel padded;
    model_init(&padded, 1, 100, sizes_48, 2, true, 0, 0);
    p = plan_for(&s, &padded.q[0], ones, 1);
    assert_int_equal(p.batch_size, 4);
    assert_int_equal(p.rows, 1);
    free_plan(&p);
    /* a noisy warm-up that measured size 1 slower than size 2 does not pad
     * single rows to 2 for ever (regression): size 1 is capped at size 2's */
    const int64_t sizes_12[] = {1, 2};
    tmodel noisy;
    model_init(&noisy, 1, 100, sizes_12, 2, true, 0, 0);
    pjs_sched_seed_cost(&noisy.q[0], 0, 764000);
    pjs_sched_seed_cost(&noisy.q[0], 1, 656000);
    p = plan_for(&s, &noisy.q[0], ones, 1);
    assert_int_equal(p.batch_size, 1);
    free_plan(&p);
    /* no batch axis: one job per execution at the smallest size */
    tmodel single;
    model_init(&single, 1, 100, sizes_148, 3, false, 0, 0);
    p = plan_for(&s, &single.q[0], ones, 3);
    assert_int_equal(p.n_jobs, 1);
    assert_int_equal(p.batch_size, 1);
    free_plan(&p);
    drain(&s);
}

/* Only jobs of one queue (variant) execute together. */
static void test_variants_never_mix(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FIFO);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m;
    model_init(&m, 1, 100, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    uint64_t now = 0;
    for (int i = 0; i < 16; i++) {
        tjob *t = job(i, ++now, 0, 1);
        t->model = i % 2;
        enqueue_ok(&s, &m.q[i % 2], t, now);
    }
    pjs_sched_plan p;
    int served = 0;
    while (pjs_sched_next(&s, now, &p)) {
        for (pjs_sched_job *j = p.jobs; j != NULL; j = j->next)
            assert_int_equal(((tjob *)j)->model, (int)p.queue->variant);
        served += (int)p.n_jobs;
        execute(&s, &p, &now);
        free_plan(&p);
    }
    assert_int_equal(served, 16);
}

/* ---- committed ---------------------------------------------------------------- */

static void test_committed_dispatched_first(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel a, b;
    model_init(&a, 100, 100, sizes_148, 3, true, 1 * MS, 0);
    model_init(&b, 1, 100, sizes_148, 3, true, 1 * MS, 0);
    uint64_t now = 0;
    for (int i = 0; i < 20; i++)
        {
            now++;
            enqueue_ok(&s, &a.q[0], job(i, now, 0, 1), now);
        }
    for (int i = 20; i < 30; i++)
        {
            now++;
            enqueue_ok(&s, &b.q[0], job(i, now, 0, 1), now);
        }
    /* b has recently used far more than its share: fair would pick a */
    pjs_sched_record(&s, &b.q[0], 0, now, 500 * MS);
    tjob *t = job(99, ++now, 0, 1); /* arrives last */
    t->job.committed = true;
    enqueue_ok(&s, &b.q[0], t, now);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_ptr_equal(p.queue, &b.q[0]);
    assert_int_equal(id_of(p.jobs), 99); /* ahead of b's older jobs in the batch */
    assert_int_equal(p.n_jobs, 8);
    free_plan(&p);
    assert_int_equal(s.committed, 0);
    assert_true(pjs_sched_next(&s, now, &p));
    assert_ptr_equal(p.queue, &a.q[0]);
    free_plan(&p);
    drain(&s);
}

/* A job queued as an ordinary one and promoted later is dispatched like a
 * committed one; promoting a job no longer queued (or twice) does nothing. */
static void test_promoted_job_dispatched_first(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FIFO);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel a, b;
    model_init(&a, 1, 100, sizes_148, 3, true, 1 * MS, 0);
    model_init(&b, 1, 100, sizes_148, 3, true, 1 * MS, 0);
    uint64_t now = 0;
    for (int i = 0; i < 20; i++) {
        now++;
        enqueue_ok(&s, &a.q[0], job(i, now, 0, 1), now);
    }
    tjob *late = job(99, ++now, 0, 1); /* fifo would run it after all of a's */
    enqueue_ok(&s, &b.q[0], late, now);
    assert_true(pjs_sched_promote(&s, &b.q[0], &late->job));
    assert_false(pjs_sched_promote(&s, &b.q[0], &late->job)); /* committed already */
    assert_int_equal(s.committed, 1);
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&s, now, &p));
    assert_ptr_equal(p.queue, &b.q[0]);
    assert_int_equal(id_of(p.jobs), 99);
    free_plan(&p);
    assert_int_equal(s.committed, 0);
    tjob *gone = job(100, ++now, 0, 1); /* never queued in b */
    assert_false(pjs_sched_promote(&s, &b.q[0], &gone->job));
    free(gone);
    assert_int_equal(s.committed, 0);
    drain(&s);
}

/* ---- fair ----------------------------------------------------------------------- */

/* Runs `n_models` always-backlogged models for `seconds` of virtual time and
 * returns each one's device time and longest wait between its executions. */
static void run_backlogged(pjs_sched *s, tmodel *m, int n_models, double seconds,
                           double *device_s, double *max_gap_s)
{
    uint64_t now = 0, end = (uint64_t)(seconds * 1e9);
    uint64_t last[8] = {0};
    int id = 0;
    for (int i = 0; i < n_models; i++) {
        device_s[i] = 0;
        max_gap_s[i] = 0;
    }
    while (now < end) {
        for (int i = 0; i < n_models; i++)
            while (m[i].q[0].length < 16)
                enqueue_ok(s, &m[i].q[0], job(id++, now, 0, 1), now);
        pjs_sched_plan p;
        assert_true(pjs_sched_next(s, now, &p));
        tmodel *t = p.queue->owner;
        int i = (int)(t - m);
        double gap = (double)(now - last[i]) / 1e9;
        if (gap > max_gap_s[i])
            max_gap_s[i] = gap;
        uint64_t before = now;
        execute(s, &p, &now);
        device_s[i] += (double)(now - before) / 1e9;
        last[i] = now;
        free_plan(&p);
    }
    drain(s);
}

static void test_fair_converges_to_weights(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    /* weights 3 : 1, and the lighter model's executions cost 4x more */
    tmodel m[2];
    model_init(&m[0], 3, 1000, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    model_init(&m[1], 1, 1000, sizes_148, 3, true, 0.4 * MS, 4 * MS);
    double device[2], gap[2];
    run_backlogged(&s, m, 2, 60, device, gap);
    double share0 = device[0] / (device[0] + device[1]);
    printf("fair 3:1 -> device shares %.4f / %.4f\n", share0, 1 - share0);
    assert_true(fabs(share0 - 0.75) < 0.02);

    /* three models 1 : 2 : 5 with equal costs */
    pjs_sched_init(&s, &c);
    tmodel t[3];
    const double w[3] = {1, 2, 5};
    for (int i = 0; i < 3; i++)
        model_init(&t[i], w[i], 1000, sizes_148, 3, true, 0.2 * MS, 0.5 * MS);
    double dev3[3], gap3[3];
    run_backlogged(&s, t, 3, 60, dev3, gap3);
    double total = dev3[0] + dev3[1] + dev3[2];
    for (int i = 0; i < 3; i++) {
        printf("fair 1:2:5 -> model %d share %.4f (target %.4f)\n", i, dev3[i] / total, w[i] / 8);
        assert_true(fabs(dev3[i] / total - w[i] / 8) < 0.02);
    }
}

static void test_fair_never_starves(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m[2];
    model_init(&m[0], 100, 1000, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    model_init(&m[1], 1, 1000, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    double device[2], gap[2];
    run_backlogged(&s, m, 2, 60, device, gap);
    double share1 = device[1] / (device[0] + device[1]);
    printf("fair 100:1 -> light share %.4f, longest wait %.3f s\n", share1, gap[1]);
    assert_true(share1 > 0.005 && share1 < 0.02);
    /* the light model runs at least once per half-life */
    assert_true(gap[1] < c.half_life_s);
}

/* A model that starts sending after another ran alone is not locked out by
 * the other's past, nor does it take the device for longer than the clamp
 * allows. */
static void test_fair_newcomer(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m[2];
    model_init(&m[0], 1, 1000, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    model_init(&m[1], 1, 1000, sizes_148, 3, true, 0.1 * MS, 1 * MS);
    for (int i = 0; i < 2; i++) /* as the warm-up at load does */
        for (size_t k = 0; k < 3; k++)
            pjs_sched_seed_cost(&m[i].q[0], k, (uint64_t)m[i].cost_ns[k]);
    uint64_t now = 0;
    int id = 0;
    for (int round = 0; round < 2000; round++) { /* ~3.6 s of model 0 alone */
        enqueue_ok(&s, &m[0].q[0], job(id++, now, 0, 8), now);
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&s, now, &p));
        execute(&s, &p, &now);
        free_plan(&p);
    }
    for (int i = 0; i < 64; i++) {
        enqueue_ok(&s, &m[0].q[0], job(id++, now, 0, 8), now);
        enqueue_ok(&s, &m[1].q[0], job(id++, now, 0, 8), now);
    }
    /* the newcomer is owed time and runs first, but rejoins owed at most
     * fair_clamp executions: model 0 is not shut out */
    int runs[2] = {0, 0};
    pjs_sched_plan p;
    for (int i = 0; i < 40; i++) {
        assert_true(pjs_sched_next(&s, now, &p));
        if (i == 0)
            assert_ptr_equal(p.queue, &m[1].q[0]);
        runs[(tmodel *)p.queue->owner - m]++;
        execute(&s, &p, &now);
        free_plan(&p);
    }
    printf("fair newcomer: %d / %d executions of the first 40\n", runs[0], runs[1]);
    assert_true(runs[1] > runs[0]);
    assert_true(runs[0] >= 15);
    drain(&s);
}

/* ---- costs ---------------------------------------------------------------------- */

static void test_costs(void **state)
{
    (void)state;
    pjs_sched_config c = config(PJS_DISCIPLINE_FAIR);
    c.cost_smoothing = 0.5;
    pjs_sched s;
    pjs_sched_init(&s, &c);
    tmodel m;
    model_init(&m, 1, 10, sizes_148, 3, true, 0, 0);
    /* unmeasured: 1 ms per row */
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 2) - 8e6) < 1);
    pjs_sched_seed_cost(&m.q[0], 1, 4000);
    /* the nearest measured size, scaled by the batch size */
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 2) - 8000) < 1e-6);
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 0) - 1000) < 1e-6);
    pjs_sched_record(&s, &m.q[0], 1, 10, 6000);
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 1) - 5000) < 1e-6);
    /* an estimate too high is capped by the measured sizes: size 1 costs no
     * more than size 4 (run padded), size 8 no more than two runs of 4 */
    pjs_sched_seed_cost(&m.q[0], 0, 7000);
    pjs_sched_seed_cost(&m.q[0], 2, 30000);
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 0) - 5000) < 1e-6);
    assert_true(fabs(pjs_sched_estimate(&m.q[0], 2) - 10000) < 1e-6);
    /* recent utilization: a device kept busy for many half-lives is ~1 */
    uint64_t now = 0;
    for (int i = 0; i < 20000; i++) {
        now += 1000000;
        pjs_sched_record(&s, &m.q[0], 0, now, 1000000);
    }
    double u = pjs_sched_recent_utilization(&s, &m.share, now);
    assert_true(u > 0.95 && u <= 1.0);
    /* and decays once idle: half after one half-life */
    double later = pjs_sched_recent_utilization(&s, &m.share, now + (uint64_t)1e9);
    assert_true(fabs(later - u / 2) < 0.01);
}

/* ---- residency ------------------------------------------------------------------ */

/* Two models of one compiled size each (1, 4, 8 rows), 1 ms per execution:
 * `cold` with weights off the device (a 5 ms load), `warm` resident. */
typedef struct residency_pair {
    pjs_sched s;
    tmodel cold, warm;
} residency_pair;

static void pair_init(residency_pair *r, pjs_discipline d, double defer_ms)
{
    pjs_sched_config c = config(d);
    c.cold_model_defer_ms = defer_ms;
    pjs_sched_init(&r->s, &c);
    model_init(&r->cold, 1, 100, sizes_148, 3, true, 0, 1 * MS);
    model_init(&r->warm, 1, 100, sizes_148, 3, true, 0, 1 * MS);
    for (size_t k = 0; k < 3; k++) {
        pjs_sched_seed_cost(&r->cold.q[0], k, 1 * MS);
        pjs_sched_seed_cost(&r->warm.q[0], k, 1 * MS);
    }
    r->cold.share.cold = true;
    r->cold.share.load_ns = 5 * MS;
}

/* Decides the next plan (there must be one) and checks which model runs it
 * and with how many jobs; executes it on the fake device. */
static void expect_next(residency_pair *r, uint64_t *now, tmodel *who, size_t n_jobs)
{
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&r->s, *now, &p));
    assert_ptr_equal(p.queue, &who->q[0]);
    assert_int_equal(p.n_jobs, n_jobs);
    execute(&r->s, &p, now);
    if (who->share.cold) { /* the dispatcher loads it */
        *now += (uint64_t)who->share.load_ns;
        pjs_sched_charge_load(&r->s, &who->share, *now, (uint64_t)who->share.load_ns);
        who->share.cold = false;
    }
    free_plan(&p);
}

/* fifo would serve the cold model's older request first; deferred, it waits
 * while the resident model has work, gathers a second request, and one
 * load serves both. */
static void test_cold_model_deferred_behind_resident_work(void **state)
{
    (void)state;
    residency_pair r;
    pair_init(&r, PJS_DISCIPLINE_FIFO, 10);
    uint64_t now = 100 * MS;
    enqueue_ok(&r.s, &r.cold.q[0], job(1, now, 0, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(2, now + 1, 0, 1), now + 1);
    now += 2;
    expect_next(&r, &now, &r.warm, 1);
    enqueue_ok(&r.s, &r.cold.q[0], job(3, now, 0, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(4, now, 0, 1), now);
    expect_next(&r, &now, &r.warm, 1);
    expect_next(&r, &now, &r.cold, 2); /* no resident work left: one load, two requests */
    assert_false(r.cold.share.cold);
    pjs_sched_plan p;
    assert_false(pjs_sched_next(&r.s, now, &p));

    /* off: the discipline's choice stands */
    pair_init(&r, PJS_DISCIPLINE_FIFO, 0);
    now = 100 * MS;
    enqueue_ok(&r.s, &r.cold.q[0], job(1, now, 0, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(2, now + 1, 0, 1), now + 1);
    now += 2;
    expect_next(&r, &now, &r.cold, 1);
    expect_next(&r, &now, &r.warm, 1);
}

/* Runs the resident model (always with a request queued) until the cold
 * model's request runs; counts the resident runs and those whose plan
 * named the cold queue as due for a copy beside them. */
static void run_until_cold(residency_pair *r, uint64_t *now, int *warm_runs, int *due_runs)
{
    *warm_runs = *due_runs = 0;
    for (;;) {
        if (r->warm.share.queued == 0)
            enqueue_ok(&r->s, &r->warm.q[0], job(100 + *warm_runs, *now, 0, 1), *now);
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&r->s, *now, &p));
        bool cold_ran = p.queue == &r->cold.q[0];
        if (cold_ran) {
            assert_null(p.cold_due);
        } else {
            *warm_runs += 1;
            if (p.cold_due != NULL) {
                assert_ptr_equal(p.cold_due, &r->cold.q[0]);
                *due_runs += 1;
            }
        }
        execute(&r->s, &p, now);
        free_plan(&p);
        if (cold_ran)
            break;
    }
}

/* The deferral ends once the cold model's oldest request has waited the
 * bound, however much resident work is queued. Without weight_prefetch
 * the cold model then runs (and loads); with it, resident work runs for up
 * to one bound more, each plan naming the cold queue so its weights are
 * copied beside. */
static void test_cold_deferral_bounded_by_wait(void **state)
{
    (void)state;
    /* without prefetch: 1 ms executions at 100, 101, 102 and 103 ms; at 104
     * the cold request has waited 4 >= 3.5. With it: due at 104, 105 and
     * 106 ms; at 107 it has waited 7 >= 2 x 3.5 */
    static const struct {
        bool prefetch;
        int warm_runs, due_runs;
    } cases[] = {{false, 4, 0}, {true, 7, 3}};
    residency_pair r;
    uint64_t now;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pair_init(&r, PJS_DISCIPLINE_FIFO, 3.5);
        r.s.cfg.weight_prefetch = cases[c].prefetch;
        now = 100 * MS;
        enqueue_ok(&r.s, &r.cold.q[0], job(1, now, 0, 1), now);
        int warm_runs, due_runs;
        run_until_cold(&r, &now, &warm_runs, &due_runs);
        assert_int_equal(warm_runs, cases[c].warm_runs);
        assert_int_equal(due_runs, cases[c].due_runs);
        drain(&r.s);
    }

    /* once its copy made it resident, it runs at its next turn */
    pair_init(&r, PJS_DISCIPLINE_FIFO, 3.5);
    now = 100 * MS;
    enqueue_ok(&r.s, &r.cold.q[0], job(1, now, 0, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(2, now + 1, 0, 1), now + 1);
    now += 4 * MS;
    pjs_sched_plan p;
    assert_true(pjs_sched_next(&r.s, now, &p));
    assert_ptr_equal(p.queue, &r.warm.q[0]);
    assert_ptr_equal(p.cold_due, &r.cold.q[0]);
    execute(&r.s, &p, &now);
    free_plan(&p);
    r.cold.share.cold = false; /* the copy beside it is done */
    enqueue_ok(&r.s, &r.warm.q[0], job(3, now, 0, 1), now);
    expect_next(&r, &now, &r.cold, 1);
    drain(&r.s);
}

/* Deferring never makes a deadline miss: a cold request whose deadline
 * leaves no room for a resident execution ahead of its load runs first. */
static void test_cold_deferral_keeps_deadlines(void **state)
{
    (void)state;
    residency_pair r;
    pair_init(&r, PJS_DISCIPLINE_FIFO, 10);
    uint64_t now = 100 * MS;
    /* load 5 + own 1 = 6 ms: with 1 ms ahead it needs 7 ms; it has 6.5 */
    enqueue_ok(&r.s, &r.cold.q[0], job(1, now, now + 6 * MS + MS / 2, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(2, now + 1, 0, 1), now + 1);
    expect_next(&r, &now, &r.cold, 1);
    expect_next(&r, &now, &r.warm, 1);

    /* 7.5 ms leaves room: deferred */
    pair_init(&r, PJS_DISCIPLINE_FIFO, 10);
    now = 100 * MS;
    enqueue_ok(&r.s, &r.cold.q[0], job(1, now, now + 7 * MS + MS / 2, 1), now);
    enqueue_ok(&r.s, &r.warm.q[0], job(2, now + 1, 0, 1), now + 1);
    expect_next(&r, &now, &r.warm, 1);
    expect_next(&r, &now, &r.cold, 1);
}

/* When every queued model is cold, the discipline's choice runs at once. */
static void test_all_cold_runs_the_disciplines_choice(void **state)
{
    (void)state;
    residency_pair r;
    pair_init(&r, PJS_DISCIPLINE_FIFO, 10);
    r.warm.share.cold = true;
    r.warm.share.load_ns = 5 * MS;
    uint64_t now = 100 * MS;
    enqueue_ok(&r.s, &r.warm.q[0], job(1, now, 0, 1), now);
    enqueue_ok(&r.s, &r.cold.q[0], job(2, now + 1, 0, 1), now + 1);
    now += 2;
    expect_next(&r, &now, &r.warm, 1);
    expect_next(&r, &now, &r.cold, 1);
}

/* edf counts a cold model's load in the laxity: a request that its
 * execution alone would serve in time is shed when the load comes first. */
static void test_edf_laxity_counts_the_load(void **state)
{
    (void)state;
    for (int cold = 0; cold < 2; cold++) {
        residency_pair r;
        pair_init(&r, PJS_DISCIPLINE_EDF, 0);
        r.cold.share.cold = cold;
        uint64_t now = 100 * MS;
        enqueue_ok(&r.s, &r.cold.q[0], job(1, now, now + 3 * MS, 1), now);
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&r.s, now, &p));
        if (cold) {
            assert_null(p.queue);
            assert_int_equal(id_of(p.shed), 1);
        } else {
            assert_int_equal(p.n_jobs, 1);
            assert_null(p.shed);
        }
        free_plan(&p);
    }
}

/* fair: a load is device time charged to the model that needed it, so a
 * model that keeps missing gets fewer executions than one that hits, at
 * equal weights, and its cost includes the load. */
static void test_fair_charges_loads(void **state)
{
    (void)state;
    residency_pair r;
    pair_init(&r, PJS_DISCIPLINE_FAIR, 0);
    uint64_t now = 100 * MS;
    int served[2] = {0, 0};
    for (int step = 0; step < 600; step++) {
        /* both always have work queued */
        if (r.cold.share.queued == 0)
            enqueue_ok(&r.s, &r.cold.q[0], job(step, now, 0, 1), now);
        if (r.warm.share.queued == 0)
            enqueue_ok(&r.s, &r.warm.q[0], job(step, now, 0, 1), now);
        pjs_sched_plan p;
        assert_true(pjs_sched_next(&r.s, now, &p));
        tmodel *who = p.queue->owner;
        served[who == &r.cold]++;
        execute(&r.s, &p, &now);
        free_plan(&p);
        if (who == &r.cold) { /* it misses every time: loads, then is evicted */
            now += 5 * MS;
            pjs_sched_charge_load(&r.s, &r.cold.share, now, 5 * MS);
        }
    }
    /* equal device time: 1 ms per warm execution, 6 ms per cold one */
    double ratio = (double)served[0] / served[1];
    assert_true(ratio > 4.5 && ratio < 7.5);
    assert_true(fabs(r.cold.share.load_ns - 5 * MS) < 1);
    drain(&r.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults_and_checks),
        cmocka_unit_test(test_fifo_global_arrival_order),
        cmocka_unit_test(test_fifo_coalesced_batches_start_with_oldest),
        cmocka_unit_test(test_edf_orders_by_deadline),
        cmocka_unit_test(test_edf_sheds_predicted_misses),
        cmocka_unit_test(test_edf_sheds_only_on_measured_costs),
        cmocka_unit_test(test_expired_dropped_at_admission_and_selection),
        cmocka_unit_test(test_queue_depth_per_model),
        cmocka_unit_test(test_coalescing_sizes),
        cmocka_unit_test(test_variants_never_mix),
        cmocka_unit_test(test_committed_dispatched_first),
        cmocka_unit_test(test_promoted_job_dispatched_first),
        cmocka_unit_test(test_fair_converges_to_weights),
        cmocka_unit_test(test_fair_never_starves),
        cmocka_unit_test(test_fair_newcomer),
        cmocka_unit_test(test_costs),
        cmocka_unit_test(test_cold_model_deferred_behind_resident_work),
        cmocka_unit_test(test_cold_deferral_bounded_by_wait),
        cmocka_unit_test(test_cold_deferral_keeps_deadlines),
        cmocka_unit_test(test_all_cold_runs_the_disciplines_choice),
        cmocka_unit_test(test_edf_laxity_counts_the_load),
        cmocka_unit_test(test_fair_charges_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
