/*
 * pjserve/model.h - the bundle ABI: what a bundle's model.so may export and
 * what pjserve offers it. Version 1. This is the one header a bundle author
 * needs; it depends on the C standard library only.
 *
 * A bundle directory may carry model.c and the model.so built from it
 * (`pjserve build-hooks BUNDLE` runs the system C compiler against this
 * header). pjserve loads model.so when the bundle loads and refuses it when
 * its ABI version is not the one the server speaks, or when model.c is newer
 * than model.so. Hook code is trusted: it runs inside the server process.
 *
 * What a model.so exports (every symbol optional unless said otherwise):
 *
 *   pjserve_model_abi_version   defined by this header (weak, one per bundle):
 *                               the version the bundle was built against.
 *   pjserve_init(ctx, &state)   at load, once; state is handed to every later
 *                               call (pjserve_state). A nonzero return refuses
 *                               the load with the message set by pjserve_error.
 *   pjserve_fini(state)         when the last request of the loaded version
 *                               finished (after a reload or unload).
 *   pjserve_preprocess          kind model: client inputs -> the executable's
 *                               inputs, before the request is queued.
 *   pjserve_postprocess         kind model: the executable's outputs for this
 *                               request's rows -> client outputs.
 *   pjserve_run                 kind meta (required): client inputs -> client
 *                               outputs, calling the sub-models named in the
 *                               manifest's meta.calls through pjserve_call.
 *
 * Threads. Hooks run on request threads, many at once, never while the device
 * is held; a hook must be reentrant (state shared between requests is the
 * author's to guard). pjserve_init and pjserve_fini run alone.
 *
 * Tensors. A pjserve_tensor is a name, an element type, a shape and a pointer
 * to the elements: row-major, densely packed, little-endian. A BYTES tensor
 * holds its elements one after another, each as a 4-byte little-endian length
 * and that many bytes (Triton's serialization); pjserve_bytes_* read and
 * write that form. Tensors handed to a hook are read-only, aligned for their
 * element type (a float tensor may be read as float *), and live until the
 * response has been sent. Tensors a hook produces point at memory from
 * pjserve_alloc or pjserve_scratch, or at (part of) a tensor it was handed.
 *
 * Output slots. Before a hook runs, pjserve fills its output array from the
 * manifest: name, dtype and rank of each tensor (the executable's inputs for
 * preprocess, client_outputs for postprocess and run), with extents that vary
 * set to -1. The hook sets every extent, data and nbytes; pjserve then checks
 * them (dtype and rank unchanged, fixed extents kept, nbytes equal to the
 * elements' size, BYTES well formed with one element per position) and turns
 * a mismatch into an INTERNAL error naming the hook and the tensor.
 *
 * Errors. Every function returning int returns PJSERVE_OK (0) or a
 * pjserve_status. A hook that fails returns the status the client should see
 * (PJSERVE_INVALID_ARGUMENT for bad input, PJSERVE_INTERNAL for its own
 * failure) after pjserve_error set the message; other requests are not
 * disturbed. A status returned by pjserve itself (pjserve_call_wait, ...) has
 * its message set already and may be returned as is.
 */
#ifndef PJSERVE_MODEL_H
#define PJSERVE_MODEL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PJSERVE_MODEL_ABI_VERSION 1u

/* Most extents a tensor may have. */
#define PJSERVE_MAX_RANK 8

typedef enum pjserve_status {
    PJSERVE_OK = 0,
    PJSERVE_INVALID_ARGUMENT = 1, /* the request's fault: gRPC INVALID_ARGUMENT, HTTP 400 */
    PJSERVE_NOT_FOUND = 2,
    PJSERVE_DEADLINE_EXCEEDED = 3, /* the request's deadline passed */
    PJSERVE_RESOURCE_EXHAUSTED = 4, /* out of memory, a full queue */
    PJSERVE_UNAVAILABLE = 5,        /* a sub-model not loaded, the server stopping */
    PJSERVE_UNSUPPORTED = 6,        /* not offered in this context */
    PJSERVE_INTERNAL = 7,           /* the hook's or the server's own failure */
} pjserve_status;

/* Element types, with KServe's names. */
typedef enum pjserve_dtype {
    PJSERVE_BOOL = 1,
    PJSERVE_UINT8,
    PJSERVE_UINT16,
    PJSERVE_UINT32,
    PJSERVE_UINT64,
    PJSERVE_INT8,
    PJSERVE_INT16,
    PJSERVE_INT32,
    PJSERVE_INT64,
    PJSERVE_FP16,
    PJSERVE_BF16,
    PJSERVE_FP32,
    PJSERVE_FP64,
    PJSERVE_BYTES, /* variable length; never an executable's input or output */
} pjserve_dtype;

typedef struct pjserve_tensor {
    const char *name;
    pjserve_dtype dtype;
    int rank;
    int64_t shape[PJSERVE_MAX_RANK];
    void *data;
    size_t nbytes;
} pjserve_tensor;

/* The request (or, in pjserve_init, the load) a call is made for. */
typedef struct pjserve_ctx pjserve_ctx;
/* A sub-model call in flight (pjserve_call_start). */
typedef struct pjserve_subcall pjserve_subcall;

/* What pjserve offers a bundle, reached through the wrappers below. New
 * entries are only ever appended; `size` says how many this server has. */
typedef struct pjserve_api {
    uint32_t abi_version;
    size_t size; /* sizeof(pjserve_api) of the server */
    void *(*alloc)(pjserve_ctx *ctx, size_t nbytes);
    void (*set_error)(pjserve_ctx *ctx, const char *message);
    void (*log)(pjserve_ctx *ctx, int level, const char *message);
    void *(*state)(pjserve_ctx *ctx);
    const char *(*bundle_dir)(pjserve_ctx *ctx);
    const char *(*model_name)(pjserve_ctx *ctx);
    const char *(*request_id)(pjserve_ctx *ctx);
    int64_t (*remaining_ns)(pjserve_ctx *ctx);
    int (*scratch)(pjserve_ctx *ctx, const size_t *sizes, size_t n, void **out);
    int (*call_start)(pjserve_ctx *ctx, const char *model, const pjserve_tensor *inputs,
                      size_t n_inputs, pjserve_subcall **out);
    int (*call_wait)(pjserve_ctx *ctx, pjserve_subcall *call, const pjserve_tensor **outputs,
                     size_t *n_outputs);
    int (*respond)(pjserve_ctx *ctx, const pjserve_tensor *outputs, size_t n_outputs,
                   bool final);
    /* Appended after the rest: call it through pjserve_cancelled, which
     * checks `size` first. */
    bool (*cancelled)(pjserve_ctx *ctx);
} pjserve_api;

/* Whether the server handing over `api` has the entry `field` (a bundle built
 * against this header may run on an older server of the same ABI version). */
#define PJSERVE_API_HAS(api, field)                                                               \
    ((api)->size >= offsetof(pjserve_api, field) + sizeof(((pjserve_api *)0)->field))

/* Every context starts with the server's table. */
struct pjserve_ctx {
    const pjserve_api *api;
};

/* ---- memory ------------------------------------------------------------- */

/* nbytes of memory (64-byte aligned) that lives until the response has been
 * sent; NULL when out of memory. Never free it. */
static inline void *pjserve_alloc(pjserve_ctx *ctx, size_t nbytes)
{
    return ctx->api->alloc(ctx, nbytes);
}

/* Reuse buffers for large intermediates (meta models): n buffers of sizes[i]
 * bytes into out[i], from the server's scratch pool (--meta-scratch-bytes),
 * or from plain memory when it has none. One call per request (a second one
 * is refused: ask for every buffer at once); waits for pool space at most
 * until the request's deadline (PJSERVE_DEADLINE_EXCEEDED). The buffers are
 * returned when the response has been sent; they may be handed to a
 * sub-call by reference. */
static inline int pjserve_scratch(pjserve_ctx *ctx, const size_t *sizes, size_t n, void **out)
{
    return ctx->api->scratch(ctx, sizes, n, out);
}

/* ---- context ------------------------------------------------------------ */

/* Sets the message the client sees with the status the hook returns. */
static inline void pjserve_error(pjserve_ctx *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline void pjserve_error(pjserve_ctx *ctx, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ctx->api->set_error(ctx, buf);
}

enum { PJSERVE_LOG_ERROR = 0, PJSERVE_LOG_WARN = 1, PJSERVE_LOG_INFO = 2, PJSERVE_LOG_DEBUG = 3 };

/* A line in the server's log, prefixed with the model's name. */
static inline void pjserve_log(pjserve_ctx *ctx, int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline void pjserve_log(pjserve_ctx *ctx, int level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ctx->api->log(ctx, level, buf);
}

/* What pjserve_init stored (NULL when it stored nothing or is absent). */
static inline void *pjserve_state(pjserve_ctx *ctx) { return ctx->api->state(ctx); }
/* The bundle's directory (to read files shipped with it, in pjserve_init). */
static inline const char *pjserve_bundle_dir(pjserve_ctx *ctx) { return ctx->api->bundle_dir(ctx); }
static inline const char *pjserve_model_name(pjserve_ctx *ctx) { return ctx->api->model_name(ctx); }
/* The client's request id ("" when none). */
static inline const char *pjserve_request_id(pjserve_ctx *ctx) { return ctx->api->request_id(ctx); }
/* Nanoseconds left before the request's deadline; INT64_MAX when it has
 * none, 0 or less when it passed. */
static inline int64_t pjserve_remaining_ns(pjserve_ctx *ctx) { return ctx->api->remaining_ns(ctx); }
/* True once nobody waits for this request's answer any more: its deadline
 * passed, or the server saw its client go (a ModelStreamInfer stream
 * cancelled or closed; where a protocol gives no such sign, the deadline
 * alone). Cheap (no system call beyond reading the clock): long hook code
 * calls it between units of work (rows, scans, iterations) and gives up with
 * PJSERVE_DEADLINE_EXCEEDED, so a request nobody waits for stops taking
 * CPU. False in pjserve_init. On a server without the entry (an older one)
 * it falls back to the deadline. */
static inline bool pjserve_cancelled(pjserve_ctx *ctx)
{
    if (PJSERVE_API_HAS(ctx->api, cancelled))
        return ctx->api->cancelled(ctx);
    return ctx->api->remaining_ns(ctx) <= 0;
}

/* ---- sub-model calls (kind meta) ---------------------------------------- */

/* Starts a call of `model` (named in the manifest's meta.calls; any other
 * name is refused with PJSERVE_NOT_FOUND) with the given inputs, passed by
 * reference: they must stay unchanged until pjserve_call_wait returned. The
 * call is queued at once, ahead of ordinary work while no other call of this
 * request is ahead; several calls may be in flight and their executions
 * overlap the caller's own work. Fails with PJSERVE_DEADLINE_EXCEEDED when
 * the request's deadline passed, PJSERVE_INVALID_ARGUMENT when the inputs do
 * not fit the model (the message says how). A batch larger than the model's
 * largest compiled batch size runs as several executions. */
static inline int pjserve_call_start(pjserve_ctx *ctx, const char *model,
                                     const pjserve_tensor *inputs, size_t n_inputs,
                                     pjserve_subcall **out)
{
    return ctx->api->call_start(ctx, model, inputs, n_inputs, out);
}

/* Waits for a started call and hands back its outputs (the model's outputs in
 * manifest order), read-only, alive until the response has been sent. Each
 * call is waited for exactly once. */
static inline int pjserve_call_wait(pjserve_ctx *ctx, pjserve_subcall *call,
                                    const pjserve_tensor **outputs, size_t *n_outputs)
{
    return ctx->api->call_wait(ctx, call, outputs, n_outputs);
}

/* pjserve_call_start then pjserve_call_wait. */
static inline int pjserve_call(pjserve_ctx *ctx, const char *model, const pjserve_tensor *inputs,
                               size_t n_inputs, const pjserve_tensor **outputs,
                               size_t *n_outputs)
{
    pjserve_subcall *c;
    int rc = pjserve_call_start(ctx, model, inputs, n_inputs, &c);
    return rc != PJSERVE_OK ? rc : pjserve_call_wait(ctx, c, outputs, n_outputs);
}

/* Sends one response now, before the run returns (a decoupled meta, manifest
 * `decoupled: true`, over a ModelStreamInfer stream may send zero, one or
 * many; `final` marks the last). outputs: every client output, checked as
 * returned outputs are, copied before the call returns; or none (n_outputs
 * 0) with `final`. May wait while the client reads slowly, until the
 * request's deadline (PJSERVE_DEADLINE_EXCEEDED); PJSERVE_UNAVAILABLE once
 * the client closed the stream. Outside such a stream it is refused with
 * PJSERVE_UNSUPPORTED. See docs/meta-models.md, "Decoupled models". */
static inline int pjserve_respond(pjserve_ctx *ctx, const pjserve_tensor *outputs,
                                  size_t n_outputs, bool final)
{
    return ctx->api->respond(ctx, outputs, n_outputs, final);
}

/* ---- tensors ------------------------------------------------------------ */

/* Elements of a shape (1 for a scalar); -1 when an extent is negative. */
static inline int64_t pjserve_numel(const pjserve_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] < 0)
            return -1;
        n *= t->shape[i];
    }
    return n;
}

/* Bytes per element; 0 for BYTES. */
static inline size_t pjserve_dtype_size(pjserve_dtype t)
{
    switch (t) {
    case PJSERVE_BOOL: case PJSERVE_UINT8: case PJSERVE_INT8: return 1;
    case PJSERVE_UINT16: case PJSERVE_INT16: case PJSERVE_FP16: case PJSERVE_BF16: return 2;
    case PJSERVE_UINT32: case PJSERVE_INT32: case PJSERVE_FP32: return 4;
    case PJSERVE_UINT64: case PJSERVE_INT64: case PJSERVE_FP64: return 8;
    default: return 0;
    }
}

/* Reads a BYTES tensor element by element:
 *
 *     pjserve_bytes_reader r = pjserve_bytes_begin(t);
 *     const char *s; uint32_t len;
 *     while (pjserve_bytes_next(&r, &s, &len)) ...
 *
 * Tensors pjserve hands to a hook are well formed (validated on arrival). */
typedef struct pjserve_bytes_reader {
    const unsigned char *at, *end;
} pjserve_bytes_reader;

static inline pjserve_bytes_reader pjserve_bytes_begin(const pjserve_tensor *t)
{
    pjserve_bytes_reader r = {(const unsigned char *)t->data,
                              (const unsigned char *)t->data + t->nbytes};
    return r;
}

static inline bool pjserve_bytes_next(pjserve_bytes_reader *r, const char **data, uint32_t *len)
{
    if ((size_t)(r->end - r->at) < 4)
        return false;
    uint32_t n = (uint32_t)r->at[0] | (uint32_t)r->at[1] << 8 | (uint32_t)r->at[2] << 16 |
                 (uint32_t)r->at[3] << 24;
    if ((size_t)(r->end - r->at) - 4 < n)
        return false;
    *data = (const char *)r->at + 4;
    *len = n;
    r->at += 4 + (size_t)n;
    return true;
}

/* Writes a BYTES tensor: reserve the total, then put each element.
 *
 *     pjserve_bytes_writer w;
 *     if (pjserve_bytes_reserve(ctx, &w, out, total_payload, count)) ...
 *     pjserve_bytes_put(&w, s, len);   (count times)
 *
 * reserve allocates 4 * count + payload bytes with pjserve_alloc and points
 * out->data there; out->nbytes counts what has been put. */
typedef struct pjserve_bytes_writer {
    pjserve_tensor *tensor;
    unsigned char *at, *end;
} pjserve_bytes_writer;

static inline int pjserve_bytes_reserve(pjserve_ctx *ctx, pjserve_bytes_writer *w,
                                        pjserve_tensor *out, size_t payload, size_t count)
{
    size_t total = payload + 4 * count;
    unsigned char *p = (unsigned char *)pjserve_alloc(ctx, total > 0 ? total : 1);
    if (p == NULL) {
        pjserve_error(ctx, "out of memory for %zu bytes of output %s", total, out->name);
        return PJSERVE_RESOURCE_EXHAUSTED;
    }
    out->data = p;
    out->nbytes = 0;
    w->tensor = out;
    w->at = p;
    w->end = p + total;
    return PJSERVE_OK;
}

/* False (nothing written) when the element does not fit what was reserved. */
static inline bool pjserve_bytes_put(pjserve_bytes_writer *w, const void *data, uint32_t len)
{
    if ((size_t)(w->end - w->at) < 4 || (size_t)(w->end - w->at) - 4 < len)
        return false;
    w->at[0] = (unsigned char)len;
    w->at[1] = (unsigned char)(len >> 8);
    w->at[2] = (unsigned char)(len >> 16);
    w->at[3] = (unsigned char)(len >> 24);
    if (len > 0)
        memcpy(w->at + 4, data, len);
    w->at += 4 + (size_t)len;
    w->tensor->nbytes += 4 + (size_t)len;
    return true;
}

/* ---- what a bundle exports ---------------------------------------------- */

#if defined(__GNUC__)
#define PJSERVE_EXPORT __attribute__((visibility("default")))
/* The version this bundle was built against, checked by the loader. Weak, so
 * every file of a bundle may include this header. (pjserve itself defines
 * PJSERVE_HOST_SIDE before including it.) */
#if !defined(PJSERVE_HOST_SIDE)
#ifdef __cplusplus
extern
#endif
    __attribute__((weak, visibility("default"))) const uint32_t pjserve_model_abi_version =
        PJSERVE_MODEL_ABI_VERSION;
#endif
#else
#define PJSERVE_EXPORT
#endif

PJSERVE_EXPORT int pjserve_init(pjserve_ctx *ctx, void **state);
PJSERVE_EXPORT void pjserve_fini(void *state);
/* in: the client's inputs (client_inputs order); out: the executable's
 * inputs (manifest `inputs` order), to fill. */
PJSERVE_EXPORT int pjserve_preprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                                      pjserve_tensor *out, size_t n_out);
/* in: the executable's outputs for this request's rows (manifest `outputs`
 * order); out: the client outputs (client_outputs order), to fill. */
PJSERVE_EXPORT int pjserve_postprocess(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                                       pjserve_tensor *out, size_t n_out);
/* kind meta: in: the client's inputs; out: the client outputs, to fill. */
PJSERVE_EXPORT int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in,
                               pjserve_tensor *out, size_t n_out);

#ifdef __cplusplus
}
#endif

#endif
