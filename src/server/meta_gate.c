/*
 * meta_gate.c - gate threads, compute threads and the deadline watchdog
 * (see meta_gate.h).
 *
 * The gate is a set of threads rather than a counting semaphore: `permits`
 * threads take gated jobs off one FIFO, so "at most N at once" holds by
 * construction and no front end's thread ever blocks on a permit. Each
 * queue is an intrusive doubly linked list (the links live in the caller's
 * job), so the watchdog unlinks an expired job from the middle in O(1).
 *
 * The watchdog sleeps on a monotonic-clock condition variable until the
 * earliest deadline among waiting jobs (found by a scan: queues are short
 * and bounded) and is woken by a submit whose deadline is earlier than the
 * one it sleeps for. A thread taking a job whose deadline has passed (the
 * watchdog not having run yet) expires it too, so no job runs late.
 *
 * One mutex guards everything; callbacks run with it released. `busy`
 * counts jobs accepted and not yet finished (waiting, running or being
 * expired); drain waits for it to reach zero.
 *
 * Sharing the compute threads (pjs_meta_gate_share): each runner records
 * the client of the job it runs, and a client's running and waiting jobs
 * are counted by scanning the runners and the queue (at most max_threads
 * and max_waiting). A compute thread takes the oldest job whose client is
 * under its share; a job that is not stays queued until one of its
 * client's runs returns, when that runner, free again, takes the next one
 * itself. Submit starts a thread, under the lock, while there are fewer
 * than jobs running and waiting.
 */
#include "core/thread_name.h"
#include "server/meta_gate.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/infer.h"
#include "core/log.h"

typedef struct job_queue {
    pjs_meta_job *head, *tail;
    size_t n;
    pthread_cond_t ready; /* a job arrived, or stopping */
} job_queue;

/* Arguments of a thread (which queue it serves), and what it runs. */
typedef struct runner {
    pjs_meta_gate *gate;
    bool gated;
    const void *client; /* the running job's client, NULL when idle (lock) */
} runner;

struct pjs_meta_gate {
    char name[64];
    size_t max_waiting;
    int permits, compute_threads;
    int max_compute_threads;      /* compute threads may grow to this many */
    int compute_started;          /* compute threads started (<= max) */
    int per_client;               /* a client's compute jobs running at once; 0: any */
    size_t per_client_waiting;    /* ... and waiting; 0: any */
    pthread_mutex_t lock;
    job_queue gated, compute;
    pthread_cond_t watchdog_wake; /* CLOCK_MONOTONIC */
    uint64_t watchdog_until;      /* deadline the watchdog sleeps for; 0: none */
    pthread_cond_t idle;          /* busy reached 0 */
    size_t busy;
    bool draining, stopping;
    uint64_t running_gated, running_compute, peak_gated;
    uint64_t completed, expired, refused;
    pthread_t *threads;           /* watchdog, gate threads, compute threads */
    size_t n_threads;             /* started */
    runner *runners;              /* gate threads', then max_compute_threads */
    pjs_log_limiter thread_start_log; /* compute threads that failed to start: per job */
};

/* ---- queues ----------------------------------------------------------------- */

static void queue_push(job_queue *q, pjs_meta_job *job)
{
    job->next = NULL;
    job->prev = q->tail;
    if (q->tail != NULL)
        q->tail->next = job;
    else
        q->head = job;
    q->tail = job;
    q->n++;
}

static void queue_unlink(job_queue *q, pjs_meta_job *job)
{
    if (job->prev != NULL)
        job->prev->next = job->next;
    else
        q->head = job->next;
    if (job->next != NULL)
        job->next->prev = job->prev;
    else
        q->tail = job->prev;
    job->prev = job->next = NULL;
    q->n--;
}

/* Earliest deadline waiting in q, or `best` when none is earlier (0: none). */
static uint64_t queue_earliest(const job_queue *q, uint64_t best)
{
    for (const pjs_meta_job *j = q->head; j != NULL; j = j->next)
        if (j->deadline_ns != 0 && (best == 0 || j->deadline_ns < best))
            best = j->deadline_ns;
    return best;
}

/* ---- sharing between clients ------------------------------------------------- */

/* Compute jobs of `client` running now. */
static int client_running(const pjs_meta_gate *g, const void *client)
{
    int n = 0;
    for (int i = 0; i < g->compute_started; i++)
        n += g->runners[g->permits + i].client == client;
    return n;
}

static size_t client_waiting(const pjs_meta_gate *g, const void *client)
{
    size_t n = 0;
    for (const pjs_meta_job *j = g->compute.head; j != NULL; j = j->next)
        n += j->client == client;
    return n;
}

/* Whether a compute job of `client` may start now. */
static bool under_share(const pjs_meta_gate *g, const void *client)
{
    return client == NULL || g->per_client == 0 || client_running(g, client) < g->per_client;
}

/* The job a thread of queue q takes next: the head of the gated queue; the
 * oldest compute job whose client is under its share. NULL: none. */
static pjs_meta_job *next_job(const pjs_meta_gate *g, const job_queue *q, bool gated)
{
    pjs_meta_job *j = q->head;
    if (!gated)
        while (j != NULL && !under_share(g, j->client))
            j = j->next;
    return j;
}

/* ---- finishing a job ---------------------------------------------------------- */

static void job_done_locked(pjs_meta_gate *g)
{
    if (--g->busy == 0)
        pthread_cond_broadcast(&g->idle);
}

/* Calls job->expire (lock released meanwhile); the job waited since its
 * submit in the queue named by `gated`. */
static void expire_job(pjs_meta_gate *g, pjs_meta_job *job, bool gated, uint64_t now)
{
    g->expired++;
    int threads = gated ? g->permits : g->compute_started;
    double waited_ms = (double)(now - job->submitted_ns) / 1e6;
    pthread_mutex_unlock(&g->lock);
    pjs_error err;
    if (gated)
        pjs_error_set(&err, PJS_ERR_DEADLINE_EXCEEDED,
                      "%s: the deadline passed after %.1f ms waiting for a permit: all %d "
                      "(--meta-concurrency) were held by running meta models; retry with a "
                      "longer timeout, or raise --meta-concurrency",
                      g->name, waited_ms, threads);
    else
        pjs_error_set(&err, PJS_ERR_DEADLINE_EXCEEDED,
                      "%s: the deadline passed after %.1f ms waiting for a thread: all %d "
                      "compute-only meta threads were busy; retry with a longer timeout",
                      g->name, waited_ms, threads);
    job->expire(job, &err);
    pthread_mutex_lock(&g->lock);
    job_done_locked(g);
}

/* ---- threads -------------------------------------------------------------------- */

static void *runner_main(void *arg)
{
    runner *self = arg;
    pjs_meta_gate *g = self->gate;
    bool gated = self->gated;
    job_queue *q = gated ? &g->gated : &g->compute;
    uint64_t *running = gated ? &g->running_gated : &g->running_compute;
    pthread_mutex_lock(&g->lock);
    for (;;) {
        pjs_meta_job *job;
        while ((job = next_job(g, q, gated)) == NULL && !g->stopping)
            pthread_cond_wait(&q->ready, &g->lock);
        if (job == NULL)
            break;
        queue_unlink(q, job);
        uint64_t now = pjs_now_ns();
        if (job->deadline_ns != 0 && job->deadline_ns <= now) {
            expire_job(g, job, gated, now);
            continue;
        }
        (*running)++;
        if (gated && g->running_gated > g->peak_gated)
            g->peak_gated = g->running_gated;
        self->client = job->client;
        pthread_mutex_unlock(&g->lock);
        job->run(job);
        pthread_mutex_lock(&g->lock);
        self->client = NULL;
        (*running)--;
        g->completed++;
        job_done_locked(g);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* Takes the first job of either queue whose deadline is at or before now. */
static pjs_meta_job *take_expired(pjs_meta_gate *g, uint64_t now, bool *gated)
{
    job_queue *queues[2] = {&g->gated, &g->compute};
    for (int i = 0; i < 2; i++)
        for (pjs_meta_job *j = queues[i]->head; j != NULL; j = j->next)
            if (j->deadline_ns != 0 && j->deadline_ns <= now) {
                queue_unlink(queues[i], j);
                *gated = i == 0;
                return j;
            }
    return NULL;
}

static void *watchdog_main(void *arg)
{
    pjs_meta_gate *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stopping) {
        uint64_t now = pjs_now_ns();
        bool gated = false;
        pjs_meta_job *job = take_expired(g, now, &gated);
        if (job != NULL) {
            expire_job(g, job, gated, now);
            continue;
        }
        g->watchdog_until = queue_earliest(&g->compute, queue_earliest(&g->gated, 0));
        if (g->watchdog_until == 0) {
            pthread_cond_wait(&g->watchdog_wake, &g->lock);
        } else {
            struct timespec ts = {.tv_sec = (time_t)(g->watchdog_until / 1000000000u),
                                  .tv_nsec = (long)(g->watchdog_until % 1000000000u)};
            pthread_cond_timedwait(&g->watchdog_wake, &g->lock, &ts);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* ---- the gate ---------------------------------------------------------------------- */

static int start_thread(pjs_meta_gate *g, void *(*fn)(void *), void *arg, pjs_error *err)
{
    if (pthread_create(&g->threads[g->n_threads], NULL, fn, arg) != 0)
        return pjs_error_set(err, PJS_ERR_INTERNAL, "%s: cannot start a thread", g->name);
    pjs_thread_name(g->threads[g->n_threads], "pjs-meta");
    g->n_threads++;
    return 0;
}

/* Starts one more compute thread (lock held, or before any submit). */
static int start_compute_thread(pjs_meta_gate *g, pjs_error *err)
{
    runner *r = &g->runners[g->permits + g->compute_started];
    *r = (runner){g, false, NULL};
    int rc = start_thread(g, runner_main, r, err);
    if (rc == 0)
        g->compute_started++;
    return rc;
}

int pjs_meta_gate_share(pjs_meta_gate *g, int max_threads, int per_client,
                        size_t per_client_waiting, pjs_error *err)
{
    if (max_threads < g->compute_threads || max_threads > PJS_META_GATE_MAX_THREADS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: at most %d compute-only threads: expected %d to %d", g->name,
                             max_threads, g->compute_threads, PJS_META_GATE_MAX_THREADS);
    if (per_client < 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: %d runs per client: expected 0 (any) or more", g->name,
                             per_client);
    pthread_mutex_lock(&g->lock);
    g->max_compute_threads = max_threads;
    g->per_client = per_client;
    g->per_client_waiting = per_client_waiting;
    pthread_mutex_unlock(&g->lock);
    return 0;
}

int pjs_meta_gate_create(const char *name, int permits, int compute_threads, size_t max_waiting,
                         pjs_meta_gate **out, pjs_error *err)
{
    *out = NULL;
    if (permits < 0 || permits > PJS_META_GATE_MAX_THREADS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: %d permits: expected 0 to %d", name, permits,
                             PJS_META_GATE_MAX_THREADS);
    if (compute_threads < 1 || compute_threads > PJS_META_GATE_MAX_THREADS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: %d compute-only threads: expected 1 to %d", name,
                             compute_threads, PJS_META_GATE_MAX_THREADS);
    pjs_meta_gate *g = calloc(1, sizeof *g);
    size_t n_runners = (size_t)permits + PJS_META_GATE_MAX_THREADS;
    if (g != NULL) {
        g->threads = calloc(n_runners + 1, sizeof *g->threads);
        g->runners = calloc(n_runners, sizeof *g->runners);
    }
    if (g == NULL || g->threads == NULL || g->runners == NULL) {
        if (g != NULL) {
            free(g->threads);
            free(g->runners);
        }
        free(g);
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory", name);
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    g->permits = permits;
    g->compute_threads = compute_threads;
    g->max_compute_threads = compute_threads;
    g->max_waiting = max_waiting != 0 ? max_waiting : PJS_META_GATE_DEFAULT_MAX_WAITING;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->gated.ready, NULL);
    pthread_cond_init(&g->compute.ready, NULL);
    pthread_cond_init(&g->idle, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&g->watchdog_wake, &monotonic);
    pthread_condattr_destroy(&monotonic);

    int rc = start_thread(g, watchdog_main, g, err);
    for (int i = 0; rc == 0 && i < permits; i++) {
        g->runners[i] = (runner){g, true, NULL};
        rc = start_thread(g, runner_main, &g->runners[i], err);
    }
    for (int i = 0; rc == 0 && i < compute_threads; i++)
        rc = start_compute_thread(g, err);
    if (rc != 0) {
        pjs_meta_gate_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

int pjs_meta_gate_submit(pjs_meta_gate *g, pjs_meta_job *job, bool gated, uint64_t deadline_ns,
                         pjs_error *err)
{
    uint64_t now = pjs_now_ns();
    job_queue *q = gated ? &g->gated : &g->compute;
    int rc = 0;
    pthread_mutex_lock(&g->lock);
    if (gated && g->permits == 0)
        rc = pjs_error_set(err, PJS_ERR_INTERNAL, "%s: has no permits for a gated run", g->name);
    else if (g->draining)
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s: the server is shutting down", g->name);
    else if (deadline_ns != 0 && deadline_ns <= now)
        rc = pjs_error_set(err, PJS_ERR_DEADLINE_EXCEEDED,
                           "%s: the request's deadline passed before its meta model could "
                           "start (%.1f ms ago)",
                           g->name, (double)(now - deadline_ns) / 1e6);
    else if (q->n >= g->max_waiting)
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "%s: %zu %s meta model runs are already waiting; retry once they "
                           "completed",
                           g->name, q->n, gated ? "gated" : "compute-only");
    else if (!gated && job->client != NULL && g->per_client_waiting > 0 &&
             !under_share(g, job->client) &&
             client_waiting(g, job->client) >= g->per_client_waiting)
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "%s: this stream has %d runs of compute-only meta models running "
                           "and %zu waiting, its most; send more once some completed",
                           g->name, g->per_client, g->per_client_waiting);
    if (rc != 0) {
        g->refused++;
        pthread_mutex_unlock(&g->lock);
        return rc;
    }
    job->deadline_ns = deadline_ns;
    job->submitted_ns = now;
    queue_push(q, job);
    g->busy++;
    /* A thread per job running or waiting: jobs over their client's share
     * count too, so a few threads more than needed may start (they stay
     * idle, within the bound). */
    if (!gated && g->running_compute + q->n > (uint64_t)g->compute_started &&
        g->compute_started < g->max_compute_threads && under_share(g, job->client)) {
        pjs_error ignored;
        if (start_compute_thread(g, &ignored) != 0)
            pjs_log_limited(&g->thread_start_log, PJS_LOG_WARN,
                            "%s: %s; the run waits for a busy thread", g->name, ignored.msg);
    }
    pthread_cond_signal(&q->ready);
    if (deadline_ns != 0 && (g->watchdog_until == 0 || deadline_ns < g->watchdog_until))
        pthread_cond_signal(&g->watchdog_wake);
    pthread_mutex_unlock(&g->lock);
    return 0;
}

void pjs_meta_gate_drain(pjs_meta_gate *g)
{
    pthread_mutex_lock(&g->lock);
    g->draining = true;
    while (g->busy > 0)
        pthread_cond_wait(&g->idle, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

void pjs_meta_gate_destroy(pjs_meta_gate *g)
{
    if (g == NULL)
        return;
    pjs_meta_gate_drain(g);
    pthread_mutex_lock(&g->lock);
    g->stopping = true;
    pthread_cond_broadcast(&g->gated.ready);
    pthread_cond_broadcast(&g->compute.ready);
    pthread_cond_broadcast(&g->watchdog_wake);
    pthread_mutex_unlock(&g->lock);
    for (size_t i = 0; i < g->n_threads; i++)
        pthread_join(g->threads[i], NULL);
    pthread_cond_destroy(&g->watchdog_wake);
    pthread_cond_destroy(&g->idle);
    pthread_cond_destroy(&g->compute.ready);
    pthread_cond_destroy(&g->gated.ready);
    pthread_mutex_destroy(&g->lock);
    free(g->runners);
    free(g->threads);
    free(g);
}

void pjs_meta_gate_get_counters(pjs_meta_gate *g, pjs_meta_gate_counters *out)
{
    pthread_mutex_lock(&g->lock);
    *out = (pjs_meta_gate_counters){
        .permits = (uint64_t)g->permits,
        .compute_threads = (uint64_t)g->compute_started,
        .running_gated = g->running_gated,
        .running_compute = g->running_compute,
        .waiting_gated = g->gated.n,
        .waiting_compute = g->compute.n,
        .peak_gated = g->peak_gated,
        .completed = g->completed,
        .expired = g->expired,
        .refused = g->refused,
    };
    pthread_mutex_unlock(&g->lock);
}
