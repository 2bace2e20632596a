/*
 * http_frontend.h - the KServe V2 HTTP/REST front end and the Prometheus
 * metrics endpoint, both on libmicrohttpd.
 *
 * Started once the server has loaded its repository; stopped after
 * pjs_server_drain, so every accepted request has been answered first.
 */
#ifndef PJS_FRONTEND_HTTP_FRONTEND_H
#define PJS_FRONTEND_HTTP_FRONTEND_H

#include "core/status.h"
#include "frontend/access.h"
#include "server/server.h"

typedef struct pjs_http_options {
    const char *host; /* bind address, e.g. "0.0.0.0" */
    int port;         /* e.g. 8000 (REST) or 8002 (metrics) */
    int threads;      /* connection threads; 0: a default */
    const pjs_access *access; /* who may call what; NULL: no tokens (frontend/access.h) */
} pjs_http_options;

typedef struct pjs_http_frontend pjs_http_frontend;

/* REST: /v2/... (health, metadata, infer, repository, shared memory). */
int pjs_http_frontend_start(pjs_server *s, const pjs_http_options *o, pjs_http_frontend **out,
                            pjs_error *err);
/* Metrics: GET /metrics in the Prometheus text format. */
int pjs_metrics_frontend_start(pjs_server *s, const pjs_http_options *o,
                               pjs_http_frontend **out, pjs_error *err);
/* Stops either kind and joins its threads. */
void pjs_http_frontend_stop(pjs_http_frontend *f);

#endif
