/*
 * internal.h - what the files of the gRPC front end share.
 *
 * Threads. One completion queue serves everything; `threads` threads wait on
 * it (frontend.c). Every event carries a pjs_grpc_tag whose function runs the
 * next step of one call's state machine. An inference request leaves these
 * threads at pjs_server_submit (pjs__grpc_infer_job_submit): when the device
 * is free the submitting queue thread executes it itself, inside that call,
 * else a dispatcher worker does; either way the thread that ran it calls
 * on_done, which encodes the response and starts the send batch
 * (grpc_call_start_batch may be called from any thread). So a submitting
 * thread touches nothing of the call after a successful submit and holds no
 * lock that on_done takes across it.
 *
 * Calls. Every call object embeds a pjs_grpc_call as its first member
 * (`base`): the call as the server handed it and what its final batch needs.
 * Each registered method keeps at least one call requested from the
 * server; when it arrives the handler first requests the next one, then
 * serves the call. Unary RPCs other than ModelInfer are a table of handlers
 * (unary.c, and control_rpc.c for the model control service) run by one
 * generic call; ModelInfer (infer_call.c), ModelStreamInfer (stream_call.c),
 * Health/Watch (health.c) and reflection (reflection.c) have their own state
 * machines. ModelInfer and each message of ModelStreamInfer take the same
 * path to the server, a pjs_grpc_infer_job (infer_call.c).
 *
 * Stop. pjs_grpc_frontend_stop sets `stopping` (no call is requested any
 * more) and shuts the server down: new calls are refused while calls in
 * progress may finish for a grace period, after which every call still open
 * (streams, watches) is cancelled. Once the server's shutdown tag arrived, no
 * request is left in the dispatcher and every call object is freed (so no
 * handler can start another batch), the queue shuts down and the threads
 * are joined.
 */
#ifndef PJS_FRONTEND_GRPC_INTERNAL_H
#define PJS_FRONTEND_GRPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "core/log.h"
#include "core/status.h"
#include "core/work_pool.h"
#include "frontend/client_id.h"
#include "frontend/grpc/arena.h"
#include "frontend/grpc/codec.h"
#include "frontend/grpc/grpc_frontend.h"
#include "registry/model.h"
#include "server/server.h"

/* Bytes a non-inference request may take once decoded. */
#define PJS_GRPC_UNARY_ARENA_LIMIT ((size_t)64 << 20)
/* Requests of one ModelStreamInfer stream in flight before reading pauses. */
#define PJS_GRPC_STREAM_MAX_IN_FLIGHT 64
/* Seconds calls in progress may take to finish once stopping began, before
 * the calls still open (streams, watches) are cancelled. */
#define PJS_GRPC_STOP_GRACE_S 2
/* Before the core shuts down, stop waits until no call has been handed over
 * for PJS_GRPC_SETTLE_QUIET_MS, at most PJS_GRPC_SETTLE_MAX_MS (see settle in
 * frontend.c). */
#define PJS_GRPC_SETTLE_QUIET_MS 50
#define PJS_GRPC_SETTLE_MAX_MS 1000
/* Threads and queued requests of the control jobs (SetModelResidency and
 * Compact wait for the dispatch thread to move weights); a full queue
 * answers RESOURCE_EXHAUSTED. */
#define PJS_GRPC_CONTROL_JOB_THREADS 2
#define PJS_GRPC_CONTROL_JOB_QUEUE 64
/* How often Health/Watch streams are checked for a change of status. */
#define PJS_GRPC_HEALTH_POLL_MS 500
/* How often relayed streams are checked for a client that stopped reading. */
#define PJS_GRPC_STALL_SWEEP_MS 100

/* An event on the completion queue: `fn` runs the next step of its call.
 * ok is the event's success flag. */
typedef struct pjs_grpc_tag pjs_grpc_tag;
struct pjs_grpc_tag {
    void (*fn)(pjs_grpc_tag *tag, bool ok);
    /* Bumped (release) each time the tag is handed to gRPC and read
     * (acquire) when its event comes back: an explicit happens-before edge
     * from the thread that started an operation to the one handling its
     * completion. gRPC orders them too, but inside an uninstrumented library
     * where ThreadSanitizer cannot see it. */
    atomic_uint handoffs;
};

/* The tag to pass to a gRPC call that will return it on the queue. Every
 * other argument of that call must be evaluated before this runs. */
static inline void *pjs__grpc_tag_arm(pjs_grpc_tag *tag)
{
    atomic_fetch_add_explicit(&tag->handoffs, 1, memory_order_release);
    return tag;
}

/* grpc_call_start_batch with an armed tag (arguments evaluated first). */
static inline grpc_call_error pjs__grpc_start_batch(grpc_call *call, const grpc_op *ops, size_t n,
                                                    pjs_grpc_tag *tag)
{
    return grpc_call_start_batch(call, ops, n, pjs__grpc_tag_arm(tag), NULL);
}

#define PJS_GRPC_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* ---- unary handlers (unary.c, health.c) ---------------------------------- */

typedef struct pjs_grpc_unary_ctx {
    pjs_grpc_frontend *frontend;
    pjs_grpc_arena *arena; /* request, response and scratch */
    pjs_model *model;      /* a reference a handler may leave for the response
                              to borrow from; released after packing */
    void *call;            /* the call (call.c), for pjs__grpc_unary_defer */
    bool deferred;         /* set by pjs__grpc_unary_defer */
} pjs_grpc_unary_ctx;

/* A unary call answered later, off the completion-queue threads (a model
 * load runs on the server's load thread). */
typedef struct pjs_grpc_deferred pjs_grpc_deferred;
/* For a handler whose answer comes later: returns the call, which the
 * handler hands to the work and then returns 0 with no response. Whoever
 * finishes the work calls pjs__grpc_unary_answer exactly once, from any
 * thread (it may do so before the handler returned). The request and the
 * call's arena stay valid until then; the arena belongs to that thread. */
pjs_grpc_deferred *pjs__grpc_unary_defer(pjs_grpc_unary_ctx *ctx);
/* Sends `response` (packed here; NULL: none) or, when err is not NULL, the
 * error's status. */
void pjs__grpc_unary_answer(pjs_grpc_deferred *d, const ProtobufCMessage *response,
                            const pjs_error *err);

/* Answers one request with a response allocated in ctx->arena, or fails
 * with err (mapped to a gRPC status by the caller). */
typedef int (*pjs_grpc_unary_fn)(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                 ProtobufCMessage **response, pjs_error *err);

typedef enum pjs_grpc_method_kind {
    PJS_GRPC_UNARY,        /* a pjs_grpc_unary_fn */
    PJS_GRPC_INFER,        /* ModelInfer */
    PJS_GRPC_STREAM_INFER, /* ModelStreamInfer */
    PJS_GRPC_HEALTH_WATCH, /* grpc.health.v1.Health/Watch */
    PJS_GRPC_REFLECTION,   /* ServerReflectionInfo, v1alpha and v1 */
} pjs_grpc_method_kind;

typedef struct pjs_grpc_method {
    const char *path; /* "/inference.GRPCInferenceService/ServerLive" */
    pjs_grpc_method_kind kind;
    const ProtobufCMessageDescriptor *request; /* PJS_GRPC_UNARY */
    pjs_grpc_unary_fn handle;                  /* PJS_GRPC_UNARY */
} pjs_grpc_method;

/* Every method served, in registration order (unary.c). */
extern const pjs_grpc_method pjs__grpc_methods[];
extern const size_t pjs__grpc_n_methods;

/* ---- the front end ----------------------------------------------------- */

typedef struct pjs_grpc_watch pjs_grpc_watch;
typedef struct pjs_grpc_reflection_index pjs_grpc_reflection_index;
typedef struct pjs_grpc_conn_guard pjs_grpc_conn_guard;

struct pjs_grpc_frontend {
    pjs_server *server;       /* NULL when forwarding */
    const pjs_grpc_proxy_ops *proxy; /* forwarding: every call goes through it (proxy.c) */
    pjs_byte_budget *budget;  /* request bytes held at once; may be NULL */
    const pjs_access *access; /* consulted by every call before it is served */
    const char *node_status_file; /* NodeStatus's answer (a node's worker); or NULL */
    size_t max_message;       /* largest inference request, decompressed (--max-request-bytes) */
    uint64_t stream_write_stall_ns; /* a stream's longest wait for its client to read; 0: none */
    grpc_resource_quota *quota;   /* bounds gRPC's own buffers (--grpc-memory-quota) */
    pjs_grpc_conn_guard *guard;   /* keeps connections within their descriptors; NULL: off */
    pjs_log_limiter refused_stream_msg_log; /* forwarding: stream messages refused (proxy.c) */
    grpc_server *core;
    grpc_completion_queue *cq;
    void **registered; /* per pjs__grpc_methods entry */
    size_t n_threads;
    pthread_t *threads;
    pjs_grpc_reflection_index *reflection;
    pjs_work_pool *control_jobs; /* SetModelResidency and Compact, off the queue threads */

    atomic_bool stopping;   /* set once by stop: request no more calls */
    atomic_uint polling;    /* threads waiting in the completion queue now */
    atomic_uint_least64_t calls_handed_over; /* calls gRPC has matched to a request */
    pthread_mutex_t lock;   /* guards the fields below */
    pthread_cond_t changed; /* signalled when they change */
    size_t in_dispatcher;   /* submitted requests whose on_done has not finished */
    size_t live_calls;      /* call objects allocated and not yet freed */
    bool shutdown_done;     /* the server's shutdown tag arrived */
    pjs_grpc_tag shutdown_tag;

    /* ModelInfer call objects kept for the next calls (infer_call.c), at
     * most PJS_GRPC_INFER_POOL of them, linked through their job. */
    pthread_mutex_t pool_lock;
    struct pjs_grpc_infer_job *pooled_jobs;
    size_t n_pooled;

    pthread_mutex_t watch_lock;           /* guards `watches` and every watch's state */
    pjs_grpc_watch *watches;              /* open Health/Watch streams */
    _Atomic uint64_t next_health_poll_ns; /* pjs_now_ns() of the next poll */

    /* Streams being relayed (proxy.c), for the stall sweep. */
    pthread_mutex_t relayed_lock;                /* guards `relayed` and its links */
    struct pjs_grpc_proxy_call *relayed;
    _Atomic uint64_t next_stall_sweep_ns; /* pjs_now_ns() of the next sweep */
};

/* Requests the next call of method `index` from the server (no-op once
 * stopping). */
void pjs__grpc_request(pjs_grpc_frontend *f, size_t index);
void pjs__grpc_request_infer(pjs_grpc_frontend *f, size_t index);
/* Frees the ModelInfer call objects kept for reuse (at teardown, once no
 * call is live). */
void pjs__grpc_infer_pool_drain(pjs_grpc_frontend *f);
void pjs__grpc_request_stream(pjs_grpc_frontend *f, size_t index);
void pjs__grpc_request_watch(pjs_grpc_frontend *f, size_t index);
void pjs__grpc_request_reflection(pjs_grpc_frontend *f, size_t index);

/* Accounting of call objects, so stop shuts the queue down only once no
 * handler can start another batch on it (pjs__grpc_call_init and
 * pjs__grpc_call_destroy count them). */
void pjs__grpc_call_born(pjs_grpc_frontend *f);
void pjs__grpc_call_gone(pjs_grpc_frontend *f);

/* Accounting of requests handed to the dispatcher, so stop can wait for
 * their on_done to have finished sending. */
void pjs__grpc_dispatch_begin(pjs_grpc_frontend *f);
void pjs__grpc_dispatch_end(pjs_grpc_frontend *f);

/* ---- what every served call has (call.c) ------------------------------------ */

/* The first member (`base`) of every call object: the call as the server
 * handed it and what its final batch needs. Set up by init and by the
 * server before on_new, read-only afterwards but for `details` and
 * `cancelled`, which belong to the batch that was given them. */
typedef struct pjs_grpc_call {
    pjs_grpc_tag on_new; /* the server handed the call over (ok false: shutting down) */
    pjs_grpc_frontend *frontend;
    size_t method;                /* in pjs__grpc_methods (SIZE_MAX: not a served method) */
    grpc_call *call;              /* set when on_new fires; our reference */
    gpr_timespec deadline;        /* the client's deadline, on a gRPC clock */
    grpc_metadata_array metadata; /* the client's initial metadata */
    grpc_slice details;           /* the status message; alive until the status batch completed */
    int cancelled;                /* written by RECV_CLOSE_ON_SERVER, final once its tag returned */
} pjs_grpc_call;

/* Sets c up for method `index` of f, on_new to run when the call arrives,
 * and counts the call born (pjs__grpc_call_born). */
void pjs__grpc_call_init(pjs_grpc_call *c, pjs_grpc_frontend *f, size_t index,
                         void (*on_new)(pjs_grpc_tag *tag, bool ok));
/* Requests c's call from the server on f's queue; *payload receives the
 * first message for a method registered to read it first, NULL for the
 * others. On failure the caller destroys c. */
grpc_call_error pjs__grpc_call_request(pjs_grpc_call *c, grpc_byte_buffer **payload);
/* Drops the call, its metadata and status message, and counts it gone:
 * the object's last use of the front end (stop may free it next), so the
 * caller releases what its object adds first and only frees it after. */
void pjs__grpc_call_destroy(pjs_grpc_call *c);
/* pjs__grpc_call_destroy without the count: for an object kept for reuse,
 * which counts itself gone (pjs__grpc_call_gone) once it is put away. */
void pjs__grpc_call_drop(pjs_grpc_call *c);

/* Whether the caller of c may make it: 0, or UNAUTHENTICATED /
 * PERMISSION_DENIED with err set (the decision is frontend/access.c's). */
int pjs__grpc_access_check(const pjs_grpc_call *c, pjs_error *err);
/* The same for a call of the method at `path` (calls not served by a
 * registered method). */
int pjs__grpc_access_check_path(const pjs_grpc_call *c, const char *path, pjs_error *err);

/* The value of the first metadata entry `key` (lower case), not
 * NUL-terminated, its length in *len; NULL when there is none. */
const char *pjs__grpc_metadata_value(const grpc_metadata_array *md, const char *key,
                                     size_t *len);

/* Who made `call` (with initial metadata md) to f, into out
 * (PJS_CLIENT_ID_MAX bytes): the `pjserve-client` metadata when the peer is
 * trusted with it (frontend/client_id.h), else the peer's address. */
void pjs__grpc_client_id(const pjs_grpc_frontend *f, grpc_call *call,
                         const grpc_metadata_array *md, char *out);

/* The final batch of a call: initial metadata, the response (if not NULL),
 * the status (OK when err is NULL, else err mapped, its message kept in
 * c->details) and RECV_CLOSE_ON_SERVER into c->cancelled; the call must
 * have no RECV_CLOSE_ON_SERVER of its own outstanding. */
grpc_call_error pjs__grpc_reply(pjs_grpc_call *c, grpc_byte_buffer *response, const pjs_error *err,
                                pjs_grpc_tag *tag);

/* Starts a batch of one RECV_CLOSE_ON_SERVER op into c->cancelled. */
grpc_call_error pjs__grpc_recv_close(pjs_grpc_call *c, pjs_grpc_tag *tag);

/* ---- one inference request (infer_call.c) ------------------------------------ */

typedef struct pjs_grpc_infer_job pjs_grpc_infer_job;

/* Runs once when a submitted job's request completed: err says why it
 * failed, NULL when its outputs are set. */
typedef void (*pjs_grpc_infer_job_done_fn)(pjs_grpc_infer_job *j, const pjs_error *err);

/* An inference request from its bytes to its response: ModelInfer's call
 * embeds one, ModelStreamInfer one per message. */
struct pjs_grpc_infer_job {
    pjs_grpc_frontend *frontend;     /* set by init */
    pjs_grpc_infer decoded;          /* the request; its arena also holds the response */
    grpc_slice bytes;                /* the message received, which decoded borrows from */
    pjs_model *model;                /* a reference, from the lookup until release; or NULL */
    uint64_t charged;                /* request bytes taken from the server's budget */
    pjs_grpc_infer_job_done_fn done; /* set by submit */
    /* Set before submit by a call that carries many responses per request
     * (ModelStreamInfer); handed to a decoupled model's request. NULL:
     * decoupled models are refused (pjs_server_submit). */
    pjs_infer_respond_fn respond;
    /* Set before submit by a call that notices its client going away
     * (ModelStreamInfer), handed to the request (pjs_infer_request's
     * client_gone); NULL elsewhere. */
    const atomic_bool *client_gone;
    const void *client; /* the request's client (pjs_infer_request's), or NULL */
    /* The call the request came on (set before submit), and who sent it
     * (frontend/client_id.h): found only for a request starting a sequence
     * of a stateful model, the one place it counts. */
    const pjs_grpc_call *call;
    char client_id[PJS_CLIENT_ID_MAX];
    pjs_grpc_infer_job *next_pooled; /* the front end's pool of ModelInfer calls */
};

void pjs__grpc_infer_job_init(pjs_grpc_infer_job *j, pjs_grpc_frontend *f);
/* Takes the request out of *payload (destroyed, NULL afterwards), charges
 * its bytes to the server's request budget, decodes it, looks its model up
 * and submits it, due by the earlier of its `timeout` and `deadline` (the
 * call's). On success `done` runs exactly once, on the thread that ran the
 * request: perhaps this one, before this returns. The caller then touches
 * nothing `done` may free, and holds no lock `done` takes. On failure `done`
 * never runs and err says why; release j. */
int pjs__grpc_infer_job_submit(pjs_grpc_infer_job *j, grpc_byte_buffer **payload,
                               gpr_timespec deadline, pjs_grpc_infer_job_done_fn done,
                               pjs_error *err);
/* Releases the decoded request, the bytes it borrowed, its budget charge
 * and the model reference; j can be submitted again (releasing twice is
 * harmless). Its
 * arena keeps a block for that (pjs_grpc_infer_recycle): destroy frees it
 * when j goes for good. */
/* Records the spans of the job's request when it is traced, answered with
 * err (NULL: success); before pjs__grpc_infer_job_release. */
void pjs__grpc_infer_job_trace(pjs_grpc_infer_job *j, const pjs_error *err);
void pjs__grpc_infer_job_release(pjs_grpc_infer_job *j);
void pjs__grpc_infer_job_destroy(pjs_grpc_infer_job *j);

/* ---- helpers shared by the call state machines (payload.c) --------------- */

/* The whole payload as one contiguous slice in *out (the caller unrefs
 * it; empty when there is none), inflated when the client compressed it;
 * the byte buffer is destroyed. A message larger than limit bytes once
 * decompressed is RESOURCE_EXHAUSTED, corrupt compressed data
 * INVALID_ARGUMENT (payload.c). */
int pjs__grpc_take_payload(grpc_byte_buffer **bb, size_t limit, grpc_slice *out, pjs_error *err);

/* The limit for messages other than inference requests: the smaller of
 * max_message and PJS_GRPC_UNARY_ARENA_LIMIT. */
size_t pjs__grpc_small_limit(const pjs_grpc_frontend *f);

/* pjs__grpc_take_payload for an inference request (limit max_message), its
 * bytes then taken from the server's request budget (RESOURCE_EXHAUSTED
 * when that is spent) and recorded in *charged. */
int pjs__grpc_take_request(pjs_grpc_frontend *f, grpc_byte_buffer **bb, grpc_slice *out,
                           uint64_t *charged, pjs_error *err);
/* Gives *charged bytes back to the budget (once: *charged becomes 0). */
void pjs__grpc_release_request(pjs_grpc_frontend *f, uint64_t *charged);

/* ---- the descriptor guard (conn_guard.c) ----------------------------------- */

/* A socket mutator that keeps gRPC's connections within `share`
 * descriptors: it shuts down accepted connections on descriptors past its
 * ceiling (the share less the listen queue); NULL when share <= 0 or the
 * gRPC core is not the one its layout was checked against (logged). */
pjs_grpc_conn_guard *pjs__grpc_conn_guard_create(int share);
/* The channel argument that installs it. */
grpc_arg pjs__grpc_conn_guard_arg(pjs_grpc_conn_guard *g);
/* Connections are refused on descriptors >= this. */
int pjs__grpc_conn_guard_ceiling(const pjs_grpc_conn_guard *g);
/* Shortens the listen queue of the sockets gRPC just bound (call after
 * grpc_server_add_http2_port). */
void pjs__grpc_conn_guard_listening(pjs_grpc_conn_guard *g);
/* Frees it once gRPC has shut down. */
void pjs__grpc_conn_guard_free(pjs_grpc_conn_guard *g);

/* A byte buffer that owns buf (malloc'd, freed by gRPC). */
grpc_byte_buffer *pjs__grpc_buffer_from(uint8_t *buf, size_t len);

/* Packs m into a byte buffer (NULL with err set on failure). */
grpc_byte_buffer *pjs__grpc_pack(const ProtobufCMessage *m, pjs_error *err);

/* A call's deadline (from grpc_server_request_registered_call) as
 * pjs_infer_request.deadline_ns: pjs_now_ns() plus the time left, 1 when it
 * already passed, 0 when it is infinite. */
uint64_t pjs__grpc_deadline_ns(gpr_timespec deadline);

/* ---- health (health.c) ---------------------------------------------------- */

/* Check and Watch answer for these services: "" and the inference service. */
bool pjs__grpc_health_known(const char *service);
/* Sends changed statuses to open Watch streams when a poll is due; any CQ
 * thread may call it after any event. */
void pjs__grpc_health_poll(pjs_grpc_frontend *f);
int pjs__grpc_health_check(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                           ProtobufCMessage **response, pjs_error *err);

/* ---- model control (control_rpc.c) ---------------------------------------- */

/* pjserve.control.v1.ModelControl: ModelControlStatus, SetModelResidency,
 * SetModelPolicy, Compact, NodeStatus. */
int pjs__grpc_control_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                             ProtobufCMessage **response, pjs_error *err);
int pjs__grpc_control_set_residency(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                    ProtobufCMessage **response, pjs_error *err);
int pjs__grpc_control_set_policy(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                 ProtobufCMessage **response, pjs_error *err);
int pjs__grpc_control_compact(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                              ProtobufCMessage **response, pjs_error *err);
int pjs__grpc_control_node_status(pjs_grpc_unary_ctx *ctx, const ProtobufCMessage *request,
                                  ProtobufCMessage **response, pjs_error *err);

/* ---- forwarding (proxy.c) ---------------------------------------------------- */

/* Serves one call the server handed over for `method` (grpc_server_request_call):
 * takes c (with its metadata) over, c is freed by the proxy. */
void pjs__grpc_proxy_serve(pjs_grpc_frontend *f, grpc_call *call, grpc_metadata_array *metadata,
                           const grpc_slice *method);
/* The same for a call that arrived with its first message (a method
 * registered to read it: ModelInfer), which the proxy takes (NULL: the
 * client sent none). */
void pjs__grpc_proxy_serve_read(pjs_grpc_frontend *f, grpc_call *call,
                                grpc_metadata_array *metadata, const grpc_slice *method,
                                grpc_byte_buffer *first);

/* Cuts off relayed streams whose client has read nothing of what waits for
 * it for the stall bound (--grpc-stream-write-timeout-ms). Called by the
 * queue threads between events; one of them sweeps, at most every
 * PJS_GRPC_STALL_SWEEP_MS. */
void pjs__grpc_proxy_sweep(pjs_grpc_frontend *f);

/* ---- reflection (reflection.c) -------------------------------------------- */

int pjs__grpc_reflection_create(pjs_grpc_reflection_index **out, pjs_error *err);
void pjs__grpc_reflection_destroy(pjs_grpc_reflection_index *r);

#endif
