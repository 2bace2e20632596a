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
} pjs_grpc_options;

typedef struct pjs_grpc_frontend pjs_grpc_frontend;

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
