/*
 * grpc_routes.h - how the gateway serves each gRPC method over its
 * workers: the ops the forwarding front end calls (grpc_frontend.h).
 */
#ifndef PJS_GATEWAY_GRPC_ROUTES_H
#define PJS_GATEWAY_GRPC_ROUTES_H

#include "frontend/grpc/grpc_frontend.h"
#include "gateway/gateway.h"
#include "gateway/pool.h"

/* What the routes answer from: the workers, and the node's status (NULL in
 * a standalone gateway). */
typedef struct pjs_gw_grpc_routes {
    pjs_gw_pool *pool;
    pjs_gateway_node_status_fn node_status;
    void *node_ctx;
    struct pjs_tracer *tracer; /* the gateway's; TraceSetting applies to it too */
} pjs_gw_grpc_routes;

/* Fills ops for forwarding as `routes` says (which must outlive the front
 * end). */
void pjs_gw_grpc_ops(pjs_gw_grpc_routes *routes, pjs_grpc_proxy_ops *ops);

#endif
