/*
 * sequence.c - requests to a stateful model.
 *
 * The front end's request arrives with the client's tensors: the model's
 * inputs without its state inputs, one row. On the request thread it is
 * checked against those tensors and admitted to the model's sequence table
 * (sched/sequence_table.h), which either lets it run now or keeps it
 * waiting behind the sequence's running step. To run, the request gets the
 * sequence's state rows as its state inputs (pointing into the table, which
 * keeps them while a step runs), a row for each control input the model
 * declares (start, end, ready, the sequence id; written when the step is
 * submitted) and asks for every output, and is submitted
 * to the executable like any request: steps of different sequences coalesce
 * into one batched execution, each bringing its own state row.
 *
 * When the execution is done (the dispatcher's completion, on a request or
 * worker thread) the state outputs are copied into the sequence's state and
 * taken out of the response, the client's requested outputs are restored,
 * the step is finished in the table (which frees an ended sequence) and the
 * sequence's next waiting step, if any, is submitted before the front end's
 * completion runs. A step that fails leaves the state as it was.
 *
 * Idle sequences are swept on admission, at most every quarter of the idle
 * timeout, with each expiry logged. A new sequence that finds the table
 * full, or its client at the model's max_sequences_per_client, evicts the
 * least recently used one (the client's own, at its cap) idle past the
 * model's evict_after_idle_ms (sched/sequence_table.h says why that keeps
 * one client from holding the table); the front end names the client in
 * the request. Evictions are logged at most once a second per model, since
 * a client can cause them at will.
 */
#include "server/sequence.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "registry/model.h"
#include "sched/sequence_table.h"
#include "server/server_internal.h"

typedef struct sequence_request {
    pjs_sequence_step step; /* step.owner == this */
    struct pjs_server *server;
    pjs_infer_request *request;
    /* What the front end gave, restored before its completion runs. */
    pjs_infer_done_fn client_done;
    void *client_ctx;
    size_t n_client_inputs;
    pjs_infer_input client_inputs[PJS_INFER_MAX_TENSORS];
    size_t n_requested;
    pjs_infer_requested_output requested[PJS_INFER_MAX_TENSORS];
    uint64_t corrid; /* the id as a number, for a `corrid` control */
    /* The step's row of each control input the model declares. */
    unsigned char controls[PJS_CONTROL_COUNT][8];
} sequence_request;

static const pjs_sequence_spec *spec_of(const pjs_model *m)
{
    return &m->bundle->manifest.sequence;
}

/* Puts back the client's inputs, requested outputs and completion. */
static void restore(sequence_request *sr)
{
    pjs_infer_request *r = sr->request;
    r->on_done = sr->client_done;
    r->frontend_ctx = sr->client_ctx;
    memcpy(r->inputs, sr->client_inputs, sr->n_client_inputs * sizeof r->inputs[0]);
    r->n_inputs = sr->n_client_inputs;
    memcpy(r->requested, sr->requested, sr->n_requested * sizeof r->requested[0]);
    r->n_requested = sr->n_requested;
}

static void sequence_done(pjs_infer_request *r);

/* The state row of state tensor j within a sequence's state bytes. */
static unsigned char *state_row(const pjs_manifest *man, unsigned char *state, size_t j,
                                size_t *row_bytes)
{
    size_t offset = 0;
    for (size_t k = 0; k < j; k++)
        offset += pjs_tensor_spec_row_bytes(&man->inputs[man->sequence.state[k].input]);
    *row_bytes = pjs_tensor_spec_row_bytes(&man->inputs[man->sequence.state[j].input]);
    return state + offset;
}

/* Appends one row of the executable's input `spec`, data borrowed. */
static void add_row_input(pjs_infer_request *r, const pjs_tensor_spec *spec, const void *data,
                          size_t nbytes)
{
    pjs_infer_input *in = &r->inputs[r->n_inputs++];
    memset(in, 0, sizeof *in);
    in->name = spec->name;
    in->datatype = pjs_dtype_kserve_name(spec->dtype);
    in->shape = spec->shape;
    in->shape.dims[0] = 1;
    in->data = data;
    in->nbytes = nbytes;
}

/* Writes value into a control input's one element of dtype t. */
static void write_control(unsigned char *dst, pjs_dtype t, uint64_t value)
{
    union {
        bool b;
        int32_t i32;
        int64_t i64;
        uint32_t u32;
        uint64_t u64;
        float f32;
    } v;
    memset(&v, 0, sizeof v);
    switch (t) {
    case PJS_DTYPE_BOOL: v.b = value != 0; break;
    case PJS_DTYPE_I32: v.i32 = (int32_t)value; break;
    case PJS_DTYPE_U32: v.u32 = (uint32_t)value; break;
    case PJS_DTYPE_I64: v.i64 = (int64_t)value; break;
    case PJS_DTYPE_U64: v.u64 = value; break;
    case PJS_DTYPE_F32: v.f32 = (float)value; break;
    default: break; /* the manifest admits no other control dtype */
    }
    memcpy(dst, &v, pjs_dtype_size(t));
}

/* The value of control k in this step. */
static uint64_t control_value(const sequence_request *sr, pjs_sequence_control k)
{
    switch (k) {
    case PJS_CONTROL_START: return sr->step.start;
    case PJS_CONTROL_END: return sr->step.end;
    case PJS_CONTROL_READY: return 1;
    case PJS_CONTROL_CORRID: return sr->corrid;
    default: return 0;
    }
}

/* Adds the state and control inputs and submits the request to the
 * executable. */
static int submit_step(sequence_request *sr, pjs_error *err)
{
    pjs_infer_request *r = sr->request;
    const pjs_manifest *man = &r->model->bundle->manifest;
    const pjs_sequence_spec *q = &man->sequence;
    unsigned char *state = pjs_sequence_state(&sr->step);
    for (size_t j = 0; j < q->n_state; j++) {
        size_t row_bytes = 0;
        unsigned char *row = state_row(man, state, j, &row_bytes);
        add_row_input(r, &man->inputs[q->state[j].input], row, row_bytes);
    }
    for (int k = 0; k < PJS_CONTROL_COUNT; k++) {
        if (q->control[k] == PJS_CONTROL_NONE)
            continue;
        const pjs_tensor_spec *spec = &man->inputs[q->control[k]];
        write_control(sr->controls[k], spec->dtype, control_value(sr, k));
        add_row_input(r, spec, sr->controls[k], pjs_dtype_size(spec->dtype));
    }
    r->n_requested = 0; /* every output: the state outputs too */
    r->on_done = sequence_done;
    r->frontend_ctx = sr;
    int rc = pjs__server_submit_executable(sr->server, r, false, err);
    if (rc != 0)
        restore(sr);
    return rc; /* on success sr belongs to sequence_done, which may have run already */
}

static pjs_sequence_step *finish_step(sequence_request *sr)
{
    pjs_model *m = sr->request->model;
    pthread_mutex_lock(&m->sequences_lock);
    pjs_sequence_step *next = pjs_sequence_finish(m->sequences, &sr->step, pjs_now_ns());
    pthread_mutex_unlock(&m->sequences_lock);
    return next;
}

/* Submits the sequence's waiting steps handed back by the table until one
 * is under way; one that cannot be submitted is answered with the error. */
static void run_waiting(pjs_sequence_step *next)
{
    while (next != NULL) {
        sequence_request *sr = next->owner;
        pjs_error err;
        pjs_error_clear(&err);
        if (submit_step(sr, &err) == 0)
            return;
        next = finish_step(sr);
        pjs_infer_request *r = sr->request;
        r->error = err;
        free(sr);
        r->on_done(r);
    }
}

/* Copies the state outputs into the sequence's state (on success) and
 * takes them out of r->outputs; then marks what the client asked for. */
static void take_state_outputs(sequence_request *sr)
{
    pjs_infer_request *r = sr->request;
    const pjs_manifest *man = &r->model->bundle->manifest;
    unsigned char *state = pjs_sequence_state(&sr->step);
    size_t kept = 0;
    for (size_t i = 0; i < r->n_outputs; i++) {
        pjs_infer_output *out = &r->outputs[i];
        size_t j = 0;
        while (j < man->sequence.n_state &&
               strcmp(man->outputs[man->sequence.state[j].output].name, out->spec->name) != 0)
            j++;
        if (j < man->sequence.n_state) {
            size_t row_bytes = 0;
            unsigned char *row = state_row(man, state, j, &row_bytes);
            if (r->error.code == 0 && out->data != NULL && out->nbytes == row_bytes)
                memcpy(row, out->data, row_bytes);
            free(out->data);
            continue;
        }
        r->outputs[kept++] = *out;
    }
    r->n_outputs = kept;
    memcpy(r->requested, sr->requested, sr->n_requested * sizeof r->requested[0]);
    r->n_requested = sr->n_requested;
    for (size_t i = 0; i < r->n_outputs; i++) {
        pjs_infer_output *out = &r->outputs[i];
        out->requested = -1;
        bool wanted = r->n_requested == 0;
        for (size_t k = 0; k < r->n_requested; k++)
            if (strcmp(r->requested[k].name, out->spec->name) == 0) {
                out->requested = (int)k;
                wanted = true;
            }
        if (!wanted) {
            free(out->data);
            out->data = NULL;
        }
    }
}

static void sequence_done(pjs_infer_request *r)
{
    sequence_request *sr = r->frontend_ctx;
    take_state_outputs(sr);
    pjs_sequence_step *next = finish_step(sr);
    restore(sr);
    free(sr);
    run_waiting(next);
    r->on_done(r);
}

/* Frees sequences idle past the timeout, at most every quarter of it.
 * Called with sequences_lock held. */
static void sweep_idle(pjs_model *m, uint64_t now)
{
    uint64_t timeout = (uint64_t)spec_of(m)->idle_timeout_ms * 1000000u;
    if (now - m->sequences_swept_ns < timeout / 4)
        return;
    m->sequences_swept_ns = now;
    pjs_sequence_id expired[1];
    size_t n = pjs_sequence_expire(m->sequences, now, expired, 1);
    if (n == 0)
        return;
    /* One line per sweep, and a client can open sequences at will. */
    char name[PJS_SEQUENCE_ID_MAX + 8], more[40] = "";
    if (n > 1)
        snprintf(more, sizeof more, " and %zu more", n - 1);
    pjs_log_limited(&m->sequence_idle_log, PJS_LOG_INFO,
                    "model %s: sequence %s%s freed after %lld ms idle", m->name,
                    pjs_sequence_id_format(&expired[0], name, sizeof name), more,
                    (long long)spec_of(m)->idle_timeout_ms);
}

static int sequence_id_of(const pjs_infer_request *r, pjs_sequence_id *id, pjs_error *err)
{
    const pjs_infer_sequence *q = &r->sequence;
    memset(id, 0, sizeof *id);
    if (!q->has_id)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s keeps state per sequence: send the sequence_id "
                             "parameter (a non-zero integer or a non-empty string), with "
                             "sequence_start on a sequence's first request and sequence_end "
                             "on its last",
                             r->model->name);
    id->is_string = q->is_string;
    id->number = q->number;
    if (q->is_string) {
        size_t len = strlen(q->string);
        if (len > PJS_SEQUENCE_ID_MAX)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: sequence_id is %zu bytes long; at most %d are "
                                 "accepted",
                                 r->model->name, len, PJS_SEQUENCE_ID_MAX);
        memcpy(id->string, q->string, len + 1);
    }
    return 0;
}

/* The id a `corrid` control input takes: the integer id, or a string id
 * made of decimal digits; it must fit the input's dtype. */
static int corrid_of(const pjs_infer_request *r, const pjs_tensor_spec *spec, uint64_t *out,
                     pjs_error *err)
{
    const pjs_infer_sequence *q = &r->sequence;
    uint64_t id = q->number;
    bool ok = true;
    if (q->is_string) {
        const char *p = q->string;
        id = 0;
        ok = *p != '\0';
        for (; ok && *p != '\0'; p++) {
            ok = *p >= '0' && *p <= '9' && id <= (UINT64_MAX - (uint64_t)(*p - '0')) / 10;
            id = id * 10 + (uint64_t)(*p - '0');
        }
    }
    uint64_t max = spec->dtype == PJS_DTYPE_I32   ? INT32_MAX
                   : spec->dtype == PJS_DTYPE_U32 ? UINT32_MAX
                   : spec->dtype == PJS_DTYPE_I64 ? INT64_MAX
                                                  : UINT64_MAX;
    if (!ok || id > max)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s passes the sequence id to its input %s (%s): send a "
                             "sequence_id that is an integer from 1 to %llu (a string of "
                             "decimal digits is read as one)",
                             r->model->name, spec->name, pjs_dtype_name(spec->dtype),
                             (unsigned long long)max);
    *out = id;
    return 0;
}

int pjs_sequence_submit(struct pjs_server *s, pjs_infer_request *r, pjs_error *err)
{
    pjs_model *m = r->model;
    const pjs_manifest *man = &m->bundle->manifest;
    pjs_sequence_id id;
    int rc = sequence_id_of(r, &id, err);
    if (rc == 0)
        rc = pjs_infer_validate_client(r, man, m->max_batch_size, err);
    if (rc == 0 && r->batch != 1)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                           "model %s: a sequence's request carries one row (batch size 1), "
                           "got %lld; send each step of a sequence as its own request",
                           m->name, (long long)r->batch);
    if (rc == 0 &&
        r->n_inputs + man->sequence.n_state + PJS_CONTROL_COUNT > PJS_INFER_MAX_TENSORS)
        rc = pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "model %s: too many tensors",
                           m->name);
    size_t corrid_input = man->sequence.control[PJS_CONTROL_CORRID];
    uint64_t corrid = 0;
    if (rc == 0 && corrid_input != PJS_CONTROL_NONE)
        rc = corrid_of(r, &man->inputs[corrid_input], &corrid, err);
    if (rc != 0)
        return rc;
    sequence_request *sr = calloc(1, sizeof *sr);
    if (sr == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory", m->name);
    sr->step.id = id;
    sr->step.start = r->sequence.start;
    sr->step.end = r->sequence.end;
    sr->step.client = r->sequence.client;
    sr->step.owner = sr;
    sr->corrid = corrid;
    sr->server = s;
    sr->request = r;
    sr->client_done = r->on_done;
    sr->client_ctx = r->frontend_ctx;
    sr->n_client_inputs = r->n_inputs;
    memcpy(sr->client_inputs, r->inputs, r->n_inputs * sizeof r->inputs[0]);
    sr->n_requested = r->n_requested;
    memcpy(sr->requested, r->requested, r->n_requested * sizeof r->requested[0]);

    bool run_now = false;
    pjs_sequence_eviction evicted;
    uint64_t now = pjs_now_ns();
    pthread_mutex_lock(&m->sequences_lock);
    sweep_idle(m, now);
    rc = pjs_sequence_admit(m->sequences, &sr->step, now, &run_now, &evicted, err);
    pthread_mutex_unlock(&m->sequences_lock);
    if (evicted.happened) {
        char name[PJS_SEQUENCE_ID_MAX + 8], why[160];
        if (evicted.own)
            snprintf(why, sizeof why,
                     "of client %s, which holds %lld (sequence.max_sequences_per_client)",
                     r->sequence.client != NULL ? r->sequence.client : "(unnamed)",
                     (long long)man->sequence.max_sequences_per_client);
        else
            snprintf(why, sizeof why, "(all %lld slots taken; sequence.max_sequences)",
                     (long long)man->sequence.max_sequences);
        pjs_log_limited(&m->sequence_evictions_log, PJS_LOG_INFO,
                        "model %s: sequence %s evicted after %llu ms idle to make room for a "
                        "new sequence %s",
                        m->name, pjs_sequence_id_format(&evicted.id, name, sizeof name),
                        (unsigned long long)(evicted.idle_ns / 1000000u), why);
    }
    if (rc != 0) {
        free(sr);
        return rc;
    }
    if (!run_now)
        return 0; /* handed back by the running step's completion */
    rc = submit_step(sr, err);
    if (rc == 0)
        return 0;
    pjs_sequence_step *next = finish_step(sr);
    free(sr);
    run_waiting(next);
    return rc;
}
