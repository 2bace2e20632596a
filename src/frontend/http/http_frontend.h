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
    /* Connections (0 picks the default in brackets). */
    unsigned max_connections;        /* open at once [min(1000, a quarter of the file limit)] */
    unsigned max_connections_per_ip; /* from one client address [256] */
    unsigned idle_timeout_s;         /* close a connection silent this long [60] */
    unsigned header_timeout_s;       /* a request's headers must be in within this [10] */
    unsigned body_timeout_s;         /* ... and its body within this after them [60] */
    /* HTTPS: PEM files; NULL: plain HTTP. With tls_ca, clients must present
     * a certificate that CA signed (mutual TLS). */
    const char *tls_cert, *tls_key, *tls_ca;
    const pjs_access *access; /* who may call what; NULL: no tokens (frontend/access.h) */
    /* serve's REST port under a node: GET /v2/pjserve/node answers this
     * file (the node keeps it up to date); NULL: that route answers 404. */
    const char *node_status_file;
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
