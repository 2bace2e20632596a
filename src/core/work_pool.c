/*
 * work_pool.c - the bounded job queue and its threads (see work_pool.h).
 *
 * The queue is a ring of `cap` slots guarded by `lock`; `ready` wakes idle
 * threads when a job arrives or stop begins. A thread takes a job out of
 * the ring before running it, so a full queue means `cap` jobs not yet
 * started (jobs running do not count).
 */
#include "core/thread_name.h"
#include "core/work_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct work_job {
    pjs_work_fn fn;
    void *arg;
} work_job;

struct pjs_work_pool {
    char name[64];
    pthread_mutex_t lock;
    pthread_cond_t ready;
    work_job *ring;   /* cap slots; `n` jobs from `head` */
    size_t cap;
    size_t head;
    size_t n;
    bool stopping;
    bool stopped;     /* threads joined */
    size_t n_threads; /* started */
    pthread_t *threads;
};

static void *worker(void *arg)
{
    pjs_work_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->n == 0 && !p->stopping)
            pthread_cond_wait(&p->ready, &p->lock);
        if (p->n == 0)
            break;
        work_job job = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->n--;
        bool cancelled = p->stopping;
        pthread_mutex_unlock(&p->lock);
        job.fn(job.arg, cancelled);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int pjs_work_pool_create(const char *name, size_t threads, size_t max_queued,
                         pjs_work_pool **out, pjs_error *err)
{
    *out = NULL;
    if (threads == 0 || max_queued == 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "%s: a work pool needs at least one thread and one queue slot", name);
    pjs_work_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->cap = max_queued;
    p->ring = calloc(max_queued, sizeof *p->ring);
    p->threads = calloc(threads, sizeof *p->threads);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->ready, NULL);
    int rc = 0;
    if (p->ring == NULL || p->threads == NULL)
        rc = pjs_error_set(err, PJS_ERR_NOMEM, "%s: out of memory", name);
    while (rc == 0 && p->n_threads < threads) {
        if (pthread_create(&p->threads[p->n_threads], NULL, worker, p) != 0)
            rc = pjs_error_set(err, PJS_ERR_INTERNAL, "%s: cannot start a thread", name);
        else
            pjs_thread_name(p->threads[p->n_threads++], p->name);
    }
    if (rc != 0) {
        pjs_work_pool_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int pjs_work_pool_submit(pjs_work_pool *p, pjs_work_fn fn, void *arg, pjs_error *err)
{
    int rc = 0;
    pthread_mutex_lock(&p->lock);
    if (p->stopping)
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE, "%s: the server is shutting down", p->name);
    else if (p->n == p->cap)
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "%s: %zu requests are already waiting; retry once they completed",
                           p->name, p->cap);
    else {
        p->ring[(p->head + p->n) % p->cap] = (work_job){fn, arg};
        p->n++;
        pthread_cond_signal(&p->ready);
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void pjs_work_pool_stop(pjs_work_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    bool joined = p->stopped;
    p->stopping = true;
    p->stopped = true;
    pthread_cond_broadcast(&p->ready);
    pthread_mutex_unlock(&p->lock);
    if (joined)
        return;
    for (size_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    /* No thread started (creation failed) or none left: cancel here. */
    while (p->n > 0) {
        work_job job = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->n--;
        job.fn(job.arg, true);
    }
}

void pjs_work_pool_destroy(pjs_work_pool *p)
{
    if (p == NULL)
        return;
    pjs_work_pool_stop(p);
    pthread_cond_destroy(&p->ready);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p->ring);
    free(p);
}
