/*
 * http_proxy.h - the gateway's REST and metrics ports: KServe V2 over HTTP
 * relayed to the workers of a pool.
 *
 * Both ports run on the HTTP front end's daemon (frontend/http), so clients
 * meet the limits and access rules of serve: connection and per-address
 * caps, header and body deadlines, body caps and the in-flight byte budget,
 * inflation of encoded bodies, tokens and the loopback rule, TLS. A request
 * that passes them is served as its operation's class says, the same as
 * over gRPC (relay_policy.h): answered by the gateway itself (health, node
 * status), relayed to one worker (a model's calls to the worker the pool
 * picks; other reads to any available worker), fanned out to every worker
 * not known to be down (repository loads and unloads, shared-memory
 * registration, logging, trace and control changes) or merged from the
 * available ones (repository index, statistics); /metrics merges every
 * worker's. The REST port's client connections and its upstream calls
 * (libcurl's multi interface, connections kept alive) run on one proxy
 * thread, in one event loop; the client's connection waits suspended, and
 * nothing waits for a worker.
 */
#ifndef PJS_GATEWAY_HTTP_PROXY_H
#define PJS_GATEWAY_HTTP_PROXY_H

#include <stdint.h>

#include "core/byte_budget.h"
#include "core/status.h"
#include "frontend/http/http_frontend.h"
#include "gateway/gateway.h"
#include "gateway/pool.h"

typedef struct pjs_gw_http pjs_gw_http;

/* Starts the REST port (rest) and the metrics port (metrics) over `pool`;
 * either may be NULL or have port 0, and is then not served. Request
 * bodies are held to max_request_bytes (decompressed) and, with every
 * other request in flight, to `budget` (never NULL). GET /v2/pjserve/node
 * answers node_status(node_ctx) (NULL: 404, a standalone gateway). Errors
 * name the address and the reason. */
int pjs_gw_http_start(pjs_gw_pool *pool, const pjs_http_options *rest,
                      const pjs_http_options *metrics, pjs_byte_budget *budget,
                      uint64_t max_request_bytes, pjs_gateway_node_status_fn node_status,
                      void *node_ctx, struct pjs_tracer *tracer, pjs_gw_http **out,
                      pjs_error *err);
/* Where worker i serves its Prometheus metrics ("host:port", its
 * --metrics-port); /metrics merges the workers set here, each sample with
 * worker="i", before the gateway's own series. Until set, worker i's
 * samples are left out. Any thread, any time. */
int pjs_gw_http_set_worker_metrics(pjs_gw_http *h, size_t i, const char *host_port,
                                   pjs_error *err);
/* Stops accepting, lets the requests in flight be answered (their worker
 * calls finish), closes both ports and joins the proxy thread. */
void pjs_gw_http_stop(pjs_gw_http *h);

#endif
