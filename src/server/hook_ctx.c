/*
 * hook_ctx.c - pjserve's side of the bundle ABI for a request (see
 * hook_ctx.h): the pjserve_api table, the arena, tensor conversion and the
 * checks of what bundle code produced.
 */
#include "server/hook_ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/log.h"
#include "registry/model.h"
#include "server/meta.h"
#include "server/scratch_pool.h"

struct pjs_hook_arena_block {
    pjs_hook_arena_block *next;
    /* the memory follows, 64-byte aligned */
};

#define ARENA_ALIGN 64

static pjs_hook_ctx *as_ctx(pjserve_ctx *c) { return (pjs_hook_ctx *)c; }

void *pjs_hook_ctx_alloc(pjs_hook_ctx *ctx, size_t nbytes)
{
    if (nbytes > SIZE_MAX - 2 * ARENA_ALIGN)
        return NULL;
    size_t size = (ARENA_ALIGN + nbytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    pjs_hook_arena_block *b = aligned_alloc(ARENA_ALIGN, size);
    if (b == NULL)
        return NULL;
    b->next = ctx->arena;
    ctx->arena = b;
    return (char *)b + ARENA_ALIGN;
}

static int copy_outputs(const pjs_infer_request *r, const pjs_tensor_spec *specs,
                        const pjserve_tensor *got, size_t n, pjs_infer_output *outs,
                        pjs_error *err);

/* ---- the pjserve_api table ---------------------------------------------- */

static void *api_alloc(pjserve_ctx *c, size_t n) { return pjs_hook_ctx_alloc(as_ctx(c), n); }

static void api_set_error(pjserve_ctx *c, const char *msg)
{
    snprintf(as_ctx(c)->message, sizeof as_ctx(c)->message, "%s", msg != NULL ? msg : "");
}

static void api_log(pjserve_ctx *c, int level, const char *msg)
{
    pjs_hook_ctx *ctx = as_ctx(c);
    pjs_log(pjs_hooks_log_level(level), "model %s: %s%s%s: %s", ctx->model->name, ctx->stage,
            ctx->request->id[0] ? " of request " : "", ctx->request->id, msg);
}

static void *api_state(pjserve_ctx *c) { return as_ctx(c)->model->bundle->hooks->state; }
static const char *api_bundle_dir(pjserve_ctx *c) { return as_ctx(c)->model->bundle->dir; }
static const char *api_model_name(pjserve_ctx *c) { return as_ctx(c)->model->name; }
static const char *api_request_id(pjserve_ctx *c) { return as_ctx(c)->request->id; }

static int64_t api_remaining_ns(pjserve_ctx *c)
{
    uint64_t deadline = as_ctx(c)->request->deadline_ns;
    if (deadline == 0)
        return INT64_MAX;
    uint64_t now = pjs_now_ns();
    return now >= deadline ? 0 : (int64_t)(deadline - now);
}

/* Nobody waits for the answer: the deadline passed or the client went. */
static bool api_cancelled(pjserve_ctx *c)
{
    const pjs_infer_request *r = as_ctx(c)->request;
    if (r->client_gone != NULL && atomic_load_explicit(r->client_gone, memory_order_relaxed))
        return true;
    return r->deadline_ns != 0 && pjs_now_ns() >= r->deadline_ns;
}

static int api_scratch(pjserve_ctx *c, const size_t *sizes, size_t n, void **out)
{
    pjs_hook_ctx *ctx = as_ctx(c);
    if (ctx->scratch_taken) {
        api_set_error(c, "pjserve_scratch was already called for this request: ask for every "
                         "buffer in one call");
        return PJSERVE_INVALID_ARGUMENT;
    }
    ctx->scratch_taken = true;
    if (n == 0)
        return PJSERVE_OK;
    ctx->scratch = pjs_hook_ctx_alloc(ctx, n * sizeof *ctx->scratch);
    if (ctx->scratch == NULL) {
        api_set_error(c, "out of memory");
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    pjs_error err;
    pjs_error_clear(&err);
    if (pjs_scratch_pool_acquire(ctx->scratch_pool, sizes, n, ctx->scratch,
                                 ctx->request->deadline_ns, &err) != 0) {
        ctx->scratch = NULL;
        api_set_error(c, err.msg);
        return pjs_hook_status_from_pjs(err.code);
    }
    ctx->n_scratch = n;
    memcpy(out, ctx->scratch, n * sizeof *out);
    return PJSERVE_OK;
}

static int api_call_start(pjserve_ctx *c, const char *model, const pjserve_tensor *in, size_t n,
                          pjserve_subcall **out)
{
    pjs_hook_ctx *ctx = as_ctx(c);
    if (ctx->meta == NULL) {
        api_set_error(c, "pjserve_call_start: sub-model calls are made by meta models (kind: "
                         "meta) from pjserve_run, not by hooks");
        return PJSERVE_UNSUPPORTED;
    }
    return pjs_meta_call_start(ctx, model, in, n, out);
}

static int api_call_wait(pjserve_ctx *c, pjserve_subcall *call, const pjserve_tensor **out,
                         size_t *n)
{
    pjs_hook_ctx *ctx = as_ctx(c);
    if (ctx->meta == NULL) {
        api_set_error(c, "pjserve_call_wait: no sub-call was started (hooks make none)");
        return PJSERVE_UNSUPPORTED;
    }
    return pjs_meta_call_wait(ctx, call, out, n);
}

/* A decoupled meta's response: every client output, checked as the run's
 * returned outputs are, or none with `final`; copied and handed to the
 * front end, which sends it now (or waits for room in its write queue). */
static int api_respond(pjserve_ctx *c, const pjserve_tensor *out, size_t n, bool final)
{
    pjs_hook_ctx *ctx = as_ctx(c);
    pjs_infer_request *r = ctx->request;
    const pjs_manifest *man = &ctx->model->bundle->manifest;
    if (!man->decoupled || r->respond == NULL || ctx->meta == NULL) {
        api_set_error(c, "pjserve_respond: this model is not served as a decoupled model over "
                         "ModelStreamInfer; return the outputs from the hook instead");
        return PJSERVE_UNSUPPORTED;
    }
    if (ctx->final_sent) {
        api_set_error(c, "pjserve_respond: the final response was sent already; send nothing "
                         "after it");
        return PJSERVE_INVALID_ARGUMENT;
    }
    if (n != man->n_client_outputs && !(n == 0 && final)) {
        snprintf(ctx->message, sizeof ctx->message,
                 "pjserve_respond: %zu outputs; a response carries all %zu client outputs "
                 "(or none, with final set)",
                 n, man->n_client_outputs);
        return PJSERVE_INVALID_ARGUMENT;
    }
    pjs_error err;
    pjs_error_clear(&err);
    pjserve_tensor slots[PJS_INFER_MAX_TENSORS], got[PJS_INFER_MAX_TENSORS];
    pjs_infer_output outs[PJS_INFER_MAX_TENSORS];
    for (size_t i = 0; i < n; i++) {
        slots[i] = pjs_hook_slot(&man->client_outputs[i], NULL);
        got[i] = out[i];
    }
    const char *stage = ctx->stage;
    ctx->stage = "pjserve_respond";
    int rc = pjs_hook_check_produced(ctx, slots, got, n, &err);
    ctx->stage = stage;
    if (rc == 0)
        rc = copy_outputs(r, man->client_outputs, got, n, outs, &err);
    if (rc == 0)
        rc = r->respond(r, outs, n, final, &err);
    if (rc != 0) {
        api_set_error(c, err.msg);
        return pjs_hook_status_from_pjs(err.code);
    }
    ctx->final_sent = final;
    return PJSERVE_OK;
}

static const pjserve_api request_api = {
    .abi_version = PJSERVE_MODEL_ABI_VERSION,
    .size = sizeof(pjserve_api),
    .alloc = api_alloc,
    .set_error = api_set_error,
    .log = api_log,
    .state = api_state,
    .bundle_dir = api_bundle_dir,
    .model_name = api_model_name,
    .request_id = api_request_id,
    .remaining_ns = api_remaining_ns,
    .scratch = api_scratch,
    .call_start = api_call_start,
    .call_wait = api_call_wait,
    .respond = api_respond,
    .cancelled = api_cancelled,
};

void pjs_hook_ctx_init(pjs_hook_ctx *ctx, struct pjs_server *s, pjs_infer_request *r,
                       struct pjs_scratch_pool *pool)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->base.api = &request_api;
    ctx->server = s;
    ctx->model = r->model;
    ctx->request = r;
    ctx->stage = "hook";
    ctx->scratch_pool = pool;
}

void pjs_hook_ctx_release(pjs_hook_ctx *ctx)
{
    if (ctx->n_scratch > 0)
        pjs_scratch_pool_release(ctx->scratch_pool, ctx->scratch, ctx->n_scratch);
    ctx->n_scratch = 0;
    ctx->scratch = NULL;
    while (ctx->arena != NULL) {
        pjs_hook_arena_block *next = ctx->arena->next;
        free(ctx->arena);
        ctx->arena = next;
    }
}

/* ---- tensors -------------------------------------------------------------- */

static const struct {
    pjs_dtype ours;
    pjserve_dtype theirs;
} dtype_map[] = {
    {PJS_DTYPE_BOOL, PJSERVE_BOOL},   {PJS_DTYPE_U8, PJSERVE_UINT8},
    {PJS_DTYPE_U16, PJSERVE_UINT16},  {PJS_DTYPE_U32, PJSERVE_UINT32},
    {PJS_DTYPE_U64, PJSERVE_UINT64},  {PJS_DTYPE_I8, PJSERVE_INT8},
    {PJS_DTYPE_I16, PJSERVE_INT16},   {PJS_DTYPE_I32, PJSERVE_INT32},
    {PJS_DTYPE_I64, PJSERVE_INT64},   {PJS_DTYPE_F16, PJSERVE_FP16},
    {PJS_DTYPE_BF16, PJSERVE_BF16},   {PJS_DTYPE_F32, PJSERVE_FP32},
    {PJS_DTYPE_F64, PJSERVE_FP64},    {PJS_DTYPE_BYTES, PJSERVE_BYTES},
};

pjserve_dtype pjs_hook_dtype_out(pjs_dtype t)
{
    for (size_t i = 0; i < sizeof dtype_map / sizeof dtype_map[0]; i++)
        if (dtype_map[i].ours == t)
            return dtype_map[i].theirs;
    return (pjserve_dtype)0;
}

pjs_dtype pjs_hook_dtype_in(pjserve_dtype t)
{
    for (size_t i = 0; i < sizeof dtype_map / sizeof dtype_map[0]; i++)
        if (dtype_map[i].theirs == t)
            return dtype_map[i].ours;
    return PJS_DTYPE_INVALID;
}

pjserve_tensor pjs_hook_tensor_from(const char *name, pjs_dtype dtype, const pjs_shape *shape,
                                    const void *data, size_t nbytes)
{
    pjserve_tensor t = {.name = name, .dtype = pjs_hook_dtype_out(dtype), .rank = shape->rank,
                        .data = (void *)data, .nbytes = nbytes};
    memcpy(t.shape, shape->dims, sizeof t.shape);
    return t;
}

pjserve_tensor pjs_hook_slot(const pjs_tensor_spec *spec, const pjs_shape *shape)
{
    pjserve_tensor t = {.name = spec->name, .dtype = pjs_hook_dtype_out(spec->dtype)};
    const pjs_shape *s = shape != NULL ? shape : &spec->shape;
    t.rank = s->rank;
    for (int d = 0; d < s->rank; d++)
        t.shape[d] = d == 0 && spec->batched ? -1 : s->dims[d];
    return t;
}

bool pjs_hook_view_inputs(pjs_hook_ctx *ctx, pjserve_tensor *in)
{
    const pjs_infer_request *r = ctx->request;
    for (size_t i = 0; i < r->n_inputs; i++) {
        const pjs_infer_input *input = &r->inputs[i];
        const void *data = input->data;
        size_t elem = pjs_dtype_size(input->spec->dtype);
        if (data != NULL && elem > 1 && (uintptr_t)data % elem != 0) {
            void *aligned = pjs_hook_ctx_alloc(ctx, input->nbytes);
            if (aligned == NULL) {
                snprintf(ctx->message, sizeof ctx->message,
                         "out of memory aligning input \"%s\" (%zu bytes)", input->spec->name,
                         input->nbytes);
                return false;
            }
            data = memcpy(aligned, data, input->nbytes);
        }
        in[i] = pjs_hook_tensor_from(input->spec->name, input->spec->dtype, &input->shape, data,
                                     input->nbytes);
    }
    return true;
}

static const char *dtype_label(pjserve_dtype t)
{
    pjs_dtype ours = pjs_hook_dtype_in(t);
    return ours == PJS_DTYPE_INVALID ? "an unknown dtype" : pjs_dtype_kserve_name(ours);
}

static int check_one(const pjs_hook_ctx *ctx, const pjserve_tensor *slot,
                     const pjserve_tensor *got, pjs_error *err)
{
    const char *model = ctx->model->name, *stage = ctx->stage, *name = slot->name;
    if (got->dtype != slot->dtype)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "model %s: %s set tensor \"%s\" to dtype %s; it is declared %s", model,
                             stage, name, dtype_label(got->dtype), dtype_label(slot->dtype));
    if (got->rank < 0 || got->rank > PJSERVE_MAX_RANK || got->rank != slot->rank)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "model %s: %s gave tensor \"%s\" rank %d; it is declared with rank %d",
                             model, stage, name, got->rank, slot->rank);
    pjs_shape shape = {.rank = got->rank};
    for (int d = 0; d < got->rank; d++) {
        if (got->shape[d] < 0)
            return pjs_error_set(err, PJS_ERR_INTERNAL,
                                 "model %s: %s left extent %d of tensor \"%s\" at %lld: set every "
                                 "extent",
                                 model, stage, d, name, (long long)got->shape[d]);
        if (slot->shape[d] >= 0 && got->shape[d] != slot->shape[d])
            return pjs_error_set(err, PJS_ERR_INTERNAL,
                                 "model %s: %s gave tensor \"%s\" extent %lld in dimension %d; it "
                                 "is declared %lld",
                                 model, stage, name, (long long)got->shape[d], d,
                                 (long long)slot->shape[d]);
        shape.dims[d] = got->shape[d];
    }
    int64_t numel = 0;
    if (!pjs_shape_numel(&shape, &numel))
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "model %s: %s gave tensor \"%s\" a shape whose size overflows", model,
                             stage, name);
    if (got->data == NULL && got->nbytes > 0)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "model %s: %s gave tensor \"%s\" %zu bytes but no data pointer", model,
                             stage, name, got->nbytes);
    if (got->dtype == PJSERVE_BYTES) {
        uint64_t count = 0;
        if (pjs_bytes_count(got->data, got->nbytes, &count, err) != 0) {
            err->code = PJS_ERR_INTERNAL;
            return pjs_error_prefix(err, "model %s: %s: string tensor \"%s\": ", model, stage,
                                    name);
        }
        if (count != (uint64_t)numel)
            return pjs_error_set(err, PJS_ERR_INTERNAL,
                                 "model %s: %s gave string tensor \"%s\" %llu elements; its shape "
                                 "holds %lld",
                                 model, stage, name, (unsigned long long)count, (long long)numel);
        return 0;
    }
    uint64_t want = (uint64_t)numel * pjserve_dtype_size(got->dtype);
    if (got->nbytes != want)
        return pjs_error_set(err, PJS_ERR_INTERNAL,
                             "model %s: %s gave tensor \"%s\" %zu bytes; its shape and dtype make "
                             "%llu",
                             model, stage, name, got->nbytes, (unsigned long long)want);
    return 0;
}

int pjs_hook_check_produced(const pjs_hook_ctx *ctx, const pjserve_tensor *slots,
                            pjserve_tensor *got, size_t n, pjs_error *err)
{
    for (size_t i = 0; i < n; i++) {
        got[i].name = slots[i].name;
        int rc = check_one(ctx, &slots[i], &got[i], err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- outputs ----------------------------------------------------------------- */

/* Index of `name` in r->requested, or -1; with none requested every output
 * is sent (-1 too). */
int pjs_hook_requested_index(const pjs_infer_request *r, const char *name, bool *wanted)
{
    *wanted = r->n_requested == 0;
    for (size_t k = 0; k < r->n_requested; k++)
        if (strcmp(r->requested[k].name, name) == 0) {
            *wanted = true;
            return (int)k;
        }
    return -1;
}

/* outs[0..n) := copies of the client outputs in `got` (slots give the
 * names) that r's client requested, in client_outputs order; unrequested
 * ones keep their shape and no data. On failure nothing is left allocated. */
static int copy_outputs(const pjs_infer_request *r, const pjs_tensor_spec *specs,
                        const pjserve_tensor *got, size_t n, pjs_infer_output *outs,
                        pjs_error *err)
{
    memset(outs, 0, n * sizeof outs[0]);
    for (size_t i = 0; i < n; i++) {
        bool wanted;
        outs[i].spec = &specs[i];
        outs[i].requested = pjs_hook_requested_index(r, specs[i].name, &wanted);
        outs[i].shape.rank = got[i].rank;
        memcpy(outs[i].shape.dims, got[i].shape, sizeof outs[i].shape.dims);
        outs[i].nbytes = got[i].nbytes;
        if (!wanted)
            continue;
        outs[i].data = malloc(got[i].nbytes > 0 ? got[i].nbytes : 1);
        if (outs[i].data == NULL) {
            for (size_t k = 0; k < i; k++)
                free(outs[k].data);
            return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: out of memory for output \"%s\"",
                                 r->model->name, specs[i].name);
        }
        if (got[i].nbytes > 0)
            memcpy(outs[i].data, got[i].data, got[i].nbytes);
    }
    return 0;
}

/* Replaces r's raw outputs by copies of the client outputs in `got` (slots
 * give the names), in client_outputs order. */
int pjs_hook_take_outputs(pjs_infer_request *r, const pjs_tensor_spec *specs,
                        const pjserve_tensor *got, size_t n, pjs_error *err)
{
    pjs_infer_output outs[PJS_INFER_MAX_TENSORS];
    int rc = copy_outputs(r, specs, got, n, outs, err);
    if (rc != 0)
        return rc;
    pjs_infer_request_release(r);
    memcpy(r->outputs, outs, n * sizeof outs[0]);
    r->n_outputs = n;
    return 0;
}

bool pjs_hook_outputs_unset(const pjserve_tensor *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (out[i].data != NULL || out[i].nbytes != 0)
            return false;
    return true;
}

/* ---- statuses -------------------------------------------------------------- */

int pjs_hook_status_to_pjs(int status)
{
    switch (status) {
    case PJSERVE_INVALID_ARGUMENT: return PJS_ERR_INVALID_ARGUMENT;
    case PJSERVE_NOT_FOUND: return PJS_ERR_NOT_FOUND;
    case PJSERVE_DEADLINE_EXCEEDED: return PJS_ERR_DEADLINE_EXCEEDED;
    case PJSERVE_RESOURCE_EXHAUSTED: return PJS_ERR_RESOURCE_EXHAUSTED;
    case PJSERVE_UNAVAILABLE: return PJS_ERR_UNAVAILABLE;
    case PJSERVE_UNSUPPORTED: return PJS_ERR_UNSUPPORTED;
    default: return PJS_ERR_INTERNAL;
    }
}

int pjs_hook_status_from_pjs(int code)
{
    switch (code) {
    case 0: return PJSERVE_OK;
    case PJS_ERR_INVALID_ARGUMENT: return PJSERVE_INVALID_ARGUMENT;
    case PJS_ERR_NOT_FOUND: return PJSERVE_NOT_FOUND;
    case PJS_ERR_DEADLINE_EXCEEDED: return PJSERVE_DEADLINE_EXCEEDED;
    case PJS_ERR_RESOURCE_EXHAUSTED:
    case PJS_ERR_NOMEM: return PJSERVE_RESOURCE_EXHAUSTED;
    case PJS_ERR_UNAVAILABLE:
    case PJS_ERR_DRAINING: return PJSERVE_UNAVAILABLE;
    case PJS_ERR_UNSUPPORTED: return PJSERVE_UNSUPPORTED;
    default: return PJSERVE_INTERNAL;
    }
}

int pjs_hook_fail(const pjs_hook_ctx *ctx, int status, pjs_error *err)
{
    return pjs_error_set(err, pjs_hook_status_to_pjs(status), "model %s: %s: %s",
                         ctx->model->name, ctx->stage,
                         ctx->message[0] ? ctx->message : "failed and set no message");
}
