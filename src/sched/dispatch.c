/*
 * dispatch.c - queue, dispatch thread, execution and completion threads.
 *
 * Two queues, each a FIFO linked list under its own mutex and condition
 * variable: `pending` (accepted, waiting for the device) and `completed`
 * (executed, waiting for a completion thread). A request is counted in
 * `in_flight` from submit until its on_done returned; drain waits for zero.
 */
#include "sched/dispatch.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "registry/model.h"

typedef struct request_fifo {
    pjs_infer_request *head;
    pjs_infer_request *tail;
    size_t length;
} request_fifo;

struct pjs_dispatcher {
    pthread_mutex_t lock; /* pending, accepting, in_flight, stopping */
    pthread_cond_t work;  /* pending became non-empty, or stopping */
    pthread_cond_t idle;  /* in_flight reached zero */
    request_fifo pending;
    size_t max_queue;
    bool accepting;
    bool stopping;
    uint64_t in_flight;

    pthread_mutex_t done_lock; /* completed, done_stopping */
    pthread_cond_t done_work;
    request_fifo completed;
    bool done_stopping;

    pthread_t dispatch_thread;
    int n_completion_threads;
    pthread_t *completion_threads;
};

static void fifo_push(request_fifo *q, pjs_infer_request *r)
{
    r->next = NULL;
    if (q->tail != NULL)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->length++;
}

static pjs_infer_request *fifo_pop(request_fifo *q)
{
    pjs_infer_request *r = q->head;
    if (r == NULL)
        return NULL;
    q->head = r->next;
    if (q->head == NULL)
        q->tail = NULL;
    q->length--;
    r->next = NULL;
    return r;
}

/* The selection policy: oldest accepted request first. */
static pjs_infer_request *take_next_locked(pjs_dispatcher *d)
{
    return fifo_pop(&d->pending);
}

/* ---- execution ------------------------------------------------------------ */

/* Whether output o (manifest order) goes back to the client; sets its
 * index into r->requested. */
static bool output_wanted(const pjs_infer_request *r, const pjs_tensor_spec *s, int *requested)
{
    *requested = -1;
    if (r->n_requested == 0)
        return true;
    for (size_t k = 0; k < r->n_requested; k++)
        if (strcmp(r->requested[k].name, s->name) == 0) {
            *requested = (int)k;
            return true;
        }
    return false;
}

static int upload_inputs(pjs_infer_request *r, int64_t module_batch, pjrt_buffer **args,
                         size_t *uploaded, pjs_error *err)
{
    pjs_model *m = r->model;
    const pjs_manifest *man = pjs_model_manifest(m);
    for (*uploaded = 0; *uploaded < man->n_inputs; (*uploaded)++) {
        const pjs_infer_input *in = &r->inputs[*uploaded]; /* manifest order */
        const pjs_tensor_spec *s = in->spec;
        pjs_shape shape = in->shape;
        const void *src = in->data;
        void *padded = NULL;
        if (s->batched && r->batch != module_batch) {
            size_t rb = pjs_tensor_spec_row_bytes(s);
            padded = calloc((size_t)module_batch, rb ? rb : 1);
            if (padded == NULL)
                return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory padding input \"%s\"",
                                     s->name);
            memcpy(padded, in->data, (size_t)r->batch * rb);
            shape.dims[0] = module_batch;
            src = padded;
        }
        int rc = pjs_rt_buffer_from_host(m->client, s->dtype, &shape, src, &args[*uploaded], err);
        free(padded);
        if (rc != 0)
            return pjs_error_prefix(err, "model %s: input \"%s\": ", m->name, s->name);
    }
    return 0;
}

static int read_outputs(pjs_infer_request *r, int64_t module_batch, pjrt_buffer **results,
                        pjs_error *err)
{
    pjs_model *m = r->model;
    const pjs_manifest *man = pjs_model_manifest(m);
    r->n_outputs = man->n_outputs;
    for (size_t o = 0; o < man->n_outputs; o++) {
        const pjs_tensor_spec *s = &man->outputs[o];
        pjs_infer_output *out = &r->outputs[o];
        out->spec = s;
        out->shape = s->shape;
        if (s->batched)
            out->shape.dims[0] = r->batch;
        if (!output_wanted(r, s, &out->requested))
            continue;
        size_t rb = pjs_tensor_spec_row_bytes(s);
        size_t full = s->batched ? rb * (size_t)module_batch : rb;
        out->nbytes = s->batched ? rb * (size_t)r->batch : rb;
        out->data = malloc(out->nbytes ? out->nbytes : 1);
        if (out->data == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory for output \"%s\"", s->name);
        if (full == out->nbytes) {
            if (pjs_rt_buffer_to_host(m->client, results[o], out->data, full, err) != 0)
                return pjs_error_prefix(err, "model %s: output \"%s\": ", m->name, s->name);
            continue;
        }
        void *whole = malloc(full);
        if (whole == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory for output \"%s\"", s->name);
        int rc = pjs_rt_buffer_to_host(m->client, results[o], whole, full, err);
        if (rc == 0)
            memcpy(out->data, whole, out->nbytes);
        free(whole);
        if (rc != 0)
            return pjs_error_prefix(err, "model %s: output \"%s\": ", m->name, s->name);
    }
    return 0;
}

static void add_duration(pjs_duration_stat *d, uint64_t from, uint64_t to)
{
    d->count++;
    d->ns += to > from ? to - from : 0;
}

static void record_stats(pjs_infer_request *r, bool executed)
{
    pjs_model *m = r->model;
    uint64_t done = pjs_now_ns();
    pthread_mutex_lock(&m->stats_lock);
    pjs_model_stats *st = &m->stats;
    if (r->error.code == PJS_OK) {
        add_duration(&st->success, r->times.received, done);
        add_duration(&st->queue, r->times.queued, r->times.exec_start);
        add_duration(&st->compute_input, r->times.exec_start, r->times.input_done);
        add_duration(&st->compute_infer, r->times.input_done, r->times.infer_done);
        add_duration(&st->compute_output, r->times.infer_done, r->times.output_done);
        st->inference_count += (uint64_t)r->batch;
        st->last_inference_ms = pjs_wall_ms();
    } else {
        add_duration(&st->fail, r->times.received, done);
    }
    if (executed) {
        st->execution_count++;
        pjs_batch_stat *b = NULL;
        if (r->error.code == PJS_OK && (b = pjs_model_stats_batch_entry(st, r->batch)) != NULL) {
            add_duration(&b->compute_input, r->times.exec_start, r->times.input_done);
            add_duration(&b->compute_infer, r->times.input_done, r->times.infer_done);
            add_duration(&b->compute_output, r->times.infer_done, r->times.output_done);
        }
    }
    pthread_mutex_unlock(&m->stats_lock);
}

void pjs_execute_request(pjs_infer_request *r)
{
    pjs_model *m = r->model;
    pjs_bundle *b = m->bundle;
    const pjs_manifest *man = pjs_model_manifest(m);
    size_t n_w = b->weights.n_tensors;
    r->times.exec_start = pjs_now_ns();
    int64_t module_batch = pjs_bundle_pick_batch_size(b, r->batch);
    size_t module_index = 0;
    while (module_index + 1 < b->n_modules && b->modules[module_index].batch_size != module_batch)
        module_index++;
    pjs_bundle_module *mod = &b->modules[module_index];

    pjrt_buffer **args = calloc(n_w + man->n_inputs + 1, sizeof *args);
    pjrt_buffer **results = calloc(man->n_outputs + 1, sizeof *results);
    size_t uploaded = 0;
    bool executed = false;
    pjs_error_clear(&r->error);
    if (args == NULL || results == NULL) {
        pjs_error_set(&r->error, PJS_ERR_NOMEM, "out of memory");
        goto out;
    }
    memcpy(args, m->weights, n_w * sizeof *args);
    if (upload_inputs(r, module_batch, args + n_w, &uploaded, &r->error) != 0)
        goto out;
    r->times.input_done = pjs_now_ns();
    executed = true;
    if (pjs_rt_execute(mod->exec, args, results, &r->error) != 0) {
        pjs_error_prefix(&r->error, "model %s: ", m->name);
        goto out;
    }
    r->times.infer_done = pjs_now_ns();
    int rc = read_outputs(r, module_batch, results, &r->error);
    for (size_t o = 0; o < man->n_outputs; o++)
        pjs_rt_buffer_destroy(m->client, results[o]);
    if (rc != 0)
        goto out;
    r->times.output_done = pjs_now_ns();
out:
    for (size_t i = 0; args != NULL && i < uploaded; i++)
        pjs_rt_buffer_destroy(m->client, args[n_w + i]);
    free(args);
    free(results);
    if (r->error.code != PJS_OK) {
        const char *id = r->id != NULL && r->id[0] ? r->id : "(no id)";
        pjs_warn("model %s: request %s failed: %s", m->name, id, r->error.msg);
        pjs_infer_request_release(r);
    }
    record_stats(r, executed);
}

/* ---- threads ---------------------------------------------------------------- */

static void *dispatch_main(void *arg)
{
    pjs_dispatcher *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (d->pending.length == 0 && !d->stopping)
            pthread_cond_wait(&d->work, &d->lock);
        pjs_infer_request *r = take_next_locked(d);
        pthread_mutex_unlock(&d->lock);
        if (r == NULL)
            return NULL; /* stopping with nothing queued */
        pjs_execute_request(r);
        pthread_mutex_lock(&d->done_lock);
        fifo_push(&d->completed, r);
        pthread_cond_signal(&d->done_work);
        pthread_mutex_unlock(&d->done_lock);
    }
}

static void *completion_main(void *arg)
{
    pjs_dispatcher *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->done_lock);
        while (d->completed.length == 0 && !d->done_stopping)
            pthread_cond_wait(&d->done_work, &d->done_lock);
        pjs_infer_request *r = fifo_pop(&d->completed);
        pthread_mutex_unlock(&d->done_lock);
        if (r == NULL)
            return NULL;
        r->on_done(r); /* r may be freed from here on */
        pthread_mutex_lock(&d->lock);
        if (--d->in_flight == 0)
            pthread_cond_broadcast(&d->idle);
        pthread_mutex_unlock(&d->lock);
    }
}

int pjs_dispatcher_create(int completion_threads, size_t max_queue, pjs_dispatcher **out,
                          pjs_error *err)
{
    pjs_dispatcher *d = calloc(1, sizeof *d);
    if (d == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    pthread_mutex_init(&d->done_lock, NULL);
    pthread_cond_init(&d->done_work, NULL);
    d->max_queue = max_queue;
    d->accepting = true;
    d->completion_threads = calloc((size_t)completion_threads, sizeof *d->completion_threads);
    if (d->completion_threads == NULL) {
        pjs_dispatcher_destroy(d);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    if (pthread_create(&d->dispatch_thread, NULL, dispatch_main, d) != 0) {
        free(d->completion_threads);
        free(d);
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the dispatch thread");
    }
    for (int i = 0; i < completion_threads; i++) {
        if (pthread_create(&d->completion_threads[i], NULL, completion_main, d) != 0)
            break;
        d->n_completion_threads++;
    }
    if (d->n_completion_threads == 0) {
        pjs_dispatcher_destroy(d);
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start completion threads");
    }
    *out = d;
    return 0;
}

int pjs_dispatcher_submit(pjs_dispatcher *d, pjs_infer_request *r, pjs_error *err)
{
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!d->accepting)
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                           "pjserve is shutting down and accepts no new requests");
    else if (d->pending.length >= d->max_queue)
        rc = pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                           "the request queue is full (%zu requests waiting); retry later",
                           d->pending.length);
    if (rc == 0) {
        r->times.queued = pjs_now_ns();
        fifo_push(&d->pending, r);
        d->in_flight++;
        pthread_cond_signal(&d->work);
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

void pjs_dispatcher_drain(pjs_dispatcher *d)
{
    pthread_mutex_lock(&d->lock);
    d->accepting = false;
    while (d->in_flight > 0)
        pthread_cond_wait(&d->idle, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

void pjs_dispatcher_counters(pjs_dispatcher *d, uint64_t *queue_depth, uint64_t *in_flight)
{
    pthread_mutex_lock(&d->lock);
    *queue_depth = d->pending.length;
    *in_flight = d->in_flight;
    pthread_mutex_unlock(&d->lock);
}

void pjs_dispatcher_destroy(pjs_dispatcher *d)
{
    if (d == NULL)
        return;
    if (d->completion_threads != NULL) {
        pjs_dispatcher_drain(d);
        pthread_mutex_lock(&d->lock);
        d->stopping = true;
        pthread_cond_broadcast(&d->work);
        pthread_mutex_unlock(&d->lock);
        pthread_join(d->dispatch_thread, NULL);
        pthread_mutex_lock(&d->done_lock);
        d->done_stopping = true;
        pthread_cond_broadcast(&d->done_work);
        pthread_mutex_unlock(&d->done_lock);
        for (int i = 0; i < d->n_completion_threads; i++)
            pthread_join(d->completion_threads[i], NULL);
        free(d->completion_threads);
    }
    pthread_cond_destroy(&d->done_work);
    pthread_mutex_destroy(&d->done_lock);
    pthread_cond_destroy(&d->idle);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
