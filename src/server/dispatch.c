/*
 * dispatch.c - queues, the device token, coalesced execution, completion.
 *
 * `lock` guards the scheduler (every attached model's queues and share), the
 * device token, the device-task list, the finished requests and the
 * counters. Whoever holds the token (`device_held`) is the device owner: it
 * alone executes, and alone touches the weight cache and `scratch`. A
 * thread takes the token under the lock, picks a plan or a task, releases
 * the lock, runs it, and gives the token back under the lock; the lock is
 * never held while executing.
 *
 * Who takes it. A submitting thread takes it when the device is free, no
 * device task waits and the request's model is resident and quick at the
 * request's size (the common case at low load: the request thread executes
 * its own request, no hand-off at all). Otherwise one of the dispatcher's
 * workers, woken by submit, takes it as soon as it is free.
 * An owner runs exactly one plan or task, then gives the token back and, if
 * work is left, wakes a worker to take it next.
 *
 * After the token is given back, the owner finishes what it ran: the
 * plan's requests (and any the scheduler dropped) go to `finished`, one
 * idle worker is woken to help when there is more than one, and the owner
 * itself calls on_done on finished requests until none are left. So
 * encoding and responding run on request or worker threads in parallel
 * and never delay the next execution. A thread already inside an on_done
 * never takes the token (a hook or stream submitting from there), so owners
 * do not nest.
 *
 * Prefetch. One weight copy may run beside executions: when the owner is
 * about to execute a resident model and the scheduler names a cold model
 * with queued work (pjs_sched_next_cold), the owner reserves its room in
 * the weight cache (evicting by the policy, never the model about to run)
 * and hands the copy to the transfer thread. The copy goes on beside
 * executions and beside the owner's own loads of other models (a file
 * read in it must not stop them). The owner alone commits it, at its next
 * decision once the copy is done, or waiting for it before a device task
 * or running that model. So residency still changes only under the token,
 * and no execution reads weights in flight. The
 * prefetched model is held (pjs_wcache_entry.holds) until it runs, so no
 * other load evicts it first, and there is one such lookahead at a time;
 * the hold goes when it runs, when its copy failed, or when its queue
 * emptied without it running (deadlines, cancellations). The transfer
 * thread runs 10 nice levels below the process (PREFETCH_NICE): its work is
 * ahead of need, and where busy threads outnumber the CPUs, reading a cold
 * model's file must not slow the requests for resident ones; when the owner
 * does wait for the copy, the owner's thread is blocked and leaves it the
 * CPU.
 *
 * Reading beside. An owner whose plan's model must first be read from its
 * file into host memory (the host tier) gives the token up for the read
 * (read_beside) and takes it back, before anyone else, when the read is
 * done: requests for models on the device or in host memory execute
 * meanwhile instead of queueing behind a disk read.
 *
 * Pipelined swap-in. When a plan finds its model cold and the bundle has
 * swap-in stages, the owner's load only issues one copy per stage
 * (pjs_model_start_staged_load) and the execution runs the stage modules:
 * stage k is queued as soon as its block is on the device, so the device
 * computes stage k while later blocks travel; only the last stage is waited
 * for. The floor stays held and the load's cost is charged once every block
 * has arrived (end_staged_load). Later executions, and loads made by the
 * transfer thread or a warm-up, use the whole model's modules.
 *
 * A plan's inputs are gathered into one buffer per input (rows in plan
 * order, zero padding up to the compiled size) unless a single request fills
 * the batch, uploaded next to the model's weights, executed, and read back:
 * straight into the request's own output buffers when it is alone at its
 * compiled size, else whole and sliced per request.
 *
 * CUDA shared memory on the model's own device stays there: an input that
 * fills the batch alone is executed on in place (a PJRT view of the
 * client's memory), one gathered with others is copied from the device into
 * the batch's host buffer; an output goes from the execution's buffer into
 * the client's window device to device, and is not read back at all when
 * no request wants it on the host. A request counts in
 * `in_flight` from submit until its on_done returned; drain waits for 0.
 */
#include "core/thread_name.h"
#include "server/dispatch.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"
#include "core/shm.h"

typedef struct request_fifo {
    pjs_infer_request *head;
    pjs_infer_request *tail;
    size_t length;
} request_fifo;

/* A function the device owner runs between executions (warm-up, residency). */
typedef struct device_task {
    void (*run)(struct device_task *t);
    bool done;
    struct device_task *next;
} device_task;

/* Arrays the device owner reuses from one execution to the next. */
typedef struct owner_scratch {
    pjrt_buffer **args;    /* weights, then inputs */
    size_t args_cap;
    pjrt_buffer **results;
    size_t results_cap;
    size_t *result_bytes; /* each output's size at the module's batch size */
    size_t result_bytes_cap;
    pjs_infer_request **reqs; /* a plan's requests in row order */
    size_t reqs_cap;
    int64_t *first_row;       /* where each one's rows start */
    size_t rows_cap;
    /* A coalesced batch's input i is gathered in staging[i], kept from one
     * execution to the next (device_execute's uploads are done when it
     * returns). Where the client's host memory is DMA-mapped (a GPU) the
     * device copies a large batch from it directly, without the plugin's
     * own staging of pageable memory (docs/runtime.md, "Input staging"). */
    pjs_rt_host_memory staging[PJS_INFER_MAX_TENSORS];
    pjs_rt_client *staging_client; /* what staging was allocated with */
    /* Bytes of CUDA shared memory executed on in place and written device
     * to device (read by the metrics without the token). */
    _Atomic uint64_t shm_device_in_bytes, shm_device_out_bytes;
} owner_scratch;

/* Inputs larger than this are gathered in memory of their own, not kept. */
#define STAGING_MAX_BYTES (256u << 20)

/* The weight copy that may run beside executions (see top). */
typedef struct transfer {
    pthread_t thread;
    bool started;
    bool stopping;
    pjs_model *model;        /* in flight (a reference held), NULL when idle */
    bool done;               /* its copy finished, rc and err say how */
    int rc;
    pjs_error err;
    pthread_cond_t wake;     /* a copy to make, or stopping */
    pthread_cond_t finished; /* done became true */
} transfer;

struct pjs_dispatcher {
    pthread_mutex_t lock;  /* everything below but the token's own fields */
    pthread_cond_t work;   /* a request, task or finished request arrived,
                              the token came back, or stopping */
    pthread_cond_t idle;   /* in_flight reached zero */
    pthread_cond_t task_done;
    pthread_cond_t token_back; /* the token came back and token_wanted > 0 */
    pjs_sched sched;
    bool device_held;      /* the device token */
    unsigned reading;      /* owners that gave the token up to read a file
                              (read_beside), until they hold it again */
    unsigned token_wanted; /* of those, the ones done reading: the token
                              goes to them next */
    pjs_wcache cache;      /* changed by the token holder only */
    /* The host tier (see "host tier" below): whether a budget manages the
     * host floors, and their books, changed under host_lock by the thread
     * that uploads (the token holder, or the transfer thread for it). */
    bool host_tier;
    pjs_wcache host;
    pthread_mutex_t host_lock;
    pthread_cond_t host_read; /* a floor's read ended (its entry left in_flight) */
    owner_scratch scratch; /* used by the token holder only */
    device_task *tasks;
    request_fifo finished; /* executed or dropped, on_done not yet called */
    uint64_t queued;
    bool accepting;
    bool stopping;
    uint64_t in_flight;
    transfer xfer;          /* model, done, rc, err under the lock */
    bool stage_next_load;   /* the owner's next cache load may be staged (acquire) */
    pjs_model *lookahead;   /* prefetched (or in flight), not run yet, held
                               and referenced; token holder only */
    uint64_t prefetches;    /* copies started beside executions */
    pjs_tier_stats tiers;   /* executed requests by their model's tier */
    uint64_t inline_plans;  /* plans run by the submitting thread */
    uint64_t worker_plans;  /* plans run by a worker */

    int n_workers;
    pthread_t *workers;
};

/* Longest estimated execution a request thread runs itself; when it is
 * its front end's only thread polling (pjs_infer_request.sole_poller), the
 * longest it runs while its connections wait. */
#define PJS_DISPATCH_INLINE_MAX_NS 2e6
#define PJS_DISPATCH_SOLE_POLLER_MAX_NS 100e3
/* Without hand-off, the most plans in a row a request thread runs before it
 * wakes a worker for the rest (it has its own connections to serve). */
#define PJS_DISPATCH_INLINE_MAX_RUNS 4

/* Set while a thread runs on_done: it must not take the token (see top). */
static _Thread_local int completing;

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

static pjs_infer_request *request_of(pjs_sched_job *j)
{
    return (pjs_infer_request *)((char *)j - offsetof(pjs_infer_request, job));
}

/* Scratch arrays of at least n entries each (token holder only). */
static int grow(void **array, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t want = n < 16 ? 16 : n;
    void *p = realloc(*array, want * elem);
    if (p == NULL)
        return -1;
    *array = p;
    *cap = want;
    return 0;
}

/* ---- one execution on the device (token holder) ---------------------------- */

/* The requests of a plan, in row order, and where each one's rows start. */
typedef struct batch {
    pjs_model *model;
    size_t variant, size_index;
    int64_t batch_size, rows;
    size_t n;
    pjs_infer_request **reqs;
    int64_t *first_row;
} batch;


typedef struct exec_times {
    uint64_t input_done, infer_done, output_done;
} exec_times;

/* Writes every output of bt's requests that is to go into CUDA shared
 * memory (in_shm) from the execution's results, device to device. */
static int write_outputs_on_device(owner_scratch *sc, const batch *bt,
                                   pjrt_buffer *const *results, pjs_error *err)
{
    pjs_model *m = bt->model;
    for (size_t j = 0; j < bt->n; j++) {
        pjs_infer_request *r = bt->reqs[j];
        for (size_t o = 0; o < r->n_outputs; o++) {
            pjs_infer_output *out = &r->outputs[o];
            if (!out->in_shm)
                continue;
            uint64_t address = 0;
            int rc = pjs_rt_buffer_device_address(m->client, results[o], &address, err);
            size_t rb = pjs_tensor_spec_row_bytes(out->spec);
            if (out->spec->batched)
                address += (uint64_t)bt->first_row[j] * rb;
            if (rc == 0)
                rc = pjs_shm_view_write_from_device(r->requested[out->requested].shm_view,
                                                    address, out->nbytes, err);
            if (rc != 0)
                return pjs_error_prefix(err, "model %s: output \"%s\": ", m->name,
                                        out->spec->name);
            atomic_fetch_add_explicit(&sc->shm_device_out_bytes, out->nbytes,
                                      memory_order_relaxed);
        }
    }
    return 0;
}

/* Runs m's swap-in stages at size_index on the uploaded inputs: stage k is
 * queued once its weights are on the device (pjs_model_await_stage), its
 * outputs passed on as device buffers; the last stage is waited for and
 * read as pjs_rt_execute_read reads. */
static int run_stages(pjs_model *m, size_t size_index, pjrt_buffer *const *inputs,
                      pjrt_buffer **results, void *const *outputs, const size_t *result_bytes,
                      pjs_rt_exec_times *times, pjs_error *err)
{
    const pjs_bundle *b = m->bundle;
    const pjs_manifest *man = &b->manifest;
    size_t n_carried = 0, most_args = 0;
    for (size_t k = 0; k < man->n_stages; k++) {
        size_t n_in = k == 0 ? man->n_inputs : man->stages[k - 1].n_outputs;
        n_carried += man->stages[k].n_outputs;
        if (man->stages[k].n_weights + n_in > most_args)
            most_args = man->stages[k].n_weights + n_in;
    }
    pjrt_buffer **carried = calloc(n_carried + 1, sizeof *carried);
    pjrt_buffer **args = calloc(most_args + 1, sizeof *args);
    int rc = carried != NULL && args != NULL
                 ? 0
                 : pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    pjrt_buffer *const *in = inputs;
    size_t n_in = man->n_inputs, at = 0;
    for (size_t k = 0; rc == 0 && k < man->n_stages; k++) {
        const pjs_swap_in_stage *st = &man->stages[k];
        pjs_rt_executable *e = pjs_bundle_stage_module_at(b, k, size_index)->exec;
        if ((rc = pjs_model_await_stage(m, k, err)) != 0)
            break;
        for (size_t j = 0; j < st->n_weights; j++)
            args[j] = m->weights[b->stages[k].weights[j]];
        memcpy(args + st->n_weights, in, n_in * sizeof *args);
        if (k + 1 < man->n_stages) {
            rc = pjs_rt_execute_launch(e, args, carried + at, err);
            in = carried + at;
            n_in = st->n_outputs;
            at += st->n_outputs;
        } else {
            rc = pjs_rt_execute_read(e, args, results, outputs, result_bytes, times, err);
        }
        if (rc != 0)
            pjs_error_prefix(err, "model %s: swap-in stage %zu: ", m->name, k);
    }
    /* after the last stage's wait (or a failure): no stage reads them now */
    for (size_t i = 0; carried != NULL && i < n_carried; i++)
        if (carried[i] != NULL)
            pjs_rt_buffer_destroy(m->client, carried[i]);
    free(carried);
    free(args);
    return rc;
}

/* Executes module (variant, size_index) of m on inputs at the module's full
 * shapes: host memory, or device memory where in_device[i] is an address
 * (in_device may be NULL); reads output o into outputs[o] when it is not
 * NULL, and with `deliver` (NULL: none) writes its requests' in_shm
 * outputs. `staged`: through the swap-in stages instead (run_stages; the
 * model has them and no variants). */
static int device_execute(owner_scratch *sc, pjs_model *m, size_t variant, size_t size_index,
                          bool staged, const void *const *inputs, const uint64_t *in_device,
                          void *const *outputs, const batch *deliver, exec_times *t,
                          pjs_error *err)
{
    pjs_bundle *b = m->bundle;
    const pjs_manifest *man = pjs_model_manifest(m);
    const pjs_variant *var = &man->variants[variant];
    pjs_bundle_module *mod = pjs_bundle_module_at(b, variant, size_index);
    size_t n_w = b->weights.n_tensors;
    /* inputs are uploaded in the layout of the executable that takes them */
    pjs_rt_executable *takes = staged ? pjs_bundle_stage_module_at(b, 0, size_index)->exec
                                      : mod->exec;
    size_t first_input = staged ? man->stages[0].n_weights : n_w;
    if (grow((void **)&sc->args, &sc->args_cap, n_w + man->n_inputs + 1, sizeof *sc->args) != 0 ||
        grow((void **)&sc->results, &sc->results_cap, man->n_outputs + 1,
             sizeof *sc->results) != 0 ||
        grow((void **)&sc->result_bytes, &sc->result_bytes_cap, man->n_outputs + 1,
             sizeof *sc->result_bytes) != 0)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    pjrt_buffer **args = sc->args;
    pjrt_buffer **results = sc->results;
    memset(results, 0, man->n_outputs * sizeof *results);
    size_t uploaded = 0;
    int rc = 0;
    memcpy(args, m->weights, n_w * sizeof *args);
    for (; uploaded < man->n_inputs; uploaded++) {
        const pjs_tensor_spec *s = &var->inputs[uploaded];
        pjs_shape shape = s->shape;
        if (s->batched)
            shape.dims[0] = mod->batch_size;
        const pjs_rt_tensor_type *param = &takes->params[first_input + uploaded];
        if (in_device != NULL && in_device[uploaded] != 0)
            rc = pjs_rt_buffer_view_device(m->client, s->dtype, &shape, param,
                                           in_device[uploaded], &args[n_w + uploaded], err);
        else
            rc = pjs_rt_buffer_from_host(m->client, s->dtype, &shape, param, inputs[uploaded],
                                         &args[n_w + uploaded], err);
        if (rc != 0) {
            pjs_error_prefix(err, "model %s: input \"%s\": ", m->name, s->name);
            goto out;
        }
    }
    t->input_done = pjs_now_ns();
    for (size_t o = 0; o < man->n_outputs; o++) {
        const pjs_tensor_spec *s = &var->outputs[o];
        size_t rb = pjs_tensor_spec_row_bytes(s);
        sc->result_bytes[o] = s->batched ? rb * (size_t)mod->batch_size : rb;
    }
    pjs_rt_exec_times times = {.want_cpu = false};
    if (staged)
        rc = run_stages(m, size_index, args + n_w, results, outputs, sc->result_bytes, &times, err);
    else
        rc = pjs_rt_execute_read(mod->exec, args, results, outputs, sc->result_bytes, &times,
                                 err);
    t->infer_done = times.executed_ns;
    if (rc != 0) {
        pjs_error_prefix(err, "model %s: ", m->name);
        goto out;
    }
    if (deliver != NULL)
        rc = write_outputs_on_device(sc, deliver, results, err);
    for (size_t o = 0; o < man->n_outputs; o++)
        pjs_rt_buffer_destroy(m->client, results[o]);
    t->output_done = pjs_now_ns();
out:
    for (size_t i = 0; i < uploaded; i++)
        pjs_rt_buffer_destroy(m->client, args[n_w + i]);
    return rc;
}

/* ---- running a plan --------------------------------------------------------- */

/* Whether output s goes back to r; sets its index into r->requested. */
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

/* Whether the batch is one request at the compiled size: its own buffers
 * are the execution's inputs and outputs, with no gathering or slicing. */
static bool batch_is_one_request(const batch *bt)
{
    return bt->n == 1 && bt->reqs[0]->batch == bt->batch_size;
}

/* staging[i] of at least `bytes`, or NULL: too large to keep, or no memory
 * (the caller then does without). */
static void *staging_for(owner_scratch *sc, pjs_rt_client *client, size_t i, size_t bytes)
{
    pjs_rt_host_memory *h = &sc->staging[i];
    if (bytes == 0 || bytes > STAGING_MAX_BYTES)
        return NULL;
    if (h->size < bytes) {
        pjs_rt_host_free(client, h);
        /* room to grow: mapping memory for the device costs more than
         * the memory */
        size_t want = bytes < STAGING_MAX_BYTES / 2 ? 2 * bytes : STAGING_MAX_BYTES;
        pjs_error err;
        if (pjs_rt_host_alloc(client, want, h, &err) != 0)
            return NULL;
        sc->staging_client = client;
    }
    return h->data;
}

/* Device addresses are handed to the plugin only at this alignment, which
 * cudaMalloc's allocations have and XLA's kernels may assume. */
#define DEVICE_VIEW_ALIGN 256u

/* Whether the CUDA shared memory window v (NULL: none) lies on m's device
 * (the CPU plugin's device is no CUDA device): then its address into
 * *address. */
static bool on_model_device(pjs_model *m, const pjs_shm_view *v, uint64_t *address)
{
    int64_t device_id = -1;
    return v != NULL && strcmp(pjs_rt_client_platform(m->client), "cpu") != 0 &&
           pjs_shm_view_device(v, &device_id, address) &&
           device_id == pjs_rt_client_hardware_id(m->client);
}

/* Whether input window v can be a parameter of type param as it is: on m's
 * device, aligned, and the parameter row-major. */
static bool input_in_place(pjs_model *m, const pjs_shm_view *v, const pjs_rt_tensor_type *param,
                           uint64_t *address)
{
    return !param->other_layout && on_model_device(m, v, address) &&
           *address % DEVICE_VIEW_ALIGN == 0;
}

/* Host inputs at the compiled size: a request's own buffer when it fills the
 * batch alone (copying it to DMA-mapped memory first made a lone ResNet-50
 * image slower on a GPU: docs/runtime.md), else rows gathered into
 * staging[i] (owned[i] when that cannot be had), zero-padded. An input in
 * CUDA shared memory on the model's device that fills the batch alone gets
 * its address in in_device[i] instead; elsewhere it is read to the host. */
static int gather_inputs(owner_scratch *sc, const batch *bt, const void **inputs,
                         uint64_t *in_device, void **owned, pjs_error *err)
{
    pjs_model *m = bt->model;
    const pjs_manifest *man = pjs_model_manifest(m);
    const pjs_variant *var = &man->variants[bt->variant];
    const pjs_rt_executable *exec = pjs_bundle_module_at(m->bundle, bt->variant,
                                                         bt->size_index)->exec;
    size_t n_w = m->bundle->weights.n_tensors;
    for (size_t i = 0; i < man->n_inputs; i++) {
        const pjs_tensor_spec *s = &var->inputs[i];
        if (!s->batched || batch_is_one_request(bt)) {
            pjs_infer_input *in = &bt->reqs[0]->inputs[i];
            if (in->data == NULL && in->device != NULL) {
                if (input_in_place(m, in->device, &exec->params[n_w + i], &in_device[i])) {
                    atomic_fetch_add_explicit(&sc->shm_device_in_bytes, in->nbytes,
                                              memory_order_relaxed);
                    continue;
                }
                if (pjs_shm_view_read(in->device, err) != 0)
                    return pjs_error_prefix(err, "model %s: input \"%s\": ", m->name, s->name);
                in->data = in->device->data;
            }
            inputs[i] = in->data;
            continue;
        }
        size_t rb = pjs_tensor_spec_row_bytes(s);
        size_t bytes = (size_t)bt->batch_size * rb;
        char *dst = staging_for(sc, m->client, i, bytes);
        if (dst != NULL) {
            memset(dst + (size_t)bt->rows * rb, 0, (size_t)(bt->batch_size - bt->rows) * rb);
        } else {
            dst = owned[i] = calloc((size_t)bt->batch_size, rb ? rb : 1);
            if (dst == NULL)
                return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory gathering input \"%s\"",
                                     s->name);
        }
        for (size_t j = 0; j < bt->n; j++) {
            const pjs_infer_input *in = &bt->reqs[j]->inputs[i];
            char *rows = dst + (size_t)bt->first_row[j] * rb;
            if (in->data == NULL && in->device != NULL) {
                if (pjs_shm_view_read_into(in->device, rows, err) != 0)
                    return pjs_error_prefix(err, "model %s: input \"%s\": ", m->name, s->name);
            } else {
                memcpy(rows, in->data, (size_t)bt->reqs[j]->batch * rb);
            }
        }
        inputs[i] = dst;
    }
    return 0;
}

/* Whether output o of bt's execution can be written into the CUDA shared
 * memory window v (NULL: none) device to device: v lies on the model's
 * device, holds nbytes, and the output is dense and row-major there. */
static bool output_to_device(const batch *bt, size_t o, const pjs_shm_view *v, size_t nbytes)
{
    pjs_model *m = bt->model;
    uint64_t address = 0;
    return v != NULL && nbytes <= v->size && on_model_device(m, v, &address) &&
           pjs_rt_output_device_row_major(
               pjs_bundle_module_at(m->bundle, bt->variant, bt->size_index)->exec, o);
}

/* Sets every request's output descriptions and allocates the buffers of
 * the outputs it wants on the host (not those written into CUDA shared
 * memory on the device: in_shm). */
static int prepare_outputs(const batch *bt, pjs_error *err)
{
    const pjs_manifest *man = pjs_model_manifest(bt->model);
    const pjs_variant *var = &man->variants[bt->variant];
    for (size_t j = 0; j < bt->n; j++) {
        pjs_infer_request *r = bt->reqs[j];
        r->n_outputs = man->n_outputs;
        for (size_t o = 0; o < man->n_outputs; o++) {
            const pjs_tensor_spec *s = &var->outputs[o];
            pjs_infer_output *out = &r->outputs[o];
            out->spec = s;
            out->shape = s->shape;
            if (s->batched)
                out->shape.dims[0] = r->batch;
            if (!output_wanted(r, s, &out->requested))
                continue;
            size_t rb = pjs_tensor_spec_row_bytes(s);
            out->nbytes = s->batched ? rb * (size_t)r->batch : rb;
            if (out->requested >= 0 && output_to_device(bt, o, r->requested[out->requested].shm_view,
                                                        out->nbytes)) {
                out->in_shm = true;
                continue;
            }
            out->data = malloc(out->nbytes ? out->nbytes : 1);
            if (out->data == NULL)
                return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory for output \"%s\"",
                                     s->name);
        }
    }
    return 0;
}

/* Where output o is read back: the request's own buffer when it is alone
 * at the compiled size, else a whole-batch buffer (owned, sliced after);
 * NULL when no request wants it. */
static int output_targets(const batch *bt, void **targets, void **whole, pjs_error *err)
{
    const pjs_manifest *man = pjs_model_manifest(bt->model);
    const pjs_variant *var = &man->variants[bt->variant];
    for (size_t o = 0; o < man->n_outputs; o++) {
        const pjs_tensor_spec *s = &var->outputs[o];
        bool wanted = false;
        for (size_t j = 0; j < bt->n && !wanted; j++)
            wanted = bt->reqs[j]->outputs[o].data != NULL;
        if (!wanted)
            continue;
        if (batch_is_one_request(bt)) {
            targets[o] = bt->reqs[0]->outputs[o].data;
            continue;
        }
        size_t rb = pjs_tensor_spec_row_bytes(s);
        size_t bytes = s->batched ? rb * (size_t)bt->batch_size : rb;
        if ((whole[o] = malloc(bytes ? bytes : 1)) == NULL)
            return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory for output \"%s\"",
                                 s->name);
        targets[o] = whole[o];
    }
    return 0;
}

/* Gives each request its rows of every whole-batch output it wants. */
static void slice_outputs(const batch *bt, void *const *whole)
{
    const pjs_manifest *man = pjs_model_manifest(bt->model);
    for (size_t j = 0; j < bt->n; j++) {
        pjs_infer_request *r = bt->reqs[j];
        for (size_t o = 0; o < man->n_outputs; o++) {
            pjs_infer_output *out = &r->outputs[o];
            if (whole[o] == NULL || out->data == NULL)
                continue;
            size_t rb = pjs_tensor_spec_row_bytes(out->spec);
            size_t from = out->spec->batched ? (size_t)bt->first_row[j] * rb : 0;
            memcpy(out->data, (char *)whole[o] + from, out->nbytes);
        }
    }
}

/* Runs the batch; on return every request has outputs or an error and its
 * phase timestamps, and t holds the phases of the execution. */
static void run_batch(owner_scratch *sc, const batch *bt, uint64_t start, exec_times *t)
{
    pjs_model *m = bt->model;
    const void *inputs[PJS_INFER_MAX_TENSORS] = {0};
    uint64_t in_device[PJS_INFER_MAX_TENSORS] = {0};
    void *owned[PJS_INFER_MAX_TENSORS] = {0};
    void *targets[PJS_INFER_MAX_TENSORS] = {0};
    void *whole[PJS_INFER_MAX_TENSORS] = {0};
    pjs_error err;
    pjs_error_clear(&err);
    memset(t, 0, sizeof *t);
    int rc = gather_inputs(sc, bt, inputs, in_device, owned, &err);
    if (rc == 0)
        rc = prepare_outputs(bt, &err);
    if (rc == 0)
        rc = output_targets(bt, targets, whole, &err);
    if (rc == 0)
        rc = device_execute(sc, m, bt->variant, bt->size_index, m->staged_loading, inputs,
                            in_device, (void *const *)targets, bt, t, &err);
    if (rc == 0)
        slice_outputs(bt, whole);
    t->output_done = pjs_now_ns();
    if (t->input_done == 0)
        t->input_done = t->output_done;
    if (t->infer_done == 0)
        t->infer_done = t->output_done;
    for (size_t i = 0; i < PJS_INFER_MAX_TENSORS; i++) {
        free(owned[i]);
        free(whole[i]);
    }
    for (size_t j = 0; j < bt->n; j++) {
        pjs_infer_request *r = bt->reqs[j];
        r->times.exec_start = start;
        r->exec_rows = bt->rows;
        r->exec_batch_size = bt->batch_size;
        r->exec_requests = bt->n;
        r->times.input_done = t->input_done;
        r->times.infer_done = t->infer_done;
        r->times.output_done = t->output_done;
        r->error = err;
        if (rc != 0) {
            const char *id = r->id != NULL && r->id[0] ? r->id : "(no id)";
            pjs_log_limited(&m->failed_requests_log, PJS_LOG_WARN, "model %s: request %s failed: %s",
                            m->name, id, err.msg);
            pjs_infer_request_release(r);
        }
    }
}

/* Says (rate-limited) that m's weights alone exceed a tier's budget. */
static void warn_over_budget(pjs_model *m, uint64_t bytes, const char *tier, uint64_t budget,
                             const char *what_happens)
{
    char have[32], limit[32];
    pjs_log_limited(&m->over_budget_log, PJS_LOG_WARN,
                    "model %s: its weights (%s) exceed the %s weight budget (%s); %s", m->name,
                    pjs_format_bytes(bytes, have, sizeof have), tier,
                    pjs_format_bytes(budget, limit, sizeof limit), what_happens);
}

/* ---- the host tier (uploading thread, host_lock held) --------------------------- */

/* With a host weight budget, the floors of `host` models are a cache
 * between the bundle files and the device: a floor is read from its file
 * (checked against the checksums taken when the model loaded: a changed
 * file is refused) when the model is uploaded and its floor is absent,
 * evicting other floors by the eviction policy (uses times what reloading
 * them costs per byte) until it fits. A floor being read by an upload is
 * held, so never dropped under it; `device` models' floors are pinned
 * (outside the budget); `unpinned` models have none. Floors are read by
 * the token holder, by an owner that gave the token up for the read
 * (read_beside), or by the transfer thread. host_lock guards the books;
 * a file is read outside it (its room reserved, the entry in flight, then
 * committed), so one thread's read never stops another thread's upload
 * of a floor already in memory; a thread that needs a floor being read
 * waits for that read. A floor holds a reference to its model, as device
 * weights do. */

static int host_load(pjs_wcache_entry *e, void *ctx, pjs_error *err)
{
    (void)ctx;
    pjs_model *m = pjs_model_of_hentry(e);
    uint64_t start = pjs_now_ns();
    int rc = pjs_model_set_host_floor(m, true, err);
    if (rc != 0)
        return rc;
    uint64_t took = pjs_now_ns() - start;
    e->load_ns = (double)took;
    atomic_fetch_add(&m->host_load_ns, took);
    pjs_model_ref(m);
    return 0;
}

static void host_evict(pjs_wcache_entry *e, void *ctx)
{
    (void)ctx;
    pjs_model *m = pjs_model_of_hentry(e);
    pjs_model_set_host_floor(m, false, NULL);
    pjs_model_unref(m);
}

static bool cache_wanted(const pjs_wcache_entry *e, void *ctx);

static bool host_wanted(const pjs_wcache_entry *e, void *ctx)
{
    const pjs_model *m = pjs_model_of_hentry((pjs_wcache_entry *)e);
    return cache_wanted(&m->wentry, ctx);
}

/* host_lock held: returns once no other thread is reading m's floor. */
static void await_host_read(pjs_dispatcher *d, pjs_model *m)
{
    while (m->hentry.in_flight)
        pthread_cond_wait(&d->host_read, &d->host_lock);
}

/* Before m's weights are uploaded: its floor in host memory, held until
 * host_upload_done. A `host` model's floor is loaded from its file when
 * absent; a `device` model's is pinned. No-op without a host tier. */
static int host_upload_begin(pjs_dispatcher *d, pjs_model *m, pjs_error *err)
{
    if (!d->host_tier || !pjs_residency_has_floor(m->residency))
        return 0;
    bool over_budget = false;
    int rc = 0;
    pthread_mutex_lock(&d->host_lock);
    await_host_read(d, m);
    if (pjs_residency_device_pinned(m->residency)) {
        rc = pjs_wcache_set_pinned(&d->host, &m->hentry, true, err);
    } else {
        if (!m->hentry.resident && pjs_wcache_reserve(&d->host, &m->hentry, NULL)) {
            pthread_mutex_unlock(&d->host_lock);
            rc = host_load(&m->hentry, d, err);
            pthread_mutex_lock(&d->host_lock);
            pjs_wcache_commit(&d->host, &m->hentry, rc == 0);
            pthread_cond_broadcast(&d->host_read);
        }
        /* resident now: counts the use; else (no room without evicting a
         * held floor) reads it over the budget, under the lock */
        if (rc == 0)
            rc = pjs_wcache_acquire(&d->host, &m->hentry, 1, &over_budget, err);
    }
    if (rc == 0)
        atomic_fetch_add(&m->hentry.holds, 1);
    pthread_mutex_unlock(&d->host_lock);
    if (rc != 0)
        return pjs_error_prefix(err, "reading its weights into host memory: ");
    if (over_budget)
        warn_over_budget(m, m->hentry.bytes, "host", d->host.budget,
                         "read after evicting every other model's from host memory");
    return 0;
}

static void host_upload_done(pjs_dispatcher *d, pjs_model *m)
{
    if (d->host_tier && pjs_residency_has_floor(m->residency))
        atomic_fetch_sub(&m->hentry.holds, 1);
}

/* m leaves the host tier (retired, or now `unpinned`): its floor is freed. */
static void host_release(pjs_dispatcher *d, pjs_model *m)
{
    if (!d->host_tier)
        return;
    pthread_mutex_lock(&d->host_lock);
    await_host_read(d, m);
    pjs_wcache_release(&d->host, &m->hentry);
    pthread_mutex_unlock(&d->host_lock);
}

/* ---- weight residency (token holder) ------------------------------------------ */

/* The cache's callbacks: a resident model holds a reference, so it outlives
 * its device weights whatever thread drops the repository's reference. They
 * also keep the scheduler's view of residency (share.cold) and of load
 * costs current, under the lock, and charge a load to the model's share. */
static int load_weights(pjs_dispatcher *d, pjs_model *m, bool staged, pjs_error *err)
{
    pjs_wcache_entry *e = &m->wentry;
    uint64_t start = pjs_now_ns();
    int rc = host_upload_begin(d, m, err);
    if (rc != 0)
        return rc;
    rc = staged ? pjs_model_start_staged_load(m, err) : PJS_ERR_UNSUPPORTED;
    if (rc == 0) { /* in flight: end_staged_load releases the floor and charges the load */
        pjs_model_ref(m);
        pthread_mutex_lock(&d->lock);
        m->share.cold = false;
        pthread_mutex_unlock(&d->lock);
        return 0;
    }
    if (rc == PJS_ERR_UNSUPPORTED)
        rc = pjs_model_load_weights(m, err);
    host_upload_done(d, m);
    if (rc != 0)
        return pjs_error_prefix(err, "loading its weights: ");
    uint64_t end = pjs_now_ns();
    pjs_model_ref(m);
    pthread_mutex_lock(&d->lock);
    pjs_sched_charge_load(&d->sched, &m->share, end, end - start);
    e->load_ns = m->share.load_ns;
    m->share.cold = false;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* The owner's loads (pjs_wcache_acquire); a staged one when acquire asks. */
static int cache_load(pjs_wcache_entry *e, void *ctx, pjs_error *err)
{
    pjs_dispatcher *d = ctx;
    return load_weights(d, pjs_model_of_wentry(e), d->stage_next_load, err);
}

static void cache_evict(pjs_wcache_entry *e, void *ctx)
{
    pjs_dispatcher *d = ctx;
    pjs_model *m = pjs_model_of_wentry(e);
    pthread_mutex_lock(&d->lock);
    m->share.cold = d->cache.autonomous; /* explicit control: nothing to wait for */
    pthread_mutex_unlock(&d->lock);
    pjs_model_free_weights(m);
    pjs_model_unref(m);
}

static bool cache_wanted(const pjs_wcache_entry *e, void *ctx)
{
    pjs_dispatcher *d = ctx;
    const pjs_model *m = pjs_model_of_wentry((pjs_wcache_entry *)e);
    pthread_mutex_lock(&d->lock);
    bool wanted = m->share.queued > 0;
    pthread_mutex_unlock(&d->lock);
    return wanted;
}

static bool d_autonomous(const pjs_dispatcher *d)
{
    return d->cache.autonomous;
}

/* A model that left the repository gives its device weights back once its
 * last queued request ran. */
static void release_if_retired(pjs_dispatcher *d, pjs_model *m);

/* ---- prefetch (token holder, lock not held) ---------------------------------------- */

/* How much nicer than the process the transfer thread is (see the top), at
 * most 19 in all: on a 2-CPU machine under a bursty trace of 1,000 models it
 * took the p99 of requests whose model was resident from 2.6-3.6 ms to
 * 1.9-2.3 ms, with cold requests' p99 unchanged (bench/catalogue.py --quick,
 * three runs each). */
#define PREFETCH_NICE 10

/* The transfer thread: copies the weights of the model it is given. */
static void *transfer_main(void *arg)
{
    pjs_dispatcher *d = arg;
    /* per thread on Linux (a thread is a task of its own), over the
     * process's own niceness */
    id_t self = (id_t)syscall(SYS_gettid);
    errno = 0;
    int niceness = getpriority(PRIO_PROCESS, self);
    int nicer = niceness + PREFETCH_NICE > 19 ? 19 : niceness + PREFETCH_NICE;
    if (errno == 0)
        (void)setpriority(PRIO_PROCESS, self, nicer);
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->xfer.stopping && (d->xfer.model == NULL || d->xfer.done))
            pthread_cond_wait(&d->xfer.wake, &d->lock);
        if (d->xfer.stopping)
            break;
        pjs_model *m = d->xfer.model;
        pthread_mutex_unlock(&d->lock);
        pjs_error err;
        int rc = load_weights(d, m, false, &err);
        pthread_mutex_lock(&d->lock);
        d->xfer.rc = rc;
        if (rc != 0)
            d->xfer.err = err;
        d->xfer.done = true;
        pthread_cond_broadcast(&d->xfer.finished);
        pthread_cond_signal(&d->work); /* an owner commits it and may run the model */
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Lets go of the lookahead's hold and reference. */
static void drop_lookahead(pjs_dispatcher *d)
{
    pjs_model *m = d->lookahead;
    if (m == NULL)
        return;
    d->lookahead = NULL;
    atomic_fetch_sub(&m->wentry.holds, 1);
    pjs_model_unref(m);
}

/* Commits the prefetch in flight, if any, once its copy is done: waiting
 * for the copy when `wait`, else only if it already finished. */
static void transfer_settle(pjs_dispatcher *d, bool wait)
{
    pthread_mutex_lock(&d->lock);
    pjs_model *m = d->xfer.model;
    if (m == NULL || (!d->xfer.done && !wait)) {
        pthread_mutex_unlock(&d->lock);
        return;
    }
    while (!d->xfer.done)
        pthread_cond_wait(&d->xfer.finished, &d->lock);
    int rc = d->xfer.rc;
    pjs_error err = d->xfer.err;
    d->xfer.model = NULL;
    d->xfer.done = false;
    pthread_mutex_unlock(&d->lock);
    pjs_wcache_commit(&d->cache, &m->wentry, rc == 0); /* cache_load marked it warm */
    if (rc != 0)
        pjs_log_limited(&m->prefetch_log, PJS_LOG_WARN,
                        "model %s: copying its weights ahead of its turn failed (%s); they are "
                        "loaded again when it runs",
                        m->name, err.msg);
    if (rc != 0)
        drop_lookahead(d);
    release_if_retired(d, m);
    pjs_model_unref(m);
}

/* Token held, lock not held, no copy in flight and no lookahead: hands the
 * copy of m's weights (referenced; the reference goes to the transfer) to
 * the transfer thread, if room can be made without evicting `keep`; false
 * (m's reference dropped) when it cannot. */
static bool start_copy(pjs_dispatcher *d, pjs_model *m, const pjs_wcache_entry *keep)
{
    if (!pjs_wcache_reserve(&d->cache, &m->wentry, keep)) {
        pjs_model_unref(m);
        return false;
    }
    atomic_fetch_add(&m->wentry.holds, 1);
    d->lookahead = pjs_model_ref(m);
    pthread_mutex_lock(&d->lock);
    d->xfer.model = m;
    d->xfer.done = false;
    d->prefetches++;
    pthread_cond_signal(&d->xfer.wake);
    pthread_mutex_unlock(&d->lock);
    return true;
}

/* Before `running` executes: starts copying the weights of `due` (the
 * cold model whose turn `running` took, pjs_sched_plan.cold_due) or else of
 * the cold model the scheduler would pick next, if the transfer is idle and
 * room can be made without evicting `running`. */
static void maybe_prefetch(pjs_dispatcher *d, pjs_model *running, pjs_model *due)
{
    if (!d->sched.cfg.weight_prefetch)
        return;
    pthread_mutex_lock(&d->lock);
    if (d->lookahead != NULL && d->lookahead->share.queued == 0 && d->xfer.model == NULL) {
        pthread_mutex_unlock(&d->lock);
        drop_lookahead(d); /* its requests went without it running */
        pthread_mutex_lock(&d->lock);
    }
    pjs_model *m = NULL;
    if (d->lookahead == NULL && due != NULL && due->share.cold) {
        m = pjs_model_ref(due);
    } else if (d->lookahead == NULL) {
        pjs_sched_queue *q = pjs_sched_next_cold(&d->sched, pjs_now_ns());
        if (q != NULL && q->owner != running)
            m = pjs_model_ref(q->owner);
    }
    pthread_mutex_unlock(&d->lock);
    if (m != NULL)
        start_copy(d, m, &running->wentry);
}

/* Makes m's weights resident before it runs `uses` requests. A copy in
 * flight is committed if done; it is waited for only when it is m's own
 * (another model's copy, perhaps still reading its file, goes on beside
 * this load).
 * `staged`: a load may be left in flight for a staged execution (see top;
 * m->staged_loading tells), which end_staged_load then ends. */
static int acquire(pjs_dispatcher *d, pjs_model *m, uint64_t uses, bool staged,
                   pjs_error *err)
{
    if (!m->wentry.resident) {
        pthread_mutex_lock(&d->lock);
        bool own_copy = d->xfer.model == m;
        pthread_mutex_unlock(&d->lock);
        transfer_settle(d, own_copy);
    }
    if (m == d->lookahead)
        drop_lookahead(d); /* it runs now */
    bool over_budget = false;
    /* read by cache_load on this thread only (the transfer thread's copies
     * are never staged) */
    bool stage = staged && !m->wentry.resident;
    if (stage)
        d->stage_next_load = true;
    int rc = pjs_wcache_acquire(&d->cache, &m->wentry, uses, &over_budget, err);
    if (stage)
        d->stage_next_load = false;
    if (rc != 0)
        return pjs_error_prefix(err, "model %s: ", m->name);
    if (over_budget) /* on every load of it: each request, when other models run between */
        warn_over_budget(m, m->wentry.bytes, "device", d->cache.budget,
                         "loaded after evicting every other model");
    return 0;
}

/* After a staged execution: waits for any block still in flight, gives the
 * floor back and charges the load, issue to last arrival; a failed copy
 * leaves m not resident. */
static void end_staged_load(pjs_dispatcher *d, pjs_model *m)
{
    pjs_error err;
    int rc = pjs_model_finish_staged_load(m, &err);
    host_upload_done(d, m);
    if (rc != 0) {
        pjs_log_limited(&m->prefetch_log, PJS_LOG_WARN, "%s", err.msg);
        pjs_wcache_release(&d->cache, &m->wentry);
        return;
    }
    pthread_mutex_lock(&d->lock);
    pjs_sched_charge_load(&d->sched, &m->share, m->staged_load_end,
                          m->staged_load_end - m->staged_load_start);
    m->wentry.load_ns = m->share.load_ns;
    pthread_mutex_unlock(&d->lock);
}

static void release_if_retired(pjs_dispatcher *d, pjs_model *m)
{
    if (!m->retired)
        return;
    pthread_mutex_lock(&d->lock);
    bool idle = m->share.queued == 0;
    pthread_mutex_unlock(&d->lock);
    if (idle) {
        pjs_wcache_release(&d->cache, &m->wentry);
        host_release(d, m);
    }
}

/* ---- statistics ------------------------------------------------------------- */

static void add_duration(pjs_duration_stat *d, uint64_t from, uint64_t to)
{
    d->count++;
    d->ns += to > from ? to - from : 0;
}

static void record_batch_stats(const batch *bt, uint64_t start, const exec_times *t)
{
    pjs_model *m = bt->model;
    uint64_t done = pjs_now_ns();
    pthread_mutex_lock(&m->stats_lock);
    pjs_model_stats *st = &m->stats;
    st->execution_count++;
    st->device_ns += t->output_done - start;
    bool ok = bt->reqs[0]->error.code == PJS_OK;
    for (size_t j = 0; j < bt->n; j++) {
        pjs_infer_request *r = bt->reqs[j];
        if (!ok) {
            add_duration(&st->fail, r->times.received, done);
            continue;
        }
        add_duration(&st->success, r->times.received, done);
        add_duration(&st->queue, r->times.queued, start);
        add_duration(&st->compute_input, start, t->input_done);
        add_duration(&st->compute_infer, t->input_done, t->infer_done);
        add_duration(&st->compute_output, t->infer_done, t->output_done);
        st->queue_wait[pjs_queue_wait_bucket(start - r->times.queued)]++;
        st->inference_count += (uint64_t)r->batch;
    }
    pjs_batch_stat *b = ok ? pjs_model_stats_batch_entry(st, bt->rows) : NULL;
    if (b != NULL) {
        add_duration(&b->compute_input, start, t->input_done);
        add_duration(&b->compute_infer, t->input_done, t->infer_done);
        add_duration(&b->compute_output, t->infer_done, t->output_done);
    }
    if (ok)
        st->last_inference_ms = pjs_wall_ms();
    pthread_mutex_unlock(&m->stats_lock);
}

/* Counts a request that failed without executing. */
static void drop_stats(pjs_infer_request *r, uint64_t now)
{
    pjs_model *m = r->model;
    pthread_mutex_lock(&m->stats_lock);
    add_duration(&m->stats.fail, r->times.received, now);
    pthread_mutex_unlock(&m->stats_lock);
}

/* Answers a request the scheduler dropped: DEADLINE_EXCEEDED (to done). */
static void drop(pjs_dispatcher *d, pjs_sched_job *j, uint64_t now, bool shed, request_fifo *done)
{
    pjs_infer_request *r = request_of(j);
    pjs_model *m = r->model;
    uint64_t waited_us = (now - r->times.queued) / 1000;
    if (shed)
        pjs_error_set(&r->error, PJS_ERR_DEADLINE_EXCEEDED,
                      "model %s: request dropped after %llu us in the queue: the edf scheduler "
                      "predicts it cannot finish before its deadline",
                      m->name, (unsigned long long)waited_us);
    else
        pjs_error_set(&r->error, PJS_ERR_DEADLINE_EXCEEDED,
                      "model %s: the request's deadline passed after %llu us in the queue; it "
                      "was not executed",
                      m->name, (unsigned long long)waited_us);
    pthread_mutex_lock(&m->stats_lock);
    if (shed)
        m->stats.shed++;
    else
        m->stats.expired++;
    pthread_mutex_unlock(&m->stats_lock);
    drop_stats(r, now);
    release_if_retired(d, m); /* the last queued request of a retired model */
    fifo_push(done, r);
}

/* ---- the device owner ---------------------------------------------------------- */

static size_t list_length(const pjs_sched_job *j)
{
    size_t n = 0;
    for (; j != NULL; j = j->next)
        n++;
    return n;
}

/* Gives every request of a job list err and counts it failed (to done). */
static void fail_jobs(pjs_sched_job *jobs, const pjs_error *err, request_fifo *done)
{
    for (pjs_sched_job *j = jobs, *next; j != NULL; j = next) {
        next = j->next;
        pjs_infer_request *r = request_of(j);
        r->error = *err;
        drop_stats(r, pjs_now_ns());
        fifo_push(done, r);
    }
}

/* Where m's weights are when they are not on the device. */
static pjs_tier host_tier_of(pjs_dispatcher *d, pjs_model *m)
{
    bool in_host;
    uint64_t loads, evictions;
    pjs_dispatcher_host_residency(d, m, &in_host, &loads, &evictions);
    return in_host ? PJS_TIER_HOST : PJS_TIER_FILE;
}

/* Token holder: where m's weights are before it is acquired to run. */
static pjs_tier tier_of(pjs_dispatcher *d, pjs_model *m)
{
    return m->wentry.resident ? PJS_TIER_DEVICE : host_tier_of(d, m);
}

/* Lock held: counts bt's requests, which succeeded, under the tier their
 * model was in when each was queued, received to executed (`executed`).
 * Not the tier when the execution was planned: a request that arrived
 * while its model was only in its file and waited for a copy made ahead of
 * its turn is a file request. */
static void record_tier_locked(pjs_dispatcher *d, const batch *bt, uint64_t executed)
{
    for (size_t j = 0; j < bt->n; j++) {
        pjs_tier tier = (pjs_tier)bt->reqs[j]->queued_tier;
        uint64_t ns = executed - bt->reqs[j]->times.received;
        d->tiers.requests[tier]++;
        d->tiers.ns[tier] += ns;
        d->tiers.buckets[tier][pjs_queue_wait_bucket(ns)]++;
    }
}

/* Token held, lock not held, before m (whose floor is not in host memory)
 * is loaded to run a plan: has m's file read with the token given up
 * meanwhile, so that requests for models on the device or in host memory
 * execute during the read instead of waiting for it; then takes the token
 * back, ahead of anyone else. The transfer thread makes the whole copy
 * when it is idle (at its lower priority: on a busy machine the read
 * yields to executions) and m has no swap-in stages (a staged load is the
 * owner's); else this thread reads the floor itself. True when this
 * thread read the floor and holds it for the load (host_upload_done after
 * it); false otherwise: the copy is the transfer's (acquire commits it),
 * or the read failed, and then the load reads again and its error goes to
 * the plan's requests. */
static bool device_work_locked(const pjs_dispatcher *d);

static bool read_beside(pjs_dispatcher *d, pjs_model *m)
{
    pthread_mutex_lock(&d->lock);
    bool idle = d->xfer.model == NULL && d->lookahead == NULL;
    pthread_mutex_unlock(&d->lock);
    bool handed = idle && d->sched.cfg.weight_prefetch && pjs_model_manifest(m)->n_stages == 0 &&
                  start_copy(d, pjs_model_ref(m), NULL);
    pthread_mutex_lock(&d->lock);
    d->device_held = false;
    d->reading++;
    if (device_work_locked(d))
        pthread_cond_signal(&d->work);
    bool held = false;
    if (handed) { /* committed by acquire, or by whoever owns the device first */
        while (d->xfer.model == m && !d->xfer.done)
            pthread_cond_wait(&d->xfer.finished, &d->lock);
    } else {
        pthread_mutex_unlock(&d->lock);
        pjs_error err;
        held = host_upload_begin(d, m, &err) == 0;
        pthread_mutex_lock(&d->lock);
    }
    d->token_wanted++;
    while (d->device_held)
        pthread_cond_wait(&d->token_back, &d->lock);
    d->token_wanted--;
    d->reading--;
    d->device_held = true;
    pthread_mutex_unlock(&d->lock);
    return held;
}

/* Runs a plan (token held, lock not held); every request of it, executed
 * or dropped, ends up in done. `due`: the model of plan->cold_due, if any
 * (referenced). */
static void run_plan(pjs_dispatcher *d, pjs_sched_plan *plan, pjs_model *due,
                     request_fifo *done)
{
    uint64_t now = pjs_now_ns();
    for (pjs_sched_job *j = plan->expired, *next; j != NULL; j = next) {
        next = j->next;
        drop(d, j, now, false, done);
    }
    for (pjs_sched_job *j = plan->shed, *next; j != NULL; j = next) {
        next = j->next;
        drop(d, j, now, true, done);
    }
    if (plan->queue == NULL)
        return;
    /* Our own reference: the requests' go with their completion, and the
     * model is looked at after that. */
    pjs_model *model = pjs_model_ref(plan->queue->owner);
    pjs_tier tier = tier_of(d, model);
    /* before the owner's scratch holds anything: another owner uses it
     * while this one reads */
    bool floor_held = tier == PJS_TIER_FILE && pjs_residency_has_floor(model->residency) &&
                      read_beside(d, model);
    owner_scratch *sc = &d->scratch;
    if (grow((void **)&sc->reqs, &sc->reqs_cap, plan->n_jobs, sizeof *sc->reqs) != 0 ||
        grow((void **)&sc->first_row, &sc->rows_cap, plan->n_jobs, sizeof *sc->first_row) != 0) {
        pjs_error nomem;
        pjs_error_set(&nomem, PJS_ERR_NOMEM, "model %s: out of memory", model->name);
        fail_jobs(plan->jobs, &nomem, done);
        if (floor_held)
            host_upload_done(d, model);
        release_if_retired(d, model);
        pjs_model_unref(model);
        return;
    }
    batch bt = {
        .model = model,
        .variant = plan->queue->variant,
        .size_index = plan->size_index,
        .batch_size = plan->batch_size,
        .rows = plan->rows,
        .n = plan->n_jobs,
        .reqs = sc->reqs,
        .first_row = sc->first_row,
    };
    int64_t row = 0;
    size_t i = 0;
    for (pjs_sched_job *j = plan->jobs; j != NULL; j = j->next, i++) {
        bt.reqs[i] = request_of(j);
        bt.first_row[i] = row;
        row += j->rows;
    }
    pjs_error acquire_err;
    int acquired = acquire(d, bt.model, bt.n, true, &acquire_err);
    if (floor_held)
        host_upload_done(d, model); /* the load took its own hold */
    if (acquired != 0) {
        fail_jobs(plan->jobs, &acquire_err, done);
    } else {
        bool staged = bt.model->staged_loading;
        if (!staged) /* its own copies take the link now */
            maybe_prefetch(d, bt.model, due);
        uint64_t start = pjs_now_ns();
        exec_times t;
        run_batch(sc, &bt, start, &t);
        if (staged)
            end_staged_load(d, bt.model);
        if (bt.reqs[0]->error.code == PJS_OK) {
            pthread_mutex_lock(&d->lock);
            pjs_sched_record(&d->sched, plan->queue, plan->size_index, t.output_done,
                             t.output_done - start);
            record_tier_locked(d, &bt, t.output_done);
            pthread_mutex_unlock(&d->lock);
        }
        record_batch_stats(&bt, start, &t);
        for (size_t k = 0; k < bt.n; k++)
            fifo_push(done, bt.reqs[k]);
    }
    release_if_retired(d, model);
    pjs_model_unref(model);
}

/* Lock held: whether the device has work and is free to take (an owner
 * back from read_beside takes it first). */
static bool device_work_locked(const pjs_dispatcher *d)
{
    return !d->device_held && d->token_wanted == 0 &&
           (d->tasks != NULL || d->sched.active != NULL);
}

static void finish_all_locked(pjs_dispatcher *d);

/* scheduler.hand_off (see pjs_hand_off). */
static bool hand_off(const pjs_dispatcher *d)
{
    return d->sched.cfg.hand_off == PJS_HAND_OFF_ON;
}

/* Lock held, token free and work waiting: takes the token, runs one task or
 * plan with the lock released, gives the token back and hands what it ran
 * to `finished`. Without hand-off (pjs_hand_off) it keeps the token while
 * plans wait: it answers what it ran, then runs the next plan, which holds
 * what arrived meanwhile (a request thread does so a few times at most).
 * Returns with the lock held. */
static void own_device_locked(pjs_dispatcher *d, bool on_submit)
{
    d->device_held = true;
    device_task *task = d->tasks;
    request_fifo done = {0};
    if (task != NULL) {
        d->tasks = task->next;
        pthread_mutex_unlock(&d->lock);
        transfer_settle(d, true); /* tasks see no copy in flight, nothing held for it */
        drop_lookahead(d);
        task->run(task);
        pthread_mutex_lock(&d->lock);
        task->done = true;
        pthread_cond_broadcast(&d->task_done);
    } else {
        for (int runs = 1;; runs++) {
            if (d->xfer.done) { /* the scheduler then sees the model resident */
                pthread_mutex_unlock(&d->lock);
                transfer_settle(d, false);
                pthread_mutex_lock(&d->lock);
            }
            pjs_sched_plan plan;
            pjs_sched_next(&d->sched, pjs_now_ns(), &plan);
            d->queued -= plan.n_jobs + list_length(plan.expired) + list_length(plan.shed);
            pjs_model *due = plan.cold_due != NULL ? pjs_model_ref(plan.cold_due->owner) : NULL;
            if (on_submit)
                d->inline_plans++;
            else
                d->worker_plans++;
            pthread_mutex_unlock(&d->lock);
            run_plan(d, &plan, due, &done);
            if (due != NULL)
                pjs_model_unref(due);
            pthread_mutex_lock(&d->lock);
            if (hand_off(d) || d->tasks != NULL || d->sched.active == NULL ||
                d->token_wanted > 0 || (on_submit && runs == PJS_DISPATCH_INLINE_MAX_RUNS))
                break;
            while (done.head != NULL)
                fifo_push(&d->finished, fifo_pop(&done));
            finish_all_locked(d);
        }
    }
    d->device_held = false;
    if (d->token_wanted > 0)
        pthread_cond_broadcast(&d->token_back);
    bool more_work = d->tasks != NULL || d->sched.active != NULL;
    while (done.head != NULL) /* they wait for their on_done */
        fifo_push(&d->finished, fifo_pop(&done));
    /* One worker takes the device next, or (with hand-off) helps finishing. */
    if (more_work || (hand_off(d) && d->finished.length > 1))
        pthread_cond_signal(&d->work);
}

/* Lock held: calls on_done for finished requests until none is left;
 * returns with the lock held. */
static void finish_all_locked(pjs_dispatcher *d)
{
    pjs_infer_request *r;
    while ((r = fifo_pop(&d->finished)) != NULL) {
        /* Counted out before on_done, which may drop the model's last
         * reference with the request's. */
        r->model->requests_in_flight--;
        pthread_mutex_unlock(&d->lock);
        if (r->committed_slot != NULL)
            atomic_store(r->committed_slot, false);
        completing++;
        r->on_done(r); /* r may be freed from here on */
        completing--;
        pthread_mutex_lock(&d->lock);
        if (--d->in_flight == 0)
            pthread_cond_broadcast(&d->idle);
    }
}

/* A worker: takes the device whenever it is free and has work, and helps
 * finishing requests. */
static void *worker_main(void *arg)
{
    pjs_dispatcher *d = arg;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        if (device_work_locked(d)) {
            own_device_locked(d, false);
            finish_all_locked(d);
        } else if (d->finished.length > 0) {
            finish_all_locked(d);
        } else if (d->stopping && d->sched.active == NULL && d->tasks == NULL &&
                   !d->device_held && d->reading == 0) {
            break;
        } else {
            pthread_cond_wait(&d->work, &d->lock);
        }
    }
    pthread_cond_broadcast(&d->work); /* the next worker sees stopping too */
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Runs task as the device owner and waits for it. */
static void run_device_task(pjs_dispatcher *d, device_task *task)
{
    task->done = false;
    task->next = NULL;
    pthread_mutex_lock(&d->lock);
    device_task **tail = &d->tasks;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = task;
    pthread_cond_signal(&d->work);
    while (!task->done)
        pthread_cond_wait(&d->task_done, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

/* ---- models ------------------------------------------------------------------------ */

int pjs_dispatcher_attach(pjs_dispatcher *d, pjs_model *m, double weight, size_t max_queue_depth,
                          pjs_error *err)
{
    const pjs_manifest *man = pjs_model_manifest(m);
    if (man->n_batch_sizes > PJS_SCHED_MAX_SIZES)
        return pjs_error_set(err, PJS_ERR_UNSUPPORTED,
                             "model %s: pjserve schedules at most %d batch sizes", m->name,
                             PJS_SCHED_MAX_SIZES);
    m->queues = calloc(man->n_variants, sizeof *m->queues);
    if (m->queues == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    pjs_sched_share_init(&m->share, weight, max_queue_depth);
    m->share.cold = d->cache.autonomous && !m->wentry.resident;
    for (size_t v = 0; v < man->n_variants; v++)
        pjs_sched_queue_init(&m->queues[v], &m->share, m, v, man->batch_sizes,
                             m->n_served_sizes, m->coalesce);
    m->n_queues = man->n_variants;
    return 0;
}

typedef struct warm_up_task {
    device_task task;
    pjs_dispatcher *dispatcher;
    pjs_model *model;
    int runs;
    uint64_t *costs_ns;
    bool reused; /* the costs were another model's: nothing ran */
    int rc;
    pjs_error err;
} warm_up_task;

/* Seeds m's costs from executables another model warmed up already (they
 * are shared: identical modules); false when one of them was not. */
static bool seed_known_costs(warm_up_task *w)
{
    pjs_model *m = w->model;
    const pjs_manifest *man = pjs_model_manifest(m);
    for (size_t v = 0; v < man->n_variants; v++)
        for (size_t k = 0; k < man->n_batch_sizes; k++)
            if (atomic_load(&pjs_bundle_module_at(m->bundle, v, k)->exec->warm_cost_ns) == 0)
                return false;
    for (size_t v = 0; v < man->n_variants; v++)
        for (size_t k = 0; k < man->n_batch_sizes; k++) {
            uint64_t cost = atomic_load(&pjs_bundle_module_at(m->bundle, v, k)->exec->warm_cost_ns);
            pjs_sched_seed_cost(&m->queues[v], k, cost);
            if (w->costs_ns != NULL)
                w->costs_ns[v * man->n_batch_sizes + k] = cost;
        }
    return true;
}

/* Executes every (variant, batch size) `runs` times on zero inputs, unless
 * a model sharing its executables did: a catalogue of one architecture
 * loads its weights and executes for the first model only. */
static void warm_up_run(device_task *task)
{
    warm_up_task *w = (warm_up_task *)task;
    pjs_model *m = w->model;
    /* Without autonomous residency (explicit control) only a pinned model
     * has its weights now; the others warm up when pinned. */
    if (!d_autonomous(w->dispatcher) && !m->wentry.pinned)
        return;
    if (w->runs <= 0 && !m->wentry.pinned)
        return; /* nothing to measure; on-demand weights wait for a request */
    if (!m->wentry.pinned && seed_known_costs(w)) {
        w->reused = true;
        return;
    }
    if ((w->rc = acquire(w->dispatcher, m, 0, false, &w->err)) != 0 || w->runs <= 0)
        return;
    const pjs_manifest *man = pjs_model_manifest(m);
    const void *inputs[PJS_INFER_MAX_TENSORS] = {0};
    void *host[PJS_INFER_MAX_TENSORS] = {0};
    void *outputs[PJS_INFER_MAX_TENSORS] = {0};
    for (size_t v = 0; v < man->n_variants && w->rc == 0; v++) {
        const pjs_variant *var = &man->variants[v];
        for (size_t k = 0; k < man->n_batch_sizes && w->rc == 0; k++) {
            int64_t n = man->batch_sizes[k];
            for (size_t i = 0; i < man->n_inputs && w->rc == 0; i++) {
                size_t rb = pjs_tensor_spec_row_bytes(&var->inputs[i]);
                host[i] = calloc(var->inputs[i].batched ? (size_t)n : 1, rb ? rb : 1);
                inputs[i] = host[i];
                if (host[i] == NULL)
                    w->rc = pjs_error_set(&w->err, PJS_ERR_NOMEM, "out of memory");
            }
            for (size_t o = 0; o < man->n_outputs && w->rc == 0; o++) {
                size_t rb = pjs_tensor_spec_row_bytes(&var->outputs[o]);
                outputs[o] = malloc((var->outputs[o].batched ? (size_t)n : 1) * (rb ? rb : 1));
                if (outputs[o] == NULL)
                    w->rc = pjs_error_set(&w->err, PJS_ERR_NOMEM, "out of memory");
            }
            /* The fastest run: the first may carry one-time costs, and a
             * noisy high seed would keep the size from being chosen. */
            uint64_t cost = UINT64_MAX;
            for (int run = 0; run < w->runs && w->rc == 0; run++) {
                exec_times t;
                uint64_t start = pjs_now_ns();
                w->rc = device_execute(&w->dispatcher->scratch, m, v, k, false, inputs, NULL,
                                       outputs, NULL, &t, &w->err);
                if (t.output_done - start < cost)
                    cost = t.output_done - start;
            }
            /* the stages too, once: their first run's one-time costs would
             * otherwise fall on a cold request */
            if (w->rc == 0 && man->n_stages > 0) {
                exec_times t;
                w->rc = device_execute(&w->dispatcher->scratch, m, v, k, true, inputs, NULL,
                                       outputs, NULL, &t, &w->err);
            }
            for (size_t i = 0; i < PJS_INFER_MAX_TENSORS; i++) {
                free(host[i]);
                free(outputs[i]);
                host[i] = outputs[i] = NULL;
            }
            if (w->rc != 0)
                break;
            uint64_t unknown = 0;
            pjs_rt_executable *e = pjs_bundle_module_at(m->bundle, v, k)->exec;
            atomic_compare_exchange_strong(&e->warm_cost_ns, &unknown, cost);
            pjs_sched_seed_cost(&m->queues[v], k, cost);
            if (w->costs_ns != NULL)
                w->costs_ns[v * man->n_batch_sizes + k] = cost;
        }
    }
}

int pjs_dispatcher_warm_up(pjs_dispatcher *d, pjs_model *m, int runs, uint64_t *costs_ns,
                           bool *reused, pjs_error *err)
{
    warm_up_task w = {
        .task.run = warm_up_run, .dispatcher = d, .model = m, .runs = runs, .costs_ns = costs_ns};
    run_device_task(d, &w.task);
    if (reused != NULL)
        *reused = w.reused;
    if (w.rc != 0) {
        *err = w.err;
        return pjs_error_prefix(err, "warm-up: ");
    }
    return 0;
}

typedef struct residency_task {
    device_task task;
    pjs_dispatcher *dispatcher;
    pjs_model *model;
    pjs_residency target;   /* set_residency */
    bool retire;            /* or: the model left the repository */
    int rc;
    pjs_error err;
} residency_task;

static void residency_run(device_task *task)
{
    residency_task *t = (residency_task *)task;
    pjs_dispatcher *d = t->dispatcher;
    pjs_model *m = t->model;
    if (t->retire) {
        m->retired = true;
        release_if_retired(d, m);
        return;
    }
    bool pin = pjs_residency_device_pinned(t->target);
    bool floor = pjs_residency_has_floor(t->target);
    if (!d->host_tier && floor && (t->rc = pjs_model_set_host_floor(m, true, &t->err)) != 0)
        return;
    if (d->host_tier && floor) {
        /* a device model's floor is pinned in host memory too, a host
         * model's is evictable (read again when it is next uploaded) */
        pthread_mutex_lock(&d->host_lock);
        t->rc = pjs_wcache_set_pinned(&d->host, &m->hentry, pin, &t->err);
        pthread_mutex_unlock(&d->host_lock);
        if (t->rc != 0) {
            pjs_error_prefix(&t->err, "model %s: ", m->name);
            return;
        }
    }
    pthread_mutex_lock(&d->cache.lock);
    pjs_residency was = m->residency;
    m->residency = t->target; /* read by the load the pinning below makes */
    pthread_mutex_unlock(&d->cache.lock);
    if ((t->rc = pjs_wcache_set_pinned(&d->cache, &m->wentry, pin, &t->err)) != 0) {
        pthread_mutex_lock(&d->cache.lock);
        m->residency = was;
        pthread_mutex_unlock(&d->cache.lock);
        pjs_error_prefix(&t->err, "model %s: ", m->name);
        return;
    }
    if (!floor) {
        host_release(d, m);
        pjs_model_set_host_floor(m, false, NULL);
    }
}

int pjs_dispatcher_set_residency(pjs_dispatcher *d, pjs_model *m, pjs_residency target,
                                 pjs_error *err)
{
    residency_task t = {
        .task.run = residency_run, .dispatcher = d, .model = m, .target = target};
    run_device_task(d, &t.task);
    if (t.rc != 0)
        *err = t.err;
    return t.rc;
}

void pjs_dispatcher_retire(pjs_dispatcher *d, pjs_model *m)
{
    residency_task t = {.task.run = residency_run, .dispatcher = d, .model = m, .retire = true};
    run_device_task(d, &t.task);
}

typedef struct compact_task {
    device_task task;
    pjs_dispatcher *dispatcher;
    pjs_model *const *reload;
    size_t n;
    size_t reloaded;
    pjs_error err;
} compact_task;

static void compact_run(device_task *task)
{
    compact_task *t = (compact_task *)task;
    pjs_wcache_entry *entries[64];
    size_t n = 0;
    for (size_t i = 0; i < t->n && n < sizeof entries / sizeof *entries; i++)
        entries[n++] = &t->reload[i]->wentry;
    t->reloaded = pjs_wcache_compact(&t->dispatcher->cache, entries, n, &t->err);
}

int pjs_dispatcher_compact(pjs_dispatcher *d, pjs_model *const *reload, size_t n,
                           size_t *reloaded, pjs_error *err)
{
    if (n > 64)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "compaction reloads at most 64 models at once (%zu named)", n);
    compact_task t = {.task.run = compact_run, .dispatcher = d, .reload = reload, .n = n};
    pjs_error_clear(&t.err);
    run_device_task(d, &t.task);
    *reloaded = t.reloaded;
    if (t.err.code != PJS_OK) {
        *err = t.err;
        return t.err.code;
    }
    return 0;
}

void pjs_dispatcher_residency(pjs_dispatcher *d, pjs_model *m, pjs_residency *residency,
                              bool *resident, uint64_t *loads, uint64_t *evictions)
{
    pthread_mutex_lock(&d->cache.lock);
    *residency = m->residency;
    *resident = m->wentry.resident;
    *loads = m->wentry.loads;
    *evictions = m->wentry.evictions;
    pthread_mutex_unlock(&d->cache.lock);
}

void pjs_dispatcher_cache_totals(pjs_dispatcher *d, uint64_t *budget, uint64_t *used,
                                 uint64_t *pinned, uint64_t *changes)
{
    pjs_wcache_totals(&d->cache, budget, used, pinned, changes);
}

void pjs_dispatcher_tier_stats(pjs_dispatcher *d, pjs_tier_stats *out)
{
    pthread_mutex_lock(&d->lock);
    *out = d->tiers;
    pthread_mutex_unlock(&d->lock);
}

bool pjs_dispatcher_host_tier(const pjs_dispatcher *d)
{
    return d->host_tier;
}

void pjs_dispatcher_host_residency(pjs_dispatcher *d, pjs_model *m, bool *in_host,
                                   uint64_t *loads, uint64_t *evictions)
{
    if (!d->host_tier) {
        pthread_mutex_lock(&d->cache.lock);
        *in_host = pjs_residency_has_floor(m->residency);
        pthread_mutex_unlock(&d->cache.lock);
        *loads = *evictions = 0;
        return;
    }
    pthread_mutex_lock(&d->host.lock);
    *in_host = m->hentry.resident;
    *loads = m->hentry.loads;
    *evictions = m->hentry.evictions;
    pthread_mutex_unlock(&d->host.lock);
}

void pjs_dispatcher_host_totals(pjs_dispatcher *d, uint64_t *budget, uint64_t *used,
                                uint64_t *pinned, uint64_t *changes)
{
    pjs_wcache_totals(&d->host, budget, used, pinned, changes);
}

/* ---- the public API ------------------------------------------------------------------ */

int pjs_dispatcher_create(int workers, const pjs_sched_config *cfg, uint64_t weight_budget,
                          bool autonomous, uint64_t host_budget, pjs_dispatcher **out,
                          pjs_error *err)
{
    pjs_dispatcher *d = calloc(1, sizeof *d);
    if (d == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    pthread_cond_init(&d->task_done, NULL);
    pthread_cond_init(&d->token_back, NULL);
    pthread_cond_init(&d->host_read, NULL);
    pjs_sched_init(&d->sched, cfg);
    pjs_wcache_init(&d->cache, weight_budget, autonomous, cfg->eviction,
                    &(pjs_wcache_ops){.load = cache_load,
                                      .evict = cache_evict,
                                      .wanted = cache_wanted,
                                      .ctx = d});
    /* The host tier is always autonomous: a control plane pins models on
     * the device, and their floors come along. */
    d->host_tier = host_budget != PJS_WCACHE_UNLIMITED;
    pjs_wcache_init(&d->host, host_budget, true, cfg->eviction,
                    &(pjs_wcache_ops){.load = host_load,
                                      .evict = host_evict,
                                      .wanted = host_wanted,
                                      .ctx = d});
    pthread_mutex_init(&d->host_lock, NULL);
    pthread_cond_init(&d->xfer.wake, NULL);
    pthread_cond_init(&d->xfer.finished, NULL);
    if (autonomous && cfg->weight_prefetch && weight_budget != PJS_WCACHE_UNLIMITED) {
        if (pthread_create(&d->xfer.thread, NULL, transfer_main, d) != 0) {
            pjs_dispatcher_destroy(d);
            return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the weight transfer thread");
        }
        pjs_thread_name(d->xfer.thread, "pjs-prefetch");
        d->xfer.started = true;
    } else {
        d->sched.cfg.weight_prefetch = false; /* nothing to copy ahead */
    }
    d->accepting = true;
    d->workers = calloc((size_t)(workers > 0 ? workers : 1), sizeof *d->workers);
    if (d->workers == NULL) {
        pjs_dispatcher_destroy(d);
        return pjs_error_set(err, PJS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&d->workers[i], NULL, worker_main, d) != 0)
            break;
        pjs_thread_name(d->workers[i], "pjs-device");
        d->n_workers++;
    }
    if (d->n_workers == 0) {
        pjs_dispatcher_destroy(d);
        return pjs_error_set(err, PJS_ERR_INTERNAL, "cannot start the dispatcher's workers");
    }
    *out = d;
    return 0;
}

/* Lock held, token free: whether a request thread may run r's execution
 * itself: its model is resident and the smallest compiled size that holds
 * r's rows is known to take at most PJS_DISPATCH_INLINE_MAX_NS, or
 * PJS_DISPATCH_SOLE_POLLER_MAX_NS, with nothing else queued, when no other
 * thread of its front end is reading connections meanwhile. A load or a long execution goes to a
 * worker instead, so the thread's other connections (an HTTP thread serves
 * several) are not held up: a gRPC front end of one thread on a GPU, whose
 * round trips take hundreds of microseconds, would otherwise read no new
 * request while it executes, and nothing would coalesce. Nobody changes
 * residency while the token is free, so reading it here is safe. */
static bool quick_on_request_thread(const pjs_dispatcher *d, const pjs_infer_request *r)
{
    if (r->sole_poller && d->queued > 1)
        return false;
    const pjs_model *m = r->model;
    const pjs_sched_queue *q = &m->queues[r->variant];
    size_t k = 0;
    while (k + 1 < q->n_sizes && q->sizes[k] < r->batch)
        k++;
    const pjs_sched_cost *c = &q->cost[k];
    double longest = r->sole_poller ? PJS_DISPATCH_SOLE_POLLER_MAX_NS : PJS_DISPATCH_INLINE_MAX_NS;
    return m->wentry.resident && c->samples > 0 && c->ns <= longest;
}

bool pjs_dispatcher_promote(pjs_dispatcher *d, pjs_infer_request *r, atomic_bool *slot)
{
    pjs_model *m = r->model;
    pthread_mutex_lock(&d->lock);
    bool promoted = r->variant < m->n_queues &&
                    pjs_sched_promote(&d->sched, &m->queues[r->variant], &r->job);
    if (promoted)
        r->committed_slot = slot;
    pthread_mutex_unlock(&d->lock);
    return promoted;
}

int pjs_dispatcher_submit(pjs_dispatcher *d, pjs_infer_request *r, bool committed,
                          pjs_error *err)
{
    pjs_model *m = r->model;
    uint64_t now = pjs_now_ns();
    r->times.queued = now;
    r->job = (pjs_sched_job){
        .arrival_ns = now, .deadline_ns = r->deadline_ns, .rows = r->batch, .committed = committed};
    pthread_mutex_lock(&d->lock);
    /* share.cold is false from the end of a copy made ahead of its turn;
     * the host books' lock is a leaf */
    r->queued_tier = m->share.cold ? host_tier_of(d, m) : PJS_TIER_DEVICE;
    int rc = 0;
    if (!d->accepting)
        rc = pjs_error_set(err, PJS_ERR_UNAVAILABLE,
                           "pjserve is shutting down and accepts no new requests");
    else if (r->variant >= m->n_queues)
        rc = pjs_error_set(err, PJS_ERR_INTERNAL, "model %s: no queue for variant %zu", m->name,
                           r->variant);
    else
        rc = pjs_sched_enqueue(&d->sched, &m->queues[r->variant], &r->job, now, err);
    if (rc == 0) {
        d->queued++;
        d->in_flight++;
        m->requests_in_flight++;
        if (completing == 0 && device_work_locked(d) && d->tasks == NULL &&
            quick_on_request_thread(d, r)) {
            /* The device is free: this thread runs the next plan itself. */
            own_device_locked(d, true);
            finish_all_locked(d);
        } else if (!d->device_held) {
            pthread_cond_signal(&d->work);
        } /* else the owner wakes a worker when it gives the token back */
    }
    pthread_mutex_unlock(&d->lock);
    if (rc == PJS_ERR_RESOURCE_EXHAUSTED || rc == PJS_ERR_DEADLINE_EXCEEDED) {
        pjs_error_prefix(err, "model %s: ", m->name);
        pthread_mutex_lock(&m->stats_lock);
        if (rc == PJS_ERR_RESOURCE_EXHAUSTED)
            m->stats.rejected_queue_full++;
        else
            m->stats.expired++;
        pthread_mutex_unlock(&m->stats_lock);
    }
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

void pjs_dispatcher_counters(pjs_dispatcher *d, uint64_t *queue_depth, uint64_t *in_flight,
                             uint64_t *plans_inline, uint64_t *plans_worker,
                             uint64_t *prefetches)
{
    pthread_mutex_lock(&d->lock);
    *prefetches = d->prefetches;
    *queue_depth = d->queued;
    *in_flight = d->in_flight;
    *plans_inline = d->inline_plans;
    *plans_worker = d->worker_plans;
    pthread_mutex_unlock(&d->lock);
}

void pjs_dispatcher_shm_device_bytes(pjs_dispatcher *d, uint64_t *in, uint64_t *out)
{
    *in = atomic_load_explicit(&d->scratch.shm_device_in_bytes, memory_order_relaxed);
    *out = atomic_load_explicit(&d->scratch.shm_device_out_bytes, memory_order_relaxed);
}

void pjs_dispatcher_model_view(pjs_dispatcher *d, pjs_model *m, pjs_sched_model_view *out)
{
    uint64_t now = pjs_now_ns();
    pthread_mutex_lock(&d->lock);
    out->weight = m->share.weight;
    out->max_queue_depth = m->share.max_queue_depth;
    out->queue_depth = m->share.queued;
    out->in_flight = m->requests_in_flight;
    out->recent_utilization = pjs_sched_recent_utilization(&d->sched, &m->share, now);
    pthread_mutex_unlock(&d->lock);
}

void pjs_dispatcher_set_policy(pjs_dispatcher *d, pjs_model *m, double weight,
                               size_t max_queue_depth)
{
    pthread_mutex_lock(&d->lock);
    if (weight > 0)
        m->share.weight = weight;
    if (max_queue_depth > 0)
        m->share.max_queue_depth = max_queue_depth;
    pthread_mutex_unlock(&d->lock);
}

void pjs_dispatcher_destroy(pjs_dispatcher *d)
{
    if (d == NULL)
        return;
    if (d->workers != NULL) {
        pjs_dispatcher_drain(d);
        pthread_mutex_lock(&d->lock);
        d->stopping = true;
        pthread_cond_broadcast(&d->work);
        pthread_mutex_unlock(&d->lock);
        for (int i = 0; i < d->n_workers; i++)
            pthread_join(d->workers[i], NULL);
        free(d->workers);
    }
    if (d->xfer.started) {
        transfer_settle(d, true);
        drop_lookahead(d);
        pthread_mutex_lock(&d->lock);
        d->xfer.stopping = true;
        pthread_cond_signal(&d->xfer.wake);
        pthread_mutex_unlock(&d->lock);
        pthread_join(d->xfer.thread, NULL);
    }
    pthread_cond_destroy(&d->xfer.finished);
    pthread_cond_destroy(&d->xfer.wake);
    /* Whatever is still resident and evictable goes with the device. */
    while (d->cache.oldest != NULL)
        pjs_wcache_release(&d->cache, d->cache.oldest);
    pjs_wcache_destroy(&d->cache);
    while (d->host.oldest != NULL)
        pjs_wcache_release(&d->host, d->host.oldest);
    pjs_wcache_destroy(&d->host);
    pthread_mutex_destroy(&d->host_lock);
    free(d->scratch.args);
    free(d->scratch.results);
    free(d->scratch.result_bytes);
    free(d->scratch.reqs);
    free(d->scratch.first_row);
    for (size_t i = 0; i < PJS_INFER_MAX_TENSORS; i++)
        pjs_rt_host_free(d->scratch.staging_client, &d->scratch.staging[i]);
    pthread_cond_destroy(&d->task_done);
    pthread_cond_destroy(&d->token_back);
    pthread_cond_destroy(&d->host_read);
    pthread_cond_destroy(&d->idle);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
