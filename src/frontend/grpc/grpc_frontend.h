/*
 * grpc_frontend.h - the KServe V2 gRPC front end (inference.GRPCInferenceService,
 * grpc.health.v1.Health and server reflection) on the gRPC C core.
 *
 * Started once the server has loaded its repository; stopped after
 * pjs_server_drain, so every accepted request has been answered first.
 */
#ifndef PJS_FRONTEND_GRPC_FRONTEND_H
#define PJS_FRONTEND_GRPC_FRONTEND_H

#include <stdbool.h>
#include <stdint.h>

#include "core/byte_budget.h"
#include "core/status.h"
#include "frontend/access.h"
#include "server/server.h"

typedef struct pjs_grpc_options {
    const char *host;              /* bind address, e.g. "0.0.0.0" */
    int port;                      /* e.g. 8001 */
    const char *tls_cert;          /* PEM files; NULL: plaintext */
    const char *tls_key;
    const char *tls_ca;            /* with tls_cert: require and verify client certificates */
    int keepalive_time_ms;         /* 0: gRPC's default */
    int keepalive_timeout_ms;      /* 0: gRPC's default */
    bool keepalive_permit_without_calls;
    int threads;                   /* completion-queue threads; 0: a default */
    /* Limits against hostile clients (docs/serving.md, section Limits). */
    uint64_t max_request_bytes;    /* largest inference request, decompressed; 0: 2 GiB - 1 */
    int max_concurrent_streams;    /* calls open at once on one connection; 0: gRPC's (no limit) */
    int max_connection_idle_ms;    /* close a connection with no call for this long; 0: never */
    int handshake_timeout_ms;      /* TLS handshake and first SETTINGS frame; 0: gRPC's 120 s */
    uint64_t memory_quota;         /* bytes for gRPC's buffers; 0: unbounded */
    int fd_share;                  /* descriptors gRPC's connections may take (the process's
                                      lowest ones); 0: no guard */
    const pjs_access *access;      /* who may call what; NULL: no tokens (frontend/access.h) */
    const char *node_status_file;  /* a node's worker: NodeStatus answers this file; NULL */
    int stream_write_timeout_ms;   /* a decoupled run's responses wait this long at most for
                                      a ModelStreamInfer client to read; past it the stream
                                      is closed; 0: until the request's deadline */
} pjs_grpc_options;

typedef struct pjs_grpc_frontend pjs_grpc_frontend;

/* ---- forwarding (the gateway) -------------------------------------------- */

/* How a front end that forwards (pjs_grpc_frontend_start_proxy) treats a
 * method. */
typedef enum pjs_grpc_proxy_kind {
    PJS_GRPC_PROXY_LOCAL,         /* answered by ops->answer, no worker involved */
    PJS_GRPC_PROXY_ROUTED,        /* unary, to the worker ops->pick chooses for its message */
    PJS_GRPC_PROXY_FANOUT,        /* unary, to every available worker; answers ops->merge'd */
    PJS_GRPC_PROXY_STREAM_ROUTED, /* a stream, to the worker picked for its first message */
} pjs_grpc_proxy_kind;

/* How a call to a worker went on the channel. */
typedef enum pjs_grpc_proxy_outcome {
    PJS_GRPC_PROXY_ANSWERED, /* the worker gave the status (or the client's own limits did) */
    PJS_GRPC_PROXY_NOT_SENT, /* the worker could not be reached: nothing was sent */
    PJS_GRPC_PROXY_BROKEN,   /* sent, then the channel failed without an answer */
} pjs_grpc_proxy_outcome;

/* What became of one call to a worker, as the front end read it. */
typedef struct pjs_grpc_proxy_result {
    int worker;
    pjs_grpc_proxy_outcome outcome;
    const char *mark; /* the worker's pjserve-answer value (status_map.h); NULL: none */
    int status;       /* a grpc_status_code */
    const char *details;
} pjs_grpc_proxy_result;

/* The reply to a fan-out, as ops->finish decides it. */
typedef struct pjs_grpc_proxy_reply {
    size_t from;      /* the result whose metadata is relayed */
    int status;       /* a grpc_status_code */
    bool own_details; /* from's details as the worker sent them; else `details` */
    char details[PJS_ERROR_MSG_MAX];
    uint8_t *message; /* malloc'd; NULL: none */
    size_t len;
} pjs_grpc_proxy_reply;

typedef struct grpc_channel grpc_channel;

/* What the forwarding front end asks of the gateway. Every function may be
 * called from any completion-queue thread at once. Messages are the
 * client's, decompressed, never trusted. */
typedef struct pjs_grpc_proxy_ops {
    void *ctx;
    pjs_grpc_proxy_kind (*classify)(void *ctx, const char *method);
    /* PJS_GRPC_PROXY_LOCAL: the answer's bytes (malloc'd) or an error. */
    int (*answer)(void *ctx, const char *method, const uint8_t *msg, size_t len, uint8_t **out,
                  size_t *out_len, pjs_error *err);
    /* The worker for one call whose (first) message is msg, never one in
     * `tried` (bit i: worker i); -1 with err. */
    int (*pick)(void *ctx, const char *method, const uint8_t *msg, size_t len, uint64_t tried,
                pjs_error *err);
    /* A call to a worker (picked, or one of a fan-out) ended as r; true
     * when a unary call should go to another worker (pick again). */
    bool (*done)(void *ctx, const char *method, const pjs_grpc_proxy_result *r);
    /* PJS_GRPC_PROXY_FANOUT: the workers to send a call of `method`, whose
     * message is msg, to, each counted in flight until done (0 with err
     * when there is none). A change the gateway remembers is numbered in
     * *change (0: none) and given back to finish. */
    uint64_t (*fanout)(void *ctx, const char *method, const uint8_t *msg, size_t len,
                       uint64_t *change, pjs_error *err);
    /* Every worker of a fan-out answered: results[i] and its message
     * answers[i] (lengths[i] bytes, empty when none). Fills *out, or
     * returns an error to answer. */
    int (*finish)(void *ctx, const char *method, uint64_t change,
                  const pjs_grpc_proxy_result *results, const uint8_t *const *answers,
                  const size_t *lengths, size_t n, pjs_grpc_proxy_reply *out, pjs_error *err);
    grpc_channel *(*channel)(void *ctx, int worker);
    /* Sent to workers as `authorization: Bearer <token>` in place of the
     * client's credential (which the front end has checked); NULL: none. */
    const char *worker_token;
    /* Traces the inference calls it forwards (a span of its own and one of
     * the forward, whose id the worker gets as its traceparent); NULL: the
     * client's traceparent goes on as it is. */
    struct pjs_tracer *tracer;
} pjs_grpc_proxy_ops;

/* Starts a front end that serves no method itself: each call is checked
 * (access rules, limits) and forwarded as ops decides. `budget` bounds the
 * request bytes held at once. */
int pjs_grpc_frontend_start_proxy(const pjs_grpc_options *o, const pjs_grpc_proxy_ops *ops,
                                  pjs_byte_budget *budget, pjs_grpc_frontend **out,
                                  pjs_error *err);

/* Binds and starts serving. Errors name the address and the reason (port in
 * use, unreadable certificate). */
int pjs_grpc_frontend_start(pjs_server *s, const pjs_grpc_options *o, pjs_grpc_frontend **out,
                            pjs_error *err);
/* Ends open streams, shuts the server down and joins its threads. Call it
 * after pjs_server_drain: calls still arriving are then refused UNAVAILABLE,
 * and stop first lets those already on the wire be read and refused (up to
 * about a second while clients keep calling) rather than cancelled. */
void pjs_grpc_frontend_stop(pjs_grpc_frontend *f);

#endif
