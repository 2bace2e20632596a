/*
 * gateway.h - one public KServe V2 endpoint (gRPC, REST, metrics) over
 * several pjserve workers.
 *
 * The gateway links no PJRT and decodes no tensors: it reads what routing
 * needs (the model name, a sequence id), checks the client's rights and
 * limits as serve does (frontend/access.h), forwards the request's bytes to
 * a worker picked by the pool (pool.h) and relays the answer. Server-wide
 * calls are answered from the workers together: repository index and
 * statistics merged, loads, unloads and shared-memory registrations fanned
 * out to every worker, metrics concatenated with a `worker` label.
 *
 * `pjserve gateway` runs one standalone; `pjserve node` runs one in-process
 * when it has more than one worker.
 */
#ifndef PJS_GATEWAY_GATEWAY_H
#define PJS_GATEWAY_GATEWAY_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "frontend/access.h"
#include "frontend/grpc/grpc_frontend.h"
#include "frontend/http/http_frontend.h"
#include "gateway/pool.h"

/* The node's status document for GET /v2/pjserve/node, as a malloc'd JSON
 * string (NULL: out of memory). */
typedef char *(*pjs_gateway_node_status_fn)(void *ctx);

typedef struct pjs_gateway_options {
    pjs_gw_pool_options pool;
    /* Public ports: host, port, TLS, client limits and access as in serve
     * (port 0: that port is not served). */
    pjs_grpc_options grpc;
    pjs_http_options http;
    pjs_http_options metrics;
    uint64_t max_request_bytes;          /* largest request, decompressed */
    uint64_t max_inflight_request_bytes; /* request bytes held at once */
    /* Set by the node: GET /v2/pjserve/node answers node_status(node_ctx).
     * NULL in a standalone gateway (the route answers 404). */
    pjs_gateway_node_status_fn node_status;
    void *node_ctx;
    /* Where the spans of the inference calls it forwards go (--trace-endpoint);
     * NULL: tracing off. The caller's; it outlives the gateway. */
    struct pjs_tracer *tracer;
} pjs_gateway_options;

typedef struct pjs_gateway pjs_gateway;

/* Creates the pool, binds the public ports and starts serving. Errors name
 * the address and the reason. */
int pjs_gateway_start(const pjs_gateway_options *o, pjs_gateway **out, pjs_error *err);
/* The worker pool (for the node: readiness, restarts, views). */
pjs_gw_pool *pjs_gateway_pool(pjs_gateway *g);
/* Refuses new requests, lets those in flight finish, closes the ports. */
void pjs_gateway_stop(pjs_gateway *g);

#endif
