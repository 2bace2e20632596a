/*
 * relay_policy.h - how the gateway relays each KServe V2 operation, the
 * same over gRPC (grpc_routes.c under frontend/grpc/proxy.c) and REST
 * (http_proxy.c): which workers a call goes to, what became of a call to a
 * worker means (tell the breaker, try another worker, relay), and how the
 * answers of several workers become one reply.
 *
 * Two tables. The operations (pjs_gw_ops): each KServe V2 or pjserve
 * control operation with its gRPC method, its REST method and path shapes
 * and its class. The classes (pjs_gw_class): a few callbacks each, in
 * relay_classes.c:
 *
 *   local     answered by the gateway; no worker is asked
 *   model     the worker the pool picks among those holding the model (a
 *             sequence stays on its worker); tried elsewhere when it
 *             provably did not run there
 *   any       any available worker; tried elsewhere alike
 *   fan-out   every worker not known to be down; the first failure wins,
 *             in the workers' words when they all gave it, else naming the
 *             worker; all succeeded: the first answer
 *   merge     every available worker; the answers that succeeded merged
 *             (the repository index: each model once, READY when ready
 *             anywhere; statistics: counts and durations summed); none
 *             succeeded: the fan-out's verdict
 *
 * A new class is one file defining a pjs_gw_class and the rows that use
 * it. The protocols keep only their encoding: reading a request's model,
 * reading a worker's answer into a pjs_gw_result, writing the reply.
 *
 * Everything here is pure (no I/O, no locks of its own) but for the pool
 * calls the classes' pick and targets make; tests/unit/test_relay_policy.c
 * covers the tables and the verdicts.
 */
#ifndef PJS_GATEWAY_RELAY_POLICY_H
#define PJS_GATEWAY_RELAY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "gateway/pool.h"

/* ---- what became of a call to a worker ---------------------------------- */

/* How the call went on the connection, as the protocol reads it. */
typedef enum pjs_gw_delivery {
    PJS_GW_DELIVERED,   /* the worker answered: a status of its own, success or error */
    PJS_GW_UNDELIVERED, /* provably never reached it (no connection could be made) */
    PJS_GW_LOST,        /* reached it, then the connection failed: it may have run */
} pjs_gw_delivery;

/* The worker's pjserve-answer mark on an error answer (status_map.h). */
typedef enum pjs_gw_mark {
    PJS_GW_MARK_NONE,
    PJS_GW_MARK_ERROR,    /* an error pjserve decided */
    PJS_GW_MARK_NOT_RUN,  /* refused before anything ran: not loaded there */
    PJS_GW_MARK_DRAINING, /* refused before anything ran: the worker is going */
} pjs_gw_mark;

/* The mark a pjserve-answer value names (len bytes; not NUL-terminated). */
pjs_gw_mark pjs_gw_mark_of(const char *value, size_t len);

/* One worker's call. `status` and `text` are the protocol's (a gRPC code
 * and its details, an HTTP status and its body): the verdicts compare them
 * between workers, never read them. */
typedef struct pjs_gw_result {
    int worker;
    pjs_gw_delivery delivery;
    pjs_gw_mark mark;
    bool ok; /* delivered with a success status (gRPC OK, HTTP 2xx) */
    int status;
    const char *text;
    size_t text_len;
} pjs_gw_result;

/* What the pool hears of a call (pjs_gw_pool_done): the worker's answer is
 * ANSWERED, but a refusal because it is going counts as never sent, like a
 * connection that could not be made; a lost connection is BROKEN. The
 * breaker counts only those last two, so no text a client chooses opens it. */
pjs_gw_outcome pjs_gw_relay_outcome(const pjs_gw_result *r);

/* ---- classes -------------------------------------------------------------- */

/* What a one-worker call is routed by: the model ("" when the call names
 * none) and its sequence key ("" when none). */
typedef struct pjs_gw_route {
    const char *model;
    const char *sequence;
} pjs_gw_route;

/* How several answers become one reply. */
typedef enum pjs_gw_verdict_kind {
    PJS_GW_VERDICT_RELAY,  /* answer `at` as it is */
    PJS_GW_VERDICT_MERGE,  /* the answers in `merged` (bit i: result i), merged */
    PJS_GW_VERDICT_FAILED, /* result `at` failed: its status, in its own words when
                              `unanimous`, else named (pjs_gw_relay_failure_text) */
} pjs_gw_verdict_kind;

typedef struct pjs_gw_verdict {
    pjs_gw_verdict_kind kind;
    size_t at;
    uint64_t merged;
    bool unanimous; /* every worker answered exactly so */
    size_t n_failed, n;
    bool accepted; /* some worker succeeded: a remembered change is kept */
} pjs_gw_verdict;

typedef struct pjs_gw_class {
    const char *name;
    /* One-worker classes: the worker for the call, never one in `tried`
     * (bit i: worker i), counted in flight until pjs_gw_pool_done; -1 with
     * err. NULL for the others. */
    int (*pick)(pjs_gw_pool *pool, const pjs_gw_route *route, uint64_t tried, pjs_error *err);
    /* Several-worker classes: the workers, each counted in flight until
     * pjs_gw_pool_done; `change` (may be NULL) remembered as *change_seq
     * as pjs_gw_pool_take_not_down says. 0 with err when there is none.
     * NULL for the others. */
    uint64_t (*targets)(pjs_gw_pool *pool, const pjs_gw_change *change, uint64_t *change_seq,
                        pjs_error *err);
    /* Whether a call that ended as r goes to a worker not tried yet. */
    bool (*retry)(const pjs_gw_result *r);
    /* Several-worker classes: the reply of n >= 1 results. */
    void (*combine)(const pjs_gw_result *results, size_t n, pjs_gw_verdict *out);
} pjs_gw_class;

/* The classes (relay_classes.c). Local has no callbacks. */
extern const pjs_gw_class pjs_gw_class_local, pjs_gw_class_model, pjs_gw_class_any,
    pjs_gw_class_fan_out, pjs_gw_class_merge;

/* The first-error verdict of a fan-out (pjs_gw_class_fan_out.combine), for
 * classes that fall back on it. */
void pjs_gw_relay_first_error(const pjs_gw_result *results, size_t n, pjs_gw_verdict *out);

/* The message of a failed verdict that is not unanimous: "worker 1
 * (ADDR): WHY (the other 1 worker succeeded)", or "worker 1 (ADDR) did not
 * answer: WHY ..." when the failure was no answer. `why` is the worker's
 * message or the transport's reason; `addr` the worker's address on the
 * protocol. Returns buf. */
char *pjs_gw_relay_failure_text(const pjs_gw_verdict *v, const pjs_gw_result *failed,
                                const char *addr, const char *why, char *buf, size_t size);

/* ---- operations --------------------------------------------------------------- */

typedef enum pjs_gw_op_id {
    PJS_GW_OP_SERVER_LIVE,
    PJS_GW_OP_SERVER_READY,
    PJS_GW_OP_HEALTH_CHECK,
    PJS_GW_OP_NODE_STATUS,
    PJS_GW_OP_SERVER_METADATA,
    PJS_GW_OP_MODEL_STATISTICS, /* before the model's other reads: /v2/models/stats */
    PJS_GW_OP_MODEL_METADATA,
    PJS_GW_OP_MODEL_CONFIG,
    PJS_GW_OP_MODEL_READY,
    PJS_GW_OP_MODEL_INFER,
    PJS_GW_OP_MODEL_STREAM_INFER,
    PJS_GW_OP_REPOSITORY_INDEX,
    PJS_GW_OP_REPOSITORY_MODEL_LOAD,
    PJS_GW_OP_REPOSITORY_MODEL_UNLOAD,
    PJS_GW_OP_SYSTEM_SHM_STATUS,
    PJS_GW_OP_SYSTEM_SHM_REGISTER,
    PJS_GW_OP_SYSTEM_SHM_UNREGISTER,
    PJS_GW_OP_CUDA_SHM_STATUS,
    PJS_GW_OP_CUDA_SHM_REGISTER,
    PJS_GW_OP_CUDA_SHM_UNREGISTER,
    PJS_GW_OP_TRACE_SETTING,
    PJS_GW_OP_LOG_SETTINGS,
    PJS_GW_OP_MODEL_CONTROL_STATUS,
    PJS_GW_OP_SET_MODEL_RESIDENCY,
    PJS_GW_OP_SET_MODEL_POLICY,
    PJS_GW_OP_COMPACT,
    PJS_GW_OP_OTHER, /* any other method or path: the worker's word on it */
    PJS_GW_N_OPS,
} pjs_gw_op_id;

/* How answers of a merge class are merged (each protocol encodes it). */
typedef enum pjs_gw_merge_kind {
    PJS_GW_MERGE_NONE,
    PJS_GW_MERGE_INDEX,      /* each name and version once, READY if ready anywhere */
    PJS_GW_MERGE_STATISTICS, /* same name and version summed; the latest last_inference */
} pjs_gw_merge_kind;

#define PJS_GW_OP_REST_SHAPES 4

typedef struct pjs_gw_op {
    pjs_gw_op_id id;
    const char *name;
    const char *grpc; /* "/package.Service/Method"; NULL: none */
    /* "METHOD /v2/seg/..." shapes (HEAD is GET): "{m}" is the model's
     * segment, "*" any one segment; unused ones NULL. */
    const char *rest[PJS_GW_OP_REST_SHAPES];
    const pjs_gw_class *cls;
    bool stream;    /* a gRPC stream (routed by its first message) */
    bool inference; /* its request may carry a sequence key */
    pjs_gw_merge_kind merge;
} pjs_gw_op;

/* The operation table, indexed by pjs_gw_op_id. */
extern const pjs_gw_op pjs_gw_ops[PJS_GW_N_OPS];

/* The operation of a gRPC method (PJS_GW_OP_OTHER when unknown). */
const pjs_gw_op *pjs_gw_op_of_grpc(const char *method);
/* The operation of a REST request: the method and the path's n segments
 * (seg[0] is "v2"); *model_at the index of the model's segment, or n when
 * the shape has none. PJS_GW_OP_OTHER when no shape matches. */
const pjs_gw_op *pjs_gw_op_of_rest(const char *method, const char *const *seg, size_t n,
                                   size_t *model_at);

#endif
