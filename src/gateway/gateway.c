/*
 * gateway.c - the gateway's life: the worker pool first (probing starts at
 * once), then the public ports: gRPC forwarding (frontend/grpc in proxy
 * mode, grpc_routes.c deciding per method) and REST and metrics
 * (http_proxy.c). Stop closes the ports (requests in flight are answered)
 * before the pool goes.
 */
#include "gateway/gateway.h"

#include <stdlib.h>

#include "core/log.h"
#include "gateway/grpc_routes.h"
#include "gateway/http_proxy.h"

struct pjs_gateway {
    pjs_gw_pool *pool;
    pjs_byte_budget budget; /* request bytes held at once, both protocols */
    pjs_grpc_proxy_ops grpc_ops;
    pjs_grpc_frontend *grpc;
    pjs_gw_http *http;
};

int pjs_gateway_start(const pjs_gateway_options *o, pjs_gateway **out, pjs_error *err)
{
    *out = NULL;
    pjs_gateway *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the gateway");
    pjs_byte_budget_init(&g->budget, o->max_inflight_request_bytes);
    int rc = pjs_gw_pool_create(&o->pool, &g->pool, err);
    if (rc != 0) {
        free(g);
        return rc;
    }
    pjs_gw_grpc_ops(g->pool, &g->grpc_ops);
    pjs_grpc_options grpc = o->grpc;
    grpc.max_request_bytes = o->max_request_bytes;
    if (grpc.port != 0 &&
        (rc = pjs_grpc_frontend_start_proxy(&grpc, &g->grpc_ops, &g->budget, &g->grpc, err)) != 0)
        pjs_error_prefix(err, "gRPC on port %d: ", grpc.port);
    if (rc == 0 && (o->http.port != 0 || o->metrics.port != 0))
        rc = pjs_gw_http_start(g->pool, &o->http, &o->metrics, &g->budget, o->max_request_bytes,
                               o->node_status, o->node_ctx, &g->http, err);
    if (rc != 0) {
        pjs_gateway_stop(g);
        return rc;
    }
    pjs_info("gateway: %zu workers, routing %s", pjs_gw_pool_size(g->pool),
             pjs_gw_routing_name(pjs_gw_pool_routing(g->pool)));
    *out = g;
    return 0;
}

pjs_gw_pool *pjs_gateway_pool(pjs_gateway *g)
{
    return g->pool;
}

void pjs_gateway_stop(pjs_gateway *g)
{
    if (g == NULL)
        return;
    pjs_grpc_frontend_stop(g->grpc);
    pjs_gw_http_stop(g->http);
    pjs_gw_pool_destroy(g->pool);
    free(g);
}
