/*
 * hook_ctx.h - the context a request's hooks and meta run see: pjserve's
 * side of include/pjserve/model.h.
 *
 * One pjs_hook_ctx per request that runs bundle code. It carries the
 * request's arena (pjserve_alloc: blocks freed together when the request is
 * done with), the message a hook sets, its scratch buffers, and for a meta
 * run the sub-calls (server/meta.h). Tensors cross the ABI as
 * pjserve_tensor; pjs_hook_tensor_from / pjs_hook_check_produced convert and
 * check them against the manifest, so a hook's mistake becomes an INTERNAL
 * error naming the hook and the tensor, never a bad read.
 *
 * A context belongs to the thread running the request's bundle code; the
 * sub-call bookkeeping inside is guarded by the meta run (meta.c).
 */
#ifndef PJS_SERVER_HOOK_CTX_H
#define PJS_SERVER_HOOK_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PJSERVE_HOST_SIDE
#include "pjserve/model.h"

#include "core/infer.h"
#include "core/manifest.h"
#include "core/status.h"

struct pjs_server;
struct pjs_model;
struct pjs_meta_run;
struct pjs_scratch_pool;

typedef struct pjs_hook_arena_block pjs_hook_arena_block;

typedef struct pjs_hook_ctx {
    pjserve_ctx base; /* first: bundle code sees a pjserve_ctx */
    struct pjs_server *server;
    struct pjs_model *model;
    pjs_infer_request *request;
    const char *stage;            /* "preprocess", "postprocess", "run": for messages */
    char message[1024];           /* what the bundle code set with pjserve_error */
    pjs_hook_arena_block *arena;  /* pjserve_alloc's blocks */
    struct pjs_scratch_pool *scratch_pool; /* NULL: plain memory */
    bool scratch_taken;
    size_t n_scratch;
    void **scratch;               /* the buffers handed out, to give back */
    size_t *scratch_sizes;
    struct pjs_meta_run *meta;    /* a meta's run; NULL in hooks */
    bool final_sent;              /* a decoupled run sent its final response */
} pjs_hook_ctx;

/* Sets up ctx for request r of model m (r->model) at stage `stage`. */
void pjs_hook_ctx_init(pjs_hook_ctx *ctx, struct pjs_server *s, pjs_infer_request *r,
                       struct pjs_scratch_pool *pool);
/* Frees the arena and gives the scratch buffers back. */
void pjs_hook_ctx_release(pjs_hook_ctx *ctx);

/* Arena memory (64-byte aligned) freed by pjs_hook_ctx_release; NULL when
 * out of memory. */
void *pjs_hook_ctx_alloc(pjs_hook_ctx *ctx, size_t nbytes);

/* pjserve_dtype <-> pjs_dtype. */
pjserve_dtype pjs_hook_dtype_out(pjs_dtype t);
pjs_dtype pjs_hook_dtype_in(pjserve_dtype t);

/* in[i] views input i of ctx's request (r->n_inputs of them, specs set by
 * validation). A client's tensor arrives wherever its bytes sat in the
 * message, so one not aligned for its element type is first copied into
 * ctx's arena: bundle code may read a float tensor as float *. false (ctx's
 * message set) when out of memory for that copy. */
bool pjs_hook_view_inputs(pjs_hook_ctx *ctx, pjserve_tensor *in);

/* A pjserve_tensor viewing the data of an input or output (no copy). */
pjserve_tensor pjs_hook_tensor_from(const char *name, pjs_dtype dtype, const pjs_shape *shape,
                                    const void *data, size_t nbytes);

/* An output slot for a hook to fill: spec's name, dtype and rank, the batch
 * axis and every varying extent -1, no data. `shape` overrides the spec's
 * extents (the executable's inputs of a model with variants); NULL: spec's. */
pjserve_tensor pjs_hook_slot(const pjs_tensor_spec *spec, const pjs_shape *shape);

/* Checks the n tensors bundle code produced in got[] against the slots it
 * was given (restoring their names: bundle code may not rename): dtype and
 * rank unchanged, fixed extents kept, none negative, data present, nbytes
 * equal to the elements' size (BYTES: well formed, one element per
 * position). INTERNAL naming ctx->stage, the model and the tensor. */
int pjs_hook_check_produced(const pjs_hook_ctx *ctx, const pjserve_tensor *slots,
                            pjserve_tensor *got, size_t n, pjs_error *err);

/* The error for a nonzero status returned by bundle code: the status mapped
 * to ours (INVALID_ARGUMENT, DEADLINE_EXCEEDED, ... else INTERNAL) and
 * "model M: STAGE: message". */
int pjs_hook_fail(const pjs_hook_ctx *ctx, int status, pjs_error *err);

/* Index of output `name` in r->requested, or -1; *wanted says whether it is
 * sent (every output is when none was requested). */
int pjs_hook_requested_index(const pjs_infer_request *r, const char *name, bool *wanted);

/* Replaces r's outputs by copies (owned by r) of the n tensors bundle code
 * produced for specs[0..n) (a model's client outputs), leaving out those the
 * client did not request. */
int pjs_hook_take_outputs(pjs_infer_request *r, const pjs_tensor_spec *specs,
                          const pjserve_tensor *got, size_t n, pjs_error *err);

/* True when bundle code left every one of the n output slots untouched (no
 * data): a decoupled run that returns nothing more to send. */
bool pjs_hook_outputs_unset(const pjserve_tensor *out, size_t n);

/* pjserve_status <-> pjs_status. */
int pjs_hook_status_to_pjs(int status);
int pjs_hook_status_from_pjs(int code);

#endif
