/*
 * gateway.c - the gateway's life: the worker pool first (probing starts at
 * once), then the public ports: gRPC forwarding (frontend/grpc in proxy
 * mode, grpc_routes.c deciding per method) and REST and metrics
 * (http_proxy.c). Stop closes the ports (requests in flight are answered)
 * before the pool goes.
 */
#include "gateway/gateway.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/cpus.h"
#include "core/log.h"
#include "gateway/grpc_routes.h"
#include "gateway/http_proxy.h"

struct pjs_gateway {
    pjs_gw_pool *pool;
    pjs_byte_budget budget; /* request bytes held at once, both protocols */
    pjs_gw_grpc_routes grpc_routes;
    pjs_grpc_proxy_ops grpc_ops;
    pjs_grpc_frontend *grpc;
    /* The REST side once started, so workers joining later (from DNS) are
     * told to it; the lock keeps it from being stopped under that. */
    pthread_mutex_t http_lock;
    pjs_gw_http *http;
};

/* CPUs per gRPC completion-queue thread when --grpc-threads is left to
 * us. A gateway's thread does little per event (no execution), and every
 * thread beyond what the traffic needs costs wake-ups: gRPC hands the
 * poller from thread to thread. With mlp at concurrency 8 on 2 CPUs, one
 * thread instead of two took the gateway's CPU per request from 81-92 to
 * 66-68 us at the same throughput (docs/benchmarks.md). */
#define CPUS_PER_GRPC_THREAD 4
#define GRPC_THREADS_MAX 4

static int default_grpc_threads(void)
{
    int n = pjs_cpus_schedulable() / CPUS_PER_GRPC_THREAD;
    return n < 1 ? 1 : n > GRPC_THREADS_MAX ? GRPC_THREADS_MAX : n;
}

/* Tells the REST side where worker i's /metrics is. */
static void scrape_worker(pjs_gateway *g, pjs_gw_http *http, size_t i)
{
    const pjs_gw_worker_addr *a = pjs_gw_pool_addr(g->pool, i);
    pjs_error err;
    if (a->metrics[0] != '\0' && pjs_gw_http_set_worker_metrics(http, i, a->metrics, &err) != 0)
        pjs_warn("gateway: worker %zu's metrics at %s are left out: %s", i, a->metrics, err.msg);
}

/* The pool's on_worker_added: a worker found by DNS joined. */
static void worker_added(void *ctx, size_t i)
{
    pjs_gateway *g = ctx;
    pthread_mutex_lock(&g->http_lock);
    if (g->http != NULL)
        scrape_worker(g, g->http, i);
    pthread_mutex_unlock(&g->http_lock);
}

int pjs_gateway_start(const pjs_gateway_options *o, pjs_gateway **out, pjs_error *err)
{
    *out = NULL;
    pjs_gateway *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pjs_error_set(err, PJS_ERR_NOMEM, "no memory for the gateway");
    pthread_mutex_init(&g->http_lock, NULL);
    pjs_byte_budget_init(&g->budget, o->max_inflight_request_bytes);
    pjs_gw_pool_options pool = o->pool;
    pool.on_worker_added = worker_added;
    pool.ctx = g;
    int rc = pjs_gw_pool_create(&pool, &g->pool, err);
    if (rc != 0) {
        pthread_mutex_destroy(&g->http_lock);
        free(g);
        return rc;
    }
    g->grpc_routes = (pjs_gw_grpc_routes){.pool = g->pool,
                                          .node_status = o->node_status,
                                          .node_ctx = o->node_ctx,
                                          .tracer = o->tracer};
    pjs_gw_grpc_ops(&g->grpc_routes, &g->grpc_ops);
    g->grpc_ops.tracer = o->tracer;
    pjs_grpc_options grpc = o->grpc;
    grpc.max_request_bytes = o->max_request_bytes;
    if (grpc.threads == 0)
        grpc.threads = default_grpc_threads();
    if (grpc.port != 0 &&
        (rc = pjs_grpc_frontend_start_proxy(&grpc, &g->grpc_ops, &g->budget, &g->grpc, err)) != 0)
        pjs_error_prefix(err, "gRPC on port %d: ", grpc.port);
    pjs_gw_http *http = NULL;
    if (rc == 0 && (o->http.port != 0 || o->metrics.port != 0))
        rc = pjs_gw_http_start(g->pool, &o->http, &o->metrics, &g->budget, o->max_request_bytes,
                               o->node_status, o->node_ctx, o->tracer, &http, err);
    if (http != NULL) {
        pthread_mutex_lock(&g->http_lock);
        g->http = http;
        for (size_t i = 0; i < pjs_gw_pool_size(g->pool); i++)
            scrape_worker(g, http, i);
        pthread_mutex_unlock(&g->http_lock);
    }
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
    pthread_mutex_lock(&g->http_lock);
    pjs_gw_http *http = g->http;
    g->http = NULL; /* a worker joining now is not told to it */
    pthread_mutex_unlock(&g->http_lock);
    pjs_gw_http_stop(http);
    pjs_gw_pool_destroy(g->pool);
    pthread_mutex_destroy(&g->http_lock);
    free(g);
}
