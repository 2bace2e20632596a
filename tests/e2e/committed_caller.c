/*
 * committed_caller.c - drives the committed-request class of the server API
 * (pjs_server_submit_committed, what meta models will use for their
 * sub-calls) against a real pjs_server: PJRT plugin, compiled bundles, the
 * dispatch thread and completion threads.
 *
 *   committed_caller REPOSITORY [PLUGIN [CACHE_DIR]]
 *
 * REPOSITORY holds the demo bundles mlp and two_io (others are loaded too
 * but not used). PLUGIN defaults to the server's default (the CPU plugin of
 * the project's .venv, or $PJSERVE_PJRT_PLUGIN); CACHE_DIR to the default
 * executable cache. The server runs the fifo discipline, so without the
 * committed class every request would run in arrival order, with a per-model
 * policy giving two_io a queue depth of 1. Checks, one line each:
 *
 *   a. 300 mlp requests (8 rows each, one execution each) are flooded into
 *      the queue from 4 threads, then one committed two_io request is
 *      submitted: it completes before at least half of the mlp requests
 *      still queued ahead of it (at least MIN_QUEUED_AHEAD of them, else the
 *      round is retried).
 *   b. while that committed request is in flight, a second committed submit
 *      by the same caller fails FAILED_PRECONDITION; after it completed the
 *      caller submits again successfully.
 *   c. with two_io's queue at its depth (1: a normal request waiting behind
 *      a new flood) another normal two_io request is refused
 *      RESOURCE_EXHAUSTED but a committed one is accepted, and completes.
 *   d. a committed request whose deadline already passed is refused
 *      DEADLINE_EXCEEDED, and its caller is free again afterwards.
 *
 * Every accepted request is checked for success and the size of its
 * outputs (two_io also for argmax agreeing with sum). Exits 0 when every
 * check passed, 1 otherwise, 2 when the server cannot be created.
 * tests/e2e/test_committed.py runs it; it is built with the other test
 * programs but is not a ctest test (it needs the exported demo bundles).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/infer.h"
#include "registry/model.h"
#include "server/config.h"
#include "server/server.h"

#define FLOOD_REQUESTS 300
#define FLOOD_THREADS 4
#define FLOOD_ROWS 8          /* mlp's largest compiled size: one execution each */
/* Check a: of the flood requests still queued when the committed one is
 * submitted, at least half must complete after it (in arrival order none
 * would). Not all: those already executing, or executed and waiting for
 * their completion to run, finish first, and on a busy machine a clean
 * clone's make test once saw 77 of 222 do so. With fewer than
 * MIN_QUEUED_AHEAD still queued the flood drained first and the round
 * proves nothing. */
#define MIN_QUEUED_AHEAD 100
#define ROUNDS 5              /* attempts at a timing-dependent check before giving up */
#define WAIT_SECONDS 120      /* longest wait for any completion */

/* ---- requests ---------------------------------------------------------------- */

/* Shared by every request of the program: completion order and a condition
 * variable to wait on. */
typedef struct tracker {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t completed; /* on_done calls so far; also the next sequence number */
} tracker;

typedef struct sreq {
    pjs_infer_request r;
    tracker *t;
    const char *model;
    int64_t rows;
    void *buf[2];        /* input bytes */
    bool submitted;      /* accepted by the server: on_done will run */
    bool done;           /* under t->lock */
    uint64_t seq;        /* completion order, under t->lock */
} sreq;

static void on_done(pjs_infer_request *r)
{
    sreq *q = r->frontend_ctx;
    pthread_mutex_lock(&q->t->lock);
    q->seq = q->t->completed++;
    q->done = true;
    pthread_cond_broadcast(&q->t->cond);
    pthread_mutex_unlock(&q->t->lock);
}

/* A synthetic request for mlp (x: rows x 16 f32) or two_io (a: rows x 8
 * f32, b: rows x 3 i32), with its own model reference. */
static sreq *sreq_new(pjs_server *s, tracker *t, const char *model, int64_t rows, unsigned seed)
{
    sreq *q = calloc(1, sizeof *q);
    if (q == NULL)
        return NULL;
    pjs_infer_request_init(&q->r);
    q->t = t;
    q->model = model;
    q->rows = rows;
    pjs_error err;
    if (pjs_server_get_model(s, model, NULL, &q->r.model, &err) != 0) {
        fprintf(stderr, "committed_caller: %s\n", err.msg);
        free(q);
        return NULL;
    }
    bool mlp = strcmp(model, "mlp") == 0;
    size_t n_in = mlp ? 1 : 2;
    static const char *const names_mlp[] = {"x"}, *const names_two[] = {"a", "b"};
    static const char *const types_mlp[] = {"FP32"}, *const types_two[] = {"FP32", "INT32"};
    static const int64_t cols_mlp[] = {16}, cols_two[] = {8, 3};
    for (size_t i = 0; i < n_in; i++) {
        int64_t cols = mlp ? cols_mlp[i] : cols_two[i];
        size_t n = (size_t)(rows * cols);
        q->buf[i] = malloc(n * 4);
        if (q->buf[i] == NULL)
            abort();
        for (size_t k = 0; k < n; k++) {
            unsigned v = (seed + 7919u * (unsigned)k + 104729u * (unsigned)i) % 2001u;
            if (!mlp && i == 1)
                ((int32_t *)q->buf[i])[k] = (int32_t)(v % 11) - 5;
            else
                ((float *)q->buf[i])[k] = ((float)v - 1000.0f) / 500.0f;
        }
        pjs_infer_input *in = &q->r.inputs[i];
        in->name = mlp ? names_mlp[i] : names_two[i];
        in->datatype = mlp ? types_mlp[i] : types_two[i];
        in->shape.rank = 2;
        in->shape.dims[0] = rows;
        in->shape.dims[1] = cols;
        in->data = q->buf[i];
        in->nbytes = n * 4;
    }
    q->r.n_inputs = n_in;
    q->r.on_done = on_done;
    q->r.frontend_ctx = q;
    return q;
}

static void sreq_free(sreq *q)
{
    if (q == NULL)
        return;
    pjs_infer_request_release(&q->r);
    pjs_model_unref(q->r.model);
    free(q->buf[0]);
    free(q->buf[1]);
    free(q);
}

/* Waits until q completed; false after WAIT_SECONDS. */
static bool sreq_wait(sreq *q)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_SECONDS;
    bool done;
    pthread_mutex_lock(&q->t->lock);
    while (!q->done && pthread_cond_timedwait(&q->t->cond, &q->t->lock, &until) == 0)
        ;
    done = q->done;
    pthread_mutex_unlock(&q->t->lock);
    return done;
}

static bool sreq_is_done(sreq *q)
{
    pthread_mutex_lock(&q->t->lock);
    bool done = q->done;
    pthread_mutex_unlock(&q->t->lock);
    return done;
}

/* Whether a completed request succeeded with outputs of the right sizes;
 * writes why not into why. */
static bool sreq_ok(const sreq *q, char *why, size_t size)
{
    const pjs_infer_request *r = &q->r;
    if (r->error.code != PJS_OK) {
        snprintf(why, size, "%s request failed: %s: %s", q->model,
                 pjs_status_name(r->error.code), r->error.msg);
        return false;
    }
    bool mlp = strcmp(q->model, "mlp") == 0;
    size_t want_n = mlp ? 1 : 2;
    size_t want_bytes[2] = {(size_t)q->rows * (mlp ? 4 : 8) * 4, (size_t)q->rows * 4};
    if (r->n_outputs != want_n) {
        snprintf(why, size, "%s request: %zu outputs, expected %zu", q->model, r->n_outputs,
                 want_n);
        return false;
    }
    for (size_t o = 0; o < want_n; o++)
        if (r->outputs[o].data == NULL || r->outputs[o].nbytes != want_bytes[o]) {
            snprintf(why, size, "%s request: output %zu has %zu bytes, expected %zu", q->model,
                     o, r->outputs[o].nbytes, want_bytes[o]);
            return false;
        }
    if (!mlp) { /* argmax must be the index of the largest sum in each row */
        const float *sum = r->outputs[0].data;
        const int32_t *arg = r->outputs[1].data;
        for (int64_t i = 0; i < q->rows; i++) {
            int32_t best = 0;
            for (int32_t k = 1; k < 8; k++)
                if (sum[i * 8 + k] > sum[i * 8 + best])
                    best = k;
            if (arg[i] != best) {
                snprintf(why, size, "two_io row %lld: argmax %d, but sum peaks at %d",
                         (long long)i, (int)arg[i], (int)best);
                return false;
            }
        }
    }
    return true;
}

/* ---- reporting --------------------------------------------------------------- */

static int failures;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (!ok)
        failures++;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("      ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

/* ---- the flood ------------------------------------------------------------------ */

typedef struct flood {
    pjs_server *s;
    tracker *t;
    sreq *reqs[FLOOD_REQUESTS];
    pthread_barrier_t start;
    atomic_int refused;
    char refusal[PJS_ERROR_MSG_MAX + 64];
    pthread_mutex_t refusal_lock;
} flood;

typedef struct flood_arg {
    flood *f;
    int index;
} flood_arg;

static void *flood_main(void *arg)
{
    flood_arg *a = arg;
    flood *f = a->f;
    pthread_barrier_wait(&f->start);
    for (int i = a->index; i < FLOOD_REQUESTS; i += FLOOD_THREADS) {
        pjs_error err;
        sreq *q = f->reqs[i];
        if (pjs_server_submit(f->s, &q->r, &err) == 0) {
            q->submitted = true;
            continue;
        }
        atomic_fetch_add(&f->refused, 1);
        pthread_mutex_lock(&f->refusal_lock);
        snprintf(f->refusal, sizeof f->refusal, "%s: %s", pjs_status_name(err.code), err.msg);
        pthread_mutex_unlock(&f->refusal_lock);
    }
    return NULL;
}

/* Prepares FLOOD_REQUESTS mlp requests and submits them from FLOOD_THREADS
 * threads at once; returns after every submit returned. */
static bool flood_start(flood *f, pjs_server *s, tracker *t, unsigned seed)
{
    memset(f, 0, sizeof *f);
    f->s = s;
    f->t = t;
    pthread_mutex_init(&f->refusal_lock, NULL);
    for (int i = 0; i < FLOOD_REQUESTS; i++)
        if ((f->reqs[i] = sreq_new(s, t, "mlp", FLOOD_ROWS, seed + (unsigned)i)) == NULL)
            return false;
    pthread_barrier_init(&f->start, NULL, FLOOD_THREADS + 1);
    pthread_t th[FLOOD_THREADS];
    flood_arg args[FLOOD_THREADS];
    for (int i = 0; i < FLOOD_THREADS; i++) {
        args[i] = (flood_arg){f, i};
        if (pthread_create(&th[i], NULL, flood_main, &args[i]) != 0)
            abort();
    }
    pthread_barrier_wait(&f->start);
    for (int i = 0; i < FLOOD_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&f->start);
    return true;
}

/* Waits for every accepted flood request, checks each, frees them all. */
static void flood_finish(flood *f, const char *label)
{
    int ok = 0, accepted = 0;
    char first_bad[PJS_ERROR_MSG_MAX + 64] = "";
    for (int i = 0; i < FLOOD_REQUESTS; i++) {
        sreq *q = f->reqs[i];
        if (q == NULL || !q->submitted)
            continue;
        accepted++;
        char why[PJS_ERROR_MSG_MAX + 64];
        if (!sreq_wait(q))
            snprintf(why, sizeof why, "mlp request %d did not complete in %d s", i,
                     WAIT_SECONDS);
        else if (sreq_ok(q, why, sizeof why))
            ok++;
        if (ok != accepted && first_bad[0] == '\0')
            snprintf(first_bad, sizeof first_bad, "%s", why);
    }
    int refused = atomic_load(&f->refused);
    check(refused == 0 && ok == accepted,
          "%s: %d of %d flooded mlp requests accepted and answered correctly%s%s%s%s", label,
          ok, FLOOD_REQUESTS, refused ? "; refused: " : "", refused ? f->refusal : "",
          first_bad[0] ? "; first failure: " : "", first_bad);
    for (int i = 0; i < FLOOD_REQUESTS; i++)
        sreq_free(f->reqs[i]);
    pthread_mutex_destroy(&f->refusal_lock);
}

/* ---- the checks ------------------------------------------------------------------ */

/* A committed two_io request that must succeed; returns it completed (or
 * NULL after a failed check). */
static sreq *committed_roundtrip(pjs_server *s, tracker *t, pjs_committed_caller *caller,
                                 const char *label, unsigned seed)
{
    sreq *q = sreq_new(s, t, "two_io", 1, seed);
    if (q == NULL) {
        check(false, "%s: cannot build a two_io request", label);
        return NULL;
    }
    pjs_error err;
    int rc = pjs_server_submit_committed(s, &q->r, caller, &err);
    if (rc != 0) {
        check(false, "%s: committed submit refused: %s: %s", label, pjs_status_name(rc),
              err.msg);
        sreq_free(q);
        return NULL;
    }
    char why[PJS_ERROR_MSG_MAX + 64];
    bool ok = sreq_wait(q) && sreq_ok(q, why, sizeof why);
    check(ok, "%s: committed two_io request accepted and answered%s%s", label, ok ? "" : ": ",
          ok ? "" : (q->done ? why : "no completion"));
    return q;
}

/* d: a deadline in the past refuses a committed request at admission. */
static void check_expired_deadline(pjs_server *s, tracker *t)
{
    pjs_committed_caller caller = {0};
    sreq *q = sreq_new(s, t, "two_io", 1, 11);
    if (q == NULL) {
        check(false, "d: cannot build a two_io request");
        return;
    }
    uint64_t now = pjs_now_ns();
    q->r.deadline_ns = now > 1000000 ? now - 1000000 : 1; /* passed 1 ms ago */
    pjs_error err;
    int rc = pjs_server_submit_committed(s, &q->r, &caller, &err);
    check(rc == PJS_ERR_DEADLINE_EXCEEDED && strstr(err.msg, "two_io") != NULL,
          "d: committed request with a passed deadline refused DEADLINE_EXCEEDED naming the "
          "model (got %s: %s)",
          pjs_status_name(rc), rc ? err.msg : "accepted");
    if (rc == 0)
        sreq_wait(q);
    sreq_free(q);
    check(!atomic_load(&caller.in_flight),
          "d: the caller is not left in flight by the refused request");
    sreq_free(committed_roundtrip(s, t, &caller, "d", 12));
}

/* a + b, one attempt. Returns false when the attempt was inconclusive (the
 * flood drained before the committed request was submitted). */
static bool check_ahead_of_flood(pjs_server *s, tracker *t, int round, bool last_round)
{
    pthread_mutex_lock(&t->lock);
    uint64_t seq_base = t->completed;
    pthread_mutex_unlock(&t->lock);
    flood f;
    if (!flood_start(&f, s, t, 1000u * (unsigned)round)) {
        check(false, "a: cannot build the flood");
        return true;
    }
    pjs_committed_caller caller = {0};
    sreq *first = sreq_new(s, t, "two_io", 1, 21);
    sreq *second = sreq_new(s, t, "two_io", 1, 22);
    if (first == NULL || second == NULL)
        abort();

    pthread_mutex_lock(&t->lock);
    uint64_t seq_at_submit = t->completed;
    pthread_mutex_unlock(&t->lock);
    pjs_error err;
    int rc = pjs_server_submit_committed(s, &first->r, &caller, &err);
    if (rc != 0) {
        check(false, "a: committed two_io submit refused: %s: %s", pjs_status_name(rc),
              err.msg);
        flood_finish(&f, "a");
        sreq_free(first);
        sreq_free(second);
        return true;
    }
    first->submitted = true;

    /* b: the same caller again, at once. */
    uint64_t second_at = pjs_now_ns();
    int rc2 = pjs_server_submit_committed(s, &second->r, &caller, &err);
    char err2[PJS_ERROR_MSG_MAX];
    snprintf(err2, sizeof err2, "%s", rc2 ? err.msg : "");
    second->submitted = rc2 == 0;

    char why[PJS_ERROR_MSG_MAX + 64] = "no completion";
    bool first_ok = sreq_wait(first) && sreq_ok(first, why, sizeof why);
    check(first_ok, "a: committed two_io request answered%s%s", first_ok ? "" : ": ",
          first_ok ? "" : why);
    if (second->submitted)
        sreq_wait(second);

    /* Flood requests that completed before the committed one. */
    int before = 0, flooded = 0;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < FLOOD_REQUESTS; i++) {
        sreq *q = f.reqs[i];
        if (!q->submitted)
            continue;
        flooded++;
        before += q->done && q->seq < first->seq;
    }
    /* Only flood requests were in flight between the two snapshots. */
    int drained_at_submit = (int)(seq_at_submit - seq_base);
    pthread_mutex_unlock(&t->lock);
    int behind = flooded - before;
    /* Only flood requests completed until the submit: what was left of the
     * flood then is what the committed request had to overtake. */
    int queued_ahead = flooded - drained_at_submit;
    bool inconclusive = queued_ahead < MIN_QUEUED_AHEAD;
    if (inconclusive && !last_round) {
        note("a: round %d inconclusive: %d of %d flood requests had completed before the "
             "committed request was submitted; retrying",
             round, drained_at_submit, flooded);
    } else {
        check(2 * behind >= queued_ahead && queued_ahead >= MIN_QUEUED_AHEAD,
              "a: committed two_io request completed before %d of the %d mlp requests still "
              "queued ahead of it (at least %d required; %d of %d had completed when it was "
              "submitted)",
              behind, queued_ahead, (queued_ahead + 1) / 2, drained_at_submit, flooded);
    }

    /* b: the second submit must have been refused, unless the first had
     * already finished executing when it was made. */
    if (rc2 == PJS_ERR_FAILED_PRECONDITION) {
        check(strstr(err2, "in flight") != NULL && strstr(err2, "two_io") != NULL,
              "b: second committed submit while the first is in flight refused "
              "FAILED_PRECONDITION (%s)",
              err2);
    } else if (rc2 == 0 && first->r.times.output_done != 0 &&
               first->r.times.output_done <= second_at && !last_round) {
        note("b: round %d inconclusive: the first committed request had finished before the "
             "second submit; retrying",
             round);
        inconclusive = true;
    } else {
        check(false,
              "b: second committed submit while the first is in flight: expected "
              "FAILED_PRECONDITION, got %s%s%s",
              pjs_status_name(rc2), rc2 ? ": " : " (accepted)", err2);
    }
    sreq_free(second);
    sreq_free(first);
    flood_finish(&f, "a");
    if (!inconclusive) {
        check(!atomic_load(&caller.in_flight), "b: the caller is free once its request completed");
        sreq_free(committed_roundtrip(s, t, &caller, "b: after completion", 23));
    }
    return !inconclusive;
}

/* c, one attempt; false when inconclusive (the waiting two_io request ran
 * before the committed one was submitted). */
static bool check_depth_exempt(pjs_server *s, tracker *t, int round, bool last_round)
{
    flood f;
    if (!flood_start(&f, s, t, 5000u + 1000u * (unsigned)round)) {
        check(false, "c: cannot build the flood");
        return true;
    }
    sreq *waiting = sreq_new(s, t, "two_io", 1, 31);
    sreq *refused = sreq_new(s, t, "two_io", 1, 32);
    sreq *committed = sreq_new(s, t, "two_io", 1, 33);
    if (waiting == NULL || refused == NULL || committed == NULL)
        abort();
    pjs_committed_caller caller = {0};
    pjs_error err;
    bool conclusive = true;

    int rc = pjs_server_submit(s, &waiting->r, &err);
    waiting->submitted = rc == 0;
    check(rc == 0, "c: a normal two_io request is queued behind the flood (%s%s%s)",
          pjs_status_name(rc), rc ? ": " : "", rc ? err.msg : "");
    int rc_full = pjs_server_submit(s, &refused->r, &err);
    char msg_full[PJS_ERROR_MSG_MAX];
    snprintf(msg_full, sizeof msg_full, "%s", rc_full ? err.msg : "accepted");
    refused->submitted = rc_full == 0;
    int rc_c = pjs_server_submit_committed(s, &committed->r, &caller, &err);
    char msg_c[PJS_ERROR_MSG_MAX];
    snprintf(msg_c, sizeof msg_c, "%s", rc_c ? err.msg : "accepted");
    committed->submitted = rc_c == 0;
    bool waiting_still_queued = !sreq_is_done(waiting);

    if (rc != 0 || rc_full != PJS_ERR_RESOURCE_EXHAUSTED || !waiting_still_queued) {
        /* The queue was not full when the committed request came. */
        conclusive = last_round;
        if (!conclusive)
            note("c: round %d inconclusive: two_io's queue was not full (%s, %s); retrying",
                 round, pjs_status_name(rc_full), waiting_still_queued ? "waiting" : "ran");
    }
    if (conclusive) {
        check(rc_full == PJS_ERR_RESOURCE_EXHAUSTED && strstr(msg_full, "two_io") != NULL,
              "c: a second normal two_io request is refused RESOURCE_EXHAUSTED at depth 1 (%s)",
              msg_full);
        check(rc_c == 0,
              "c: a committed two_io request is accepted with the model's queue at its depth "
              "(%s)",
              msg_c);
    }
    sreq *mine[] = {waiting, refused, committed};
    static const char *const labels[] = {"the waiting normal", "the refused normal",
                                         "the committed"};
    for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) {
        char why[PJS_ERROR_MSG_MAX + 64] = "no completion";
        if (mine[i]->submitted) {
            bool ok = sreq_wait(mine[i]) && sreq_ok(mine[i], why, sizeof why);
            if (conclusive || !ok)
                check(ok, "c: %s two_io request answered%s%s", labels[i], ok ? "" : ": ",
                      ok ? "" : why);
        }
        sreq_free(mine[i]);
    }
    flood_finish(&f, "c");
    return conclusive;
}

/* ---- main ----------------------------------------------------------------------- */

static int configure(pjs_server_config *c)
{
    static const char *const settings[][2] = {
        {"scheduler.discipline", "fifo"},
        {"scheduler.max_queue_depth", "4096"},
        {"models.two_io.max_queue_depth", "1"},
    };
    pjs_error err;
    pjs_server_config_init(c);
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++)
        if (pjs_server_config_set(c, settings[i][0], settings[i][1], "committed_caller",
                                  &err) != 0) {
            fprintf(stderr, "committed_caller: %s\n", err.msg);
            return -1;
        }
    if (pjs_server_config_check(c, &err) != 0) {
        fprintf(stderr, "committed_caller: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s REPOSITORY [PLUGIN [CACHE_DIR]]\n", argv[0]);
        return 2;
    }
    pjs_server_config config;
    if (configure(&config) != 0)
        return 2;
    pjs_server_options o = {
        .repository = argv[1],
        .plugin_path = argc > 2 && argv[2][0] ? argv[2] : NULL,
        .cache_dir = argc > 3 ? argv[3] : NULL,
        .dispatch_workers = 4,
        .config = &config,
    };
    pjs_server *s = NULL;
    pjs_error err;
    if (pjs_server_create(&o, &s, &err) != 0) {
        fprintf(stderr, "committed_caller: cannot create the server: %s\n", err.msg);
        pjs_server_config_free(&config);
        return 2;
    }
    printf("committed_caller: server on %s, discipline %s\n", argv[1], pjs_server_discipline(s));
    tracker t = {.completed = 0};
    pthread_mutex_init(&t.lock, NULL);
    pthread_cond_init(&t.cond, NULL);

    check_expired_deadline(s, &t);
    for (int round = 1; round <= ROUNDS && !check_ahead_of_flood(s, &t, round, round == ROUNDS);
         round++)
        ;
    for (int round = 1; round <= ROUNDS && !check_depth_exempt(s, &t, round, round == ROUNDS);
         round++)
        ;

    pjs_server_destroy(s);
    pjs_server_config_free(&config);
    pthread_cond_destroy(&t.cond);
    pthread_mutex_destroy(&t.lock);
    printf("committed_caller: %s (%d failed)\n", failures ? "FAILED" : "all checks passed",
           failures);
    return failures ? 1 : 0;
}
