/*
 * grpc_routes.h - how the gateway serves each gRPC method over its
 * workers: the ops the forwarding front end calls (grpc_frontend.h).
 */
#ifndef PJS_GATEWAY_GRPC_ROUTES_H
#define PJS_GATEWAY_GRPC_ROUTES_H

#include "frontend/grpc/grpc_frontend.h"
#include "gateway/pool.h"

/* Fills ops for forwarding to the workers of `pool` (which must outlive
 * the front end). */
void pjs_gw_grpc_ops(pjs_gw_pool *pool, pjs_grpc_proxy_ops *ops);

#endif
